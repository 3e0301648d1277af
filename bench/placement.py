"""What topology-aware scheduling buys: a GPU cluster simulator that runs the real placement code.

    python bench/placement.py [--pods 3000] [--seed 1] [--plot bench/placement.png]

Cluster (default, 236 GPUs): 32 nodes of the shipped simulated profiles, each scanned as the agent
scans it (`--simulate`): 8 dgx-a100, 8 dgx-h100, 6 dgx-1-v100, 6 pcie-8x and 4
workstation-nvlink-bridge (3 GPUs, two joined by an NVLink bridge).

Trace: pods of 1, 2, 4 and 8 GPUs arriving as a Poisson process and running for a drawn time.
The size mix and durations are Microsoft's Philly cluster (Jeon et al., "Analysis of Large-Scale
Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC'19, trace at
github.com/msr-fiddle/philly-traces), in the form Gavel (Narayanan et al., OSDI'20) samples it "from
the Philly distribution" (stanford-futuredata/gavel, scheduler/utils.py, `_generate_scale_factor`
and `_generate_duration`):
- sizes: 70% 1 GPU, 10% 2 GPUs, 15% 4 GPUs, 5% 8 GPUs (mean 1.9 GPUs per pod);
- durations: 80% of pods run 10^U(1.5, 3) minutes (32 min to 16.7 h), 20% run 10^U(3, 4) minutes
  (16.7 h to 6.9 days): mean about 1,000 minutes, heavy-tailed.
For scale, SenseTime's Helios (Hu et al., SC'21; HeliosArtifact `helios_cluster_summary.csv`):
median GPU job 1 GPU, mean 3.7 GPUs; median duration 206 s, mean 6,652 s: smaller and shorter on
the median, as heavy on the mean.
The arrival rate is set so that the offered load (rate × mean GPUs × mean duration) is 50%, 80%
or 95% of the cluster's GPUs; the occupancy reported is what was measured (busy GPUs, time-averaged
between the end of the warm-up, the first quarter of arrivals, and the last arrival).

Node choice, each on the same trace (pending pods retried in arrival order after every event, as
the kube-scheduler's queue does; a pod never waits behind one that does not fit):
- `least-allocated`: count-only, the default scheduler's NodeResourcesFit LeastAllocated on GPUs;
- `most-allocated`: count-only, the MostAllocated (bin-packing) strategy;
- `extender`: the stock scheduler plus the topo-reporter extender at weight 5: each node's score is
  `reporter.availability.node_score` of its `availability` annotation (computed by
  `compute_availability`, encoded and decoded exactly as agent and extender do; filtered with
  `can_fit`) × 10 × 5, plus LeastAllocated; the extender helper's HTTP server calls these same
  functions;
- `extender+most`: the same with the MostAllocated strategy configured;
- `greedy-best`: a reference, not a scheduler: at each decision it runs `best_gpu_set` on every
  node that fits and takes the best set of all (ties: the fullest node), what an extender searching
  the whole cluster per pod would do. No offline bound is computed: the optimum over the whole
  trace is an online bin-packing problem with no tractable exact solution at this size, and the
  trivial bounds (100% connected, link ratio 1.00) say nothing. The greedy reference shows instead
  that the best set for each pod is not the best policy for the cluster.
Ties between equal totals go to a seeded random pick, as kube-scheduler's selectHost does.

On-node choice (the device plugin's GetPreferredAllocation): `lowest-index` (the first k free
GPUs), `best` (`best_gpu_set`, best single set) and `packing` (`Policy.PACKING`).

Metrics, over the pods that arrive after the warm-up:
- `nvlink`: share of k >= 2 pods whose GPUs are all pairwise NVLink-connected;
- `links`: mean link points of each k >= 2 pod's set over the best k-set of an empty node of the
  best profile in the cluster (1.00 = every pod got a set as good as an empty DGX H100's);
- `frag`: share of pods that waited while the cluster held at least k free GPUs, but no node did;
- `dec/s`: scheduling decisions per second (node choice plus on-node choice, one core; the
  agents' availability computation runs on the nodes and is not counted; `greedy-best` caches
  its searches, so its rate is not reported);
- `wait`: mean minutes from arrival to placement (the queue the occupancy builds).
Seeded and deterministic: the same seed gives the same table, except the decisions per second.
"""

from __future__ import annotations

import argparse
import heapq
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import structlog

from reporter.availability import (
    Availability,
    can_fit,
    compute_availability,
    decode_availability,
    encode_availability,
    node_score,
)
from reporter.collect import build_scanner
from reporter.placement import GpuSet, Policy, best_gpu_set, pair_link, score_gpu_set
from reporter.schema.model import Topology

DEFAULT_CLUSTER = (
    ("dgx-a100", 8),
    ("dgx-h100", 8),
    ("dgx-1-v100", 6),
    ("pcie-8x", 6),
    ("workstation-nvlink-bridge", 4),
)
NODE_POLICIES = ("least-allocated", "most-allocated", "extender", "extender+most", "greedy-best")
ON_NODE_POLICIES = ("lowest-index", "best", "packing")
LOADS = (0.50, 0.80, 0.95)
EXTENDER_WEIGHT = 5
MAX_NODE_SCORE = 100  # kube-scheduler's plugin score range; extender scores 0..10 are scaled x10

# The Philly mix as Gavel samples it (see the module docstring).
SIZES = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
SHORT_SHARE, SHORT_LOG_MINUTES, LONG_LOG_MINUTES = 0.80, (1.5, 3.0), (3.0, 4.0)


def _mean_log_uniform(low: float, high: float) -> float:
    """E[10^U(low, high)]."""
    return (10**high - 10**low) / ((high - low) * math.log(10))


MEAN_GPUS = sum(k * p for k, p in SIZES)
MEAN_MINUTES = SHORT_SHARE * _mean_log_uniform(*SHORT_LOG_MINUTES) + (
    1 - SHORT_SHARE
) * _mean_log_uniform(*LONG_LOG_MINUTES)


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod of the trace: its GPU count, arrival and run time in minutes."""

    id: int
    k: int
    arrival: float
    minutes: float


def trace(pods: int, gpus: int, load: float, seed: int) -> list[Pod]:
    """`pods` pods whose offered load is `load` of `gpus` GPUs; seeded."""
    rng = random.Random(seed)
    rate = load * gpus / (MEAN_GPUS * MEAN_MINUTES)  # pods per minute
    out, now = [], 0.0
    sizes, weights = zip(*SIZES, strict=True)
    for i in range(pods):
        now += rng.expovariate(rate)
        k = rng.choices(sizes, weights)[0]
        low, high = SHORT_LOG_MINUTES if rng.random() < SHORT_SHARE else LONG_LOG_MINUTES
        out.append(Pod(id=i, k=k, arrival=now, minutes=10 ** rng.uniform(low, high)))
    return out


@cache
def profile_topology(profile: str) -> Topology:
    """The topology the agent publishes for a simulated profile (one full scan)."""
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None, profile
    return topology


@cache
def annotation(profile: str, free: frozenset[int]) -> str:
    """The `availability` annotation the agent writes for these free GPUs (cached per profile:
    it is the agent's work, done on the node, not the scheduler's)."""
    return encode_availability(compute_availability(profile_topology(profile), free))


@cache
def greedy_set(profile: str, free: frozenset[int], k: int) -> GpuSet:
    return best_gpu_set(profile_topology(profile), k, free)


@dataclass(slots=True)
class Node:
    """A node of the simulated cluster: its profile, free GPUs and last read availability."""

    name: str
    profile: str
    topology: Topology
    free: set[int]
    availability: Availability | None = None

    @property
    def capacity(self) -> int:
        return len(self.topology.gpus)

    def refresh(self) -> None:
        """What the extender's Node watch sees after the agent republished."""
        self.availability = decode_availability(annotation(self.profile, frozenset(self.free)))


def cluster(layout: Sequence[tuple[str, int]]) -> list[Node]:
    """Nodes named after their profile, in layout order."""
    nodes = []
    for profile, count in layout:
        topology = profile_topology(profile)
        for i in range(count):
            free = set(range(len(topology.gpus)))
            nodes.append(Node(f"{profile}-{i}", profile, topology, free))
    return nodes


def least_allocated(node: Node, k: int) -> int:
    return (len(node.free) - k) * MAX_NODE_SCORE // node.capacity


def most_allocated(node: Node, k: int) -> int:
    return (node.capacity - len(node.free) + k) * MAX_NODE_SCORE // node.capacity


def choose_node(policy: str, nodes: list[Node], k: int, rng: random.Random) -> Node | None:
    """The node the scheduler binds a k-GPU pod to, or None when none fits."""
    if policy == "greedy-best":
        fits = [n for n in nodes if len(n.free) >= k]
        if not fits:
            return None
        return max(
            fits,
            key=lambda n: (greedy_set(n.profile, frozenset(n.free), k).score, most_allocated(n, k)),
        )
    if policy.startswith("extender"):
        fits = [n for n in nodes if can_fit(n.availability, k) and len(n.free) >= k]
        plugin = most_allocated if policy == "extender+most" else least_allocated
        totals = [EXTENDER_WEIGHT * node_score(n.availability, k) * 10 + plugin(n, k) for n in fits]
    else:
        fits = [n for n in nodes if len(n.free) >= k]
        plugin = most_allocated if policy == "most-allocated" else least_allocated
        totals = [plugin(n, k) for n in fits]
    if not fits:
        return None
    top = max(totals)
    return rng.choice([n for n, t in zip(fits, totals, strict=True) if t == top])


def choose_gpus(policy: str, node: Node, k: int) -> tuple[int, ...]:
    """The GPUs the device plugin hands the pod on its node."""
    if policy == "lowest-index":
        return tuple(sorted(node.free)[:k])
    chosen = Policy.PACKING if policy == "packing" else Policy.BEST
    return best_gpu_set(node.topology, k, node.free, policy=chosen).gpus


def connected(topology: Topology, gpus: Sequence[int]) -> bool:
    return all(
        pair_link(topology, a, b).is_nvlink for i, a in enumerate(gpus) for b in gpus[i + 1 :]
    )


@dataclass(slots=True)
class Result:
    """What one run measured (see the module docstring for each metric)."""

    node_policy: str
    on_node: str
    load: float
    occupancy: float = 0.0
    nvlink: float = 0.0
    links: float = 0.0
    frag: float = 0.0
    decisions_per_s: float | None = None
    wait: float = 0.0
    placed: int = 0
    pods: int = 0
    by_k: dict[int, tuple[int, int]] = field(default_factory=dict)
    """k -> (NVLink-connected, placed) over the measured pods of k GPUs."""
    sets: dict[int, tuple[str, tuple[int, ...], float, float]] = field(default_factory=dict)
    """pod id -> (node, GPUs, start, end): every placement, for the invariants the test checks."""


def simulate(
    layout: Sequence[tuple[str, int]],
    pods: list[Pod],
    node_policy: str,
    on_node: str,
    load: float,
    seed: int,
) -> Result:
    """Run `pods` through the cluster `layout` with the given policies; see the module docstring."""
    rng = random.Random(seed)
    nodes = cluster(layout)
    for node in nodes:
        node.refresh()
    total = sum(n.capacity for n in nodes)
    best_empty = _best_empty_links(layout)
    warmup = pods[len(pods) // 4].arrival if pods else 0.0
    end = pods[-1].arrival if pods else 0.0
    result = Result(node_policy, on_node, load, pods=len(pods))
    events: list[tuple[float, int, int]] = [(p.arrival, 0, p.id) for p in pods]  # 0 arrive, 1 end
    heapq.heapify(events)
    pending: list[Pod] = []
    fragmented: set[int] = set()
    where: dict[int, tuple[Node, tuple[int, ...]]] = {}
    busy, last, busy_time = 0, warmup, 0.0
    decide_s, decisions = 0.0, 0
    measured = {p.id for p in pods if p.arrival >= warmup}
    k2, k2_connected, ratios, waits = 0, 0, [], []
    per_k: dict[int, list[int]] = {}
    while events:
        now, kind, pod_id = heapq.heappop(events)
        if warmup <= now:
            upto = min(now, end)
            if upto > last:
                busy_time += busy * (upto - last)
                last = upto
        pod = pods[pod_id]
        if kind == 0:
            pending.append(pod)
        else:
            node, gpus = where.pop(pod_id)
            node.free.update(gpus)
            busy -= len(gpus)
            if node_policy.startswith("extender"):
                node.refresh()
        still: list[Pod] = []
        for waiting in pending:
            free_anywhere = max(len(n.free) for n in nodes)
            if waiting.k > free_anywhere:
                if sum(len(n.free) for n in nodes) >= waiting.k:
                    fragmented.add(waiting.id)
                still.append(waiting)
                continue
            start = time.perf_counter()
            node = choose_node(node_policy, nodes, waiting.k, rng)
            assert node is not None  # some node holds k free GPUs
            gpus = choose_gpus(on_node, node, waiting.k)
            decide_s += time.perf_counter() - start
            decisions += 1
            node.free.difference_update(gpus)
            busy += len(gpus)
            if node_policy.startswith("extender"):
                node.refresh()
            where[waiting.id] = (node, gpus)
            result.sets[waiting.id] = (node.name, gpus, now, now + waiting.minutes)
            heapq.heappush(events, (now + waiting.minutes, 1, waiting.id))
            if waiting.id in measured:
                waits.append(now - waiting.arrival)
                counts = per_k.setdefault(waiting.k, [0, 0])
                counts[1] += 1
            if waiting.id in measured and waiting.k >= 2:
                joined = connected(node.topology, gpus)
                k2 += 1
                k2_connected += joined
                counts[0] += joined
                ratios.append(
                    score_gpu_set(node.topology, gpus).score.links / best_empty[waiting.k]
                )
        pending = still
    result.placed = len(result.sets)
    assert not pending, "a pod larger than every node never runs"
    result.wait = sum(waits) / len(waits) if waits else 0.0
    result.by_k = {k: (c[0], c[1]) for k, c in sorted(per_k.items())}
    result.occupancy = busy_time / (total * (end - warmup)) if end > warmup else 0.0
    result.nvlink = k2_connected / k2 if k2 else 0.0
    result.links = sum(ratios) / len(ratios) if ratios else 0.0
    result.frag = len(fragmented & measured) / len(measured) if measured else 0.0
    if node_policy != "greedy-best" and decide_s > 0:
        result.decisions_per_s = decisions / decide_s
    return result


def _best_empty_links(layout: Sequence[tuple[str, int]]) -> dict[int, int]:
    """Per k, the link points of the best k-set of an empty node of the best profile."""
    out: dict[int, int] = {}
    for k, _ in SIZES:
        fits = [profile_topology(p) for p, _ in layout if len(profile_topology(p).gpus) >= k]
        out[k] = max(best_gpu_set(t, k).score.links for t in fits) if fits else 1
    return out


def run_all(
    layout: Sequence[tuple[str, int]],
    pods: int,
    seed: int,
    loads: Sequence[float] = LOADS,
    node_policies: Sequence[str] = NODE_POLICIES,
    on_node_policies: Sequence[str] = ON_NODE_POLICIES,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Every combination on the same trace per load."""
    gpus = sum(len(profile_topology(p).gpus) * count for p, count in layout)
    results = []
    for load in loads:
        pod_trace = trace(pods, gpus, load, seed)
        for node_policy in node_policies:
            for on_node in on_node_policies:
                result = simulate(layout, pod_trace, node_policy, on_node, load, seed)
                results.append(result)
                if progress is not None:
                    progress(result)
    return results


def table(results: Sequence[Result]) -> str:
    lines = [
        "| offered | occupancy | node choice | on-node | nvlink (k≥2) | links vs best empty "
        "| frag | wait (min) | dec/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = "—" if r.decisions_per_s is None else f"{r.decisions_per_s:,.0f}"
        lines.append(
            f"| {r.load:.0%} | {r.occupancy:.1%} | {r.node_policy} | {r.on_node} | {r.nvlink:.1%} "
            f"| {r.links:.2f} | {r.frag:.1%} | {r.wait:,.0f} | {rate} |"
        )
    return "\n".join(lines)


def table_by_k(results: Sequence[Result]) -> str:
    """NVLink-connected share per pod size: where the misses are."""
    lines = [
        "| offered | node choice | on-node | k=2 | k=4 | k=8 |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = []
        for k in (2, 4, 8):
            joined, placed = r.by_k.get(k, (0, 0))
            cells.append(f"{joined / placed:.1%} of {placed}" if placed else "—")
        lines.append(f"| {r.load:.0%} | {r.node_policy} | {r.on_node} | {' | '.join(cells)} |")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> None:
    """NVLink-connected share and link quality against occupancy, per node choice."""
    import matplotlib  # noqa: PLC0415 - only this command needs it (the `bench` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    styles = {"lowest-index": ":", "best": "-", "packing": "--"}
    colours = dict(zip(NODE_POLICIES, ("C0", "C1", "C2", "C3", "C7"), strict=True))
    for node_policy in NODE_POLICIES:
        for on_node in ("lowest-index", "best"):
            if node_policy == "greedy-best" and on_node == "lowest-index":
                continue
            rows = sorted(
                (r for r in results if r.node_policy == node_policy and r.on_node == on_node),
                key=lambda r: r.load,
            )
            if not rows:
                continue
            style = {
                "linestyle": styles[on_node],
                "color": colours[node_policy],
                "marker": "o" if on_node == "best" else "x",
                "label": f"{node_policy} / {on_node}",
            }
            x = [r.occupancy * 100 for r in rows]
            left.plot(x, [r.nvlink * 100 for r in rows], **style)
            right.plot(x, [r.links for r in rows], **style)
    left.axhline(95, color="grey", linewidth=0.8)
    left.annotate("goal: 95% at 80%", (50, 96), fontsize=8, color="grey")
    left.set(
        xlabel="measured GPU occupancy (%)",
        ylabel="k ≥ 2 pods on NVLink-connected GPUs (%)",
        title="NVLink-connected pods (node choice / on-node choice)",
        ylim=(0, 100),
    )
    right.set(
        xlabel="measured GPU occupancy (%)",
        ylabel="link points / best set of an empty node",
        title="Link quality per k ≥ 2 pod",
        ylim=(0, 1.05),
    )
    left.grid(alpha=0.3)
    right.grid(alpha=0.3)
    left.legend(fontsize=7, loc="lower left", ncol=2)
    fig.suptitle("Philly-mix trace on 32 mixed nodes (236 GPUs): node choice / on-node choice")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=3000, help="pods per run (default 3000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results = run_all(
        DEFAULT_CLUSTER,
        args.pods,
        args.seed,
        progress=lambda r: print(
            f"{r.load:.0%} {r.node_policy} {r.on_node}: occupancy {r.occupancy:.1%} "
            f"nvlink {r.nvlink:.1%}",
            flush=True,
        ),
    )
    print(table(results))
    print()
    print(table_by_k([r for r in results if r.on_node == "best"]))
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
