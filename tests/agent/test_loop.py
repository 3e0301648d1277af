"""The agent against the API server double, through the real Kubernetes client.

A fake scanner hands it prepared topologies; what is asserted is what reached the "cluster":
the Node's labels and annotations, the requests made (writes counted), and the Events.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from reporter.agent import STALL_AFTER_S
from reporter.collect import build_scanner
from reporter.collect.kubelet import read_kubelet
from reporter.collect.simulate.fake_nvml import Faults
from reporter.publish import patch as node_patch
from reporter.publish.patch import NodeMetadata
from reporter.publish.retry import Backoff, Interrupted
from reporter.schema.annotations import annotations
from reporter.schema.codec import decode
from reporter.schema.labels import labels
from reporter.schema.model import Link, LinkKind, Topology
from reporter.serve.state import Verdict
from tests.support.agent_support import (
    NODE,
    PREFIX,
    ClockedStop,
    FakeClock,
    FakeScanner,
    WireAgent,
    nvml_failed,
    ok,
    topology,
)
from tests.support.kube_double import ApiServerDouble, Fault

OWNED = f"{PREFIX}/owned"


def ours(apiserver: ApiServerDouble) -> node_patch.Desired:
    meta = apiserver.node(NODE)["metadata"]
    return node_patch.ours(NodeMetadata(NODE, meta["labels"], meta["annotations"]), PREFIX)


def events(apiserver: ApiServerDouble) -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in apiserver.events]


def test_first_publish_writes_labels_annotations_owned_in_one_patch_and_tells_operators(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert w.agent.step()
    assert len(apiserver.writes()) == 1
    published = ours(apiserver)
    assert published.labels[f"{PREFIX}/count"] == "8"
    assert published.labels[f"{PREFIX}/interconnect"] == "nvswitch"
    assert decode(published.annotations[f"{PREFIX}/topology"]) == topology()
    assert "matrix" in published.annotations.get(OWNED, "").split(",")
    assert events(apiserver) == [
        (
            "Normal",
            "GPUTopologyChanged",
            "published: 8x NVIDIA H100 80GB HBM3, NVSwitch NV18, 2 NUMA nodes, 2 RDMA NICs",
        )
    ]
    assert w.state.readiness().ok


def test_second_run_with_the_same_topology_makes_no_request_at_all(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    apiserver.clear_requests()
    for _ in range(3):
        w.clock.advance(60)
        assert w.agent.step()
    assert apiserver.requests == []


def test_restart_with_an_unchanged_topology_reads_once_and_writes_nothing(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    wire(kubeconfig, FakeScanner([ok(topology())])).agent.step()
    apiserver.clear_requests()
    restarted = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert restarted.agent.step()
    assert [(r.method, r.path) for r in apiserver.requests] == [("GET", f"/api/v1/nodes/{NODE}")]
    assert len(apiserver.events) == 1  # only the first run's


def test_foreign_labels_and_annotations_are_never_touched(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    foreign_labels = {
        "nvidia.com/gpu.count": "8",
        "team": "ml",
        f"{PREFIX}/added-by-hand": "yes",
    }
    foreign_annotations = {"other.io/note": "keep me", "nfd.node.kubernetes.io/x": "y"}
    apiserver.edit_node(
        NODE, {"metadata": {"labels": foreign_labels, "annotations": foreign_annotations}}
    )
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    w.scanner.then(ok(topology(4, nics=())))
    w.clock.advance(60)
    w.agent.step()
    labels, annotations = apiserver.labels(NODE), apiserver.annotations(NODE)
    assert {k: labels[k] for k in foreign_labels} == foreign_labels
    assert {k: annotations[k] for k in foreign_annotations} == foreign_annotations
    for write in apiserver.writes(f"/api/v1/nodes/{NODE}"):
        named = {
            *write.body["metadata"].get("labels", {}),
            *write.body["metadata"].get("annotations", {}),
        }
        assert all(k.startswith(f"{PREFIX}/") for k in named), named
        assert f"{PREFIX}/added-by-hand" not in named


def test_an_edited_owned_list_naming_kubernetes_labels_deletes_none_of_them(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    kubelet = {
        "kubernetes.io/hostname": NODE,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node-role.kubernetes.io/gpu": "",
    }
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    apiserver.edit_node(
        NODE,
        {
            "metadata": {
                "labels": kubelet,
                "annotations": {OWNED: ",".join([*kubelet, f"{PREFIX}/count"])},
            }
        },
    )
    w.scanner.then(ok(topology(4)))
    w.clock.advance(300)
    assert w.agent.step()
    labels = apiserver.labels(NODE)
    assert {k: labels[k] for k in kubelet} == kubelet
    assert labels[f"{PREFIX}/count"] == "4"


def test_keys_it_owned_and_no_longer_produces_are_removed(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    assert f"{PREFIX}/numa-nodes" in apiserver.labels(NODE)
    one_gpu = topology(1, nics=())
    w.scanner.then(ok(one_gpu))
    w.clock.advance(60)
    w.agent.step()
    labels = apiserver.labels(NODE)
    assert labels[f"{PREFIX}/count"] == "1"
    assert labels[f"{PREFIX}/interconnect"] == "none"
    expected = set(node_patch.desired(*_projection(one_gpu), PREFIX).labels)
    assert {k for k in labels if k.startswith(f"{PREFIX}/")} == expected


def _projection(t: Topology) -> tuple[dict[str, str], dict[str, str]]:
    return labels(t, PREFIX, NODE), annotations(t, PREFIX)


def test_drift_is_repaired_at_resync_with_one_read_and_one_patch(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]), resync_s=300)
    w.agent.step()
    apiserver.edit_node(
        NODE,
        {
            "metadata": {
                "labels": {f"{PREFIX}/count": "80", f"{PREFIX}/interconnect": None},
                "annotations": {f"{PREFIX}/matrix": None},
            }
        },
    )
    apiserver.clear_requests()
    w.clock.advance(240)
    w.agent.step()
    assert apiserver.requests == []  # before the resync period: the drift is not seen yet
    w.clock.advance(60)
    w.agent.step()
    assert [r.method for r in apiserver.requests] == ["GET", "PATCH"]
    assert ours(apiserver) == node_patch.desired(*_projection(topology()), PREFIX)
    assert len(apiserver.events) == 1  # a repair is not a topology change


def test_a_change_is_one_patch_and_an_event_in_words(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    apiserver.clear_requests()
    w.scanner.then(ok(topology(overrides={(3, 5): Link(LinkKind.NV, 12)})))
    w.clock.advance(60)
    w.agent.step()
    assert [r.method for r in apiserver.writes()] == ["PATCH"]
    assert events(apiserver)[-1] == ("Normal", "GPUTopologyChanged", "GPU3↔GPU5: NV18 → NV12")


def test_a_gpu_nvml_reports_lost_is_published_as_lost_with_a_warning(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    w.scanner.then(ok(topology(lost=[6])))
    w.clock.advance(60)
    assert w.agent.step()
    published = decode(apiserver.annotations(NODE)[f"{PREFIX}/topology"])
    assert [g.index for g in published.gpus if g.lost] == [6]
    assert events(apiserver)[-2] == ("Warning", "GPUTopologyChanged", "GPU6 lost")
    kind, reason, message = events(apiserver)[-1]
    assert (kind, reason) == ("Warning", "GPULost")
    assert message.startswith("GPU6 fell off the bus")
    assert w.state.readiness().ok


@pytest.mark.parametrize("lost", [0, 3, 7])
@pytest.mark.parametrize("profile", ["dgx-h100", "pcie-8x"])
def test_a_gpu_nvml_reports_lost_is_told_once_as_lost_with_no_other_noise(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent, profile: str, lost: int
) -> None:
    """What the NVML collector really gives for a lost GPU (its index, nothing else), end to end."""
    healthy = build_scanner("auto", Path("/sys"), profile).scan()
    broken = build_scanner(
        "auto", Path("/sys"), profile, faults=Faults(lost=frozenset({lost}))
    ).scan()
    w = wire(kubeconfig, FakeScanner([healthy]))
    assert w.agent.step()
    apiserver.events.clear()
    w.scanner.then(broken)
    w.clock.advance(60)
    assert w.agent.step()
    told = events(apiserver)
    assert ("Warning", "GPUTopologyChanged", f"GPU{lost} lost") in told
    assert [reason for _, reason, _ in told] == ["GPUTopologyChanged", "GPULost"]


def test_nvml_failing_after_it_worked_keeps_the_last_data_and_marks_degraded(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    before = ours(apiserver)
    apiserver.clear_requests()
    w.scanner.then(nvml_failed(topology(8, nics=())), nvml_failed(None))
    for _ in range(2):
        w.clock.advance(60)
        assert not w.agent.step()
    assert ours(apiserver) == before
    assert apiserver.writes() == []
    assert not w.state.readiness().ok
    assert "nvml: NVML did not load" in w.state.readiness().reason
    assert w.metrics.degraded._value.get() == 1
    warnings = [e for e in events(apiserver) if e[0] == "Warning"]
    assert warnings == [
        (
            "Warning",
            "GPUTopologyDegraded",
            "nvml: NVML did not load: driver gone; keeping the last published topology",
        )
    ]
    w.scanner.then(ok(topology()))
    w.clock.advance(60)
    assert w.agent.step()
    assert w.state.readiness().ok
    assert w.metrics.degraded._value.get() == 0


def test_degraded_after_a_restart_keeps_what_the_node_already_carries(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    wire(kubeconfig, FakeScanner([ok(topology())])).agent.step()
    before = ours(apiserver)
    restarted = wire(kubeconfig, FakeScanner([nvml_failed(None)]))
    assert not restarted.agent.step(), "a failed source is a failed step: run --once exits 1"
    assert ours(apiserver) == before
    assert not restarted.state.readiness().ok


@pytest.mark.parametrize(
    "visible",
    [frozenset(), frozenset({0, 1, 2, 3}), frozenset({0, 1, 2, 3, 4, 5, 6})],
    ids=["NVML sees 0 of 8 GPUs", "NVML sees 4 of 8", "NVML sees 7 of 8"],
)
def test_nvml_seeing_fewer_gpus_than_sysfs_is_degraded_and_keeps_the_last_topology(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent, visible: frozenset[int]
) -> None:
    """NVIDIA_VISIBLE_DEVICES=none (or a partial list) in the pod: NVML loads and counts short."""
    healthy = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    short = build_scanner("auto", Path("/sys"), "dgx-h100", faults=Faults(visible=visible)).scan()
    w = wire(kubeconfig, FakeScanner([healthy]))
    assert w.agent.step()
    before = ours(apiserver)
    assert before.labels[f"{PREFIX}/nvlink-island-size"] == "8"
    apiserver.events.clear()
    apiserver.clear_requests()
    w.scanner.then(short)
    for _ in range(2):
        w.clock.advance(60)
        assert not w.agent.step()
    assert ours(apiserver) == before
    assert apiserver.writes() == []
    assert not w.state.readiness().ok
    assert f"NVML sees {len(visible)} of the 8 NVIDIA GPUs" in w.state.readiness().reason
    ((kind, reason, message),) = events(apiserver)
    assert (kind, reason) == ("Warning", "GPUTopologyDegraded")
    assert message.startswith(f"nvml: NVML sees {len(visible)} of the 8 NVIDIA GPUs in sysfs")
    assert message.endswith("; keeping the last published topology")
    w.scanner.then(healthy)
    w.clock.advance(60)
    assert w.agent.step()
    assert w.state.readiness().ok


def test_degraded_with_nothing_published_before_publishes_what_sysfs_saw(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([nvml_failed(topology())]))
    w.agent.step()
    assert apiserver.labels(NODE)[f"{PREFIX}/interconnect"] == "unknown"
    assert not w.state.readiness().ok


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (Fault(503), 503),
        (Fault(429, retry_after="0"), 429),
        (Fault(500), 500),
        (Fault(502), 502),
        (Fault(504), 504),
        (Fault(drop=True), None),
    ],
    ids=["503", "429 with Retry-After", "500", "502", "504", "dropped connection"],
)
def test_transient_faults_are_retried_until_the_patch_lands(
    apiserver: ApiServerDouble, kubeconfig: Path, fault: Fault, status: int | None, wire: WireAgent
) -> None:
    on_patch = replace(fault, method="PATCH")
    apiserver.plan(on_patch, on_patch)
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert w.agent.step()
    assert apiserver.pending_faults() == []
    assert apiserver.labels(NODE)[f"{PREFIX}/count"] == "8"
    patches = [r.status for r in apiserver.requests if r.method == "PATCH"]
    assert patches == [-1 if status is None else status] * 2 + [200]


def test_a_conflict_rereads_the_node_and_patches_against_the_new_version(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    w.agent.step()
    # Someone else writes the Node between our read and our next patch: our version is stale.
    apiserver.edit_node(NODE, {"metadata": {"labels": {"team": "ml"}}})
    w.scanner.then(ok(topology(lost=[1])))
    w.clock.advance(60)
    apiserver.clear_requests()
    assert w.agent.step()
    assert [(r.method, r.status) for r in apiserver.requests if "events" not in r.path] == [
        ("PATCH", 409),
        ("GET", 200),
        ("PATCH", 200),
    ]
    assert apiserver.labels(NODE)["team"] == "ml"


def test_a_failed_event_is_counted_as_an_api_error_and_the_publish_stands(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(Fault(503, "POST", path="/api/v1/namespaces/default/events"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert w.agent.step()
    assert apiserver.events == []
    assert w.metrics.api_errors.labels(kind="server")._value.get() == 1
    assert w.metrics.publishes.labels(result="written")._value.get() == 1


def test_retries_give_up_after_the_budget_and_the_next_interval_tries_again(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(*[Fault(503, "PATCH") for _ in range(4)])
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    assert not w.agent.step()
    assert not w.state.readiness().ok
    assert w.metrics.api_errors.labels(kind="server")._value.get() == 4
    w.clock.advance(60)
    assert w.agent.step()
    assert w.state.readiness().ok


def test_a_422_is_logged_once_and_not_retried_until_the_topology_changes_or_resync(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(Fault(422, "PATCH", message="metadata.labels: Invalid value"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]), resync_s=300)
    with capture_logs() as logs:
        assert not w.agent.step()
        for _ in range(3):
            w.clock.advance(60)
            assert not w.agent.step()
    refusals = [e for e in logs if e["event"] == "publish_refused"]
    assert len(refusals) == 1
    assert "refused the metadata (422)" in refusals[0]["error"]
    assert "check the label values" in refusals[0]["error"]
    assert len([r for r in apiserver.requests if r.method == "PATCH"]) == 1
    assert not w.state.readiness().ok
    w.clock.advance(120)  # the resync period has passed: one more try, which now succeeds
    assert w.agent.step()
    assert w.state.readiness().ok


def test_a_403_says_which_rbac_rule_is_missing_and_the_agent_stays_up(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.tokens["agent-token"] = frozenset({"get nodes", "create events"})
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        assert not w.agent.step()
    (refusal,) = [e for e in logs if e["event"] == "publish_refused"]
    assert "grant the agent's ClusterRole `patch` on `nodes`" in refusal["error"]
    assert w.state.liveness().ok
    assert not w.state.readiness().ok


def test_the_annotation_budget_is_checked_before_sending(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.edit_node(NODE, {"metadata": {"annotations": {"other.io/blob": "x" * 260_000}}})
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        assert not w.agent.step()
    assert apiserver.writes() == []
    (refusal,) = [e for e in logs if e["event"] == "publish_refused"]
    assert "over the apiserver's 262144-byte limit" in refusal["error"]


def test_every_log_line_carries_the_node_name(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(Fault(503, "PATCH"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        w.agent.step()
        w.scanner.then(nvml_failed(None))
        w.clock.advance(60)
        w.agent.step()
    names = {e["event"] for e in logs}
    assert {"api_retry", "node_patched", "topology_published"} <= names
    assert "degraded_keeping_last_topology" in names
    assert all(e.get("node") == NODE for e in logs), [e for e in logs if "node" not in e]


def test_a_retry_wait_honours_retry_after(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(Fault(429, "PATCH", retry_after="1"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        assert w.agent.step()
    (retry,) = [e for e in logs if e["event"] == "api_retry"]
    assert retry["wait_s"] >= 1.0


def test_honouring_a_long_retry_after_is_not_a_stall(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    """429 with Retry-After: 200, four times: 800 s of waits the server asked for (issue 11)."""
    clock = FakeClock()
    stop = ClockedStop(clock)
    apiserver.plan(*[Fault(429, "PATCH", retry_after="200")] * 4)
    w = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        clock=clock,
        stop=stop,
        backoff=Backoff(),
        stall_after_s=STALL_AFTER_S,
    )
    stop.probe = w.state.liveness
    assert w.agent.step()
    assert len(stop.waited) == 4
    assert all(seconds >= 200 for seconds in stop.waited)
    assert stop.seen == [Verdict(True, "ok")] * 4
    assert w.state.liveness().ok
    # A loop that stops beating is still caught, a stall limit after its last announced wait.
    clock.advance(STALL_AFTER_S + 1)
    assert not w.state.liveness().ok


def test_a_long_interval_is_a_wait_not_a_stall(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    clock = FakeClock()
    stop = ClockedStop(clock, waits=2)
    w = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        clock=clock,
        stop=stop,
        interval_s=86400.0,
        stall_after_s=STALL_AFTER_S,
    )
    stop.probe = w.state.liveness
    w.agent.run()
    assert stop.waited == [86400.0, 86400.0]
    assert stop.seen == [Verdict(True, "ok")] * 2


def test_shutdown_during_a_retry_wait_stops_without_another_attempt(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    apiserver.plan(Fault(503, "PATCH", retry_after="120"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]))

    def stop_once_refused() -> None:
        # Shut down once the refused PATCH is in, whatever the machine's speed: the agent is then
        # in (or about to start) its 120 s wait, which the stop must cut short.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "PATCH" not in [r.method for r in apiserver.requests]:
            time.sleep(0.01)
        w.stop.set()

    threading.Thread(target=stop_once_refused, daemon=True).start()
    with pytest.raises(Interrupted):
        w.agent.step()
    assert [r.method for r in apiserver.requests].count("PATCH") == 1


def test_kubelet_policies_are_published_as_labels_and_their_limit_as_one_warning(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path, wire: WireAgent
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n")
    w = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        kubelet=functools.partial(read_kubelet, config),
    )
    assert w.agent.step()
    node_labels = apiserver.labels(NODE)
    assert node_labels[f"{PREFIX}/topology-manager-policy"] == "single-numa-node"
    assert node_labels[f"{PREFIX}/topology-manager-scope"] == "container"
    assert node_labels[f"{PREFIX}/cpu-manager-policy"] == "none"
    owned = ours(apiserver).annotations[f"{PREFIX}/owned"].split(",")
    assert "topology-manager-policy" in owned
    limits = [e for e in events(apiserver) if e[1] == "TopologyManagerLimit"]
    assert len(limits) == 1
    assert "admits at most 4 GPUs per pod" in limits[0][2]
    for _ in range(3):
        w.clock.advance(60)
        assert w.agent.step()
    assert len([e for e in events(apiserver) if e[1] == "TopologyManagerLimit"]) == 1


def test_a_finding_is_told_again_only_after_it_went_away(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    w = wire(kubeconfig, FakeScanner([ok(topology(lost=[6]))]))
    w.agent.step()
    w.scanner.then(ok(topology()))
    w.clock.advance(60)
    w.agent.step()
    w.scanner.then(ok(topology(lost=[6])))
    w.clock.advance(60)
    w.agent.step()
    assert [e[1] for e in events(apiserver)].count("GPULost") == 2


def test_a_missing_kubelet_config_means_no_policy_labels_and_a_bad_one_is_logged_once(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path, wire: WireAgent
) -> None:
    missing = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        kubelet=functools.partial(read_kubelet, tmp_path / "absent.yaml"),
    )
    assert missing.agent.step()
    assert f"{PREFIX}/topology-manager-policy" not in apiserver.labels(NODE)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    w = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        kubelet=functools.partial(read_kubelet, bad),
    )
    with capture_logs() as logs:
        for _ in range(3):
            w.clock.advance(60)
            assert w.agent.step()
    unreadable = [e for e in logs if e["event"] == "kubelet_config_unreadable"]
    assert len(unreadable) == 1
    assert "bad.yaml" in unreadable[0]["error"]


def test_a_kubelet_config_that_cannot_be_read_is_told_on_the_node_and_in_readyz_once(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path, wire: WireAgent
) -> None:
    config = tmp_path / "config.yaml"
    w = wire(
        kubeconfig, FakeScanner([ok(topology())]), kubelet=functools.partial(read_kubelet, config)
    )
    for _ in range(3):
        assert w.agent.step()
        w.clock.advance(60)
    unknown = [e for e in events(apiserver) if e[1] == "KubeletPolicyUnknown"]
    assert len(unknown) == 1
    assert unknown[0][0] == "Warning"
    assert f"no kubelet config at {config}" in unknown[0][2]
    assert "--topology-manager-policy" in unknown[0][2]
    # Ready (the topology is published), and saying why the policy is missing.
    verdict = w.state.readiness()
    assert verdict.ok
    assert verdict.reason == f"ok; Topology Manager policy unknown: no kubelet config at {config}"
    # Readable again: the note goes, the labels come, and nothing more is told.
    config.write_text("kind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n")
    with capture_logs() as logs:
        assert w.agent.step()
    assert [e["event"] for e in logs if e["event"].startswith("kubelet_")] == [
        "kubelet_config_read"
    ]
    assert w.state.readiness().reason == "ok"
    assert apiserver.labels(NODE)[f"{PREFIX}/topology-manager-policy"] == "best-effort"
    # Unreadable once more (the config went): told again, with the labels it owned gone.
    config.unlink()
    w.clock.advance(60)
    assert w.agent.step()
    assert [e[1] for e in events(apiserver)].count("KubeletPolicyUnknown") == 2
    assert f"{PREFIX}/topology-manager-policy" not in apiserver.labels(NODE)


def test_a_refused_first_read_is_logged_once_however_often_it_is_retried(
    apiserver: ApiServerDouble, kubeconfig_with_token: Callable[[str], Path], wire: WireAgent
) -> None:
    w = wire(kubeconfig_with_token("wrong-token"), FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        for _ in range(4):
            w.clock.advance(60)
            assert not w.agent.step()
    refused = [e for e in logs if e["event"] == "node_read_refused"]
    assert len(refused) == 1
    assert "(401)" in refused[0]["error"]
    assert not w.state.readiness().ok
