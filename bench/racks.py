"""Multi-node jobs on NVL72 racks: what a required partition level buys, and what it costs.

    python -m bench.racks [--jobs 2000] [--seeds 5] [--plot bench/racks.png]

Cluster (default, 576 GPUs): 8 GB200 NVL72 racks of 18 nodes x 4 GPUs. Each rack is one NVLink
domain (a cluster UUID); racks 0-5 are one partition (x72) each, racks 6 and 7 are split into two
x36 partitions of 9 nodes. Clique IDs repeat across racks as fabric managers assign them
(dra-driver-nvidia-gpu#377: two racks both reported clique 17044): racks 0 and 1 both carry clique
17044, racks 6 and 7 both carry cliques 1 and 2. Each node's domain and partition are the
`nvlink-domain` and `nvlink-partition` labels of the layout (`layout()`).

Trace: bench/multinode.py's (`multinode.trace`): jobs of N pods x 4 GPUs (one pod per node, the
whole node: what a multi-node NVLink job asks for) of 1, 2, 4, 8 and 16 nodes (35, 20, 20, 15,
10%; mean 4.35 nodes), Poisson arrivals, Philly durations, offered at 50%, 80% and 95% of the
nodes. A 16-node job fits only an unsplit rack's partition.

Node choice for a job, each on the same trace and through the same event loop (bench/multinode.py:
pending jobs retried in arrival order after every event, as Kueue's BestEffortFIFO queues do):
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
import random
import statistics
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import multinode

NODES_PER_RACK = 18
GPUS_PER_NODE = 4
DEFAULT_RACKS = 8
SPLIT_RACKS = (6, 7)
"""Racks divided into two x36 partitions of 9 nodes."""
SHARED_CLIQUES = {0: (17044,), 1: (17044,), 6: (1, 2), 7: (1, 2)}
"""Clique IDs per rack where two racks repeat them; the others get their own."""

POLICIES = ("count-only", "clique-id", "partition", "partition-preferred")
UUID_NAMESPACE = uuid.UUID("6f0b2f5e-6c1e-4f1e-9a57-4e5b1d2c3a40")
"""Fixed, so a rack's cluster UUID is the same in every run."""
LARGEST = max(n for n, _ in multinode.SIZES)
"""The job size whose wait is reported apart."""


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


Chooser = multinode.Chooser[RackNode]


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
    "count-only": multinode.count_only,
    "clique-id": clique_id,
    "partition": partition,
    "partition-preferred": partition_preferred,
}


@dataclass(slots=True)
class Result(multinode.Result):
    """What one run measured (see the module docstring for each metric)."""

    one_partition: float = 0.0
    split_racks: float = 0.0


COLUMNS = (
    multinode.share("one partition (N≥2)", "one_partition"),
    multinode.share("split racks (N≥2)", "split_racks"),
    multinode.share("util", "util"),
    multinode.share("frag", "frag"),
    multinode.Column("wait (min)", "wait", ",.0f"),
    multinode.Column(f"wait {LARGEST}-node (min)", "wait_watched", ",.0f"),
)


def simulate(
    nodes: list[RackNode], jobs: list[multinode.Job], policy: str, load: float, seed: int
) -> Result:
    """Run `jobs` through the cluster `nodes` with one node-choice policy."""
    result = multinode.simulate(nodes, jobs, CHOOSERS[policy], LARGEST, Result(policy, load, seed))
    by_name = {n.name: n for n in nodes}
    multi = result.measured_multi_node()
    in_one = sum(len({by_name[n].partition for n in names}) == 1 for names in multi)
    across = sum(len({by_name[n].domain for n in names}) > 1 for names in multi)
    result.one_partition = in_one / len(multi) if multi else 0.0
    result.split_racks = across / len(multi) if multi else 0.0
    return result


BENCH = multinode.Bench(simulate, POLICIES, COLUMNS)


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
    multinode.add_trace_arguments(parser)
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    args = parser.parse_args()
    nodes = layout()
    results = BENCH.run_all(
        nodes,
        args.jobs,
        range(1, args.seeds + 1),
        progress=lambda r: print(
            f"{r.load:.0%} seed {r.seed} {r.policy}: one partition {r.one_partition:.1%} "
            f"split racks {r.split_racks:.1%} util {r.util:.1%}",
            flush=True,
        ),
    )
    print(BENCH.table(results))
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
