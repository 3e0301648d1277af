"""`topo-reporter doctor` against the API server double: one crafted Node per finding."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from parsers.kubelet import KubeletPolicies
from parsers.links import SELF, Link, LinkKind
from reporter.cli import main
from reporter.schema.codec import encode
from reporter.schema.labels import kubelet_labels, labels
from reporter.schema.model import Gpu, NumaNode, Source, Topology
from tests.support.agent_support import FakeScanner, nvml_failed, wire_agent
from tests.support.hostile_text import (
    ESCAPES,
    agents_event,
    controls,
    foreign_event,
    hostile_message,
)
from tests.support.kube_double import ApiServerDouble

NV18, NV12 = Link(LinkKind.NV, 18), Link(LinkKind.NV, 12)
PREFIX = "gpu.topology.io"
AGENT = {"app.kubernetes.io/name": "topo-reporter"}
DEFAULT_POLICIES = KubeletPolicies()
"""What a kubelet config that sets no policy gives: the kubelet's defaults."""


def dgx(
    lost: tuple[int, ...] = (), numa: Callable[[int], Any] | None = None, cell: Any = None
) -> Topology:
    cell = cell or (lambda a, b: NV18)
    place = numa or (lambda i: frozenset({i // 4}))
    return Topology(
        Source.NVML,
        tuple(
            Gpu(i, model="NVIDIA H100 80GB HBM3", numa=place(i), lost=i in lost) for i in range(8)
        ),
        tuple(tuple(SELF if a == b else cell(a, b) for b in range(8)) for a in range(8)),
        numa_nodes=(NumaNode(0, frozenset(range(56))), NumaNode(1, frozenset(range(56, 112)))),
        nvswitch=True,
    )


def publish(
    api: ApiServerDouble,
    name: str,
    topology: Topology | None,
    *,
    allocatable: str | None = "8",
    extra_labels: dict[str, str] | None = None,
    ready: bool | None = True,
    kubelet: KubeletPolicies | None = DEFAULT_POLICIES,
) -> None:
    """A node as the agent, the kubelet and the device plugin would have left it; `kubelet`: the
    policies in the kubelet config the agent read (None: it could not read it)."""
    api.add_node(name)
    patch: dict[str, Any] = {"metadata": {"labels": {}}, "status": {}}
    if topology is not None:
        patch["metadata"]["labels"].update(labels(topology, PREFIX))
        if kubelet is not None:
            patch["metadata"]["labels"].update(kubelet_labels(kubelet, PREFIX))
        patch["metadata"]["annotations"] = {f"{PREFIX}/topology": encode(topology)}
    patch["metadata"]["labels"].update(extra_labels or {})
    patch["status"]["allocatable"] = {"nvidia.com/gpu": allocatable}
    api.edit_node(name, patch)
    if ready is not None:
        api.add_pod("gpu-topology", f"topo-reporter-{name}", node=name, labels=AGENT, ready=ready)


def doctor(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    status = main(["doctor", "--kubeconfig", str(kubeconfig), *argv])
    out, err = capsys.readouterr()
    return status, out, err


CASES: list[tuple[str, dict[str, Any], str, int, str]] = [
    ("healthy", {"topology": dgx()}, "", 0, "no findings"),
    (
        "no-plugin",
        {"topology": dgx(), "allocatable": None},
        "device-plugin-missing",
        1,
        "status.allocatable has no nvidia.com/gpu",
    ),
    (
        "one-lost",
        {"topology": dgx(lost=(6,)), "allocatable": "7"},
        "gpus-unallocatable",
        1,
        "lost: GPU6",
    ),
    (
        "no-agent",
        {"topology": None, "ready": None},
        "no-topology-data",
        1,
        "no topo-reporter pod on no-agent",
    ),
    (
        "not-ready",
        {"topology": dgx(), "ready": False},
        "agent-not-ready",
        0,
        "topo-reporter is not ready",
    ),
    (
        "aligned",
        {
            "topology": dgx(),
            "extra_labels": {f"{PREFIX}/topology-manager-policy": "single-numa-node"},
        },
        "numa-alignment-limit",
        0,
        "node 0: 4, node 1: 4",
    ),
    (
        "nvlink",
        {"topology": dgx(cell=lambda a, b: NV12 if 5 in (a, b) else NV18)},
        "nvlink-degraded",
        0,
        "GPU5 has 12 NVLinks where other NVIDIA H100 80GB HBM3s have 18",
    ),
    (
        "numa-gap",
        {"topology": dgx(numa=lambda i: None if i == 3 else frozenset({0}))},
        "numa-unknown",
        0,
        "numa_node is -1 for GPU3",
    ),
    (
        "no-kubelet",
        {"topology": dgx(), "kubelet": None},
        "kubelet-policy-unknown",
        0,
        "no gpu.topology.io/topology-manager-policy label on the Node",
    ),
]


@pytest.mark.parametrize(
    ("name", "state", "code", "exit_status", "evidence"),
    CASES,
    ids=[
        "a healthy node has no findings and exits 0",
        "no device plugin is an error",
        "a lost GPU leaves fewer allocatable GPUs",
        "GPUs without data and no agent pod",
        "an agent that is not ready is a warning",
        "single-numa-node caps the GPUs per pod",
        "a GPU lost six NVLinks",
        "a GPU whose NUMA node is unknown",
        "an agent that cannot read the kubelet's config published no policy",
    ],
)
def test_one_node_per_finding(
    name: str,
    state: dict[str, Any],
    code: str,
    exit_status: int,
    evidence: str,
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish(apiserver, name, **state)
    status, out, err = doctor(admin_kubeconfig, capsys, "--node", name, "--format", "json")
    assert (status, err) == (exit_status, "")
    findings = json.loads(out)["nodes"][0]["findings"]
    if not code:
        assert findings == []
        _, text, _ = doctor(admin_kubeconfig, capsys, "--node", name)
        assert text == f"node {name}: {evidence}\n"
        return
    finding = next(f for f in findings if f["code"] == code)
    assert any(evidence in line for line in finding["evidence"]), finding
    assert finding["fix"]


def test_an_invalid_annotation_is_only_unreadable_not_missing(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish(apiserver, "edited", dgx())
    apiserver.edit_node("edited", {"metadata": {"annotations": {f"{PREFIX}/topology": '{"v":1}'}}})
    status, out, _ = doctor(admin_kubeconfig, capsys, "--node", "edited", "--format", "json")
    assert status == 1
    (node,) = json.loads(out)["nodes"]
    assert [f["code"] for f in node["findings"]] == ["topology-unreadable"]
    _, text, _ = doctor(admin_kubeconfig, capsys, "--node", "edited")
    assert "no topology annotation" not in text
    assert "no-topology-data" not in text


def test_the_agents_degraded_event_is_found(
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish(apiserver, "degraded", dgx())
    # The agent itself posts it: NVML fails after the node carries a topology.
    agent = wire_agent(kubeconfig, FakeScanner([nvml_failed(None)]), node="degraded")
    assert not agent.agent.step()
    status, out, _ = doctor(admin_kubeconfig, capsys, "--node", "degraded")
    assert status == 1
    assert "ERROR agent-degraded" in out
    assert "evidence: nvml: NVML did not load: driver gone" in out


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
@pytest.mark.parametrize("which", [["--node", "victim"], ["--all"]], ids=["--node", "--all"])
def test_an_event_written_in_another_namespace_neither_speaks_for_the_agent_nor_drives_the_terminal(
    escape: str,
    which: list[str],
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish(apiserver, "victim", dgx())
    apiserver.edit_node("gpu-node-1", {"status": {"capacity": None, "allocatable": None}})
    apiserver.create_event("team-a", foreign_event("team-a", "victim", hostile_message(escape)))
    status, out, _ = doctor(admin_kubeconfig, capsys, *which)
    assert (status, controls(out)) == (0, [])
    assert "agent-degraded" not in out
    assert apiserver.reads("/api/v1/namespaces/default/events")
    assert not apiserver.reads("/api/v1/events")


@pytest.mark.parametrize(
    "field", ["reportingInstance", "source.host", "reportingComponent"], ids=str
)
def test_an_event_another_nodes_agent_could_write_does_not_speak_for_this_one(
    field: str,
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Issue 28 item 9: node B's agent posted GPUTopologyDegraded about node A, and the doctor
    # showed it as A's evidence. Only an Event that A itself reported is A's agent's word.
    publish(apiserver, "victim", dgx())
    event = agents_event("victim", "nvml: forged by another node")
    if field == "source.host":
        event["source"]["host"] = "gpu-node-2"
    else:
        event[field] = "gpu-node-2"
    apiserver.create_event("default", event)
    for which in (["--node", "victim"], ["--all"]):
        _, out, _ = doctor(admin_kubeconfig, capsys, *which)
        assert "agent-degraded" not in out, which
        assert "forged" not in out


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_the_agents_own_event_is_shown_without_control_sequences(
    escape: str,
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    publish(apiserver, "victim", dgx())
    apiserver.edit_node("gpu-node-1", {"status": {"capacity": None, "allocatable": None}})
    apiserver.create_event("default", agents_event("victim", hostile_message(escape)))
    for which in (["--node", "victim"], ["--all"], ["--node", "victim", "--format", "json"]):
        status, out, _ = doctor(admin_kubeconfig, capsys, *which)
        assert (status, controls(out)) == (1, []), which
        assert "agent-degraded" in out
    _, text, _ = doctor(admin_kubeconfig, capsys, "--node", "victim")
    assert "evidence: nvml: NVML did not load (Driver Not Loaded); keeping the last" in text


def test_all_summarizes_gpu_nodes_worst_first(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, state, *_ in CASES:
        publish(apiserver, name, **state)
    apiserver.edit_node("gpu-node-1", {"status": {"capacity": None, "allocatable": None}})
    status, out, _ = doctor(admin_kubeconfig, capsys, "--all")
    lines = out.splitlines()
    assert status == 1
    assert lines[0] == f"{len(CASES)} nodes, 1 without findings"
    summary = lines[1 : lines.index("")]
    severities = [line.split()[0] for line in summary]
    assert {line.split()[1].rstrip(":") for line in summary} == {c[2] for c in CASES if c[2]} | {
        "gpu-lost"
    }
    assert severities == sorted(severities, key=["ERROR", "WARNING", "INFO"].index)
    assert "gpu-node-1" not in out


def test_an_operator_who_may_only_read_nodes_still_gets_the_node_findings(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    apiserver.tokens["viewer"] = frozenset({"get nodes", "list nodes"})
    publish(apiserver, "viewed", dgx(), allocatable=None)
    status, out, err = doctor(kubeconfig_with_token("viewer"), capsys, "--node", "viewed")
    assert (status, err) == (1, "")
    assert "device-plugin-missing" in out
    assert "agent-not-ready" not in out


@pytest.mark.parametrize(
    ("argv", "token", "message"),
    [
        (["--node", "absent"], "admin-token", "node absent: not found (404)"),
        (["--all"], "nobody", "forbidden (403): `topo-reporter doctor` needs get and list on"),
        (["--all"], "wrong", "rejected the credentials (401)"),
    ],
    ids=["an unknown node", "credentials that may not list nodes", "a wrong token"],
)
def test_api_errors_end_in_one_line_and_exit_1(
    argv: list[str],
    token: str,
    message: str,
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    apiserver.tokens["nobody"] = frozenset()
    status, out, err = doctor(kubeconfig_with_token(token), capsys, *argv)
    assert (status, out) == (1, "")
    assert err.count("\n") == 1
    assert message in err


def test_an_api_server_that_is_down_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.kube_double.kubeconfig import write_kubeconfig  # noqa: PLC0415

    config = write_kubeconfig(tmp_path / "k", "http://127.0.0.1:9", "t", ca_cert=None)
    status, _, err = doctor(config, capsys, "--all")
    assert status == 1
    assert "cannot connect to the API server at http://127.0.0.1:9" in err


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--node", "a", "--all"])
    assert info.value.code == 2
