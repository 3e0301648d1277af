"""`bench/racks.py` on a short trace, so the rack simulator cannot rot: it runs, it is
deterministic, every placement is consistent, and each policy keeps its own promise (a required
partition never splits a job; the clique-ID key can only split across racks that share the ID). No
result is asserted: the numbers are the benchmark's to report (bench/README.md)."""

from __future__ import annotations

import pytest

from bench import multinode, racks
from tests.support.multinode import checked_run

NODES = racks.layout()
BY_NAME = {n.name: n for n in NODES}


@pytest.fixture(scope="module")
def jobs() -> list[multinode.Job]:
    return multinode.trace(150, len(NODES), load=0.9, seed=7)


def test_the_layout_is_the_documented_cluster() -> None:
    assert len(NODES) == racks.DEFAULT_RACKS * racks.NODES_PER_RACK
    domains = {n.domain for n in NODES}
    partitions = {n.partition for n in NODES}
    assert len(domains) == racks.DEFAULT_RACKS
    assert len(partitions) == racks.DEFAULT_RACKS + len(racks.SPLIT_RACKS)
    # Two pairs of racks repeat clique IDs: 17044 on racks 0 and 1, 1 and 2 on racks 6 and 7.
    by_clique: dict[str, set[str]] = {}
    for n in NODES:
        by_clique.setdefault(n.clique, set()).add(n.domain)
    assert {c for c, d in by_clique.items() if len(d) > 1} == {"17044", "1", "2"}


def test_the_trace_draws_the_documented_mix(jobs: list[multinode.Job]) -> None:
    assert {j.nodes for j in jobs} <= {n for n, _ in multinode.SIZES}
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)
    assert multinode.trace(150, len(NODES), load=0.9, seed=7) == jobs
    assert pytest.approx(4.35) == multinode.MEAN_NODES


@pytest.mark.parametrize("policy", racks.POLICIES)
def test_every_policy_places_every_job_consistently(policy: str, jobs: list[multinode.Job]) -> None:
    result = checked_run(lambda: racks.simulate(NODES, jobs, policy, load=0.9, seed=3), jobs)
    assert len(result.placements) == len(jobs)  # the cluster drains: every job runs
    for share in (result.one_partition, result.split_racks):
        assert 0.0 <= share <= 1.0


def test_a_required_partition_never_splits_a_job(jobs: list[multinode.Job]) -> None:
    result = racks.simulate(NODES, jobs, "partition", load=0.9, seed=3)
    for names, _, _ in result.placements.values():
        assert len({BY_NAME[n].partition for n in names}) == 1
    assert result.split_racks == 0.0


def test_the_clique_id_key_splits_only_across_racks_that_share_the_id(
    jobs: list[multinode.Job],
) -> None:
    result = racks.simulate(NODES, jobs, "clique-id", load=0.9, seed=3)
    for names, _, _ in result.placements.values():
        assert len({BY_NAME[n].clique for n in names}) == 1
    assert result.split_racks > 0.0
