"""The doctor's NVLink fabric findings (issue 21 item 4): what one node's GPUs say about its fabric,
our partition label against GPU Feature Discovery's, and the racks judged together (a partition
short of its peers, a clique ID under two cluster UUIDs), on nodes the agent's projection labels
from simulated racks; and `doctor --all` against the API server double."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import structlog

from reporter.cli import main
from reporter.collect import build_scanner
from reporter.collect.simulate.racks import RackNode, rack_nodes, write_profiles
from reporter.doctor.model import GFD_CLIQUE_LABEL, AgentObservation, Finding, Severity
from reporter.doctor.node import fabric_node_findings, node_findings
from reporter.doctor.racks import fabric_cluster_findings
from reporter.schema.codec import encode
from reporter.schema.labels import labels
from reporter.schema.model import Topology
from tests.support.kube_double import ApiServerDouble

PREFIX = "gpu.topology.io"
PARTITION = f"{PREFIX}/nvlink-partition"
AGENT = {"app.kubernetes.io/name": "topo-reporter"}


@pytest.fixture(autouse=True)
def quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@cache
def _scan(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/sys"), profile).scan().topology
    assert topology is not None
    return topology


def topology_of(node: RackNode, tmp_path: Path, **fabric: Any) -> Topology:
    """The topology the agent scans on this rack node, its fabric changed by `fabric`."""
    node.profile["fabric"] = {**node.profile["fabric"], **fabric}
    directory = tmp_path / str(len(list(tmp_path.iterdir())))
    (path,) = write_profiles([node], directory)
    return _scan(str(path))


def node_object(
    name: str, topology: Topology, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node as the agent leaves it: its labels and topology annotation."""
    return {
        "metadata": {
            "name": name,
            "labels": {**labels(topology, PREFIX, name), **(extra or {})},
            "annotations": {f"{PREFIX}/topology": encode(topology)},
        },
        "status": {"allocatable": {"nvidia.com/gpu": "4"}, "capacity": {"nvidia.com/gpu": "4"}},
    }


def codes(findings: Sequence[Finding]) -> list[str]:
    return [f.code for f in findings]


# --- One node's own GPUs ------------------------------------------------------------------------


def test_a_healthy_rack_node_has_no_fabric_finding(tmp_path: Path) -> None:
    (node,) = rack_nodes(1, trays=1)
    assert fabric_node_findings(topology_of(node, tmp_path)) == []


def test_a_fabric_still_joining_is_a_warning_naming_each_gpu(tmp_path: Path) -> None:
    (node,) = rack_nodes(1, trays=1)
    (finding,) = fabric_node_findings(topology_of(node, tmp_path, state="in-progress"))
    assert (finding.code, finding.severity) == ("fabric-not-ready", Severity.WARNING)
    assert finding.summary.startswith("no nvlink-partition label")
    assert finding.evidence == (
        "fabric not completed: GPU0 in-progress, GPU1 in-progress, GPU2 in-progress, "
        "GPU3 in-progress",
    )


def test_gpus_of_one_node_on_two_cliques_is_an_error_naming_the_values(tmp_path: Path) -> None:
    (node,) = rack_nodes(1, trays=1)
    node.profile["gpus"] = [{"index": 0, "fabric": {"clique": 7}}]
    (finding,) = fabric_node_findings(topology_of(node, tmp_path))
    assert (finding.code, finding.severity) == ("fabric-gpus-disagree", Severity.ERROR)
    (evidence,) = finding.evidence
    assert evidence.startswith("GPUs disagree on the clique: GPU0 ")
    assert " clique 7, GPU1 " in evidence
    assert evidence.endswith(" clique 100")


@pytest.mark.parametrize(
    ("health", "conditions", "severity", "evidence"),
    [
        ("unhealthy", ["route-unhealthy"], Severity.ERROR, "GPU0: unhealthy (route-unhealthy)"),
        ("limited-capacity", [], Severity.WARNING, "GPU0: degraded"),
        (
            "healthy",
            ["degraded-bandwidth"],
            Severity.WARNING,
            "GPU0: degraded (degraded-bandwidth)",
        ),
    ],
    ids=["unhealthy with a condition", "limited capacity", "healthy summary, degraded mask"],
)
def test_a_hurt_fabric_names_each_gpu_and_its_conditions(
    tmp_path: Path, health: str, conditions: list[str], severity: Severity, evidence: str
) -> None:
    (node,) = rack_nodes(1, trays=1)
    topology = topology_of(node, tmp_path, health=health, conditions=conditions)
    (finding,) = fabric_node_findings(topology)
    assert (finding.code, finding.severity) == ("fabric-degraded", severity)
    assert finding.evidence[1] == evidence
    assert len(finding.evidence) == 5  # the node's word, then each of its four GPUs


def test_garbage_from_the_driver_is_its_own_warning(tmp_path: Path) -> None:
    (node,) = rack_nodes(1, trays=1)
    (finding,) = fabric_node_findings(topology_of(node, tmp_path, chassis_serial="S" * 200))
    assert (finding.code, finding.severity) == ("fabric-values-invalid", Severity.WARNING)
    assert "chassis serial" in finding.evidence[0]


# --- Our partition label against GFD's ----------------------------------------------------------


@pytest.mark.parametrize(
    ("gfd", "expected"),
    [(None, []), ("same", []), ("other", ["partition-label-mismatch"])],
    ids=["no GFD label", "GFD agrees", "GFD names another partition"],
)
def test_our_partition_label_is_checked_against_gfds(
    tmp_path: Path, gfd: str | None, expected: list[str]
) -> None:
    (node,) = rack_nodes(1, trays=1)
    topology = topology_of(node, tmp_path)
    ours = labels(topology, PREFIX, "n")[PARTITION]
    extra = {} if gfd is None else {GFD_CLIQUE_LABEL: ours if gfd == "same" else ours + "1"}
    found = [
        f
        for f in node_findings(
            node_object("n", topology, extra), topology, PREFIX, AgentObservation(True, True)
        )
        if f.code.startswith("partition")
    ]
    assert codes(found) == expected
    if expected:
        assert found[0].severity is Severity.ERROR
        assert found[0].evidence == (f"{PARTITION}={ours}", f"{GFD_CLIQUE_LABEL}={ours}1")


# --- The racks together -------------------------------------------------------------------------


def rack_objects(nodes: Sequence[RackNode], tmp_path: Path) -> list[dict[str, Any]]:
    return [
        node_object(n.name, _scan(str(p)))
        for n, p in zip(nodes, write_profiles(nodes, tmp_path / "racks"), strict=True)
    ]


def test_a_rack_missing_a_tray_is_short_of_its_peers_and_says_which_tray(tmp_path: Path) -> None:
    nodes = rack_nodes(3, trays=4)
    missing = [n for n in nodes if not (n.rack == 1 and n.tray == 2)]
    found = fabric_cluster_findings(rack_objects(missing, tmp_path), PREFIX)
    short = {n for n, fs in found.items() if "partition-short" in codes(fs)}
    assert short == {n.name for n in missing if n.rack == 1}
    finding = found["nvl72-r01-n00"][0]
    assert finding.severity is Severity.WARNING
    assert finding.summary.endswith(
        "has 3 nodes where its peers have 4: a job sized for a full partition waits"
    )
    assert finding.evidence[1] == "its peers (2 partitions): 4 nodes"
    assert finding.evidence[2] == "trays present: 0-1,3; missing between them: 2"


def test_split_racks_are_compared_with_racks_split_the_same_way(tmp_path: Path) -> None:
    whole = rack_nodes(2, trays=4)
    split = [n for n in rack_nodes(4, trays=4, partitions=2) if n.rack >= 2]
    # One x36-style half short by a tray: only it, not the whole racks, not the other halves.
    nodes = [*whole, *[n for n in split if not (n.rack == 3 and n.tray == 3)]]
    found = fabric_cluster_findings(rack_objects(nodes, tmp_path), PREFIX)
    short = {n for n, fs in found.items() if "partition-short" in codes(fs)}
    assert short == {"nvl72-r03-n02"}
    assert (
        found["nvl72-r03-n02"][0].evidence[1]
        == "its peers (3 partitions of racks split in 2): 2 nodes"
    )


def test_a_clique_id_under_two_cluster_uuids_is_told_as_information(tmp_path: Path) -> None:
    nodes = rack_nodes(3, trays=2, cliques=[17044, 17044, 5])
    found = fabric_cluster_findings(rack_objects(nodes, tmp_path), PREFIX)
    shared = {n for n, fs in found.items() if codes(fs) == ["clique-id-shared"]}
    assert shared == {n.name for n in nodes if n.rack in (0, 1)}
    finding = found["nvl72-r00-n00"][0]
    assert finding.severity is Severity.INFO
    assert "clique ID 17044 names partitions of 2 different NVLink domains" in finding.summary
    assert len(finding.evidence) == 2


def test_nodes_without_a_fabric_take_no_part(tmp_path: Path) -> None:
    single = _scan("dgx-h100")
    nodes = [node_object(f"dgx-{i}", single) for i in range(3)]
    assert fabric_cluster_findings(nodes, PREFIX) == {}


# --- doctor --all -------------------------------------------------------------------------------


def test_doctor_all_reports_the_short_rack_and_the_shared_clique(
    apiserver: ApiServerDouble,
    admin_kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    nodes = [
        n
        for n in rack_nodes(2, trays=3, cliques=[17044, 17044])
        if not (n.rack == 0 and n.tray == 1)
    ]
    apiserver.delete_node("gpu-node-1")  # the double's own node: no agent, no topology
    for node in rack_objects(nodes, tmp_path):
        name = node["metadata"]["name"]
        apiserver.add_node(name)
        apiserver.add_pod(
            "gpu-topology", f"topo-reporter-{name}", node=name, labels=AGENT, ready=True
        )
        apiserver.edit_node(name, {k: v for k, v in node.items() if k != "status"})
        apiserver.edit_node(name, {"status": node["status"]})
    status = main(["doctor", "--all", "--format", "json", "--kubeconfig", str(admin_kubeconfig)])
    report = json.loads(capsys.readouterr().out)
    summary = {row["code"]: sorted(row["nodes"]) for row in report["summary"]}
    assert summary["partition-short"] == ["nvl72-r00-n00", "nvl72-r00-n02"]
    assert summary["clique-id-shared"] == sorted(n.name for n in nodes)
    assert status == 0, summary  # a warning and information: nothing is an error
