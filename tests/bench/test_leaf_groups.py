"""`bench/leaf_groups.py` on a short trace, so the leaf-group simulator cannot rot: it runs, it is
deterministic, every placement is consistent, and each policy keeps its own promise (a required
`network-tier-0` never splits a job and never places one larger than every leaf group). No result
is asserted: the numbers are the benchmark's to report (bench/README.md)."""

from __future__ import annotations

import pytest

from bench import leaf_groups, multinode
from reporter.collect.infiniband_tiers import LEAF_GROUP_PREFIX
from tests.support.multinode import checked_run

CLUSTERS = sorted(leaf_groups.CLUSTERS)


@pytest.fixture(scope="module", params=CLUSTERS, ids=CLUSTERS)
def cluster(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def nodes(cluster: str) -> list[leaf_groups.LeafNode]:
    return leaf_groups.layout(cluster)


@pytest.fixture(scope="module")
def jobs(nodes: list[leaf_groups.LeafNode]) -> list[multinode.Job]:
    return multinode.trace(150, len(nodes), load=0.9, seed=7)


@pytest.mark.parametrize(
    ("cluster_name", "nodes_total", "groups", "smallest", "largest", "holding_8"),
    [("ib", 120, 16, 4, 11, 8), ("marin", 64, 15, 1, 11, 2)],
    ids=["ib: 16 leaf groups of 4 to 11", "marin#6950: 15 leaf groups of 1 to 11"],
)
def test_the_layout_is_the_documented_cluster(
    cluster_name: str, nodes_total: int, groups: int, smallest: int, largest: int, holding_8: int
) -> None:
    laid = leaf_groups.layout(cluster_name)
    sizes: dict[str, int] = {}
    for node in laid:
        assert node.tier0.startswith(LEAF_GROUP_PREFIX)
        sizes[node.tier0] = sizes.get(node.tier0, 0) + 1
    assert len(laid) == len({n.name for n in laid}) == nodes_total
    assert len(sizes) == groups
    assert (min(sizes.values()), max(sizes.values())) == (smallest, largest)
    assert sum(size >= leaf_groups.WATCHED_SIZE for size in sizes.values()) == holding_8


@pytest.mark.parametrize("policy", leaf_groups.POLICIES)
def test_every_policy_places_jobs_consistently(
    policy: str, nodes: list[leaf_groups.LeafNode], jobs: list[multinode.Job]
) -> None:
    result = checked_run(lambda: leaf_groups.simulate(nodes, jobs, policy, load=0.9, seed=3), jobs)
    assert set(result.placements) | result.never == {j.id for j in jobs}
    assert not set(result.placements) & result.never
    for share in (result.one_group, result.never_placed):
        assert 0.0 <= share <= 1.0
    groups = len({n.tier0 for n in nodes})
    assert result.groups_per_job == 0.0 or 1.0 <= result.groups_per_job <= groups


def test_a_required_leaf_group_never_splits_a_job_and_refuses_only_the_oversized(
    nodes: list[leaf_groups.LeafNode], jobs: list[multinode.Job]
) -> None:
    tier0 = {n.name: n.tier0 for n in nodes}
    largest = max(sum(n.tier0 == t for n in nodes) for t in set(tier0.values()))
    result = leaf_groups.simulate(nodes, jobs, "tier-0-required", load=0.9, seed=3)
    for names, _, _ in result.placements.values():
        assert len({tier0[n] for n in names}) == 1
    assert result.never == {j.id for j in jobs if j.nodes > largest}
    assert result.never  # the trace's 16-node jobs fit no leaf group of either cluster
    assert result.one_group == 1.0


def test_the_other_policies_place_every_job_and_count_only_keeps_fewer_whole(
    nodes: list[leaf_groups.LeafNode], jobs: list[multinode.Job]
) -> None:
    results = {
        policy: leaf_groups.simulate(nodes, jobs, policy, load=0.9, seed=3)
        for policy in leaf_groups.POLICIES
    }
    for policy in ("count-only", "tier-0-or-1", "tier-0-preferred"):
        assert not results[policy].never
        assert results[policy].never_placed == 0.0
    assert results["count-only"].one_group <= results["tier-0-required"].one_group
    assert results["count-only"].one_group <= results["tier-0-or-1"].one_group
    # Preferred never holds a job that fits somewhere: it waits exactly as count-only does.
    assert results["tier-0-preferred"].frag == results["count-only"].frag == 0.0


def test_the_table_has_a_row_per_load_and_policy(nodes: list[leaf_groups.LeafNode]) -> None:
    results = leaf_groups.BENCH.run_all(nodes, 60, seeds=[1, 2], loads=[0.5, 0.95])
    rows = leaf_groups.BENCH.table(results).splitlines()[2:]
    assert len(rows) == 2 * len(leaf_groups.POLICIES)
    assert all(row.count("|") == 10 for row in rows)
