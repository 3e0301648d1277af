"""`best_gpu_set` and `score_gpu_set`: the exact optimum, the documented order, the errors.

Every policy, with and without `available` and `must_include`, is compared against an exhaustive
search written plainly here: every k-subset for `best` and `packing` (whose reach is every clique
of free GPUs), every split in go-gpuallocator's order for `nvidia-besteffort`. How that policy
answers go-gpuallocator's own test cases, and agrees with go-gpuallocator's own code, is
tests/placement/test_gpuallocator.py.
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
from reporter.gpuallocator import pair_points, pair_points_matrix
from reporter.placement import (
    DEFAULT_BUDGET,
    GpuSet,
    Policy,
    Score,
    best_gpu_set,
    link_points,
    nvlink_reach,
    pair_link,
    score_gpu_set,
)
from reporter.schema.model import Gpu, Nic, Source, Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import FIXTURES, body
from tests.support.strategies import topologies


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


def reach_by_cliques(topology: Topology, usable: Sequence[int]) -> dict[int, int]:
    """Per usable GPU, the largest set of usable GPUs holding it, all pairwise NVLink-joined."""
    reach = dict.fromkeys(usable, 1)
    for size in range(2, len(usable) + 1):
        for group in itertools.combinations(usable, size):
            if all(
                pair_link(topology, a, b).is_nvlink for a, b in itertools.combinations(group, 2)
            ):
                for g in group:
                    reach[g] = size
    return reach


def brute_force_packing(
    topology: Topology,
    k: int,
    available: Sequence[int] | None = None,
    must_include: Sequence[int] = (),
) -> GpuSet:
    """Every k-subset holding must_include in lexicographic order; the first that is connected if
    any is, then of the smallest fit (the largest reach of its GPUs), then of the best score."""
    pool = sorted(set(range(len(topology.gpus)) if available is None else available))
    usable = [i for i in pool if not topology.gpus[i].lost]
    reach = reach_by_cliques(topology, usable)
    best: tuple[tuple[bool, int, Score], GpuSet] | None = None
    for gpus in itertools.combinations(usable, k):
        if not set(must_include) <= set(gpus):
            continue
        scored = score_gpu_set(topology, gpus)
        joined = all(
            pair_link(topology, a, b).is_nvlink for a, b in itertools.combinations(gpus, 2)
        )
        key = (joined, -max(reach[g] for g in gpus), scored.score)
        if best is None or key > best[0]:
            best = (key, scored)
    assert best is not None
    return best[1]


def go_order_splits(
    devices: list[int | None], size: int, padding: int
) -> Iterator[list[tuple[int | None, ...]]]:
    """Every split of `devices` (padded with None) into sets of `size`, in go-gpuallocator's
    order: the first device left starts a set, its partners in combination order; a set holds
    no padding or all of it."""
    if len(devices) == size:
        yield [tuple(devices)]
        return
    first, rest = devices[0], devices[1:]
    for picks in itertools.combinations(range(len(rest)), size - 1):
        group = (first, *(rest[i] for i in picks))
        empty = group.count(None)
        if empty and empty != padding:
            continue
        left = [d for i, d in enumerate(rest) if i not in picks]
        if empty:
            left = [d for d in left if d is not None]
        for tail in go_order_splits(left, size, padding):
            yield [group, *tail]


def brute_force_besteffort(
    topology: Topology, k: int, order: Sequence[int], required: Sequence[int] = ()
) -> tuple[int | None, ...]:
    """go-gpuallocator's Allocate, exhaustively: the first split in its order with the most
    points (the padded set's pairs count), holding the required GPUs in one unpadded set; its
    first set of the most points among those holding them. k = 1: the first that is required."""
    points = pair_points_matrix(topology)

    def value(group: Sequence[int | None]) -> int:
        real = [g for g in group if g is not None]
        return sum(points[a][b] for a, b in itertools.combinations(real, 2))

    if k == 1:
        return next((g,) for g in order if set(required) <= {g})
    padding = (-len(order)) % k
    best: tuple[int, list[tuple[int | None, ...]]] | None = None
    for split in go_order_splits([*order, *([None] * padding)], k, padding):
        if not any(set(required) <= set(g) and None not in g for g in split):
            continue
        total = sum(value(g) for g in split)
        if best is None or total > best[0]:
            best = (total, split)
    assert best is not None
    held = [g for g in best[1] if set(required) <= set(g)]
    return max(held, key=lambda g: (value(g), -held.index(g)))


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
def test_every_machine_packs_as_the_exhaustive_search(name: str, topology: Topology) -> None:
    for pool in small_pools(topology):
        for k in range(1, len(pool) + 1):
            got = best_gpu_set(topology, k, pool, policy=Policy.PACKING)
            assert got == brute_force_packing(topology, k, pool), f"{name} k={k} pool={pool}"
        must = pool[-1:]
        for k in range(1, len(pool) + 1):
            got = best_gpu_set(topology, k, pool, must_include=must, policy=Policy.PACKING)
            want = brute_force_packing(topology, k, pool, must)
            assert got == want, f"{name} k={k} pool={pool} must={must}"


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_every_machine_answers_as_go_gpuallocators_exhaustive_splits(
    name: str, topology: Topology
) -> None:
    rng = random.Random(name)
    for pool in small_pools(topology):
        for k in range(1, len(pool) + 1):
            order = rng.sample(pool, len(pool))  # the kubelet's map order decides the ties
            must = rng.sample(order, min(k, 2)) if k % 2 else []
            want = brute_force_besteffort(topology, k, order, must)
            if None in want:
                with pytest.raises(PlacementError, match="empty place"):
                    best_gpu_set(topology, k, order, must_include=must, policy=NVIDIA)
                continue
            got = best_gpu_set(topology, k, order, must_include=must, policy=NVIDIA)
            assert got == score_gpu_set(topology, want), f"{name} k={k} order={order} must={must}"


NVIDIA = Policy.NVIDIA_BESTEFFORT


@settings(max_examples=150, deadline=None)
@given(data=st.data(), topology=topologies(max_gpus=8).filter(lambda t: len(t.gpus) > 0))
def test_generated_topologies_with_must_include_and_every_policy(
    data: st.DataObject, topology: Topology
) -> None:
    usable = [i for i in range(len(topology.gpus)) if not topology.gpus[i].lost]
    if not usable:
        return
    available = data.draw(st.lists(st.sampled_from(usable), min_size=1, unique=True), "available")
    k = data.draw(st.integers(1, len(available)), "k")
    must = data.draw(st.lists(st.sampled_from(available), max_size=k, unique=True), "must")
    policy = data.draw(st.sampled_from(list(Policy)), "policy")
    if policy is NVIDIA:
        want = brute_force_besteffort(topology, k, available, must)
        if None in want:
            with pytest.raises(PlacementError, match="empty place"):
                best_gpu_set(topology, k, available, must_include=must, policy=policy)
            return
        expected = score_gpu_set(topology, want)
    else:
        exhaustive = brute_force_packing if policy is Policy.PACKING else brute_force
        expected = exhaustive(topology, k, available, must)
    got = best_gpu_set(topology, k, available, must_include=must, policy=policy)
    assert got == expected
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


WORKSTATION = dict(SIMULATED)["simulated-workstation-nvlink-bridge"]


def test_packing_keeps_the_largest_connected_sets_whole() -> None:
    # A workstation: GPUs 0 and 1 on an NVLink bridge, GPU 2 alone. One GPU: the lone one.
    assert best_gpu_set(WORKSTATION, 1).gpus == (0,)
    assert best_gpu_set(WORKSTATION, 1, policy=Policy.PACKING).gpus == (2,)
    # A DGX-1 with one quad whole (4-7) and the pair 0-1 (NV1) left of the other: a pair takes
    # the loose pair, not two of the quad, although 6-7 (NV2 over a PCIe switch) scores higher.
    assert best_gpu_set(DGX1, 2, [0, 1, 4, 5, 6, 7]).gpus == (6, 7)
    packed = best_gpu_set(DGX1, 2, [0, 1, 4, 5, 6, 7], policy=Policy.PACKING)
    assert (packed.gpus, packed.exact) == ((0, 1), True)
    # The policy by name, as a config file gives it.
    assert best_gpu_set(DGX1, 2, [0, 1, 4, 5, 6, 7], policy="packing").gpus == (0, 1)  # type: ignore[arg-type]
    # One GPU beside the whole quad 0-3: GPU 5 reaches only 1 (NV2), so it goes first.
    assert best_gpu_set(DGX1, 1, [0, 1, 2, 3, 5]).gpus == (0,)
    assert best_gpu_set(DGX1, 1, [0, 1, 2, 3, 5], policy=Policy.PACKING).gpus == (5,)
    # A connected set beats a smaller fit: 4 GPUs take the quad, not 1, 2 and two of the quad.
    assert best_gpu_set(DGX1, 4, [0, 1, 4, 5, 6, 7], policy=Policy.PACKING).gpus == (4, 5, 6, 7)
    # Without any connected set, the smallest fit still: 3 GPUs of the workstation take all.
    assert best_gpu_set(WORKSTATION, 3, policy=Policy.PACKING).gpus == (0, 1, 2)
    assert best_gpu_set(WORKSTATION, 2, must_include=[2], policy=Policy.PACKING).gpus == (0, 2)


def test_reach_is_the_largest_connected_set_of_free_gpus_holding_each() -> None:
    reach, exact = nvlink_reach(DGX1, range(8))
    assert (reach, exact) == (dict.fromkeys(range(8), 4), True)
    # 0, 1 and 2 are a triangle of their quad; 4 reaches only 0 (NV2) or 5 (NV1), one at a time.
    assert nvlink_reach(DGX1, [0, 1, 2, 4, 5])[0] == {0: 3, 1: 3, 2: 3, 4: 2, 5: 2}
    assert nvlink_reach(WORKSTATION, [0, 1, 2])[0] == {0: 2, 1: 2, 2: 1}
    # A budget too small for the clique search: each GPU's island stands in, never smaller.
    assert nvlink_reach(DGX1, range(8), budget=3) == (dict.fromkeys(range(8), 8), False)


def test_nvidia_besteffort_sees_the_machine_as_go_gpuallocator_does() -> None:
    # Points per pair: 100 per NVLink plus the PCIe path (PIX 50 ... SYS 10).
    assert DGX1.pcie is not None
    assert pair_points(DGX1, 2, 3) == 200 + 50  # NV2 over a shared PCIe switch
    assert pair_points(DGX1, 0, 5) == 10  # SYS, no NVLink
    # Through NVSwitches go-gpuallocator sees no NVLink at all: only the PCIe points remain.
    h100 = dict(SIMULATED)["simulated-dgx-h100"]
    assert h100.nvswitch
    assert (pair_points(h100, 0, 1), pair_points(h100, 0, 4)) == (20, 10)
    # Parsed `nvidia-smi topo -m` text does not know the PCIe path beneath an NVLink: 0 there.
    blind = dataclasses.replace(DGX1, pcie=None)
    assert (pair_points(blind, 2, 3), pair_points(blind, 0, 5)) == (200, 1 * 10)
    # Its ties go to the order of `available` (the kubelet's map order): one GPU is the first.
    assert best_gpu_set(h100, 1, [5, 2, 7], policy=NVIDIA).gpus == (5,)
    assert best_gpu_set(h100, 1, [7, 2, 5], policy=NVIDIA).gpus == (7,)


def test_nvidia_besteffort_answers_a_padded_set_that_the_device_plugin_cannot_hand_out() -> None:
    a100 = dict(SIMULATED)["simulated-dgx-a100"]
    # Five free, three asked: go-gpuallocator pads to six; its best split is {0, 2, 6} and
    # {4, 5, empty}, and the padded set scores highest (4-5 share a PCIe switch: PXB 40).
    assert brute_force_besteffort(a100, 3, [0, 2, 4, 5, 6]) == (4, 5, None)
    with pytest.raises(
        PlacementError,
        match=r"go-gpuallocator v0\.6\.0 answers GPUs 4,5 and 1 empty place\(s\) for 3 GPUs",
    ):
        best_gpu_set(a100, 3, [0, 2, 4, 5, 6], policy=NVIDIA)
    # Any required GPU keeps the padding out of the answer.
    assert best_gpu_set(a100, 3, [0, 2, 4, 5, 6], must_include=[0], policy=NVIDIA).gpus == (
        0,
        2,
        6,
    )


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
    with pytest.raises(
        PlacementError, match="policy 'spread' is not one of: best, packing, nvidia-besteffort"
    ):
        best_gpu_set(DGX_A100, 2, policy="spread")  # type: ignore[arg-type]


def test_the_real_machines_spend_a_small_part_of_the_budget() -> None:
    for name, topology in MACHINES:
        for k in range(1, len(topology.gpus) + 1):
            work = best_gpu_set(topology, k).work
            assert 0 < work < DEFAULT_BUDGET // 20, f"{name} k={k}: {work}"
