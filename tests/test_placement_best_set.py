"""`best_gpu_set` and `score_gpu_set`: the exact optimum, the documented order, the errors."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.errors import ParseError
from parsers.links import SELF, Link, LinkKind, parse_link
from parsers.nvsmi import parse_topo
from reporter.collect import build_scanner, list_profiles
from reporter.errors import InputError, PlacementError
from reporter.placement import GpuSet, Score, best_gpu_set, link_points, score_gpu_set
from reporter.schema.model import Gpu, Nic, Source, Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import FIXTURES, body
from tests.strategies import topologies


def brute_force(topology: Topology, k: int, available: Sequence[int] | None = None) -> GpuSet:
    """Every k-subset in lexicographic order; the first with the highest score wins."""
    pool = sorted(set(range(len(topology.gpus)) if available is None else available))
    usable = [i for i in pool if not topology.gpus[i].lost]
    best: GpuSet | None = None
    for gpus in itertools.combinations(usable, k):
        scored = score_gpu_set(topology, gpus)
        if best is None or scored.score > best.score:
            best = scored
    assert best is not None
    return best


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
        score=Score(links=120, numa=-1, nic=4),
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
        "score": [120, -1, 4],
        "points_per_pair": 120.0,
        "pairs": {"NV12": 1},
        "numa_nodes": [3],
        "nic": "mlx5_0",
        "nic_link": "PXB",
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
