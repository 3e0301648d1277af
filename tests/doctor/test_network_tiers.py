"""`doctor --all` on the network tiers (issue 43, item 3): Topograph's grouping against ours, tier
by tier, and NVLink domains that do not nest under one tier-0 group; on Node label sets, as a
property of the partition comparison, and through the command against the API server double."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.cli import main
from reporter.doctor.model import Code
from reporter.doctor.network import (
    SHOWN_DOMAINS,
    SHOWN_NODES,
    disagreeing,
    nesting_findings,
    topograph_findings,
)
from reporter.doctor.report import report_text
from tests.doctor.test_cli import dgx, publish
from tests.support.kube_double import ApiServerDouble

PREFIX = "gpu.topology.io"
OURS_0, OURS_1 = f"{PREFIX}/network-tier-0", f"{PREFIX}/network-tier-1"
THEIRS_0, THEIRS_1 = "fabric.topograph.run/tier-0", "fabric.topograph.run/tier-1"
DOMAIN = f"{PREFIX}/nvlink-domain"


def node(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}}


def cluster(*rows: tuple[str, dict[str, str]]) -> list[Any]:
    return [node(name, labels) for name, labels in rows]


def labelled(ours: list[str], theirs: list[str], tier: int = 0) -> list[Any]:
    """Node n<i> with our tier value ours[i] and Topograph's theirs[i] ('' leaves it out)."""
    our_key = f"{PREFIX}/network-tier-{tier}"
    their_key = f"fabric.topograph.run/tier-{tier}"
    return [
        node(f"n{i}", {k: v for k, v in ((our_key, o), (their_key, t)) if v})
        for i, (o, t) in enumerate(zip(ours, theirs, strict=True))
    ]


@pytest.mark.parametrize(
    ("nodes", "subjects", "named"),
    [
        (labelled(["eth-a", "eth-a", "eth-b", "eth-b"], ["S-1", "S-1", "S-2", "S-2"]), [], []),
        (
            labelled(["a", "a", "b", "b", "c", "c"], ["S-1", "S-1", "S-2", "S-2", "S-2", "S-2"]),
            [0],
            [2, 3, 4, 5],
        ),
        (
            labelled(["eth-a", "eth-a", "eth-b", "eth-b"], ["S-1", "S-1", "S-1", "S-1"]),
            [0],
            [0, 1, 2, 3],
        ),
        (labelled(["eth-a", "eth-b", "eth-c", "eth-d"], ["S-1", "S-2", "S-3", "S-4"]), [], []),
        (labelled(["eth-a", "eth-a", "", ""], ["", "", "S-1", "S-2"]), [], []),
        (labelled(["eth-a", "eth-a", "eth-a", ""], ["S-1", "S-1", "S-2", "S-2"]), [0], [0, 1, 2]),
        (labelled(["ib-x", "ib-x", "ib-y"], ["S-1", "S-1", "S-2"], tier=1), [], []),
        (labelled(["ib-x", "ib-x", "ib-y"], ["S-1", "S-2", "S-2"], tier=1), [1], [0, 1, 2]),
        (
            cluster(
                ("n0", {OURS_0: "a", OURS_1: "up", THEIRS_0: "S-1", THEIRS_1: "T"}),
                ("n1", {OURS_0: "a", OURS_1: "up", THEIRS_0: "S-1", THEIRS_1: "T"}),
                ("n2", {OURS_0: "b", OURS_1: "up", THEIRS_0: "S-1", THEIRS_1: "T"}),
            ),
            [0],
            [0, 1, 2],
        ),
        (
            cluster(
                ("n0", {OURS_0: "a", "fabric.topograph.run/tier-2": "core"}),
                ("n1", {OURS_0: "b", "fabric.topograph.run/tier-2": "core"}),
                ("n2", {OURS_0: "c", "fabric.topograph.run/tier-02": "x"}),
            ),
            [],
            [],
        ),
    ],
    ids=[
        "the same leaf groups under other names: nothing",
        "two of our groups Topograph sees as one: their nodes named, the agreeing group's not",
        "Topograph one group where we see two: every node named",
        "every node its own group on both sides: nothing",
        "nodes labelled by one side only are not compared",
        "a node only we label takes no part; the others are compared",
        "tier 1 agreeing: nothing",
        "tier 1 disagreeing is a finding of tier 1",
        "tier 0 disagreeing while tier 1 agrees: one finding, of tier 0",
        "a Topograph tier we do not write, and a key that is no tier: nothing",
    ],
)
def test_topographs_grouping_is_compared_with_ours_class_by_class(
    nodes: list[Any], subjects: list[int], named: list[int]
) -> None:
    found = topograph_findings(nodes, PREFIX)
    assert list(found) == [f"network tier-{t}" for t in subjects]
    for findings in found.values():
        (finding,) = findings
        assert finding.code == Code.TOPOGRAPH_TIERS_DISAGREE
        shown = [line.split(":")[0] for line in finding.evidence[1:]]
        assert sorted(shown) == [f"n{i}" for i in named]


def test_tiers_the_agent_wrote_under_topographs_keys_are_not_compared_with_ours() -> None:
    # `--network-label-style topograph`: the agent's values, listed whole in `owned`. A node
    # carrying both keys (another agent of an older style beside it) still has nothing of
    # Topograph's to compare.
    owned = {f"{PREFIX}/owned": "count,fabric.topograph.run/tier-0"}
    nodes = [node(f"n{i}", {OURS_0: "eth-a", THEIRS_0: f"eth-{i}"}, owned) for i in range(3)]
    assert topograph_findings(nodes, PREFIX) == {}
    # Not listed there, the same labels are Topograph's own: compared.
    nodes = [node(f"n{i}", {OURS_0: "eth-a", THEIRS_0: f"eth-{i}"}) for i in range(3)]
    assert list(topograph_findings(nodes, PREFIX)) == ["network tier-0"]


def test_a_disagreement_over_a_large_cluster_names_a_bounded_number_of_nodes() -> None:
    # 2,000 nodes in 100 groups of 20; Topograph shifts every group by one node.
    n = 2000
    nodes = labelled([f"eth-{i // 20}" for i in range(n)], [f"S-{(i + 1) // 20}" for i in range(n)])
    (finding,) = topograph_findings(nodes, PREFIX)["network tier-0"]
    assert len(finding.evidence) == 1 + SHOWN_NODES + 1
    assert (
        finding.evidence[0]
        == "over the 2000 nodes both label: 100 groups of ours, 101 of Topograph's"
    )
    assert finding.evidence[-1] == f"{n - SHOWN_NODES} more nodes"
    assert finding.summary.startswith(f"{THEIRS_0} and {OURS_0} group {n} of {n} nodes differently")
    assert len(report_text({"network tier-0": [finding]}, summary=True)) < 2000


def test_the_evidence_says_how_each_named_node_is_grouped_on_each_side_moved_nodes_first() -> None:
    nodes = labelled(["eth-a", "eth-a", "eth-a", "eth-b"], ["S-1", "S-1", "S-2", "S-2"])
    (finding,) = topograph_findings(nodes, PREFIX)["network tier-0"]
    assert finding.evidence == (
        "over the 4 nodes both label: 2 groups of ours, 2 of Topograph's",
        "n2: ours eth-a (3 nodes), Topograph's S-2 (2 nodes), 1 in both",
        "n3: ours eth-b (1 nodes), Topograph's S-2 (2 nodes), 1 in both",
        "n0: ours eth-a (3 nodes), Topograph's S-1 (2 nodes), 2 in both",
        "n1: ours eth-a (3 nodes), Topograph's S-1 (2 nodes), 2 in both",
    )


names = st.sampled_from([f"n{i}" for i in range(12)])
groups = st.sampled_from(["a", "b", "c", "d"])
labellings = st.dictionaries(names, groups, max_size=12)


def partition(labelling: dict[str, str], among: set[str]) -> set[frozenset[str]]:
    """The labelling's classes over the nodes `among`, from scratch."""
    return {
        frozenset(n for n in among if labelling[n] == value)
        for value in {labelling[n] for n in among}
    }


@given(labellings, labellings)
def test_the_comparison_is_empty_exactly_when_the_partitions_are_equal_and_is_symmetric(
    ours: dict[str, str], theirs: dict[str, str]
) -> None:
    common = ours.keys() & theirs.keys()
    differ = disagreeing(ours, theirs)
    assert (differ == []) == (partition(ours, common) == partition(theirs, common))
    assert differ == disagreeing(theirs, ours)
    assert set(differ) <= common
    # Renaming one side's values changes nothing: classes are compared, not text.
    renamed = {n: f"S-{v}" for n, v in theirs.items()}
    assert disagreeing(ours, renamed) == differ


@given(labellings)
def test_a_labelling_agrees_with_itself_and_any_renaming_of_it(ours: dict[str, str]) -> None:
    assert disagreeing(ours, ours) == []
    assert disagreeing(ours, {n: v.upper() + "-x" for n, v in ours.items()}) == []


# --- NVLink domains under network-tier-0 -------------------------------------------------------


def racks(spans: dict[str, list[str]]) -> list[Any]:
    """Each domain's nodes, one per tier-0 value listed."""
    return [
        node(f"{d}-n{i}", {DOMAIN: d, OURS_0: g})
        for d, tier_0 in spans.items()
        for i, g in enumerate(tier_0)
    ]


@pytest.mark.parametrize(
    ("nodes", "split"),
    [
        (racks({"rack-1": ["ib-a"] * 18, "rack-2": ["ib-b"] * 18}), []),
        (racks({"rack-1": ["ib-a"] * 9 + ["ib-b"] * 9, "rack-2": ["ib-c"] * 18}), ["rack-1"]),
        (racks({"rack-1": ["ib-a"] * 18, "rack-2": ["ib-a"] * 18}), []),
        (racks({f"node-h{i}": [f"ib-{i // 4}"] for i in range(16)}), []),
        (
            [
                *racks({"rack-1": ["ib-a"] * 4}),
                node("rack-1-x", {DOMAIN: "rack-1"}),
                node("loose", {OURS_0: "ib-z"}),
            ],
            [],
        ),
    ],
    ids=[
        "each rack under its own leaf group: nests",
        "a rack cabled across two leaf groups does not nest",
        "two racks under one leaf group: nests",
        "H100 nodes, each its own domain: nests",
        "nodes without both labels take no part",
    ],
)
def test_nvlink_domains_are_checked_to_nest_under_network_tier_0(
    nodes: list[Any], split: list[str]
) -> None:
    found = nesting_findings(nodes, PREFIX)
    if not split:
        assert found == {}
        return
    (finding,) = found["network tier-0"]
    assert finding.code == Code.NVLINK_DOMAIN_SPANS_NETWORK_GROUPS
    assert [line.split(":")[0] for line in finding.evidence[1:]] == split
    assert "network-only" in finding.fix


def test_a_split_domains_groups_are_named_largest_first_and_bounded() -> None:
    spans = {f"rack-{r:02}": [f"ib-{r}-{g}" for g in range(6) for _ in range(3)] for r in range(9)}
    spans["rack-99"] = ["ib-x"] * 10 + ["ib-y"] * 8
    (finding,) = nesting_findings(racks(spans), PREFIX)["network tier-0"]
    assert finding.evidence[0] == "10 of 10 NVLink domains span two or more tier-0 groups"
    assert finding.evidence[1] == (
        "rack-00: ib-0-0 (3 nodes), ib-0-1 (3 nodes), ib-0-2 (3 nodes), ib-0-3 (3 nodes) "
        "and 2 more groups"
    )
    assert len(finding.evidence) == 1 + SHOWN_DOMAINS + 1
    assert finding.evidence[-1] == f"{10 - SHOWN_DOMAINS} more domains"
    assert finding.summary.startswith("10 NVLink domains (gpu.topology.io/nvlink-domain) do not")
    one = {"rack-1": ["ib-a", "ib-b"], "rack-2": ["ib-c"]}
    (finding,) = nesting_findings(racks(one), PREFIX)["network tier-0"]
    assert finding.summary.startswith("1 NVLink domain (gpu.topology.io/nvlink-domain) does not")
    assert finding.summary.endswith("splits it")


# --- Through the command -----------------------------------------------------------------------


def test_doctor_all_reports_both_under_the_network_subject(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {
        "gb-1": {DOMAIN: "rack-1", OURS_0: "ib-a", THEIRS_0: "S-1"},
        "gb-2": {DOMAIN: "rack-1", OURS_0: "ib-b", THEIRS_0: "S-1"},
        "gb-3": {DOMAIN: "rack-2", OURS_0: "ib-b", THEIRS_0: "S-2"},
    }
    for name, labels in rows.items():
        publish(apiserver, name, dgx(), extra_labels=labels)
    # The double's own GPU node, which publishes nothing, is not what this test is about.
    apiserver.edit_node("gpu-node-1", {"status": {"capacity": None, "allocatable": None}})
    argv = ["doctor", "--kubeconfig", str(admin_kubeconfig), "--all"]
    status = main([*argv, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0  # warnings only
    network = [
        (entry["network"], f["code"])
        for entry in out["nodes"]
        if "network" in entry
        for f in entry["findings"]
    ]
    assert network == [
        ("tier-0", "topograph-tiers-disagree"),
        ("tier-0", "nvlink-domain-spans-network-groups"),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "3 nodes, 3 without findings" in text
    assert "\nnetwork tier-0: 2 findings\n" in text
    assert "  WARNING topograph-tiers-disagree: 1 (network tier-0)" in text
