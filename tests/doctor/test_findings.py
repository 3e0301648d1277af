"""The doctor's checklist as pure judgements: one crafted case per finding, and a healthy node."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from parsers.kubelet import KubeletPolicies
from parsers.links import SELF, Link, LinkKind
from reporter.doctor.model import AgentObservation, DraObservation, Severity
from reporter.doctor.node import local_findings, node_findings
from reporter.doctor.reader import examine, observe_agent
from reporter.doctor.report import report_json, report_text, summarize, worst
from reporter.schema.codec import encode
from reporter.schema.model import Gpu, NumaNode, Source, Topology
from tests.support.hostile_text import agents_event, foreign_event

NV18, NV12, SYS = Link(LinkKind.NV, 18), Link(LinkKind.NV, 12), Link(LinkKind.SYS)
H100 = "NVIDIA H100 80GB HBM3"
NUMA = (NumaNode(0, frozenset(range(48))), NumaNode(1, frozenset(range(48, 96))))


def dgx(
    n: int = 8,
    cell: Any = None,
    lost: tuple[int, ...] = (),
    numa: Any = None,
) -> Topology:
    cell = cell or (lambda a, b: NV18)
    numa = numa or (lambda i: frozenset({i * 2 // n}))
    return Topology(
        Source.NVML,
        tuple(Gpu(i, model=H100, numa=numa(i), lost=i in lost) for i in range(n)),
        tuple(tuple(SELF if a == b else cell(a, b) for b in range(n)) for a in range(n)),
        numa_nodes=NUMA,
        nvswitch=True,
    )


POLICY = "gpu.topology.io/topology-manager-policy"


def node(gpus: int | None = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU Node; its labels by default what the agent publishes where it reads the kubelet's
    config (the policy)."""
    resources = {} if gpus is None else {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {
            "name": "dgx-07",
            "labels": {POLICY: "best-effort"} if labels is None else labels,
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


HEALTHY = AgentObservation(pod_found=True, pod_ready=True)
AGENTS_NAMESPACE = {"name": "dgx-07.1", "namespace": "default"}
TEAM_NAMESPACE = {"name": "dgx-07.2", "namespace": "team-a"}


def codes(findings: list[Any]) -> list[str]:
    return [f.code for f in findings]


def test_a_healthy_node_has_no_findings() -> None:
    assert node_findings(node(), dgx(), "gpu.topology.io", HEALTHY) == []


@pytest.mark.parametrize(
    ("the_node", "topology", "agent", "code", "severity", "evidence"),
    [
        (
            node(None),
            dgx(),
            HEALTHY,
            "device-plugin-missing",
            Severity.ERROR,
            "status.allocatable has no nvidia.com/gpu",
        ),
        (node(7), dgx(lost=(6,)), HEALTHY, "gpus-unallocatable", Severity.ERROR, "lost: GPU6"),
        (
            node(8),
            None,
            AgentObservation(pod_found=False),
            "no-topology-data",
            Severity.ERROR,
            "no topo-reporter pod on dgx-07",
        ),
        (
            node(8),
            dgx(),
            AgentObservation(pod_found=True, pod_ready=False),
            "agent-not-ready",
            Severity.WARNING,
            "topo-reporter is not ready",
        ),
        (
            node(8, {POLICY: "single-numa-node"}),
            dgx(),
            HEALTHY,
            "numa-alignment-limit",
            Severity.WARNING,
            "GPUs per NUMA node: node 0: 4, node 1: 4",
        ),
        (
            node(8),
            dgx(cell=lambda a, b: NV12 if 3 in (a, b) else NV18),
            HEALTHY,
            "nvlink-degraded",
            Severity.WARNING,
            "GPU3 has 12 NVLinks where other NVIDIA H100",
        ),
        (
            node(8),
            dgx(numa=lambda i: None if i == 2 else frozenset({0})),
            HEALTHY,
            "numa-unknown",
            Severity.WARNING,
            "numa_node is -1 for GPU2",
        ),
        (
            node(8),
            dgx(),
            AgentObservation(True, False, "NVML: Driver Not Loaded"),
            "agent-degraded",
            Severity.ERROR,
            "NVML: Driver Not Loaded",
        ),
        (
            node(8, {}),
            dgx(),
            HEALTHY,
            "kubelet-policy-unknown",
            Severity.WARNING,
            "no gpu.topology.io/topology-manager-policy label on the Node",
        ),
    ],
    ids=[
        "GPUs seen but the device plugin never registered",
        "fewer GPUs allocatable than seen, one lost",
        "GPU capacity but no topology data and no agent pod",
        "the agent pod is not ready",
        "single-numa-node with GPUs on two NUMA nodes",
        "a GPU down to 12 of its 18 switch links",
        "a GPU of unknown NUMA node on a two-socket host",
        "the agent cannot load NVML",
        "the agent could not read the kubelet's config: no policy labels",
    ],
)
def test_each_finding_with_its_evidence(
    the_node: dict[str, Any],
    topology: Topology | None,
    agent: AgentObservation,
    code: str,
    severity: Severity,
    evidence: str,
) -> None:
    findings = node_findings(the_node, topology, "gpu.topology.io", agent)
    finding = next(f for f in findings if f.code == code)
    assert finding.severity is severity
    assert any(evidence in line for line in finding.evidence), finding.evidence
    assert finding.fix


def test_a_lost_gpu_is_an_error_the_agent_sees_by_itself() -> None:
    findings = local_findings(dgx(lost=(6,)), None)
    assert codes(findings) == ["gpu-lost"]
    assert findings[0].severity is Severity.ERROR


def test_a_lost_gpu_as_nvml_reports_it_is_one_finding_not_also_an_unknown_numa_node() -> None:
    """The NVML collector knows a lost GPU by its index alone: no NUMA node, no PCI address."""
    healthy = dgx()
    gpus = tuple(Gpu(index=6, lost=True) if g.index == 6 else g for g in healthy.gpus)
    findings = local_findings(replace(healthy, gpus=gpus), None)
    assert codes(findings) == ["gpu-lost"]


@pytest.mark.parametrize(
    ("topology", "evidence"),
    [
        (
            dgx(cell=lambda a, b: SYS if 7 in (a, b) else NV18),
            "GPU7 has no NVLink while other NVIDIA H100 80GB HBM3s have 18",
        ),
        (
            dgx(cell=lambda a, b: SYS if (a < 4) != (b < 4) else NV18),
            "NVSwitch system split into islands [[0, 1, 2, 3], [4, 5, 6, 7]]",
        ),
        (
            dgx(cell=lambda a, b: NV12 if (a, b) == (1, 2) else NV18),
            "GPU1→GPU2 is NV12 but GPU2→GPU1 is NV18",
        ),
    ],
    ids=["a GPU with no NVLink among NVLink peers", "an island split", "an asymmetric pair"],
)
def test_nvlink_damage_shapes(topology: Topology, evidence: str) -> None:
    findings = local_findings(topology, None)
    assert codes(findings) == ["nvlink-degraded"]
    assert evidence in findings[0].evidence


def test_alignment_needs_an_aligning_policy_and_gpus_on_several_nodes() -> None:
    assert local_findings(dgx(), KubeletPolicies("best-effort")) == []
    assert local_findings(dgx(numa=lambda i: frozenset({0})), KubeletPolicies("restricted")) == []
    assert codes(local_findings(dgx(), KubeletPolicies("restricted"))) == ["numa-alignment-limit"]


def test_a_node_without_gpus_or_data_is_not_a_gpu_node() -> None:
    assert node_findings(node(None), None, "gpu.topology.io", AgentObservation()) == []


def test_mig_nodes_are_not_compared_with_whole_gpus() -> None:
    mig = Topology(Source.NVML, (Gpu(0, mig=True),), ((SELF,),))
    assert node_findings(node(None), mig, "gpu.topology.io", HEALTHY) == []


def test_summary_orders_nodes_by_finding_worst_first() -> None:
    a = node_findings(node(None), dgx(), "gpu.topology.io", HEALTHY)
    b = node_findings(node(8), dgx(numa=lambda i: None), "gpu.topology.io", HEALTHY)
    c = node_findings(node(None), dgx(), "gpu.topology.io", HEALTHY)
    rows = summarize({"a": a, "b": b, "c": c})
    assert rows[0] == ("device-plugin-missing", Severity.ERROR, ["a", "c"])
    assert rows[-1][1] is Severity.WARNING


class FakeReader:
    """A ClusterReader over dicts; None for reads the operator may not make."""

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        pods: dict[str, list[dict[str, Any]]] | None = None,
        events: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.nodes, self.pods, self.events = nodes, pods, events

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def get_node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.nodes if n["metadata"]["name"] == name)

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None:
        return None if self.pods is None else self.pods.get(node, [])

    def node_events(self, node: str) -> list[dict[str, Any]] | None:
        return None if self.events is None else self.events.get(node, [])

    def dra(self, node: str) -> DraObservation:
        return DraObservation()


def _annotated(topology: Topology, name: str = "dgx-07") -> dict[str, Any]:
    n = node(len(topology.gpus))
    n["metadata"]["name"] = name
    n["metadata"]["annotations"] = {"gpu.topology.io/topology": encode(topology)}
    return n


READY_POD = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_examine_decodes_the_annotation_and_observes_the_agent() -> None:
    seven = _annotated(dgx(lost=(2,)))
    seven["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    reader = FakeReader(
        [seven],
        pods={"dgx-07": [READY_POD]},
        events={
            "dgx-07": [
                agents_event("dgx-07", "NVML: Driver Not Loaded") | {"metadata": AGENTS_NAMESPACE},
                # Anyone may write an Event about the Node in their own namespace: not the agent's.
                foreign_event("team-a", "dgx-07", "NVML: spoofed") | {"metadata": TEAM_NAMESPACE},
            ]
        },
    )
    findings = examine(reader, reader.list_nodes()[0], "gpu.topology.io")
    assert codes(findings) == ["gpus-unallocatable", "agent-degraded", "gpu-lost"]
    assert findings[1].evidence == ("NVML: Driver Not Loaded",)


def test_an_edited_annotation_is_a_finding_not_a_crash() -> None:
    bad = _annotated(dgx())
    bad["metadata"]["annotations"]["gpu.topology.io/topology"] = '{"v":1}'
    findings = examine(FakeReader([bad]), bad, "gpu.topology.io")
    # The annotation exists: "no topology annotation" would be false evidence.
    assert codes(findings) == ["topology-unreadable"]


def test_an_unreadable_annotation_still_says_when_no_agent_can_republish_it() -> None:
    bad = _annotated(dgx())
    bad["metadata"]["annotations"]["gpu.topology.io/topology"] = '{"v":1}'
    findings = examine(FakeReader([bad], pods={}), bad, "gpu.topology.io")
    assert codes(findings) == ["topology-unreadable", "agent-not-ready"]
    assert not any("no topology annotation" in e for f in findings for e in f.evidence)


def test_observation_without_permission_to_read_pods_or_events_is_unknown() -> None:
    assert observe_agent(FakeReader([]), "n") == AgentObservation(None, None, None)
    assert observe_agent(FakeReader([], pods={}), "n").pod_found is False


def test_reports_in_text_and_json() -> None:
    by_node = {
        "a": examine(FakeReader([]), _annotated(dgx(), "a") | {"status": {}}, "gpu.topology.io"),
        "b": [],
    }
    text = report_text(by_node, summary=True)
    assert text.splitlines()[0] == "2 nodes, 1 without findings"
    assert "  ERROR   device-plugin-missing: 1 (a)" in text
    assert "    fix: the NVIDIA device plugin is not registered on a" in text
    doc = json.loads(report_json(by_node))
    assert doc["nodes"][0]["findings"][0]["severity"] == "error"
    assert doc["summary"][0] == {
        "code": "device-plugin-missing",
        "severity": "error",
        "nodes": ["a"],
    }
    assert worst(by_node) is Severity.ERROR
    assert worst({"b": []}) is None
