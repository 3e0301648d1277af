"""The engine bench/racks.py and bench/leaf_groups.py share: a trace of multi-node jobs, the event
loop that places it on a cluster with one node-choice policy, the metrics every such bench reports
and the table. Each bench keeps its cluster, its policies and its own metrics.

Trace: jobs of N whole nodes (one pod per node), arriving as a Poisson process and running for a
drawn time.
- sizes (stated, not measured: no public trace of multi-node GPU jobs exists): 1, 2, 4, 8 and 16
  nodes with weights 35%, 20%, 20%, 15%, 10%: mean 4.35 nodes;
- durations: the Philly distribution that bench/placement.py uses (Gavel's sampling of Microsoft's
  trace): 80% of jobs run 10^U(1.5, 3) minutes, 20% run 10^U(3, 4) minutes.
The arrival rate sets the offered load (rate x mean nodes x mean minutes) to 50%, 80% or 95% of
the nodes.

Event loop: pending jobs are retried in arrival order after every arrival and every end; a job
never waits behind one that does not fit, as Kueue's BestEffortFIFO queues do. A job the policy
cannot place even on an empty cluster would wait for ever: it is counted (`never`), not queued.

Metrics, over the jobs that arrive after the warm-up (the first quarter of arrivals):
- `util`: GPUs busy, time-averaged between the end of the warm-up and the last arrival;
- `frag`: share of jobs that waited while the cluster held N free nodes but the policy's groups
  did not;
- `wait`: mean minutes from arrival to start over the placed jobs, and over the jobs of the
  watched size.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

LOADS = (0.50, 0.80, 0.95)
SIZES = ((1, 0.35), (2, 0.20), (4, 0.20), (8, 0.15), (16, 0.10))
SHORT_SHARE, SHORT_LOG_MINUTES, LONG_LOG_MINUTES = 0.80, (1.5, 3.0), (3.0, 4.0)


def _mean_log_uniform(low: float, high: float) -> float:
    """E[10^U(low, high)]."""
    return (10**high - 10**low) / ((high - low) * math.log(10))


MEAN_NODES = sum(n * p for n, p in SIZES)
MEAN_MINUTES = SHORT_SHARE * _mean_log_uniform(*SHORT_LOG_MINUTES) + (
    1 - SHORT_SHARE
) * _mean_log_uniform(*LONG_LOG_MINUTES)


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
    sizes = [n for n, _ in SIZES]
    weights = [w for _, w in SIZES]
    out, now = [], 0.0
    for i in range(jobs):
        now += rng.expovariate(rate)
        size = rng.choices(sizes, weights)[0]
        low, high = SHORT_LOG_MINUTES if rng.random() < SHORT_SHARE else LONG_LOG_MINUTES
        out.append(Job(id=i, nodes=size, arrival=now, minutes=10 ** rng.uniform(low, high)))
    return out


class Named(Protocol):
    """A node of a bench's cluster: the engine needs only its name."""

    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)
Chooser = Callable[[list[N], set[str], int, random.Random], list[N] | None]
"""A node-choice policy: (cluster, names of the busy nodes, job size, the run's random source) to
the nodes chosen, or None where the job must wait."""


@dataclass(slots=True)
class Result:
    """What one run measured: the engine's metrics; each bench's subclass adds its own."""

    policy: str
    load: float
    seed: int
    util: float = 0.0
    frag: float = 0.0
    wait: float = 0.0
    wait_watched: float = 0.0
    placements: dict[int, tuple[tuple[str, ...], float, float]] = field(default_factory=dict)
    """job id -> (nodes, start, end): every placement, for the invariants the tests check."""
    never: set[int] = field(default_factory=set)
    """Ids of the jobs the policy can place on no state of the cluster."""
    measured: set[int] = field(default_factory=set)
    """Ids of the jobs that arrive after the warm-up."""

    def measured_multi_node(self) -> list[tuple[str, ...]]:
        """The nodes of each measured job of two or more nodes that ran, in the order they
        started."""
        return [
            names
            for job_id, (names, _, _) in self.placements.items()
            if job_id in self.measured and len(names) >= 2
        ]


R = TypeVar("R", bound=Result)


def count_only(nodes: list[N], busy: set[str], size: int, rng: random.Random) -> list[N] | None:
    """Any `size` free nodes, picked at random: the kube-scheduler scores every empty node alike
    for a whole-node pod, and gang schedulers that count admit on the total."""
    free = [n for n in nodes if n.name not in busy]
    return rng.sample(free, size) if len(free) >= size else None


def simulate(nodes: list[N], jobs: list[Job], choose: Chooser[N], watched: int, result: R) -> R:
    """Run `jobs` through the cluster `nodes` with one node-choice policy, filling `result`'s
    engine metrics; the bench computes its own from `result.placements`."""
    rng = random.Random(result.seed)
    never_sizes = {j.nodes for j in jobs if choose(nodes, set(), j.nodes, random.Random(0)) is None}
    warmup = jobs[len(jobs) // 4].arrival if jobs else 0.0
    end = jobs[-1].arrival if jobs else 0.0
    result.measured = {j.id for j in jobs if j.arrival >= warmup}
    events: list[tuple[float, int, int]] = [(j.arrival, 0, j.id) for j in jobs]  # 0 arrive, 1 end
    heapq.heapify(events)
    pending: list[Job] = []
    busy: set[str] = set()
    held: dict[int, list[str]] = {}
    fragmented: set[int] = set()
    last, busy_time = warmup, 0.0
    waits: list[float] = []
    waits_watched: list[float] = []
    while events:
        now, kind, job_id = heapq.heappop(events)
        if warmup <= now:
            upto = min(now, end)
            if upto > last:
                busy_time += len(busy) * (upto - last)
                last = upto
        if kind == 0:
            if jobs[job_id].nodes in never_sizes:
                result.never.add(job_id)
            else:
                pending.append(jobs[job_id])
        else:
            busy.difference_update(held.pop(job_id))
        still: list[Job] = []
        for job in pending:
            enough = len(nodes) - len(busy) >= job.nodes
            chosen = choose(nodes, busy, job.nodes, rng) if enough else None
            if chosen is None:
                if enough:
                    fragmented.add(job.id)
                still.append(job)
                continue
            names = [n.name for n in chosen]
            busy.update(names)
            held[job.id] = names
            result.placements[job.id] = (tuple(names), now, now + job.minutes)
            heapq.heappush(events, (now + job.minutes, 1, job.id))
            if job.id in result.measured:
                waits.append(now - job.arrival)
                if job.nodes == watched:
                    waits_watched.append(now - job.arrival)
        pending = still
    assert not pending, "a job that fits an empty cluster never ran"
    measured = result.measured
    result.util = busy_time / (len(nodes) * (end - warmup)) if end > warmup else 0.0
    result.frag = len(fragmented & measured) / len(measured) if measured else 0.0
    result.wait = statistics.fmean(waits) if waits else 0.0
    result.wait_watched = statistics.fmean(waits_watched) if waits_watched else 0.0
    return result


@dataclass(frozen=True, slots=True)
class Column:
    """One metric column of the table: a `Result` attribute, scaled and formatted."""

    header: str
    attribute: str
    fmt: str = ".1f"
    scale: float = 1.0
    suffix: str = ""


def share(header: str, attribute: str) -> Column:
    """A column of a share in [0, 1], printed as a percentage."""
    return Column(header, attribute, ".1f", 100, "%")


def _spread(values: Sequence[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


@dataclass(frozen=True, slots=True)
class Bench(Generic[N, R]):
    """One bench: its `simulate` (the engine's loop, then its own metrics), its policies and the
    columns of its table."""

    simulate: Callable[[list[N], list[Job], str, float, int], R]
    policies: Sequence[str]
    columns: Sequence[Column]

    def run_all(
        self,
        nodes: list[N],
        jobs: int,
        seeds: Sequence[int],
        loads: Sequence[float] = LOADS,
        progress: Callable[[R], None] | None = None,
    ) -> list[R]:
        """Every policy on the same trace per load and seed."""
        results = []
        for load in loads:
            for seed in seeds:
                job_trace = trace(jobs, len(nodes), load, seed)
                for policy in self.policies:
                    result = self.simulate(nodes, job_trace, policy, load, seed)
                    results.append(result)
                    if progress is not None:
                        progress(result)
        return results

    def table(self, results: Sequence[R]) -> str:
        """Per load and policy: the mean over seeds, with the range across seeds in brackets."""
        lines = [
            "| offered | policy | " + " | ".join(c.header for c in self.columns) + " |",
            "|---" * (2 + len(self.columns)) + "|",
        ]
        for load in sorted({r.load for r in results}):
            for policy in self.policies:
                rows = [r for r in results if r.load == load and r.policy == policy]
                if not rows:
                    continue
                cells = "".join(
                    f"| {_spread([getattr(r, c.attribute) * c.scale for r in rows], c.fmt)}"
                    f"{c.suffix} "
                    for c in self.columns
                )
                lines.append(f"| {load:.0%} | {policy} {cells}|")
        return "\n".join(lines)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every such bench takes: the trace's length and the seeds."""
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per run (default 2000)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
