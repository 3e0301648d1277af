"""Multi-node jobs on NVL72 racks: what a required partition level buys, and what it costs.

    python -m bench.racks [--jobs 2000] [--seeds 5] [--plot bench/racks.png]

Cluster (default, 576 GPUs): 8 GB200 NVL72 racks of 18 nodes x 4 GPUs. Each rack is one NVLink
domain (a cluster UUID); racks 0-5 are one partition (x72) each, racks 6 and 7 are split into two
x36 partitions of 9 nodes. Clique IDs repeat across racks as fabric managers assign them
(dra-driver-nvidia-gpu#377: two racks both reported clique 17044): racks 0 and 1 both carry clique
17044, racks 6 and 7 both carry cliques 1 and 2. Each node's domain and partition are the
`nvlink-domain` and `nvlink-partition` labels of the layout (`layout()`).

Trace: jobs of N pods x 4 GPUs (one pod per node, the whole node: what a multi-node NVLink job
asks for), arriving as a Poisson process and running for a drawn time.
- sizes (stated, not measured: no public trace of NVL72 jobs exists): 1, 2, 4, 8 and 16 nodes
  (4 to 64 GPUs) with weights 35%, 20%, 20%, 15%, 10%: mean 4.35 nodes. A 16-node job fits only an
  unsplit rack's partition;
- durations: the Philly distribution that bench/placement.py uses (Gavel's sampling of Microsoft's
  trace): 80% of jobs run 10^U(1.5, 3) minutes, 20% run 10^U(3, 4) minutes.
The arrival rate sets the offered load (rate x mean nodes x mean minutes) to 50%, 80% or 95% of
the nodes.

Node choice for a job, each on the same trace (pending jobs retried in arrival order after every
event; a job never waits behind one that does not fit, as Kueue's BestEffortFIFO queues do):
- `count-only`: any N free nodes, picked at random: the kube-scheduler scores every empty node
  alike for a whole-node pod, and gang schedulers that count (Kueue without TAS, YuniKorn's task
  groups, Volcano without networkTopology) admit on the total;
- `clique-id`: the pods must share a group keyed on the clique ID alone (a label that carries only
  the number, the key #377 warns about): one group per clique ID, across racks;
- `partition`: Kueue TAS with `kueue.x-k8s.io/podset-required-topology:
  gpu.topology.io/nvlink-partition`: all pods in one partition; among partitions with N free nodes
  the one with the fewest (Kueue's BestFit); a job that fits no partition waits, never split;
- `partition-preferred`: `podset-preferred-topology` on the same label: one partition where one
  fits (BestFit), else one domain (rack), else the free nodes of the partitions with the most free
  nodes first (as few domains as it can).

Metrics, over the jobs that arrive after the warm-up (the first quarter of arrivals):
- `one partition`: share of multi-node jobs (N >= 2) whose pods are all in one partition;
- `split racks`: share of multi-node jobs whose pods span two or more racks (domains): across
  racks there is no NVLink; the job runs over the network at a fraction of the bandwidth, or
  fails outright (#377);
- `util`: GPUs busy, time-averaged between the end of the warm-up and the last arrival;
- `frag`: share of jobs that waited while the cluster held N free nodes but the policy's groups
  did not;
- `wait`: mean minutes from arrival to start, over all jobs and over the 16-node jobs.
Seeded and deterministic: the same seeds give the same tables.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NODES_PER_RACK = 18
GPUS_PER_NODE = 4
DEFAULT_RACKS = 8
SPLIT_RACKS = (6, 7)
"""Racks divided into two x36 partitions of 9 nodes."""
SHARED_CLIQUES = {0: (17044,), 1: (17044,), 6: (1, 2), 7: (1, 2)}
"""Clique IDs per rack where two racks repeat them; the others get their own."""

POLICIES = ("count-only", "clique-id", "partition", "partition-preferred")
LOADS = (0.50, 0.80, 0.95)
SIZES = ((1, 0.35), (2, 0.20), (4, 0.20), (8, 0.15), (16, 0.10))
SHORT_SHARE, SHORT_LOG_MINUTES, LONG_LOG_MINUTES = 0.80, (1.5, 3.0), (3.0, 4.0)
UUID_NAMESPACE = uuid.UUID("6f0b2f5e-6c1e-4f1e-9a57-4e5b1d2c3a40")
"""Fixed, so a rack's cluster UUID is the same in every run."""


def _mean_log_uniform(low: float, high: float) -> float:
    """E[10^U(low, high)]."""
    return (10**high - 10**low) / ((high - low) * math.log(10))


MEAN_NODES = sum(n * p for n, p in SIZES)
MEAN_MINUTES = SHORT_SHARE * _mean_log_uniform(*SHORT_LOG_MINUTES) + (
    1 - SHORT_SHARE
) * _mean_log_uniform(*LONG_LOG_MINUTES)


@dataclass(frozen=True, slots=True)
class RackNode:
    """A node of a rack, as its labels describe it."""

    name: str
    domain: str
    """`gpu.topology.io/nvlink-domain`: the rack's cluster UUID."""
    partition: str
    """`gpu.topology.io/nvlink-partition`: `<clusterUUID>.<cliqueId>`."""

    @property
    def clique(self) -> str:
        """The clique ID alone: what a key without the cluster UUID sees."""
        return self.partition.rpartition(".")[2]


def layout(racks: int = DEFAULT_RACKS) -> list[RackNode]:
    """The default cluster of the module docstring: racks of 18 nodes, some split, some sharing
    clique IDs."""
    nodes: list[RackNode] = []
    for rack in range(racks):
        domain = str(uuid.uuid5(UUID_NAMESPACE, f"rack-{rack}"))
        parts = 2 if rack in SPLIT_RACKS else 1
        cliques = SHARED_CLIQUES.get(rack, tuple(32000 + 2 * rack + p for p in range(parts)))
        for slot in range(NODES_PER_RACK):
            clique = cliques[slot * parts // NODES_PER_RACK]
            nodes.append(RackNode(f"rack{rack}-node{slot:02d}", domain, f"{domain}.{clique}"))
    return nodes


@dataclass(frozen=True, slots=True)
class Job:
    """One job of the trace: its node count, arrival and run time in minutes."""

    id: int
    nodes: int
    arrival: float
    minutes: float


def trace(jobs: int, nodes: int, load: float, seed: int) -> list[Job]:
    """`jobs` jobs whose offered load is `load` of `nodes` nodes; seeded."""
    rng = random.Random(seed)
    rate = load * nodes / (MEAN_NODES * MEAN_MINUTES)  # jobs per minute
    sizes, weights = zip(*SIZES, strict=True)
    out, now = [], 0.0
    for i in range(jobs):
        now += rng.expovariate(rate)
        size = rng.choices(sizes, weights)[0]
        low, high = SHORT_LOG_MINUTES if rng.random() < SHORT_SHARE else LONG_LOG_MINUTES
        out.append(Job(id=i, nodes=size, arrival=now, minutes=10 ** rng.uniform(low, high)))
    return out


Chooser = Callable[[list[RackNode], set[str], int, random.Random], list[RackNode] | None]


def _groups(free: list[RackNode], key: Callable[[RackNode], str]) -> dict[str, list[RackNode]]:
    out: dict[str, list[RackNode]] = {}
    for node in free:
        out.setdefault(key(node), []).append(node)
    return out


def _best_fit(groups: dict[str, list[RackNode]], size: int) -> list[RackNode] | None:
    """The group with the fewest free nodes that still holds `size` (ties: the first by name)."""
    fits = [(len(members), name) for name, members in groups.items() if len(members) >= size]
    if not fits:
        return None
    _, name = min(fits)
    return groups[name][:size]


def count_only(
    nodes: list[RackNode], busy: set[str], size: int, rng: random.Random
) -> list[RackNode] | None:
    free = [n for n in nodes if n.name not in busy]
    return rng.sample(free, size) if len(free) >= size else None


def clique_id(
    nodes: list[RackNode], busy: set[str], size: int, rng: random.Random
) -> list[RackNode] | None:
    free = [n for n in nodes if n.name not in busy]
    groups = _groups(free, lambda n: n.clique)
    fits = [g for g in groups.values() if len(g) >= size]
    if not fits:
        return None
    # The same BestFit over the wrong key: the group's nodes, whichever rack they are in.
    chosen = min(fits, key=lambda g: (len(g), g[0].name))
    return rng.sample(chosen, size)


def partition(
    nodes: list[RackNode], busy: set[str], size: int, rng: random.Random
) -> list[RackNode] | None:
    free = [n for n in nodes if n.name not in busy]
    return _best_fit(_groups(free, lambda n: n.partition), size)


def partition_preferred(
    nodes: list[RackNode], busy: set[str], size: int, rng: random.Random
) -> list[RackNode] | None:
    free = [n for n in nodes if n.name not in busy]
    if len(free) < size:
        return None
    chosen = _best_fit(_groups(free, lambda n: n.partition), size)
    if chosen is None:
        chosen = _best_fit(_groups(free, lambda n: n.domain), size)
    if chosen is None:
        by_partition = sorted(
            _groups(free, lambda n: n.partition).values(), key=lambda g: (-len(g), g[0].name)
        )
        chosen = [n for group in by_partition for n in group][:size]
    return chosen


CHOOSERS: dict[str, Chooser] = {
    "count-only": count_only,
    "clique-id": clique_id,
    "partition": partition,
    "partition-preferred": partition_preferred,
}


@dataclass(slots=True)
class Result:
    """What one run measured (see the module docstring for each metric)."""

    policy: str
    load: float
    seed: int
    one_partition: float = 0.0
    split_racks: float = 0.0
    util: float = 0.0
    frag: float = 0.0
    wait: float = 0.0
    wait_largest: float = 0.0
    placements: dict[int, tuple[tuple[str, ...], float, float]] = field(default_factory=dict)
    """job id -> (nodes, start, end): every placement, for the invariants the test checks."""


def simulate(nodes: list[RackNode], jobs: list[Job], policy: str, load: float, seed: int) -> Result:
    """Run `jobs` through the cluster `nodes` with one node-choice policy."""
    choose = CHOOSERS[policy]
    rng = random.Random(seed)
    by_name = {n.name: n for n in nodes}
    result = Result(policy, load, seed)
    warmup = jobs[len(jobs) // 4].arrival if jobs else 0.0
    end = jobs[-1].arrival if jobs else 0.0
    measured = {j.id for j in jobs if j.arrival >= warmup}
    largest = max((n for n, _ in SIZES), default=0)
    events: list[tuple[float, int, int]] = [(j.arrival, 0, j.id) for j in jobs]  # 0 arrive, 1 end
    heapq.heapify(events)
    pending: list[Job] = []
    busy: set[str] = set()
    held: dict[int, list[str]] = {}
    fragmented: set[int] = set()
    last, busy_time = warmup, 0.0
    waits: list[float] = []
    waits_largest: list[float] = []
    multi = in_one = across = 0
    while events:
        now, kind, job_id = heapq.heappop(events)
        if now > last and warmup <= now:
            upto = min(now, end)
            if upto > last:
                busy_time += len(busy) * (upto - last)
                last = upto
        if kind == 0:
            pending.append(jobs[job_id])
        else:
            busy.difference_update(held.pop(job_id))
        still: list[Job] = []
        for job in pending:
            chosen = (
                choose(nodes, busy, job.nodes, rng) if len(nodes) - len(busy) >= job.nodes else None
            )
            if chosen is None:
                if len(nodes) - len(busy) >= job.nodes:
                    fragmented.add(job.id)
                still.append(job)
                continue
            names = [n.name for n in chosen]
            busy.update(names)
            held[job.id] = names
            result.placements[job.id] = (tuple(names), now, now + job.minutes)
            heapq.heappush(events, (now + job.minutes, 1, job.id))
            if job.id not in measured:
                continue
            waits.append(now - job.arrival)
            if job.nodes == largest:
                waits_largest.append(now - job.arrival)
            if job.nodes >= 2:
                multi += 1
                in_one += len({by_name[n].partition for n in names}) == 1
                across += len({by_name[n].domain for n in names}) > 1
        pending = still
    assert not pending, "a job larger than every group never runs"
    result.one_partition = in_one / multi if multi else 0.0
    result.split_racks = across / multi if multi else 0.0
    result.util = busy_time / (len(nodes) * (end - warmup)) if end > warmup else 0.0
    result.frag = len(fragmented & measured) / len(measured) if measured else 0.0
    result.wait = statistics.fmean(waits) if waits else 0.0
    result.wait_largest = statistics.fmean(waits_largest) if waits_largest else 0.0
    return result


def run_all(
    nodes: list[RackNode],
    jobs: int,
    seeds: Sequence[int],
    loads: Sequence[float] = LOADS,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Every policy on the same trace per load and seed."""
    results = []
    for load in loads:
        for seed in seeds:
            job_trace = trace(jobs, len(nodes), load, seed)
            for policy in policies:
                result = simulate(nodes, job_trace, policy, load, seed)
                results.append(result)
                if progress is not None:
                    progress(result)
    return results


def _spread(values: Sequence[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def table(results: Sequence[Result]) -> str:
    """Per load and policy: the mean over seeds, with the range across seeds in brackets."""
    lines = [
        "| offered | policy | one partition (N≥2) | split racks (N≥2) | util | frag "
        "| wait (min) | wait 16-node (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in sorted({r.load for r in results}):
        for policy in POLICIES:
            rows = [r for r in results if r.load == load and r.policy == policy]
            if not rows:
                continue
            lines.append(
                f"| {load:.0%} | {policy} "
                f"| {_spread([r.one_partition * 100 for r in rows], '.1f')}% "
                f"| {_spread([r.split_racks * 100 for r in rows], '.1f')}% "
                f"| {_spread([r.util * 100 for r in rows], '.1f')}% "
                f"| {_spread([r.frag * 100 for r in rows], '.1f')}% "
                f"| {_spread([r.wait for r in rows], ',.0f')} "
                f"| {_spread([r.wait_largest for r in rows], ',.0f')} |"
            )
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> None:
    """Inside one partition, split across racks, utilization and waits against offered load."""
    import matplotlib  # noqa: PLC0415 - only this command needs it (the `bench` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    panels = (
        ("one_partition", 100, "multi-node jobs in one partition (%)"),
        ("split_racks", 100, "multi-node jobs split across racks (%)"),
        ("util", 100, "GPU utilization (%)"),
        ("wait", 1, "mean wait (minutes)"),
    )
    for ax, (metric, scale, label) in zip(axes, panels, strict=True):
        for i, policy in enumerate(POLICIES):
            loads = sorted({r.load for r in results if r.policy == policy})
            means, lows, highs = [], [], []
            for load in loads:
                values = [
                    getattr(r, metric) * scale
                    for r in results
                    if r.policy == policy and r.load == load
                ]
                means.append(statistics.fmean(values))
                lows.append(statistics.fmean(values) - min(values))
                highs.append(max(values) - statistics.fmean(values))
            ax.errorbar(
                [load * 100 for load in loads],
                means,
                yerr=[lows, highs],
                marker="o",
                capsize=3,
                color=f"C{i}",
                label=policy,
            )
        ax.set(xlabel="offered load (% of nodes)", ylabel=label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 105)
    axes[1].set_ylim(0, 105)
    axes[0].legend(fontsize=8, loc="lower left")
    nodes = len(layout())
    fig.suptitle(
        f"N pods x 4 GPUs on {nodes // NODES_PER_RACK} NVL72 racks ({nodes * GPUS_PER_NODE} GPUs;"
        " 2 racks split in x36, 2 pairs sharing clique IDs): node choice per job, mean and range"
        " over seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per run (default 2000)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    args = parser.parse_args()
    nodes = layout()
    results = run_all(
        nodes,
        args.jobs,
        range(1, args.seeds + 1),
        progress=lambda r: print(
            f"{r.load:.0%} seed {r.seed} {r.policy}: one partition {r.one_partition:.1%} "
            f"split racks {r.split_racks:.1%} util {r.util:.1%}",
            flush=True,
        ),
    )
    print(table(results))
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
