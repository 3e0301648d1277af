"""What topology-aware scheduling buys: a GPU cluster simulator that runs the real placement code.

    python -m bench.placement [--seeds 20] [--first-seed 1] [--pods 3000] [--loads 50,80,95]
        [--jobs 2] [--repeats 1] [--bound] [--plot bench/placement.png]
                                              every combination on N seeds: mean, min, spread
    python -m bench.placement --seed S        one seed: one summary line per row, then its tables
    python -m bench.placement --seed S --trace FILE [--loads 80]
                                              one seed, the target row: every lost connected set
    ... --ranking v2                          the same with the extender's ranking before the
                                              whole-node fit (availability version 2)
    ... --ranking v1                          the same with the extender's ranking before best fit
    ... --connected-wait 0                    the extender never holds a pod for a connected set
                                              (its --connected-wait; default 2h)

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
between the end of the warm-up, the first quarter of arrivals, and the last arrival). Heavy tails
make a seed's measured occupancy wander well away from the offered load (76% to 91% at 80%).

Node choice, each on the same trace (pending pods retried in arrival order after every event, as
the kube-scheduler's queue does; a pod never waits behind one that does not fit):
- `least-allocated`: count-only, the default scheduler's NodeResourcesFit LeastAllocated on GPUs;
- `most-allocated`: count-only, the MostAllocated (bin-packing) strategy;
- `extender`: the stock scheduler plus the topo-reporter extender at weight 5: each node's score is
  `reporter.availability.node_score` of its `availability` annotation (computed by
  `compute_availability` for the node's on-node policy, encoded and decoded exactly as agent and
  extender do; filtered with `can_fit`) × 10 × 5, plus LeastAllocated; the extender's HTTP server
  serves these same functions;
- `extender+most`: the same with the MostAllocated strategy configured;
- both extender rows hold a pod of k >= 2 GPUs back (its filter fails every node) while no node
  hands it a connected set and some node could once its pods end, for up to `--connected-wait`
  (2 h, the extender's default) from its arrival: `reporter.availability.holds_for_connected`, on
  what the extender knows (`connected_now`, `connected_capacity` of every node's availability).
  A held pod is tried again at every event, as the kube-scheduler retries it when a Node changes,
  and when its hold runs out;
- `greedy-best`: a reference, not a scheduler: at each decision it runs `best_gpu_set` on every
  node that fits and takes the best set of all (ties: the fullest node), what an extender searching
  the whole cluster per pod would do.
Ties between equal totals go to a seeded random pick, as kube-scheduler's selectHost does.

On-node choice (the device plugin's GetPreferredAllocation), and the policy the simulated agent
declares for its annotation:
- `lowest-index`: the first k free GPUs (no agent policy describes it: the agent says `best`);
  also the DRA allocator's own choice for a plain claim, which takes the slice's first k free
  devices (tests/controlplane/test_dra_allocator.py, on the real kube-scheduler);
- `best`: `best_gpu_set`, the best single set;
- `packing`: `Policy.PACKING`, which keeps the largest connected sets whole;
- `nvidia-besteffort`: NVIDIA's device plugin, go-gpuallocator's best-effort policy
  (`reporter.gpuallocator`), handed the free GPUs in a seeded random order, as the kubelet hands
  them in Go map order (go-gpuallocator breaks its ties by that order).

Metrics, over the pods that arrive after the warm-up:
- `nvlink`: share of k >= 2 pods whose GPUs are all pairwise NVLink-connected;
- `8-GPU`: the same for the 8-GPU pods alone (a connected 8-set exists only on the 16 NVSwitch
  nodes);
- `links`: mean link points of each k >= 2 pod's set over the best k-set of an empty node of the
  best profile in the cluster (1.00 = every pod got a set as good as an empty DGX H100's);
- `frag`: share of pods that waited while the cluster held at least k free GPUs, but no node did;
- `wait`: mean minutes from arrival to placement (the queue the occupancy builds);
- `held`: share of k >= 2 pods the extender held back for a connected set at least once;
- `dec/s`: scheduling decisions per second (node choice plus on-node choice, one core; the
  agents' availability computation runs on the nodes and is not counted; `greedy-best` caches
  its searches, so its rate is not reported).
Over several seeds each row reports the mean, the minimum and the spread (maximum minus minimum)
of `nvlink`, and the upper reference of each seed: the best `nvlink` any row reached on that seed
and load. The rows of one seed are paired (common random numbers): the same trace (arrivals,
sizes, durations) and the same tie-break draws, each pod drawing its own from a stream seeded by
the seed and its id (`TieBreaks`), so a pod meets the same draws in every row whatever the row
decided before it. Rows still diverge after their first different decision (the cluster differs
from then on), so one seed's rows differ by the trajectory their policies lead to as well as by
the policies themselves: `--repeats R` runs each seed R times with other tie-breaks (`tie_seed`)
and averages them.

`--bound` adds, per seed, the target row's schedule bound (`schedule_bound`): a linear program's
upper bound on the connected share of any placement that starts and ends every pod when that row
did (the same waits and occupancy), relaxing which node of a profile and which GPUs (a pod may
move at every start). The best over the whole trace without that relaxation is an online
bin-packing problem with no tractable exact solution at this size.

The extender ranks by the whole-node fit (availability version 3, `node_score`): the largest
connected set of the whole node (free or not) that the set cuts into. `--ranking v2` ranks by the
free fit instead (`node_score_v2`: the free GPUs' largest connected set the set cuts into), as the
extender did before version 3; `--ranking v1` as it did before best fit.

`--trace FILE` (one seed, `extender+most` beside every on-node choice, default load 80%) writes
one JSON line per k >= 2 pod that got no connected set: the pod, the node, its free GPUs, the
extender's ranking (top nodes with their scores), what the on-node policy took, what `packing`
would have taken there, and the loss's class: `on-node` (the chosen node had a connected set the
policy did not take), `node-choice` (another node had one) or `cluster` (no node had one); for a
`cluster` loss, what held the GPUs of the nodes that could have given a connected set when empty:
the pods by size, and how many smaller ones were placed there while a node that can never give a
connected set of the lost size had a connected set for them (an island-keeping choice). The
summary it prints is in bench/README.md.

Seeded and deterministic: the same seed gives the same tables, except the decisions per second.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import structlog

from parsers.duration import parse_duration
from parsers.errors import ParseError
from parsers.links import LinkKind
from reporter.availability import (
    CONNECTED_WAIT_S,
    NEUTRAL_SCORE,
    can_fit,
    connected_capacity,
    connected_now,
    holds_for_connected,
    node_score,
)
from reporter.collect import build_scanner
from reporter.free_sets import compute_availability
from reporter.placement import (
    PCIE_POINTS,
    GpuSet,
    Policy,
    best_gpu_set,
    pair_link,
    score_gpu_set,
)
from reporter.schema.availability import Availability, decode_availability, encode_availability
from reporter.schema.model import Topology

DEFAULT_CLUSTER = (
    ("dgx-a100", 8),
    ("dgx-h100", 8),
    ("dgx-1-v100", 6),
    ("pcie-8x", 6),
    ("workstation-nvlink-bridge", 4),
)
NODE_POLICIES = ("least-allocated", "most-allocated", "extender", "extender+most", "greedy-best")
ON_NODE_POLICIES = ("lowest-index", "best", "packing", "nvidia-besteffort")
LOADS = (0.50, 0.80, 0.95)
DEFAULT_SEEDS = 20
TARGET = (0.80, "extender+most", "packing")
"""The row the goal is stated for (bench/README.md): >= 95% of k >= 2 pods connected."""
EXTENDER_WEIGHT = 5
MAX_NODE_SCORE = 100  # kube-scheduler's plugin score range; extender scores 0..10 are scaled x10
AGENT_POLICY = {
    "lowest-index": Policy.BEST,
    "best": Policy.BEST,
    "packing": Policy.PACKING,
    "nvidia-besteffort": Policy.NVIDIA_BESTEFFORT,
}
"""The policy each simulated agent declares for its node's on-node choice."""

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
    sizes, weights = [k for k, _ in SIZES], [w for _, w in SIZES]
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
def annotation(profile: str, free: frozenset[int], policy: Policy) -> str:
    """The `availability` annotation the agent writes for these free GPUs and its node's on-node
    policy (cached per profile: it is the agent's work, done on the node, not the scheduler's)."""
    return encode_availability(compute_availability(profile_topology(profile), free, policy=policy))


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
    policy: Policy = Policy.BEST
    """The on-node policy its agent declares."""
    availability: Availability | None = None

    @property
    def capacity(self) -> int:
        return len(self.topology.gpus)

    def refresh(self) -> None:
        """What the extender's Node watch sees after the agent republished."""
        self.availability = decode_availability(
            annotation(self.profile, frozenset(self.free), self.policy)
        )


def cluster(layout: Sequence[tuple[str, int]], policy: Policy = Policy.BEST) -> list[Node]:
    """Nodes named after their profile, in layout order, whose agents declare `policy`."""
    nodes = []
    for profile, count in layout:
        topology = profile_topology(profile)
        for i in range(count):
            free = set(range(len(topology.gpus)))
            nodes.append(Node(f"{profile}-{i}", profile, topology, free, policy))
    return nodes


def least_allocated(node: Node, k: int) -> int:
    return (len(node.free) - k) * MAX_NODE_SCORE // node.capacity


def most_allocated(node: Node, k: int) -> int:
    return (node.capacity - len(node.free) + k) * MAX_NODE_SCORE // node.capacity


def node_score_v1(a: Availability | None, k: int) -> int:
    """The extender's ranking before best fit (commit d028fc7), for comparison on the same traces:
    by the best free k-set, connected 4..10 by one NUMA node (4), a close NIC (2) and an island of
    exactly k (1); not connected 1..3."""
    if a is None or k < 1:
        return NEUTRAL_SCORE
    if not can_fit(a, k):
        return 0
    best = a.best[k - 1]
    one_numa, close_nic = best.numa == 1, best.nic >= PCIE_POINTS[LinkKind.PXB]
    if best.connected:
        return 4 + max(4 * one_numa + 2 * close_nic + (best.island == k) - 1, 0)
    return 1 + one_numa + close_nic


def node_score_v2(a: Availability | None, k: int) -> int:
    """The extender's ranking before availability version 3: `node_score` by the free fit alone
    (each set's whole-node fit dropped, as a version-2 value carries none)."""
    if a is None or k < 1 or not can_fit(a, k):
        return node_score(a, k)
    best = list(a.best)
    best[k - 1] = replace(best[k - 1], whole=None)
    return node_score(replace(a, best=tuple(best)), k)


RANKINGS: dict[str, Callable[[Node, int], int]] = {
    "fit": lambda node, k: node_score(node.availability, k),
    "v2": lambda node, k: node_score_v2(node.availability, k),
    "v1": lambda node, k: node_score_v1(node.availability, k),
}
"""The extender's node score: `fit` (reporter.availability.node_score, what it ranks by: the
whole-node fit of availability version 3), `v2` (by the free fit, before version 3) or `v1` (the
ranking before best fit)."""


def node_totals(
    policy: str, nodes: list[Node], k: int, ranking: str = "fit"
) -> list[tuple[Node, int]]:
    """The nodes that can take a k-GPU pod, each with the scheduler's total score for it."""
    if policy.startswith("extender"):
        fits = [n for n in nodes if can_fit(n.availability, k) and len(n.free) >= k]
        plugin = most_allocated if policy == "extender+most" else least_allocated
        score = RANKINGS[ranking]
        return [(n, EXTENDER_WEIGHT * score(n, k) * 10 + plugin(n, k)) for n in fits]
    plugin = most_allocated if policy == "most-allocated" else least_allocated
    return [(n, plugin(n, k)) for n in nodes if len(n.free) >= k]


@dataclass(frozen=True, slots=True)
class TieBreaks:
    """The random tie-breaks of a run, common to every row of a seed (common random numbers).

    Each pod draws from its own stream, seeded by the tie seed and the pod's id alone, so a pod
    meets the same draws in every row whatever the row decided before it: a random priority per
    node (equal totals go to the node of the lowest, a uniform pick among them, as kube-scheduler's
    selectHost makes) and, per node, a random order of its GPUs (the kubelet's Go map order).
    With one stream for the whole run, as before, a row that made one decision more or fewer
    shifted every later draw, and two rows differed by chance at every tie after that.
    """

    seed: int

    def node_priority(self, pod: Pod, nodes: Sequence[Node]) -> dict[str, float]:
        rng = random.Random(f"{self.seed}/{pod.id}")
        return {n.name: rng.random() for n in nodes}

    def kubelet_order(self, pod: Pod, node: Node) -> list[int]:
        rng = random.Random(f"{self.seed}/{pod.id}/{node.name}")
        keys = [rng.random() for _ in range(node.capacity)]
        return sorted(node.free, key=keys.__getitem__)


def choose_node(
    policy: str, nodes: list[Node], pod: Pod, ties: TieBreaks, ranking: str = "fit"
) -> Node | None:
    """The node the scheduler binds a pod to, or None when none fits."""
    k = pod.k
    if policy == "greedy-best":
        fits = [n for n in nodes if len(n.free) >= k]
        if not fits:
            return None
        return max(
            fits,
            key=lambda n: (greedy_set(n.profile, frozenset(n.free), k).score, most_allocated(n, k)),
        )
    totals = node_totals(policy, nodes, k, ranking)
    if not totals:
        return None
    top = max(t for _, t in totals)
    tied = [n for n, t in totals if t == top]
    if len(tied) == 1:
        return tied[0]
    priority = ties.node_priority(pod, nodes)
    return min(tied, key=lambda n: priority[n.name])


def holds(nodes: list[Node], pod: Pod, now: float, connected_wait_s: float) -> bool:
    """Whether the extender's filter holds `pod` back for an NVLink-connected set now
    (`holds_for_connected`, with what the extender knows: every node's availability)."""
    if pod.k < 2 or not connected_wait_s:
        return False
    return holds_for_connected(
        pod.k,
        (now - pod.arrival) * 60,
        connected_wait_s,
        connected=any(connected_now(n.availability, pod.k) for n in nodes),
        capable=any(connected_capacity(n.availability) >= pod.k for n in nodes),
    )


def choose_gpus(policy: str, node: Node, pod: Pod, ties: TieBreaks) -> tuple[int, ...]:
    """The GPUs the device plugin hands the pod on its node."""
    k = pod.k
    if policy == "lowest-index":
        return tuple(sorted(node.free)[:k])
    if policy == "nvidia-besteffort":
        order = ties.kubelet_order(pod, node)
        return best_gpu_set(node.topology, k, order, policy=Policy.NVIDIA_BESTEFFORT).gpus
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
    seed: int = 1
    repeat: int = 0
    """Which tie-break stream of the seed's trace (0: the seed itself; see `tie_seed`)."""
    occupancy: float = 0.0
    nvlink: float = 0.0
    links: float = 0.0
    frag: float = 0.0
    held: float = 0.0
    """Share of the measured k >= 2 pods the extender held for a connected set at least once."""
    decisions_per_s: float | None = None
    wait: float = 0.0
    placed: int = 0
    pods: int = 0
    by_k: dict[int, tuple[int, int]] = field(default_factory=dict)
    """k -> (NVLink-connected, placed) over the measured pods of k GPUs."""
    sets: dict[int, tuple[str, tuple[int, ...], float, float]] = field(default_factory=dict)
    """pod id -> (node, GPUs, start, end): every placement, for the invariants the test checks."""
    bound: float | None = None
    """`schedule_bound` of this run (`--bound`, the target row only), else None."""

    @property
    def eight(self) -> float | None:
        """NVLink-connected share of the measured 8-GPU pods (None without one)."""
        joined, placed = self.by_k.get(8, (0, 0))
        return joined / placed if placed else None


@dataclass(frozen=True, slots=True)
class Decision:
    """One placement, as `simulate` hands it to an observer: before the GPUs are taken."""

    now: float
    pod: Pod
    node: Node
    gpus: tuple[int, ...]
    nodes: list[Node]
    ranking: list[tuple[Node, int]]
    """The scheduler's total for every node that fit, best first (empty for greedy-best)."""


def simulate(
    layout: Sequence[tuple[str, int]],
    pods: list[Pod],
    node_policy: str,
    on_node: str,
    load: float,
    seed: int,
    observe: Callable[[Decision], None] | None = None,
    ranking: str = "fit",
    connected_wait_s: float = CONNECTED_WAIT_S,
) -> Result:
    """Run `pods` through the cluster `layout` with the given policies; see the module docstring.

    `observe`, when given, sees every placement before the GPUs are taken (it may read, never
    change, the nodes); the time it takes is not counted in decisions per second. `ranking` `v1`
    ranks nodes as the extender did before best fit, its agents describing the best set; `v2` by
    the free fit (`node_score_v2`), as before availability version 3. `connected_wait_s` is the
    extender's `--connected-wait` (`holds_for_connected`; 0: it never holds a pod).
    """
    ties = TieBreaks(seed)
    nodes = cluster(layout, Policy.BEST if ranking == "v1" else AGENT_POLICY[on_node])
    extender = node_policy.startswith("extender")
    if extender:
        for node in nodes:
            node.refresh()
    total = sum(n.capacity for n in nodes)
    best_empty = _best_empty_links(tuple(layout))
    warmup = pods[len(pods) // 4].arrival if pods else 0.0
    end = pods[-1].arrival if pods else 0.0
    result = Result(node_policy, on_node, load, seed=seed, pods=len(pods))
    # 0 arrive, 1 end, 2 a hold runs out (the scheduler retries a pod it could not place within
    # podMaxInUnschedulablePodsDuration, 5 minutes, at the latest: here at once)
    events: list[tuple[float, int, int]] = [(p.arrival, 0, p.id) for p in pods]
    heapq.heapify(events)
    pending: list[Pod] = []
    fragmented: set[int] = set()
    held: set[int] = set()
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
        elif kind == 1:
            node, gpus = where.pop(pod_id)
            node.free.update(gpus)
            busy -= len(gpus)
            if extender:
                node.refresh()
        still: list[Pod] = []
        for waiting in pending:
            free_anywhere = max(len(n.free) for n in nodes)
            if waiting.k > free_anywhere:
                if sum(len(n.free) for n in nodes) >= waiting.k:
                    fragmented.add(waiting.id)
                still.append(waiting)
                continue
            if extender and holds(nodes, waiting, now, connected_wait_s):
                if waiting.id not in held:
                    held.add(waiting.id)
                    expiry = waiting.arrival + connected_wait_s / 60
                    heapq.heappush(events, (expiry, 2, waiting.id))
                still.append(waiting)
                continue
            start = time.perf_counter()
            chosen = choose_node(node_policy, nodes, waiting, ties, ranking)
            assert chosen is not None  # some node holds k free GPUs
            node = chosen
            gpus = choose_gpus(on_node, node, waiting, ties)
            decide_s += time.perf_counter() - start
            decisions += 1
            if observe is not None:
                ranked = (
                    []
                    if node_policy == "greedy-best"
                    else node_totals(node_policy, nodes, waiting.k, ranking)
                )
                ranked.sort(key=lambda nt: -nt[1])
                observe(Decision(now, waiting, node, gpus, nodes, ranked))
            node.free.difference_update(gpus)
            busy += len(gpus)
            if extender:
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
    measured_k2 = sum(1 for p in pods if p.id in measured and p.k >= 2)
    result.held = len(held & measured) / measured_k2 if measured_k2 else 0.0
    if node_policy != "greedy-best" and decide_s > 0:
        result.decisions_per_s = decisions / decide_s
    return result


@cache
def _best_empty_links(layout: tuple[tuple[str, int], ...]) -> dict[int, int]:
    """Per k, the link points of the best k-set of an empty node of the best profile."""
    out: dict[int, int] = {}
    for k, _ in SIZES:
        fits = [profile_topology(p) for p, _ in layout if len(profile_topology(p).gpus) >= k]
        out[k] = max(best_gpu_set(t, k).score.links for t in fits) if fits else 1
    return out


def cluster_gpus(layout: Sequence[tuple[str, int]]) -> int:
    return sum(len(profile_topology(p).gpus) * count for p, count in layout)


@cache
def disjoint_connected_sets(profile: str, k: int) -> int:
    """How many disjoint NVLink-connected k-sets an empty node of the profile holds at most."""
    topology = profile_topology(profile)
    gpus = range(len(topology.gpus))
    sets = [
        frozenset(c)
        for c in itertools.combinations(gpus, k)
        if connected(topology, c) and not any(topology.gpus[g].lost for g in c)
    ]

    def most(start: int, used: frozenset[int]) -> int:
        return max(
            (1 + most(i + 1, used | s) for i, s in enumerate(sets[start:], start) if not s & used),
            default=0,
        )

    return most(0, frozenset())


def schedule_bound(layout: Sequence[tuple[str, int]], pods: Sequence[Pod], run: Result) -> float:
    """An upper bound on the NVLink-connected share of the measured k >= 2 pods for any placement
    that starts and ends every pod when `run` did (its waits and occupancy): a linear program.

    Each pod is assigned to the node profiles, fractionally, connected or not; at every start from
    the first measured one on, the pods running on a profile hold at most its GPUs, and its
    connected k-pods number at most its nodes times `disjoint_connected_sets` (where that is
    tighter than the GPUs); a connected k-pod goes only where an empty node has a connected k-set.
    It relaxes which node and which GPUs (a pod may move at every start) and integrality; every
    real placement with these times is a feasible point, so the optimum is an upper bound. It
    needs scipy (the `bench` extra).
    """
    # Only --bound needs scipy (the `bench` extra); it ships no type information.
    from scipy.optimize import linprog  # type: ignore[import-untyped]  # noqa: PLC0415
    from scipy.sparse import coo_array  # type: ignore[import-untyped]  # noqa: PLC0415

    warmup = pods[len(pods) // 4].arrival
    span = {pod_id: (start, end) for pod_id, (_, _, start, end) in run.sets.items()}
    first = min(span[p.id][0] for p in pods if p.arrival >= warmup)
    profiles = [(name, count, len(profile_topology(name).gpus)) for name, count in layout]
    columns: list[tuple[Pod, str, bool]] = []  # (pod, profile, connected there)
    by_pod: dict[int, list[int]] = {}
    for pod in pods:
        if span[pod.id][1] <= first:
            continue  # it never runs beside a measured pod
        for name, _, capacity in profiles:
            for joined in (False, True):
                if pod.k > capacity or (joined and disjoint_connected_sets(name, pod.k) == 0):
                    continue
                if joined and pod.k < 2:
                    continue
                by_pod.setdefault(pod.id, []).append(len(columns))
                columns.append((pod, name, joined))
    rows: list[list[tuple[int, float]]] = []
    upper: list[float] = []
    starts = sorted({span[i][0] for i in by_pod if span[i][0] >= first})
    ends = sorted((span[i][1], i) for i in by_pod)
    began = sorted((span[i][0], i) for i in by_pod if span[i][0] >= first)
    running: set[int] = {i for i in by_pod if span[i][0] < first}
    b = e = 0
    for n, now in enumerate(starts):
        while e < len(ends) and ends[e][0] <= now:
            running.discard(ends[e][1])
            e += 1
        while b < len(began) and began[b][0] <= now:
            running.add(began[b][1])
            b += 1
        later = starts[n + 1] if n + 1 < len(starts) else math.inf
        if all(span[i][1] > later for i in running):
            continue  # the next start's running pods hold these: its constraints are tighter
        for name, count, capacity in profiles:
            held = [j for i in running for j in by_pod[i] if columns[j][1] == name]
            rows.append([(j, float(columns[j][0].k)) for j in held])
            upper.append(float(count * capacity))
            for k in sorted({columns[j][0].k for j in held if columns[j][2]}):
                most = disjoint_connected_sets(name, k)
                if most * k < capacity:
                    rows.append([(j, 1.0) for j in held if columns[j][2] and columns[j][0].k == k])
                    upper.append(float(count * most))

    def matrix(entries: list[list[tuple[int, float]]]) -> Any:
        cells = [(r, j, v) for r, row in enumerate(entries) for j, v in row]
        rows_, cols_, values_ = zip(*cells, strict=True)
        return coo_array((values_, (rows_, cols_)), shape=(len(entries), len(columns))).tocsr()

    measured = [j for j, (pod, _, joined) in enumerate(columns) if joined and pod.arrival >= warmup]
    cost = [0.0] * len(columns)
    for j in measured:
        cost[j] = -1.0
    solved = linprog(
        cost,
        A_ub=matrix(rows),
        b_ub=upper,
        A_eq=matrix([[(j, 1.0) for j in js] for js in by_pod.values()]),
        b_eq=[1.0] * len(by_pod),
        bounds=(0, 1),
        method="highs",
    )
    assert solved.status == 0, solved.message  # feasible: the run itself is a solution
    k2 = sum(1 for p in pods if p.arrival >= warmup and p.k >= 2)
    return sum(solved.x[j] for j in measured) / k2 if k2 else 1.0


def tie_seed(seed: int, repeat: int) -> int:
    """The seed of the random tie-breaks (node choice, the kubelet's order) of a repeat."""
    return seed + 100_003 * repeat


def run_all(
    layout: Sequence[tuple[str, int]],
    pods: int,
    seed: int,
    loads: Sequence[float] = LOADS,
    node_policies: Sequence[str] = NODE_POLICIES,
    on_node_policies: Sequence[str] = ON_NODE_POLICIES,
    progress: Callable[[Result], None] | None = None,
    repeats: int = 1,
    ranking: str = "fit",
    bound: bool = False,
    connected_wait_s: float = CONNECTED_WAIT_S,
) -> list[Result]:
    """Every combination on the same trace per load, `repeats` times with other tie-breaks; with
    `bound`, the target row's `schedule_bound` too."""
    gpus = cluster_gpus(layout)
    results = []
    for load in loads:
        pod_trace = trace(pods, gpus, load, seed)
        for repeat in range(repeats):
            for node_policy in node_policies:
                for on_node in on_node_policies:
                    result = simulate(
                        layout,
                        pod_trace,
                        node_policy,
                        on_node,
                        load,
                        tie_seed(seed, repeat),
                        ranking=ranking,
                        connected_wait_s=connected_wait_s,
                    )
                    result.seed, result.repeat = seed, repeat
                    if bound and (node_policy, on_node) == TARGET[1:]:
                        result.bound = schedule_bound(layout, pod_trace, result)
                    result.sets.clear()  # only the test reads them; 20 seeds would hold millions
                    results.append(result)
                    if progress is not None:
                        progress(result)
    return results


def _one_seed(
    args: tuple[
        tuple[tuple[str, int], ...],
        int,
        int,
        tuple[float, ...],
        int,
        str,
        tuple[str, ...],
        bool,
        float,
    ],
) -> list[Result]:
    layout, pods, seed, loads, repeats, ranking, node_policies, bound, connected_wait_s = args
    quiet()
    return run_all(
        layout,
        pods,
        seed,
        loads,
        node_policies,
        repeats=repeats,
        ranking=ranking,
        bound=bound,
        connected_wait_s=connected_wait_s,
    )


def run_seeds(
    layout: Sequence[tuple[str, int]],
    pods: int,
    seeds: Sequence[int],
    loads: Sequence[float] = LOADS,
    jobs: int = 1,
    progress: Callable[[Result], None] | None = None,
    repeats: int = 1,
    ranking: str = "fit",
    node_policies: Sequence[str] = NODE_POLICIES,
    bound: bool = False,
    connected_wait_s: float = CONNECTED_WAIT_S,
) -> list[Result]:
    """Every combination on every seed, `jobs` seeds at a time in worker processes."""
    work = [
        (
            tuple(layout),
            pods,
            seed,
            tuple(loads),
            repeats,
            ranking,
            tuple(node_policies),
            bound,
            connected_wait_s,
        )
        for seed in seeds
    ]
    runs: Iterator[list[Result]]
    if jobs <= 1:
        runs = map(_one_seed, work)
    else:
        pool = ProcessPoolExecutor(max_workers=jobs)
        runs = pool.map(_one_seed, work)
    results: list[Result] = []
    for batch in runs:
        for result in batch:
            results.append(result)
            if progress is not None:
                progress(result)
    if jobs > 1:
        pool.shutdown()
    return results


def summary_line(r: Result) -> str:
    """`<offered>% <node choice> <on-node>: occupancy X% nvlink Y%`: the interface line."""
    return (
        f"{r.load:.0%} {r.node_policy} {r.on_node}: occupancy {r.occupancy:.1%} "
        f"nvlink {r.nvlink:.1%}"
    )


def table(results: Sequence[Result]) -> str:
    lines = [
        "| offered | occupancy | node choice | on-node | nvlink (k≥2) | 8-GPU | links vs best "
        "empty | frag | wait (min) | held | dec/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = "—" if r.decisions_per_s is None else f"{r.decisions_per_s:,.0f}"
        eight = "—" if r.eight is None else f"{r.eight:.1%}"
        lines.append(
            f"| {r.load:.0%} | {r.occupancy:.1%} | {r.node_policy} | {r.on_node} | {r.nvlink:.1%} "
            f"| {eight} | {r.links:.2f} | {r.frag:.1%} | {r.wait:,.0f} | {r.held:.1%} | {rate} |"
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


@dataclass(frozen=True, slots=True)
class SeedFigures:
    """One row on one seed: the figures of its repeats, averaged."""

    load: float
    node_policy: str
    on_node: str
    seed: int
    repeats: int
    nvlink: float
    eight: float | None
    occupancy: float
    wait: float
    frag: float
    held: float
    bound: float | None = None
    """The mean `schedule_bound` of its repeats, where computed."""


def per_seed(results: Sequence[Result]) -> list[SeedFigures]:
    """The results averaged over the repeats of each row and seed."""
    groups: dict[tuple[float, str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.load, r.node_policy, r.on_node, r.seed), []).append(r)
    out = []
    for (load, node_policy, on_node, seed), runs in groups.items():
        eights = [r.eight for r in runs if r.eight is not None]
        bounds = [r.bound for r in runs if r.bound is not None]
        out.append(
            SeedFigures(
                load,
                node_policy,
                on_node,
                seed,
                len(runs),
                statistics.mean(r.nvlink for r in runs),
                statistics.mean(eights) if eights else None,
                statistics.mean(r.occupancy for r in runs),
                statistics.mean(r.wait for r in runs),
                statistics.mean(r.frag for r in runs),
                statistics.mean(r.held for r in runs),
                statistics.mean(bounds) if bounds else None,
            )
        )
    return out


def _rows(results: Sequence[Result]) -> dict[tuple[float, str, str], list[SeedFigures]]:
    rows: dict[tuple[float, str, str], list[SeedFigures]] = {}
    for r in per_seed(results):
        rows.setdefault((r.load, r.node_policy, r.on_node), []).append(r)
    for runs in rows.values():
        runs.sort(key=lambda r: r.seed)
    return rows


def upper_reference(results: Sequence[Result]) -> dict[tuple[float, int], SeedFigures]:
    """Per (load, seed), the row with the best `nvlink` any combination reached (averaged over
    its repeats)."""
    best: dict[tuple[float, int], SeedFigures] = {}
    for r in per_seed(results):
        key = (r.load, r.seed)
        if key not in best or r.nvlink > best[key].nvlink:
            best[key] = r
    return best


def seeds_table(results: Sequence[Result]) -> str:
    """Mean, minimum and spread over the seeds, per row."""
    lines = [
        "| offered | node choice | on-node | seeds | nvlink mean | min (seed) | spread "
        "| below ref. (max) | 8-GPU mean | 8-GPU min | occupancy | wait (min) | frag | held |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = upper_reference(results)
    for (load, node_policy, on_node), runs in _rows(results).items():
        nvlink = [r.nvlink for r in runs]
        worst = min(runs, key=lambda r: r.nvlink)
        eights = [r.eight for r in runs if r.eight is not None]
        gap = max(reference[(load, r.seed)].nvlink - r.nvlink for r in runs)
        lines.append(
            f"| {load:.0%} | {node_policy} | {on_node} | {len(runs)} "
            f"| {statistics.mean(nvlink):.1%} | {worst.nvlink:.1%} ({worst.seed}) "
            f"| {max(nvlink) - min(nvlink):.1%} | {gap:.1%} "
            f"| {statistics.mean(eights):.1%} | {min(eights):.1%} "
            f"| {statistics.mean(r.occupancy for r in runs):.1%} "
            f"| {statistics.mean(r.wait for r in runs):,.1f} "
            f"| {statistics.mean(r.frag for r in runs):.1%} "
            f"| {statistics.mean(r.held for r in runs):.1%} |"
        )
    return "\n".join(lines)


def target_table(results: Sequence[Result], target: tuple[float, str, str] = TARGET) -> str:
    """Per seed: the target row beside count-only MostAllocated and the upper reference."""
    load, node_policy, on_node = target
    rows = _rows(results)
    reference = upper_reference(results)
    ours = {r.seed: r for r in rows.get(target, [])}
    count_only = {r.seed: r for r in rows.get((load, "most-allocated", "best"), [])}
    bounds = any(r.bound is not None for r in ours.values())
    lines = [
        f"| seed | occupancy | {node_policy} / {on_node}: nvlink | 8-GPU | wait (min) "
        "| most-allocated / best: nvlink | wait (min) | upper reference: nvlink (row) |"
        + (" schedule bound |" if bounds else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if bounds else ""),
    ]
    for seed in sorted(ours):
        r, c, ref = ours[seed], count_only.get(seed), reference[(load, seed)]
        eight = "—" if r.eight is None else f"{r.eight:.1%}"
        count = "— | —" if c is None else f"{c.nvlink:.1%} | {c.wait:,.0f}"
        bound = "" if not bounds else " — |" if r.bound is None else f" {r.bound:.1%} |"
        lines.append(
            f"| {seed} | {r.occupancy:.1%} | {r.nvlink:.1%} | {eight} | {r.wait:,.0f} | {count} "
            f"| {ref.nvlink:.1%} ({ref.node_policy} / {ref.on_node}) |{bound}"
        )
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> None:
    """The spread over seeds of the NVLink-connected share per row, and the target row per seed
    against the upper reference and count-only MostAllocated."""
    import matplotlib  # noqa: PLC0415 - only this command needs it (the `bench` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = _rows(results)
    loads = sorted({load for load, _, _ in rows})
    columns = 2 if loads else 1
    lines = (len(loads) + 1 + columns - 1) // columns
    fig, axes = plt.subplots(lines, columns, figsize=(7 * columns, 6 * lines), squeeze=False)
    panels = [ax for line in axes for ax in line]
    for spare in panels[len(loads) + 1 :]:
        spare.set_axis_off()
    colours = dict(zip(ON_NODE_POLICIES, ("C0", "C1", "C2", "C3"), strict=True))
    for ax, load in zip(panels, loads, strict=False):
        keys = [
            (load, n, o)
            for n in NODE_POLICIES
            for o in ON_NODE_POLICIES
            if (load, n, o) in rows and not (n == "greedy-best" and o != "best")
        ]
        data = [[r.nvlink * 100 for r in rows[key]] for key in keys]
        boxes = ax.boxplot(data, orientation="horizontal", patch_artist=True, whis=(0, 100))
        for patch, key in zip(boxes["boxes"], keys, strict=True):
            patch.set_facecolor(colours[key[2]])
            patch.set_alpha(0.5)
        ax.set_yticks(range(1, len(keys) + 1), [f"{n} / {o}" for _, n, o in keys], fontsize=7)
        ax.axvline(95, color="grey", linewidth=0.8)
        runs = len(next(iter(rows.values())))
        ax.set(
            xlabel="k ≥ 2 pods on NVLink-connected GPUs (%), min to max over seeds",
            title=f"{load:.0%} offered load, {runs} seeds",
            xlim=(40, 100),
        )
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    ax = panels[len(loads)]
    target = (0.80, TARGET[1], TARGET[2]) if (0.80, *TARGET[1:]) in rows else None
    if target is not None:
        reference = upper_reference(results)
        ours = rows[target]
        seeds = [r.seed for r in ours]
        ax.plot(
            seeds, [r.nvlink * 100 for r in ours], "o-", color="C2", label="extender+most / packing"
        )
        nvidia = rows.get((0.80, "extender+most", "nvidia-besteffort"), [])
        if nvidia:
            ax.plot(
                [r.seed for r in nvidia],
                [r.nvlink * 100 for r in nvidia],
                "s--",
                color="C3",
                label="extender+most / nvidia-besteffort",
            )
        ax.plot(
            seeds,
            [reference[(0.80, s)].nvlink * 100 for s in seeds],
            "^:",
            color="black",
            label="upper reference (best any row)",
        )
        bounded = [r for r in ours if r.bound is not None]
        if bounded:
            ax.plot(
                [r.seed for r in bounded],
                [(r.bound or 0.0) * 100 for r in bounded],
                "v-.",
                color="C4",
                label="schedule bound (extender+most / packing's times)",
            )
        count_only = rows.get((0.80, "most-allocated", "best"), [])
        ax.plot(
            [r.seed for r in count_only],
            [r.nvlink * 100 for r in count_only],
            "x:",
            color="C7",
            label="count-only most-allocated / best",
        )
        occupancy = ax.twinx()
        occupancy.bar(seeds, [r.occupancy * 100 for r in ours], color="C9", alpha=0.15)
        occupancy.set(ylim=(60, 100), ylabel="measured occupancy (%), bars")
        ax.axhline(95, color="grey", linewidth=0.8)
        ax.set(
            xlabel="seed",
            ylabel="k ≥ 2 pods on NVLink-connected GPUs (%)",
            title="80% offered: per seed",
            ylim=(60, 101),
            xticks=seeds,
        )
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Philly-mix trace on 32 mixed nodes (236 GPUs): node choice / on-node choice, spread over "
        "seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# --- Tracing the losses --------------------------------------------------------------------------


@cache
def _connected_set_exists(profile: str, free: frozenset[int], k: int) -> bool:
    if len(free) < k:
        return False
    chosen = best_gpu_set(profile_topology(profile), k, free, policy=Policy.PACKING).gpus
    return connected(profile_topology(profile), chosen)


@cache
def _can_connect(profile: str, k: int) -> bool:
    """Whether an empty node of this profile has a connected k-set."""
    topology = profile_topology(profile)
    return _connected_set_exists(profile, frozenset(range(len(topology.gpus))), k)


@cache
def _nvlink_free(profile: str) -> bool:
    """Whether the profile has no NVLink at all: its GPUs can serve only one-GPU pods connected."""
    return not profile_topology(profile).islands


class LossTracer:
    """Observes a run and records every k >= 2 placement that got no connected set (see the module
    docstring), with the placements it needs to explain a `cluster` loss."""

    def __init__(self) -> None:
        self.losses: list[dict[str, Any]] = []
        self.placed: dict[int, tuple[str, int, frozenset[int], float]] = {}
        """pod id -> (node, k, the larger sizes K for which a node that cannot give a connected
        K-set had a connected k-set then, end minute)."""

    def __call__(self, d: Decision) -> None:
        k = d.pod.k
        spare = frozenset(
            size
            for size, _ in SIZES
            if size > k
            and any(
                not _can_connect(n.profile, size)
                and _connected_set_exists(n.profile, frozenset(n.free), k)
                for n in d.nodes
            )
        )
        self.placed[d.pod.id] = (d.node.name, k, spare, d.now + d.pod.minutes)
        if k < 2 or connected(d.node.topology, d.gpus):
            return
        here = _connected_set_exists(d.node.profile, frozenset(d.node.free), k)
        elsewhere = [
            n.name for n in d.nodes if _connected_set_exists(n.profile, frozenset(n.free), k)
        ]
        kind = "on-node" if here else "node-choice" if elsewhere else "cluster"
        packing = best_gpu_set(d.node.topology, k, d.node.free, policy=Policy.PACKING).gpus
        loss: dict[str, Any] = {
            "minute": round(d.now, 1),
            "pod": d.pod.id,
            "k": k,
            "waited": round(d.now - d.pod.arrival, 1),
            "class": kind,
            "node": d.node.name,
            "free": sorted(d.node.free),
            "took": list(d.gpus),
            "packing_would_take": list(packing),
            "ranking": [[n.name, total] for n, total in d.ranking[:4]],
            "connected_elsewhere": elsewhere[:4],
        }
        if kind == "cluster":
            loss["holders"] = self._holders(d, k)
        self.losses.append(loss)

    def _holders(self, d: Decision, k: int) -> dict[str, int]:
        """What held the GPUs of the nodes that could give a connected k-set when empty."""
        capable = {n.name for n in d.nodes if _can_connect(n.profile, k)}
        held: Counter[str] = Counter()
        for pod_id, (name, size, spare, end) in self.placed.items():
            if name in capable and pod_id != d.pod.id and end > d.now:
                held[f"pods of {size}"] += 1
                held[f"GPUs of pods of {size}"] += size
                if k in spare:
                    held["smaller pods placed there while another node had a connected set"] += 1
        held["free GPUs on those nodes"] = sum(len(n.free) for n in d.nodes if n.name in capable)
        held["free GPUs on nodes without NVLink"] = sum(
            len(n.free) for n in d.nodes if _nvlink_free(n.profile)
        )
        return dict(held)


def trace_losses(
    layout: Sequence[tuple[str, int]],
    pods: int,
    seed: int,
    load: float,
    out: Path,
    ranking: str = "fit",
    connected_wait_s: float = CONNECTED_WAIT_S,
) -> list[tuple[Result, Counter[tuple[int, str]]]]:
    """The loss trace of `extender+most` beside every on-node choice; one JSON line per loss."""
    pod_trace = trace(pods, cluster_gpus(layout), load, seed)
    warmup = pod_trace[len(pod_trace) // 4].arrival
    summaries = []
    with out.open("w", encoding="utf-8") as f:
        for on_node in ON_NODE_POLICIES:
            tracer = LossTracer()
            result = simulate(
                layout,
                pod_trace,
                "extender+most",
                on_node,
                load,
                seed,
                tracer,
                ranking,
                connected_wait_s,
            )
            classes: Counter[tuple[int, str]] = Counter()
            for loss in tracer.losses:
                if pod_trace[loss["pod"]].arrival < warmup:
                    continue
                classes[(loss["k"], loss["class"])] += 1
                f.write(json.dumps({"on_node": on_node, **loss}) + "\n")
            summaries.append((result, classes))
    return summaries


def quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def _duration(text: str) -> float:
    try:
        return parse_duration(text, name="--connected-wait")
    except ParseError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _loads(text: str) -> tuple[float, ...]:
    return tuple(int(part) / 100 for part in text.split(",") if part.strip())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=3000, help="pods per run (default 3000)")
    parser.add_argument("--seed", type=int, help="run this one seed (tables for it alone)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="run N seeds (default 20)")
    parser.add_argument(
        "--first-seed", type=int, default=1, help="the first of the N seeds (default 1)"
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="compute the target row's schedule bound per seed (a linear program: highspy)",
    )
    parser.add_argument(
        "--loads", type=_loads, default=LOADS, help="offered loads in %% (default 50,80,95)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (processes)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per seed with other random tie-breaks, averaged (default 1)",
    )
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    parser.add_argument("--json", type=Path, help="write every run's figures here (JSON lines)")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="print the tables (and --plot) of the runs a --json file holds, running nothing",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="with --seed: write the lost connected sets here (JSON lines), at the first of "
        "--loads (default 80)",
    )
    parser.add_argument(
        "--node-choices",
        type=lambda text: tuple(part for part in text.split(",") if part),
        default=NODE_POLICIES,
        help=f"the node choices to run, comma-separated (default all: {','.join(NODE_POLICIES)})",
    )
    parser.add_argument(
        "--ranking",
        choices=sorted(RANKINGS),
        default="fit",
        help="the extender's node score: fit (default: node_score, by the whole-node fit), v2 (by "
        "the free fit, before availability version 3) or v1 (the one best fit replaced)",
    )
    parser.add_argument(
        "--connected-wait",
        type=_duration,
        default=CONNECTED_WAIT_S,
        help="how long the extender holds a pod of k >= 2 GPUs for an NVLink-connected set "
        f"(its --connected-wait: 90s, 30m, 2h; 0 never; default {CONNECTED_WAIT_S / 3600:g}h)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.node_choices) - set(NODE_POLICIES))
    if unknown:
        parser.error(f"--node-choices: {unknown[0]} is not one of {', '.join(NODE_POLICIES)}")
    quiet()
    if args.from_json is not None:
        results = [Result(**json.loads(line)) for line in args.from_json.read_text().splitlines()]
        for r in results:
            r.by_k = {int(k): (v[0], v[1]) for k, v in r.by_k.items()}
        print(seeds_table(results))
        print()
        print(target_table(results))
        if args.plot is not None:
            plot(results, args.plot)
        return
    if args.trace is not None:
        if args.seed is None:
            parser.error("--trace needs --seed")
        load = TARGET[0] if args.loads == LOADS else args.loads[0]
        for result, classes in trace_losses(
            DEFAULT_CLUSTER,
            args.pods,
            args.seed,
            load,
            args.trace,
            args.ranking,
            args.connected_wait,
        ):
            print(summary_line(result), dict(sorted(classes.items())), flush=True)
        return
    if args.seed is not None:
        results = run_all(
            DEFAULT_CLUSTER,
            args.pods,
            args.seed,
            args.loads,
            args.node_choices,
            progress=lambda r: print(summary_line(r), flush=True),
            ranking=args.ranking,
            connected_wait_s=args.connected_wait,
        )
        print(table(results))
        print()
        print(table_by_k([r for r in results if r.on_node in ("best", "packing")]))
    else:
        results = run_seeds(
            DEFAULT_CLUSTER,
            args.pods,
            range(args.first_seed, args.first_seed + args.seeds),
            args.loads,
            args.jobs,
            progress=lambda r: print(f"seed {r.seed}.{r.repeat}: {summary_line(r)}", flush=True),
            repeats=args.repeats,
            ranking=args.ranking,
            node_policies=args.node_choices,
            bound=args.bound,
            connected_wait_s=args.connected_wait,
        )
        print(seeds_table(results))
        print()
        print(target_table(results))
    if args.json is not None:
        with args.json.open("w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({k: v for k, v in asdict(r).items() if k != "sets"}) + "\n")
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
