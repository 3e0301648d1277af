"""The nodefeature sink: the NodeFeature object as a projection, and the sink against the double.

The double serves NFD's NodeFeature custom resource with a real apiserver's contracts
(resourceVersion, 409, 404 for a missing CRD, the CRD's structural schema); the agent talks to it
through each client (the official `kubernetes` one and the lean one, every sink test runs with
both) with a token holding only what the chart's Role grants.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from reporter.agent import STALL_AFTER_S, Agent, SchemaProjection
from reporter.assembly import build_agent
from reporter.collect.kubelet import KubeletReading
from reporter.errors import ApiPermanentError, ApiTransientError, ConfigError
from reporter.publish import errors_map
from reporter.publish import nodefeature as nf
from reporter.publish.api import NODE_FEATURES
from reporter.publish.patch import Desired
from reporter.publish.retry import Backoff
from reporter.schema import keys
from reporter.schema.codec import compact, decode, expand, to_document
from reporter.schema.labels import labels as label_projection
from reporter.schema.model import Gpu, Source
from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState, Verdict
from reporter.settings import Settings
from tests.support.agent_support import (
    API_CLIENTS,
    FAST,
    NODE,
    PREFIX,
    ApiClientFactory,
    ClockedStop,
    FakeClock,
    FakeScanner,
    ok,
    topology,
)
from tests.support.kube_double import ApiServerDouble, Fault, write_kubeconfig
from tests.support.kube_double.nodefeatures import API, schema_problems

NAMESPACE = "gpu-topology"
NAME = f"{NODE}-topo-reporter"
PATH = f"{API}/namespaces/{NAMESPACE}/nodefeatures"
TOKEN = "nodefeature-agent-token"
ROLE = frozenset({f"{verb} nodefeatures" for verb in nf.RBAC_VERBS} | {"create events"})
"""What the chart's Role grants (the chart test checks the Role against nf.RBAC_VERBS)."""

_HTTP_VERB = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


# --- the object, as a projection ---------------------------------------------------------------


def want_for(t: Any) -> Desired:
    return SchemaProjection(PREFIX, NODE).desired(t)


def body_for(t: Any, current: dict[str, Any] | None = None) -> dict[str, Any]:
    return nf.node_feature(
        want_for(t), node=NODE, namespace=NAMESPACE, prefix=PREFIX, current=current
    )


def test_the_object_is_named_after_the_node_labelled_for_nfd_master_and_carries_our_labels() -> (
    None
):
    body = body_for(topology())
    assert body["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert body["kind"] == "NodeFeature"
    assert body["metadata"]["name"] == NAME
    assert body["metadata"]["namespace"] == NAMESPACE
    assert body["metadata"]["labels"] == {
        "nfd.node.kubernetes.io/node-name": NODE,
        "app.kubernetes.io/managed-by": "topo-reporter",
        # Which install wrote it: prune under another prefix leaves it alone.
        f"{PREFIX}/node": NODE,
    }
    assert body["spec"]["labels"] == label_projection(topology(), PREFIX, NODE)
    assert schema_problems(body) == []


def test_every_gpu_is_an_instance_with_its_attributes_all_strings() -> None:
    t = topology(4)
    instances = body_for(t)["spec"]["features"]["instances"]
    gpus = [e["attributes"] for e in instances["gputopology.gpu"]["elements"]]
    assert gpus[2] == {
        "index": "2",
        "uuid": "GPU-00000002-0000-0000-0000-000000000000",
        "pci": "0000:38:00.0",
        "model": "NVIDIA H100 80GB HBM3",
        "numa": "1",
        "cpus": "48-95",
        "mem_mib": "81559",
        "mig": "false",
        "links": "NV18 NV18 X NV18",
        "nvlink_peers": "0,1,3",
        "island": "0",
    }
    assert [g["index"] for g in gpus] == ["0", "1", "2", "3"]
    nics = [e["attributes"] for e in instances["gputopology.nic"]["elements"]]
    assert nics[1] == {
        "name": "mlx5_1",
        "pci": "0000:1b:00.0",
        "numa": "1",
        "links": "SYS SYS PIX PIX",
    }
    numa = [e["attributes"] for e in instances["gputopology.numa"]["elements"]]
    assert numa == [
        {"id": "0", "cpus": "0-47", "distances": "10,21"},
        {"id": "1", "cpus": "48-95", "distances": "21,10"},
    ]


def test_node_attributes_are_the_label_values_plus_source_driver_and_nvswitch() -> None:
    elements = body_for(topology())["spec"]["features"]["attributes"]["gputopology.node"][
        "elements"
    ]
    assert elements == {
        **{
            k.removeprefix(PREFIX + "/"): v
            for k, v in label_projection(topology(), PREFIX, NODE).items()
        },
        "source": "nvml",
        "driver": "550.54.15",
        "nvswitch": "true",
    }


def test_what_the_source_does_not_know_is_absent_not_a_placeholder() -> None:
    t = topology(2)
    vague = replace(
        t,
        source=Source.SYSFS,
        nvlink_observed=False,
        driver=None,
        gpus=(Gpu(index=0), replace(t.gpus[1], uuid=None, numa=None)),
    )
    features = body_for(vague)["spec"]["features"]
    gpus = [e["attributes"] for e in features["instances"]["gputopology.gpu"]["elements"]]
    assert gpus[0] == {"index": "0", "links": "X NV18", "island": "0"}
    assert "uuid" not in gpus[1]
    assert "numa" not in gpus[1]
    assert "nvlink_peers" not in gpus[1]  # NVLink not observable: no claim either way
    assert "driver" not in features["attributes"]["gputopology.node"]["elements"]
    assert schema_problems(body_for(vague)) == []


def test_the_topology_document_travels_in_the_object_and_reads_back_exactly() -> None:
    t = topology()
    body = body_for(t)
    documents = body["spec"]["features"]["attributes"]["gputopology.annotations"]["elements"]
    assert decode(documents["topology"]) == t
    assert json.loads(documents["topology"]) == compact(to_document(t))
    assert expand(json.loads(documents["topology"])) == to_document(t)
    assert documents["matrix"].startswith("8x NVIDIA H100 80GB HBM3, NVSwitch NV18")
    assert nf.read_back(body, PREFIX) == want_for(t)
    assert nf.read_back(None, PREFIX) == Desired({}, {})


def test_reading_back_ignores_labels_outside_the_prefix_and_hand_edited_junk() -> None:
    body = body_for(topology())
    body["spec"]["labels"]["vendor.example/other"] = "1"
    body["spec"]["features"]["attributes"]["gputopology.annotations"]["elements"]["junk"] = "x"
    assert nf.read_back(body, PREFIX) == want_for(topology())


def test_replacing_keeps_others_metadata_and_sends_the_version_it_read() -> None:
    current = body_for(topology())
    current["metadata"].update(
        resourceVersion="42",
        uid="u-1",
        annotations={"team": "ml"},
        labels={**current["metadata"]["labels"], "team": "ml"},
    )
    body = body_for(topology(4), current=current)
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["annotations"] == {"team": "ml"}
    assert body["metadata"]["labels"]["team"] == "ml"
    assert body["spec"] == body_for(topology(4))["spec"]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("gpu-node-1", "gpu-node-1-topo-reporter"),
        ("ip-10-0-0-11.ec2.internal", "ip-10-0-0-11.ec2.internal-topo-reporter"),
        ("n" * 63, "n" * 63 + "-topo-reporter"),
    ],
    ids=["short name", "a dotted cloud name", "the longest a label value allows"],
)
def test_object_name_is_the_node_name_and_a_suffix(node: str, expected: str) -> None:
    assert nf.object_name(node) == expected


@pytest.mark.parametrize(
    ("node", "said"),
    [
        ("n" * 64, "at most 63 characters; use --sink node"),
        ("GPU-Node", "not a lower-case DNS subdomain"),
        ("", "not a lower-case DNS subdomain"),
    ],
    ids=["too long for the node-name label", "upper case", "empty"],
)
def test_a_node_name_nfd_cannot_take_is_a_config_error(node: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        nf.object_name(node)


# --- the sink against the double ---------------------------------------------------------------


@pytest.fixture
def nf_kubeconfig(apiserver: ApiServerDouble, apiserver_certificate: Any, tmp_path: Path) -> Path:
    """The agent's kubeconfig for the nodefeature sink: the chart's Role, no right on Nodes."""
    apiserver.tokens[TOKEN] = ROLE
    return write_kubeconfig(
        tmp_path / "nf.kubeconfig", apiserver.url, TOKEN, ca_cert=apiserver_certificate.cert
    )


@dataclass
class NfWired:
    agent: Agent
    scanner: FakeScanner
    sink: nf.NodeFeatureSink
    state: AgentState
    clock: FakeClock
    metrics: Metrics


def wire_nf_agent(
    client: ApiClientFactory,
    kubeconfig: Path,
    scanner: FakeScanner,
    *,
    clock: FakeClock | None = None,
    stop: threading.Event | None = None,
    backoff: Backoff = FAST,
    stall_after_s: float = 180,
) -> NfWired:
    clock = clock or FakeClock()
    parts = build_agent(
        Settings(node=NODE, prefix=PREFIX, sink="nodefeature", namespace=NAMESPACE),
        api=client(kubeconfig, (2.0, 2.0)),
        scanner=scanner,
        kubelet=lambda: KubeletReading(None),
        stop=stop,
        clock=clock,
        backoff=backoff,
        stall_after_s=stall_after_s,
    )
    assert isinstance(parts.sink, nf.NodeFeatureSink)
    return NfWired(parts.agent, scanner, parts.sink, parts.state, clock, parts.metrics)


WireNf = Callable[..., NfWired]


@pytest.fixture(params=sorted(API_CLIENTS))
def wire_nf(request: pytest.FixtureRequest) -> WireNf:
    """`wire_nf_agent` through each NodeFeatureClient (official, lean): each test runs twice."""
    return functools.partial(wire_nf_agent, API_CLIENTS[request.param])


def ours(apiserver: ApiServerDouble) -> dict[str, Any]:
    found = apiserver.nodefeatures.get(NAMESPACE, NAME)
    assert found is not None, "the agent's NodeFeature does not exist"
    return found


def nf_requests(apiserver: ApiServerDouble) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in apiserver.requests if r.path.startswith(API)]


def test_first_publish_creates_the_object_and_touches_no_node(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    node_before = apiserver.node(NODE)
    wired = wire_nf(nf_kubeconfig, FakeScanner([ok(topology())]))
    assert wired.agent.step()
    assert nf_requests(apiserver) == [("GET", f"{PATH}/{NAME}"), ("POST", PATH)]
    obj = ours(apiserver)
    assert obj["spec"] == body_for(topology())["spec"]
    assert obj["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"] == NODE
    assert apiserver.node(NODE) == node_before
    assert not [r for r in apiserver.requests if r.path.startswith("/api/v1/nodes")]
    assert wired.state.readiness().ok


def test_steady_state_sends_nothing_and_a_restart_reads_once_and_writes_nothing(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    wire_nf(nf_kubeconfig, FakeScanner([ok(topology())])).agent.step()
    version = ours(apiserver)["metadata"]["resourceVersion"]
    apiserver.clear_requests()
    first = wire_nf(nf_kubeconfig, FakeScanner([ok(topology())]))
    for _ in range(3):
        assert first.agent.step()
    assert nf_requests(apiserver) == [("GET", f"{PATH}/{NAME}")]
    assert ours(apiserver)["metadata"]["resourceVersion"] == version
    assert first.state.readiness().ok


def test_a_change_is_one_update_that_drops_stale_labels(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    apiserver.clear_requests()
    # A sysfs-only view cannot see NVLink: the island labels are no longer produced.
    blind = replace(topology(), source=Source.SYSFS, nvlink_observed=False)
    scanner.then(ok(blind))
    assert wired.agent.step()
    assert nf_requests(apiserver) == [("PUT", f"{PATH}/{NAME}")]
    labels = ours(apiserver)["spec"]["labels"]
    assert labels == label_projection(blind, PREFIX, NODE)
    assert f"{PREFIX}/{keys.NVLINK_ISLAND_SIZE}" not in labels
    assert wired.agent.step()
    assert len(nf_requests(apiserver)) == 1


def test_drift_is_repaired_at_resync_hand_added_labels_included(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    wired = wire_nf(nf_kubeconfig, FakeScanner([ok(topology())]))
    wired.agent.step()
    apiserver.nodefeatures.edit(
        NAMESPACE,
        NAME,
        {"spec": {"labels": {f"{PREFIX}/count": "7", f"{PREFIX}/extra": "x"}}},
    )
    wired.agent.step()
    assert ours(apiserver)["spec"]["labels"][f"{PREFIX}/count"] == "7"  # not before the resync
    apiserver.clear_requests()
    wired.clock.advance(301)
    assert wired.agent.step()
    assert nf_requests(apiserver) == [("GET", f"{PATH}/{NAME}"), ("PUT", f"{PATH}/{NAME}")]
    assert ours(apiserver)["spec"]["labels"] == label_projection(topology(), PREFIX, NODE)


def test_a_deleted_object_is_created_again_at_resync(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    wired = wire_nf(nf_kubeconfig, FakeScanner([ok(topology())]))
    wired.agent.step()
    apiserver.nodefeatures.remove(NAMESPACE, NAME)
    wired.clock.advance(301)
    assert wired.agent.step()
    assert ours(apiserver)["spec"] == body_for(topology())["spec"]


def test_foreign_nodefeatures_and_others_metadata_on_ours_are_untouched(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    worker = {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": NODE, "labels": {"nfd.node.kubernetes.io/node-name": NODE}},
        "spec": {"labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}},
    }
    gfd = copy.deepcopy(worker)
    gfd["metadata"]["name"] = f"nvidia-features-for-{NODE}"
    gfd["spec"] = {"labels": {"nvidia.com/gpu.count": "8", f"{PREFIX}/count": "1"}}
    stored = [apiserver.nodefeatures.put(NAMESPACE, o) for o in (worker, gfd)]
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    apiserver.nodefeatures.edit(
        NAMESPACE, NAME, {"metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}}}
    )
    scanner.then(ok(topology(4)))
    wired.clock.advance(301)
    assert wired.agent.step()
    assert [apiserver.nodefeatures.get(NAMESPACE, o["metadata"]["name"]) for o in stored] == stored
    assert {p for _, p in nf_requests(apiserver)} == {PATH, f"{PATH}/{NAME}"}
    mine = ours(apiserver)
    assert mine["spec"]["labels"][f"{PREFIX}/count"] == "4"
    assert mine["metadata"]["labels"]["team"] == "ml"
    assert mine["metadata"]["annotations"] == {"a": "b"}


@pytest.mark.parametrize(
    "owner",
    [{}, {"old.example.com/node": NODE}],
    ids=["an earlier version's, unlabelled", "an agent's under another prefix"],
)
def test_an_object_of_ours_without_this_prefixs_label_is_written_at_once_with_it_alone(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf, owner: dict[str, str]
) -> None:
    # The spec the agent wants, but not this install's label: prune under the old prefix (or with
    # --unlabelled) would delete it from under the current install, and nfd-master its labels.
    earlier = body_for(topology())
    labels = earlier["metadata"]["labels"]
    del labels[f"{PREFIX}/node"]
    labels.update(owner, team="ml")
    apiserver.nodefeatures.put(NAMESPACE, earlier)
    apiserver.clear_requests()
    assert wire_nf(nf_kubeconfig, FakeScanner([ok(topology())])).agent.step()
    assert nf_requests(apiserver) == [("GET", f"{PATH}/{NAME}"), ("PUT", f"{PATH}/{NAME}")]
    assert ours(apiserver)["metadata"]["labels"] == {
        "nfd.node.kubernetes.io/node-name": NODE,
        "app.kubernetes.io/managed-by": "topo-reporter",
        f"{PREFIX}/node": NODE,
        "team": "ml",
    }


def test_the_sink_uses_exactly_the_verbs_the_chart_grants(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    apiserver.plan(Fault(409, method="PUT", path=PATH))
    wired.agent.step()
    scanner.then(ok(topology(4)))
    wired.agent.step()
    wired.clock.advance(301)
    wired.agent.step()
    used = {_HTTP_VERB[m] for m, _ in nf_requests(apiserver)}
    assert used == nf.RBAC_VERBS
    assert {r.status for r in apiserver.requests} <= {200, 201, 404, 409}


@pytest.mark.parametrize(
    ("fault", "requests"),
    [
        (
            Fault(409, method="PUT", path=PATH),
            [("PUT", f"{PATH}/{NAME}"), ("GET", f"{PATH}/{NAME}"), ("PUT", f"{PATH}/{NAME}")],
        ),
        (Fault(503, method="PUT", path=PATH, retry_after="0"), None),
        (Fault(500, method="PUT", path=PATH), None),
        (Fault(429, method="PUT", path=PATH, retry_after="0"), None),
        (Fault(method="PUT", path=PATH, drop=True), None),
    ],
    ids=["409 re-reads", "503", "500", "429", "dropped connection"],
)
def test_transient_errors_are_retried_until_the_update_lands(
    apiserver: ApiServerDouble,
    nf_kubeconfig: Path,
    fault: Fault,
    requests: list[tuple[str, str]] | None,
    wire_nf: WireNf,
) -> None:
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    apiserver.clear_requests()
    apiserver.plan(fault)
    scanner.then(ok(topology(4)))
    with capture_logs() as logs:
        assert wired.agent.step()
    assert ours(apiserver)["spec"]["labels"][f"{PREFIX}/count"] == "4"
    assert [e for e in logs if e["event"] == "api_retry"]
    if requests is not None:
        assert nf_requests(apiserver) == requests


def test_an_object_deleted_between_read_and_update_is_created(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    apiserver.nodefeatures.remove(NAMESPACE, NAME)
    apiserver.clear_requests()
    scanner.then(ok(topology(4)))
    assert wired.agent.step()
    assert nf_requests(apiserver) == [
        ("PUT", f"{PATH}/{NAME}"),
        ("GET", f"{PATH}/{NAME}"),
        ("POST", PATH),
    ]
    assert ours(apiserver)["spec"]["labels"][f"{PREFIX}/count"] == "4"


def test_a_5xx_on_create_is_retried(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    apiserver.plan(Fault(502, method="POST", path=PATH))
    assert wire_nf(nf_kubeconfig, FakeScanner([ok(topology())])).agent.step()
    # A failed write may have landed: the object is read again before the next try.
    assert [m for m, _ in nf_requests(apiserver)] == ["GET", "POST", "GET", "POST"]


def refusal(
    wire_nf: WireNf, apiserver: ApiServerDouble, kubeconfig: Path, *faults: Fault
) -> tuple[NfWired, list[dict[str, Any]]]:
    apiserver.plan(*faults)
    wired = wire_nf(kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        assert not wired.agent.step()
        assert not wired.agent.step()
    return wired, [e for e in logs if e.get("log_level") == "error"]


def test_nfd_not_installed_is_permanent_and_says_to_install_it(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    apiserver.nodefeatures.installed = False
    wired, errors = refusal(wire_nf, apiserver, nf_kubeconfig)
    assert "does not serve nodefeatures.nfd.k8s-sigs.io/v1alpha1 (404)" in errors[0]["error"]
    assert "install Node Feature Discovery" in errors[0]["error"]
    assert not wired.state.readiness().ok
    # Permanent: each step tries once, never a retry loop.
    assert [m for m, _ in nf_requests(apiserver)] == ["GET", "GET"]


def test_a_missing_role_is_permanent_and_names_the_verb_and_the_namespace(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    apiserver.tokens[TOKEN] = frozenset({"get nodefeatures", "create events"})
    _, errors = refusal(wire_nf, apiserver, nf_kubeconfig)
    assert errors[0]["event"] == "publish_refused"
    assert (
        f"create NodeFeature {NAMESPACE}/{NAME}: forbidden (403): grant the agent a Role in "
        f"namespace {NAMESPACE} with `create` on `nodefeatures.nfd.k8s-sigs.io`"
    ) in errors[0]["error"]
    assert len(errors) == 1, "a refusal is logged once, not every step"
    assert [m for m, _ in nf_requests(apiserver)] == ["GET", "POST"]


def test_a_422_is_permanent_and_carries_the_apiservers_message(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    fault = Fault(422, method="POST", path=PATH, message="spec.labels: Invalid value")
    _, errors = refusal(wire_nf, apiserver, nf_kubeconfig, fault)
    assert (
        "the API server refused the object (422): spec.labels: Invalid value" in errors[0]["error"]
    )
    assert len(errors) == 1


@pytest.mark.parametrize(
    ("status", "body", "kind", "said"),
    [
        (
            404,
            {
                "message": 'namespaces "gpu-topology" not found',
                "details": {"name": NAMESPACE, "kind": "namespaces"},
            },
            ApiPermanentError,
            "namespace gpu-topology does not exist (404): set --namespace",
        ),
        (
            404,
            {"message": "the server could not find the requested resource"},
            ApiPermanentError,
            "install Node Feature Discovery",
        ),
        (
            404,
            {"message": "gone", "details": {"name": NAME, "kind": "nodefeatures"}},
            ApiTransientError,
            "deleted since it was read (404)",
        ),
        (401, {"message": "Unauthorized"}, ApiPermanentError, "rejected the credentials (401)"),
        (409, {"message": "conflict"}, ApiTransientError, "conflict (409)"),
    ],
    ids=["namespace missing", "CRD missing", "object deleted", "401", "409"],
)
def test_nodefeature_error_mapping(
    status: int, body: dict[str, Any], kind: type[Exception], said: str
) -> None:
    mapped = errors_map.api_error(
        status,
        "x",
        json.dumps({"kind": "Status", **body}),
        None,
        verb="create",
        resource=NODE_FEATURES,
        name=NAME,
        namespace=NAMESPACE,
        what=errors_map.describe("create", NODE_FEATURES, NAME, NAMESPACE),
    )
    assert type(mapped) is kind
    assert said in str(mapped)
    assert str(mapped).startswith(f"create NodeFeature {NAMESPACE}/{NAME}: ")


def test_events_go_to_default_where_the_apiserver_takes_node_events_and_name_the_node(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    """Not the agent's namespace: an Event about a Node is valid only in `default` (issue 11)."""
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    scanner.then(ok(topology(8, lost=[3])))
    wired.agent.step()
    assert apiserver.list_events(NAMESPACE, "") == []
    events = [
        e for e in apiserver.list_events("default", "") if e["reason"] == "GPUTopologyChanged"
    ]
    assert [e["type"] for e in events] == ["Normal", "Warning"]
    # Every Event the agent sends goes the same way, its findings included.
    assert ("GPULost", "Warning") in {
        (e["reason"], e["type"]) for e in apiserver.list_events("default", "")
    }
    assert events[1]["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": NODE,
    }
    assert "GPU3 lost" in events[1]["message"]


def test_an_event_without_the_right_to_post_it_is_logged_and_publishing_goes_on(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    apiserver.tokens[TOKEN] = ROLE - {"create events"}
    wired = wire_nf(nf_kubeconfig, FakeScanner([ok(topology())]))
    with capture_logs() as logs:
        assert wired.agent.step()
    (failed,) = [e for e in logs if e["event"] == "event_failed"]
    assert (
        "grant the agent a Role in namespace default, where Events about Nodes go, with "
        "`create` on `events`" in failed["error"]
    )
    assert ours(apiserver)["spec"]["labels"][f"{PREFIX}/count"] == "8"
    assert wired.metrics.api_errors.labels(kind="forbidden")._value.get() == 1


def test_a_real_conflict_is_read_again_and_written_over_the_new_version(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    scanner = FakeScanner([ok(topology())])
    wired = wire_nf(nf_kubeconfig, scanner)
    wired.agent.step()
    # Someone labels our object between the agent's read and its next write.
    apiserver.nodefeatures.edit(NAMESPACE, NAME, {"metadata": {"labels": {"team": "ml"}}})
    apiserver.clear_requests()
    scanner.then(ok(topology(4)))
    assert wired.agent.step()
    assert [(r.method, r.status) for r in apiserver.requests if r.path.startswith(API)] == [
        ("PUT", 409),
        ("GET", 200),
        ("PUT", 200),
    ]
    assert ours(apiserver)["metadata"]["labels"]["team"] == "ml"


def test_honouring_a_long_retry_after_is_not_a_stall(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, wire_nf: WireNf
) -> None:
    clock = FakeClock()
    stop = ClockedStop(clock)
    apiserver.plan(*[Fault(429, "POST", path=f"/apis/{nf.GROUP}", retry_after="250")] * 3)
    wired = wire_nf(
        nf_kubeconfig,
        FakeScanner([ok(topology())]),
        clock=clock,
        stop=stop,
        backoff=Backoff(),
        stall_after_s=STALL_AFTER_S,
    )
    stop.probe = wired.state.liveness
    assert wired.agent.step()
    assert [seconds >= 250 for seconds in stop.waited] == [True] * 3
    assert stop.seen == [Verdict(True, "ok")] * 3
