"""`bench/placement.py` on a tiny cluster, so the simulator cannot rot: it runs, it is
deterministic, and what it reports is consistent with the placements it made. No result is
asserted: the numbers are the benchmark's to report (bench/README.md), not the test's."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from bench import placement
from reporter.placement import Policy, score_gpu_set

TINY = (("dgx-h100", 1), ("pcie-8x", 1), ("workstation-nvlink-bridge", 1))


@pytest.fixture(scope="module")
def pods() -> list[placement.Pod]:
    return placement.trace(60, gpus=19, load=0.9, seed=7)


def test_the_trace_draws_the_documented_mix(pods: list[placement.Pod]) -> None:
    assert {p.k for p in pods} <= {1, 2, 4, 8}
    assert all(10**1.5 <= p.minutes <= 10**4 for p in pods)
    assert [p.arrival for p in pods] == sorted(p.arrival for p in pods)
    assert pytest.approx(1.9) == placement.MEAN_GPUS
    assert placement.trace(60, gpus=19, load=0.9, seed=7) == pods


@pytest.mark.parametrize("node_policy", placement.NODE_POLICIES)
@pytest.mark.parametrize("on_node", placement.ON_NODE_POLICIES)
def test_every_policy_pair_places_pods_consistently(
    node_policy: str, on_node: str, pods: list[placement.Pod]
) -> None:
    result = placement.simulate(TINY, pods, node_policy, on_node, load=0.9, seed=3)
    nodes = {n.name: n for n in placement.cluster(TINY)}
    assert result.placed == len(pods)  # the cluster drains: every pod runs
    assert sum(placed for _, placed in result.by_k.values()) <= len(pods)
    assert result.wait >= 0.0
    for pod_id, (name, gpus, _, _) in result.sets.items():
        assert len(gpus) == len(set(gpus)) == pods[pod_id].k
        assert set(gpus) <= set(range(nodes[name].capacity))
        score_gpu_set(nodes[name].topology, gpus)  # a valid set of that node
    for value in (result.occupancy, result.nvlink, result.links, result.frag):
        assert 0.0 <= value <= 1.0
    again = placement.simulate(TINY, pods, node_policy, on_node, load=0.9, seed=3)
    assert (again.sets, again.nvlink, again.links, again.frag, again.occupancy) == (
        result.sets,
        result.nvlink,
        result.links,
        result.frag,
        result.occupancy,
    )


@pytest.mark.parametrize("node_policy", ["extender", "least-allocated"])
def test_no_gpu_is_held_by_two_pods_at_once(node_policy: str, pods: list[placement.Pod]) -> None:
    result = placement.simulate(TINY, pods, node_policy, "best", load=0.9, seed=3)
    held: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for pod_id, (name, gpus, start, end) in result.sets.items():
        assert start >= pods[pod_id].arrival
        assert end == pytest.approx(start + pods[pod_id].minutes)
        for gpu in gpus:
            held.setdefault((name, gpu), []).append((start, end))
    for spans in held.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert len(held) > 10


def test_the_table_has_a_row_per_run(pods: list[placement.Pod]) -> None:
    results = placement.run_all(
        TINY, 30, seed=1, loads=(0.5,), node_policies=("extender",), on_node_policies=("best",)
    )
    text = placement.table(results)
    assert text.count("\n") == 2
    assert "| 50% |" in text
    assert "| extender | best |" in text


SUMMARY_LINE = re.compile(r"^(\d+)% (\S+) (\S+): occupancy \d+\.\d% nvlink \d+\.\d%$")


def test_one_seed_prints_a_summary_line_per_row_then_its_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The interface checked from outside: `python -m bench.placement --seed S`.
    placement.main(["--seed", "5", "--pods", "40", "--loads", "50"])
    out = capsys.readouterr().out.splitlines()
    rows = [SUMMARY_LINE.match(line) for line in out[: len(placement.NODE_POLICIES) * 4]]
    assert all(rows), out[:4]
    assert [(m.group(2), m.group(3)) for m in rows if m] == [
        (n, o) for n in placement.NODE_POLICIES for o in placement.ON_NODE_POLICIES
    ]
    assert {m.group(1) for m in rows if m} == {"50"}
    assert "nvidia-besteffort" in placement.ON_NODE_POLICIES
    assert out[len(rows)].startswith("| offered | occupancy | node choice | on-node | nvlink")


def test_several_seeds_give_mean_minimum_spread_and_the_upper_reference() -> None:
    results = placement.run_seeds(TINY, 50, seeds=(1, 2), loads=(0.8,), jobs=1)
    assert len(results) == 2 * len(placement.NODE_POLICIES) * len(placement.ON_NODE_POLICIES)
    reference = placement.upper_reference(results)
    for r in results:
        assert reference[(r.load, r.seed)].nvlink >= r.nvlink
        assert r.sets == {}  # dropped: a 20-seed run would hold every placement
    text = placement.seeds_table(results)
    target = next(line for line in text.splitlines() if "| extender+most | packing | 2 |" in line)
    runs = [r for r in results if (r.node_policy, r.on_node) == ("extender+most", "packing")]
    low = min(runs, key=lambda r: r.nvlink)
    assert f"| {low.nvlink:.1%} ({low.seed}) |" in target
    per_seed = placement.target_table(results).splitlines()
    assert [line.split(" | ")[0] for line in per_seed[2:]] == ["| 1", "| 2"]


def test_the_loss_trace_explains_each_lost_connected_set(tmp_path: Path) -> None:
    out = tmp_path / "losses.jsonl"
    summaries = placement.trace_losses(TINY, 80, seed=2, load=0.9, out=out)
    assert [r.on_node for r, _ in summaries] == list(placement.ON_NODE_POLICIES)
    losses = [json.loads(line) for line in out.read_text().splitlines()]
    assert losses
    assert sum(sum(c.values()) for _, c in summaries) == len(losses)
    nodes = {n.name: n for n in placement.cluster(TINY)}
    for loss in losses:
        topology = nodes[loss["node"]].topology
        assert loss["k"] >= 2
        assert not placement.connected(topology, loss["took"])
        assert set(loss["took"]) <= set(loss["free"])
        assert loss["class"] in {"on-node", "node-choice", "cluster"}
        if loss["class"] == "on-node":  # packing would have kept the set connected
            assert placement.connected(topology, loss["packing_would_take"])
        if loss["class"] == "cluster":
            assert loss["connected_elsewhere"] == []
            # TINY's one node without NVLink is the pcie-8x: 8 GPUs at most, never the others'.
            assert 0 <= loss["holders"]["free GPUs on nodes without NVLink"] <= 8


def test_every_row_of_a_seed_meets_the_same_tie_breaks() -> None:
    # Common random numbers: a pod's draws depend on the seed and its id, not on what the row
    # decided (or drew) before it, so two rows of one seed differ by policy, not by draw order.
    nodes = placement.cluster(TINY)
    pod, other = placement.Pod(5, 2, 0.0, 1.0), placement.Pod(4, 1, 0.0, 1.0)
    ties = placement.TieBreaks(3)
    priority, order = ties.node_priority(pod, nodes), ties.kubelet_order(pod, nodes[0])
    ties.node_priority(other, nodes)
    ties.kubelet_order(other, nodes[0])
    assert ties.node_priority(pod, nodes) == priority
    assert ties.kubelet_order(pod, nodes[0]) == order
    assert sorted(order) == sorted(nodes[0].free)
    assert placement.TieBreaks(4).node_priority(pod, nodes) != priority


def test_the_schedule_bound_holds_every_run_and_binds_where_capacity_does() -> None:
    pods = placement.trace(60, gpus=19, load=0.9, seed=7)
    for on_node in ("lowest-index", "packing"):
        run = placement.simulate(TINY, pods, "extender+most", on_node, load=0.9, seed=3)
        assert run.nvlink - 1e-9 <= placement.schedule_bound(TINY, pods, run) <= 1 + 1e-9
    # Two 8-GPU pods at once on a cluster with one NVSwitch node: one of them, at best.
    overlap = [
        placement.Pod(0, 1, 0.0, 5.0),
        placement.Pod(1, 8, 1.0, 100.0),
        placement.Pod(2, 8, 2.0, 100.0),
        placement.Pod(3, 1, 3.0, 5.0),
    ]
    run = placement.simulate(TINY, overlap, "extender+most", "packing", load=0.9, seed=3)
    assert run.nvlink == 0.5
    assert placement.schedule_bound(TINY, overlap, run) == pytest.approx(0.5)


def test_the_whole_node_ranking_keeps_one_gpu_pods_off_nvswitch_nodes() -> None:
    h100, pcie = placement.cluster((("dgx-h100", 1), ("pcie-8x", 1)), Policy.PACKING)
    h100.free = {7}  # its last free GPU: the free fit is 1, as on a PCIe node
    for node in (h100, pcie):
        node.refresh()
    # The product's ranking (availability version 3) against the free fit (version 2).
    fit, v2 = placement.RANKINGS["fit"], placement.RANKINGS["v2"]
    assert v2(h100, 1) == v2(pcie, 1)
    assert fit(h100, 1) < fit(pcie, 1) == v2(pcie, 1)
    assert v2(h100, 1) == placement.node_score_v2(h100.availability, 1)


HOLD = (("dgx-h100", 1), ("pcie-8x", 1))


def _placements(result: placement.Result) -> dict[int, tuple[str, float]]:
    return {pod: (name, start) for pod, (name, _, start, _) in result.sets.items()}


@pytest.mark.parametrize(
    ("wait_s", "quad"),
    [
        (placement.CONNECTED_WAIT_S, ("dgx-h100-0", 60.0)),  # held until the H100 empties
        (30 * 60, ("pcie-8x-0", 31.0)),  # held until its hold ran out, then what there was
        (0, ("pcie-8x-0", 1.0)),  # never held: the PCIe quad at once
    ],
)
def test_the_extender_holds_a_pod_for_a_connected_set(
    wait_s: float, quad: tuple[str, float]
) -> None:
    # A 7-GPU pod holds the only NVSwitch node for an hour; a 4-GPU pod arrives a minute later
    # when only the PCIe node has 4 free GPUs, none of them NVLink-connected. The H100's free GPU
    # belongs to its connected 8: a connected quad is worth waiting for there. (Two pods later make
    # the first a warm-up pod, whose size the link figures need not know.)
    pods = [
        placement.Pod(0, 7, arrival=0.0, minutes=60.0),
        placement.Pod(1, 4, arrival=1.0, minutes=10.0),
        placement.Pod(2, 1, arrival=500.0, minutes=10.0),
        placement.Pod(3, 1, arrival=501.0, minutes=10.0),
    ]
    result = placement.simulate(
        HOLD, pods, "extender+most", "packing", 0.8, 1, connected_wait_s=wait_s
    )
    assert {p: _placements(result)[p] for p in (0, 1)} == {0: ("dgx-h100-0", 0.0), 1: quad}
    assert result.held == (1.0 if wait_s else 0.0)
    # Count-only scoring never holds: the quad starts when it arrives, wherever it lands.
    plain = placement.simulate(HOLD, pods, "most-allocated", "packing", 0.8, 1)
    assert (_placements(plain)[1][1], plain.held) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("layout", "first"),
    [
        # No node could ever give 2 connected GPUs: nothing is worth waiting for.
        ((("pcie-8x", 2),), 7),
        # The NVSwitch node is full: no free GPU says what it could give (a limit of the rule).
        (HOLD, 8),
    ],
)
def test_no_node_that_could_connect_the_pod_holds_nothing(
    layout: tuple[tuple[str, int], ...], first: int
) -> None:
    pods = [placement.Pod(0, first, 0.0, 60.0), placement.Pod(1, 2, 1.0, 10.0)]
    pods += [placement.Pod(2, 1, 500.0, 10.0), placement.Pod(3, 1, 501.0, 10.0)]
    result = placement.simulate(layout, pods, "extender+most", "packing", 0.8, 1)
    assert (_placements(result)[1][1], result.held) == (1.0, 0.0)
