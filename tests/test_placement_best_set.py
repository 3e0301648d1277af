"""`best_gpu_set` and `score_gpu_set`: the exact optimum, the documented order, the errors.

Both policies, with and without `available` and `must_include`, are compared against exhaustive
searches written plainly here: every k-subset for `best`, every split for `packing`.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.errors import ParseError
from parsers.links import SELF, Link, LinkKind, parse_link
from parsers.nvsmi import parse_topo
from reporter.collect import build_scanner, list_profiles
from reporter.errors import InputError, PlacementError
from reporter.placement import (
    DEFAULT_BUDGET,
    GpuSet,
    Policy,
    Score,
    best_gpu_set,
    link_points,
    score_gpu_set,
)
from reporter.schema.model import Gpu, Nic, Source, Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import FIXTURES, body
from tests.strategies import topologies


def brute_force(
    topology: Topology,
    k: int,
    available: Sequence[int] | None = None,
    must_include: Sequence[int] = (),
) -> GpuSet:
    """Every k-subset holding must_include in lexicographic order; the first with the best score."""
    pool = sorted(set(range(len(topology.gpus)) if available is None else available))
    usable = [i for i in pool if not topology.gpus[i].lost]
    best: GpuSet | None = None
    for gpus in itertools.combinations(usable, k):
        if not set(must_include) <= set(gpus):
            continue
        scored = score_gpu_set(topology, gpus)
        if best is None or scored.score > best.score:
            best = scored
    assert best is not None
    return best


def splits(gpus: list[int], k: int, leftover: int) -> Iterator[list[tuple[int, ...]]]:
    """Every split of `gpus` into sets of k and `leftover` unassigned, in the documented order:
    the lowest GPU starts a set (partners in lexicographic order), or else is left over."""
    if not gpus:
        yield []
        return
    first, others = gpus[0], gpus[1:]
    for partners in itertools.combinations(others, k - 1):
        rest = [g for g in others if g not in partners]
        for tail in splits(rest, k, leftover):
            yield [(first, *partners), *tail]
    if leftover:
        yield from splits(others, k, leftover - 1)


def brute_force_packing(
    topology: Topology,
    k: int,
    available: Sequence[int] | None = None,
    must_include: Sequence[int] = (),
) -> GpuSet:
    """The first split with the most (link, PCIe) points summed, holding must_include in one set;
    then its set holding must_include, or its best scored set (ties: the lowest indices)."""
    pool = sorted(set(range(len(topology.gpus)) if available is None else available))
    usable = [i for i in pool if not topology.gpus[i].lost]
    must = set(must_include)
    best: tuple[tuple[int, int], list[GpuSet]] | None = None
    for split in splits(usable, k, len(usable) % k):
        if must and not any(must <= set(group) for group in split):
            continue
        scored = [score_gpu_set(topology, group) for group in split]
        value = (sum(s.score.links for s in scored), sum(s.score.pcie for s in scored))
        if best is None or value > best[0]:
            best = (value, scored)
    assert best is not None
    if must:
        return next(s for s in best[1] if must <= set(s.gpus))
    return min(best[1], key=lambda s: (tuple(-x for x in s.score), s.gpus))


def real_topologies() -> list[tuple[str, Topology]]:
    out = []
    for path in sorted(FIXTURES.glob("*.txt")):
        try:
            out.append((path.stem, topology_from_matrix(parse_topo(body(path)))))
        except ParseError:
            continue  # the damage fixtures (rocm-smi output) are not topologies
    return out


def simulated_topologies() -> list[tuple[str, Topology]]:
    """Every shipped machine profile, as the agent would collect it with `--simulate`."""
    out = []
    for profile in list_profiles():
        topology = build_scanner("auto", Path("/"), profile.name).scan().topology
        assert topology is not None, profile.name
        out.append((f"simulated-{profile.name}", topology))
    return out


REAL = real_topologies()
SIMULATED = simulated_topologies()
MACHINES = REAL + SIMULATED


def grid(tokens: Sequence[str]) -> tuple[tuple[Link, ...], ...]:
    """A matrix from rows of space-separated tokens (`X NV1 SYS`)."""
    return tuple(tuple(parse_link(t) for t in row.split()) for row in tokens)


def machine(
    rows: Sequence[str],
    numa: Sequence[int | None] | None = None,
    nics: Sequence[str] = (),
    lost: Sequence[int] = (),
) -> Topology:
    """A small topology for a behaviour table: GPU matrix rows, each GPU's NUMA node, NICs."""
    n = len(rows)
    homes = numa or [None] * n
    return Topology(
        source=Source.NVIDIA_SMI,
        gpus=tuple(
            Gpu(index=i, numa=None if h is None else frozenset({h}), lost=i in lost)
            for i, h in enumerate(homes)
        ),
        links=grid(rows),
        nics=tuple(Nic(name=f"mlx5_{k}", links=grid([r])[0]) for k, r in enumerate(nics)),
    )


def test_real_fixtures_and_simulated_machines_are_there() -> None:
    assert len(REAL) >= 15
    assert len(SIMULATED) >= 9
    assert max(len(t.gpus) for _, t in SIMULATED) == 16


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_every_machine_and_every_k_gives_the_exhaustive_optimum(
    name: str, topology: Topology
) -> None:
    for k in range(1, len(topology.gpus) + 1):
        assert best_gpu_set(topology, k) == brute_force(topology, k), f"{name} k={k}"


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_every_machine_with_half_its_gpus_taken(name: str, topology: Topology) -> None:
    free = list(range(1, len(topology.gpus), 2)) or [0]
    for k in range(1, len(free) + 1):
        assert best_gpu_set(topology, k, free) == brute_force(topology, k, free), f"{name} k={k}"


def sample_ks(usable: int) -> list[int]:
    """Every k on small machines; a spread of k on large ones (the exhaustive search is slow)."""
    if usable <= 10:
        return list(range(1, usable + 1))
    return sorted({1, 2, 4, usable // 2, usable - 1})


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_every_machine_with_gpus_that_must_be_included(name: str, topology: Topology) -> None:
    usable = [i for i in range(len(topology.gpus)) if not topology.gpus[i].lost]
    for must in ([usable[-1]], usable[1:3]):
        for k in sample_ks(len(usable)):
            if k < len(must):
                continue
            got = best_gpu_set(topology, k, must_include=must)
            assert got == brute_force(topology, k, None, must), f"{name} k={k} must={must}"


def small_pools(topology: Topology) -> list[list[int]]:
    """The usable GPUs when there are at most 9 of them, and every other one."""
    usable = [i for i in range(len(topology.gpus)) if not topology.gpus[i].lost]
    pools = [usable[1::2]] + ([usable] if len(usable) <= 9 else [])
    return [pool for pool in pools if pool]


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_every_machine_packs_as_the_exhaustive_split(name: str, topology: Topology) -> None:
    for pool in small_pools(topology):
        for k in range(1, len(pool) + 1):
            got = best_gpu_set(topology, k, pool, policy=Policy.PACKING)
            assert got == brute_force_packing(topology, k, pool), f"{name} k={k} pool={pool}"
        must = pool[-1:]
        for k in range(1, len(pool) + 1):
            got = best_gpu_set(topology, k, pool, must_include=must, policy=Policy.PACKING)
            want = brute_force_packing(topology, k, pool, must)
            assert got == want, f"{name} k={k} pool={pool} must={must}"


@settings(max_examples=150, deadline=None)
@given(data=st.data(), topology=topologies(max_gpus=8).filter(lambda t: len(t.gpus) > 0))
def test_generated_topologies_with_must_include_and_both_policies(
    data: st.DataObject, topology: Topology
) -> None:
    usable = [i for i in range(len(topology.gpus)) if not topology.gpus[i].lost]
    if not usable:
        return
    available = data.draw(st.lists(st.sampled_from(usable), min_size=1, unique=True), "available")
    k = data.draw(st.integers(1, len(available)), "k")
    must = data.draw(st.lists(st.sampled_from(available), max_size=k, unique=True), "must")
    policy = data.draw(st.sampled_from(list(Policy)), "policy")
    got = best_gpu_set(topology, k, available, must_include=must, policy=policy)
    exhaustive = brute_force_packing if policy is Policy.PACKING else brute_force
    assert got == exhaustive(topology, k, available, must)
    assert set(must) <= set(got.gpus)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), topology=topologies(max_gpus=9).filter(lambda t: len(t.gpus) > 0))
def test_generated_topologies_give_the_exhaustive_optimum(
    data: st.DataObject, topology: Topology
) -> None:
    indices = range(len(topology.gpus))
    available = data.draw(st.none() | st.lists(st.sampled_from(indices), unique=True), "available")
    usable = [i for i in (indices if available is None else available) if not topology.gpus[i].lost]
    k = data.draw(st.integers(1, max(len(usable), 1)), "k")
    if k > len(usable):
        with pytest.raises(PlacementError, match=f"asked for {k} GPUs but only 0"):
            best_gpu_set(topology, k, available)
    else:
        assert best_gpu_set(topology, k, available) == brute_force(topology, k, available)


DGX_A100 = dict(REAL)["03-dgx-a100-nv12-mlx5"]


def test_a_dgx_a100_pair_stays_on_one_numa_node_next_to_its_nics() -> None:
    best = best_gpu_set(DGX_A100, 2)
    assert best == GpuSet(
        gpus=(0, 1),
        score=Score(links=120, numa=-1, nic=4, pcie=0),
        pairs=(("NV12", 1),),
        numa_nodes=(3,),
        nic="mlx5_0",
        nic_link=Link(LinkKind.PXB),
    )
    assert best.explain() == (
        "pairs: 1x NV12; NUMA node 3; closest NIC mlx5_0 (PXB to the farthest GPU)"
    )
    assert best.to_document() == {
        "gpus": [0, 1],
        "score": [120, -1, 4, 0],
        "points_per_pair": 120.0,
        "pairs": {"NV12": 1},
        "numa_nodes": [3],
        "nic": "mlx5_0",
        "nic_link": "PXB",
        "exact": True,
    }


def test_taken_gpus_are_not_chosen_and_the_next_best_pair_is() -> None:
    best = best_gpu_set(DGX_A100, 2, available=[1, 2, 3, 5])
    assert best.gpus == (2, 3)
    assert best.nic == "mlx5_2"


# Behaviour tables: each machine is built so that exactly one rule decides.
ORDER_CASES = [
    pytest.param(
        ["X NV1 NV2", "NV1 X NV1", "NV2 NV1 X"],
        [0, 0, 0],
        (),
        (0, 2),
        id="more bonded NVLinks beat fewer",
    ),
    pytest.param(
        ["X PIX NV1", "PIX X SYS", "NV1 SYS X"],
        [0, 0, 0],
        (),
        (0, 2),
        id="any NVLink beats PIX",
    ),
    *[
        pytest.param(
            [f"X {worse} {better}", f"{worse} X {worse}", f"{better} {worse} X"],
            [0, 0, 0],
            (),
            (0, 2),
            id=f"{better} beats {worse}",
        )
        for better, worse in itertools.pairwise(["PIX", "PXB", "PHB", "NODE", "SYS"])
    ],
    pytest.param(
        ["X SYS SYS", "SYS X SYS", "SYS SYS X"],
        [0, 1, 1],
        (),
        (1, 2),
        id="equal links: fewer NUMA nodes win",
    ),
    pytest.param(
        ["X PIX PIX", "PIX X PIX", "PIX PIX X"],
        [0, 0, 0],
        ("SYS PXB PXB", "NODE NODE SYS"),
        (1, 2),
        id="equal links and NUMA: the pair with the closer NIC wins",
    ),
    pytest.param(
        ["X NV2 NV2", "NV2 X NV2", "NV2 NV2 X"],
        [0, 0, 0],
        (),
        (0, 1),
        id="a full tie goes to the smallest indices",
    ),
]


@pytest.mark.parametrize(("rows", "numa", "nics", "expected"), ORDER_CASES)
def test_scoring_order(
    rows: list[str], numa: list[int], nics: tuple[str, ...], expected: tuple[int, ...]
) -> None:
    assert best_gpu_set(machine(rows, numa, nics), 2).gpus == expected


def test_points_are_those_documented() -> None:
    assert [link_points(Link(LinkKind(k))) for k in ("PIX", "PXB", "PHB", "NODE", "SYS")] == [
        5,
        4,
        3,
        2,
        1,
    ]
    assert link_points(Link(LinkKind.NV, 18)) == 180
    assert link_points(Link(LinkKind.NV, 1)) == 10


def test_lost_gpus_are_never_chosen() -> None:
    topology = machine(["X NV4 PIX", "NV4 X PIX", "PIX PIX X"], lost=[1])
    assert best_gpu_set(topology, 2).gpus == (0, 2)
    assert best_gpu_set(topology, 1, available=[1, 2]).gpus == (2,)


def test_a_single_gpu_is_scored_by_its_nic_alone() -> None:
    topology = machine(["X SYS", "SYS X"], [0, 0], ("SYS PIX",))
    best = best_gpu_set(topology, 1)
    assert (best.gpus, best.score, best.pairs, best.points_per_pair) == (
        (1,),
        Score(0, -1, 5),
        (),
        0.0,
    )
    assert (
        best.explain()
        == "pairs: no pairs; NUMA node 0; closest NIC mlx5_0 (PIX to the farthest GPU)"
    )


def test_unknown_numa_nodes_count_as_one_and_no_nic_scores_zero() -> None:
    best = best_gpu_set(machine(["X PHB", "PHB X"]), 2)
    assert (best.score, best.numa_nodes, best.nic) == (Score(3, -1, 0), (None,), None)
    assert best.explain() == "pairs: 1x PHB; NUMA node ?; no RDMA NIC"


def test_either_matrix_cell_reporting_nvlink_joins_the_pair() -> None:
    links = ((SELF, Link(LinkKind.NV, 2)), (Link(LinkKind.SYS), SELF))
    topology = Topology(source=Source.NVML, gpus=(Gpu(index=0), Gpu(index=1)), links=links)
    assert score_gpu_set(topology, [1, 0]).pairs == (("NV2", 1),)


ERROR_CASES = [
    pytest.param(0, None, "asked for 0 GPUs: ask for at least 1", id="k below 1"),
    pytest.param(
        4,
        None,
        "asked for 4 GPUs but only 2 of 3 available GPUs are usable (1 of them lost)",
        id="more than the usable GPUs",
    ),
    pytest.param(
        2,
        [0, 7],
        "available GPUs: GPU 7 is not on this node (it has GPUs 0..2)",
        id="unknown index",
    ),
    pytest.param(
        2,
        [-1],
        "available GPUs: GPU -1 is not on this node (it has GPUs 0..2)",
        id="negative index",
    ),
]


@pytest.mark.parametrize(("k", "available", "message"), ERROR_CASES)
def test_bad_requests_raise_a_clear_placement_error(
    k: int, available: list[int] | None, message: str
) -> None:
    topology = machine(["X PIX PIX", "PIX X PIX", "PIX PIX X"], lost=[2])
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        best_gpu_set(topology, k, available)


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        pytest.param([], "a GPU set needs at least one GPU", id="empty"),
        pytest.param([0, 0], r"GPU set \[0, 0\] names a GPU twice", id="repeated"),
        pytest.param(
            [0, 3], r"GPU set: GPU 3 is not on this node \(it has GPUs 0..2\)", id="unknown"
        ),
        pytest.param([2], "GPU 2 is lost", id="lost"),
    ],
)
def test_scoring_a_bad_set_raises(gpus: list[int], message: str) -> None:
    topology = machine(["X PIX PIX", "PIX X PIX", "PIX PIX X"], lost=[2])
    with pytest.raises(PlacementError, match=message):
        score_gpu_set(topology, gpus)


def test_placement_errors_are_value_errors_and_input_errors() -> None:
    assert issubclass(PlacementError, ValueError)
    assert issubclass(PlacementError, InputError)


def test_a_node_without_gpus_has_no_set() -> None:
    empty = Topology(source=Source.NVML, gpus=(), links=())
    with pytest.raises(PlacementError, match="only 0 of 0"):
        best_gpu_set(empty, 1)
    with pytest.raises(PlacementError, match="GPU 0 is not on this node, which has no GPU"):
        best_gpu_set(empty, 1, [0])


def test_must_include_gpus_are_in_the_set_even_when_a_better_set_leaves_them_out() -> None:
    best = best_gpu_set(DGX_A100, 2, must_include=[5])
    assert best.gpus == (4, 5)
    assert best_gpu_set(DGX_A100, 3, [0, 1, 5, 7], must_include=[7, 0]).gpus == (0, 1, 7)
    assert best_gpu_set(DGX_A100, 2, must_include=[0, 6]).gpus == (0, 6)


MUST_INCLUDE_ERRORS = [
    pytest.param(
        2,
        None,
        [9],
        "must-include GPUs: GPU 9 is not on this node (it has GPUs 0..2)",
        id="unknown",
    ),
    pytest.param(
        2,
        [0, 1],
        [2],
        "must-include GPU 2 is not among the available GPUs: add it to them",
        id="not available",
    ),
    pytest.param(
        1, None, [1], "GPU 1 is lost (fell off the bus): it cannot be scheduled", id="lost"
    ),
    pytest.param(
        1,
        None,
        [0, 2],
        "2 must-include GPUs do not fit in a set of 1: ask for at least 2",
        id="more than k",
    ),
]


@pytest.mark.parametrize(("k", "available", "must", "message"), MUST_INCLUDE_ERRORS)
@pytest.mark.parametrize("policy", list(Policy))
def test_bad_must_include_raises_a_clear_placement_error(
    k: int, available: list[int] | None, must: list[int], message: str, policy: Policy
) -> None:
    topology = machine(["X PIX PIX", "PIX X PIX", "PIX PIX X"], lost=[1])
    with pytest.raises(PlacementError, match=re.escape(message)):
        best_gpu_set(topology, k, available, must_include=must, policy=policy)


DGX1 = dict(SIMULATED)["simulated-dgx-1-v100"]


def test_the_pcie_path_beneath_breaks_a_tie_between_nvlink_pairs() -> None:
    # 0-3 and 2-3 are both NV2; 2-3 share a PCIe switch (PIX), 0-3 cross the host bridge (PHB).
    assert DGX1.pcie is not None
    assert (pair_token(DGX1.pcie, 0, 3), pair_token(DGX1.pcie, 2, 3)) == ("PHB", "PIX")
    best = best_gpu_set(DGX1, 2, [0, 2, 3])
    assert best.gpus == (2, 3)
    assert best.score == Score(links=20, numa=-1, nic=2, pcie=5)
    assert best_gpu_set(DGX1, 2, [0, 1, 2], must_include=[0]).gpus == (0, 1)  # PIX beats PHB
    # Without the pcie matrix (parsed `topo -m` text) the lowest indices win the tie, as before.
    blind = dataclasses.replace(DGX1, pcie=None)
    assert best_gpu_set(blind, 2, [0, 2, 3]).gpus == (0, 3)
    assert best_gpu_set(blind, 2, [0, 2, 3]).score.pcie == 0


def pair_token(matrix: tuple[tuple[Link, ...], ...], a: int, b: int) -> str:
    return matrix[a][b].token


def test_packing_keeps_the_rest_of_the_node_in_good_sets() -> None:
    # The best pair is 1-2 (NV3), but taking it leaves 0 and 3 joined only by SYS; splitting into
    # 0-1 and 2-3 (NV2 each) keeps two good pairs, so packing hands out 0-1.
    topology = machine(
        ["X NV2 SYS SYS", "NV2 X NV3 SYS", "SYS NV3 X NV2", "SYS SYS NV2 X"], [0, 0, 0, 0]
    )
    assert best_gpu_set(topology, 2).gpus == (1, 2)
    packed = best_gpu_set(topology, 2, policy=Policy.PACKING)
    assert (packed.gpus, packed.exact) == ((0, 1), True)
    # The policy by name, as a config file gives it.
    assert best_gpu_set(topology, 2, policy="packing").gpus == (0, 1)  # type: ignore[arg-type]
    # With 3 free, one is left over: 1-2 with 0 left over is the best split (30 points).
    assert best_gpu_set(topology, 2, [0, 1, 2], policy=Policy.PACKING).gpus == (1, 2)
    assert best_gpu_set(topology, 2, must_include=[3], policy=Policy.PACKING).gpus == (2, 3)


def random_topology(n: int, seed: int) -> Topology:
    """n GPUs with random links (what no real machine has): the search's hardest case."""
    rng = random.Random(seed)
    cells = [f"NV{k}" for k in (1, 2, 4, 6, 12, 18)] + ["PIX", "PXB", "PHB", "NODE", "SYS"]
    grid = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            grid[a][b] = grid[b][a] = rng.choice(cells)
    return machine([" ".join(row) for row in grid], [rng.randrange(4) for _ in range(n)])


def test_a_48_gpu_random_machine_stops_at_the_budget_with_a_set_not_proven_optimal() -> None:
    topology = random_topology(48, 1)
    best = best_gpu_set(topology, 24)
    assert not best.exact
    assert DEFAULT_BUDGET <= best.work <= DEFAULT_BUDGET + 48  # the last step may overrun by one
    assert len(best.gpus) == 24
    assert best == dataclasses.replace(score_gpu_set(topology, best.gpus), exact=False)
    assert best_gpu_set(topology, 24) == best  # deterministic: work units, not time


@pytest.mark.parametrize("policy", list(Policy))
def test_a_tiny_budget_still_answers_a_valid_set_marked_inexact(policy: Policy) -> None:
    for budget in (1, 10):
        best = best_gpu_set(
            DGX_A100, 3, [0, 2, 3, 5, 6], must_include=[6], policy=policy, budget=budget
        )
        assert not best.exact
        assert len(best.gpus) == 3
        assert 6 in best.gpus
        assert set(best.gpus) <= {0, 2, 3, 5, 6}
    with pytest.raises(PlacementError, match="a search budget of 0 work units: give at least 1"):
        best_gpu_set(DGX_A100, 3, budget=0, policy=policy)


def test_an_unknown_policy_is_a_placement_error() -> None:
    with pytest.raises(PlacementError, match="policy 'spread' is not one of: best, packing"):
        best_gpu_set(DGX_A100, 2, policy="spread")  # type: ignore[arg-type]


def test_the_real_machines_spend_a_small_part_of_the_budget() -> None:
    for name, topology in MACHINES:
        for k in range(1, len(topology.gpus) + 1):
            work = best_gpu_set(topology, k).work
            assert 0 < work < DEFAULT_BUDGET // 20, f"{name} k={k}: {work}"
