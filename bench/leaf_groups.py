"""Multi-node jobs on an InfiniBand fabric's leaf groups: what a required or preferred
`network-tier-0` buys, and what it costs.

    python -m bench.leaf_groups [--cluster ib|marin] [--jobs 2000] [--seeds 5]

Clusters (8 GPUs a node; each node's `network-tier-0` is its leaf group's value as
reporter.collect.infiniband_tiers derives it, `ib-leaves-<hash>` of the group's leaf GUIDs):
- `ib` (default, 120 nodes, 960 GPUs): 16 leaf groups of 4, 4, 5, 5, ... 11, 11 nodes (stated: a
  fabric whose scalable units are unevenly filled, as real ones are);
- `marin` (64 nodes, 512 GPUs): the 15 leaf groups of 1, 1, 2, 2, 2, 3, 3, 3, 5, 5, 6, 6, 6, 8 and
  11 H100 nodes a user found on a CoreWeave cluster (marin-community/marin#6950): only the 8 and
  the 11 can hold an 8-node gang.
Both are 2-tier fabrics: tier 1 (the spine group) is the whole cluster, so above a leaf group there
is nothing narrower to ask for. (marin's cluster has two superpods, 41 and 23 nodes, which the
issue does not map to leaf groups; they are not modelled.)

Trace: bench/multinode.py's, as bench/racks.py runs it (`multinode.trace`): jobs of 1, 2, 4, 8
and 16 whole nodes (35, 20, 20, 15, 10%), Poisson arrivals, Philly durations, offered at 50%, 80%
and 95% of the nodes. A 16-node job fits no leaf group of either cluster.

Node choice for a job, each on the same trace and through bench/racks.py's event loop
(bench/multinode.py: pending jobs retried in arrival order after every event, as Kueue's
BestEffortFIFO queues do), as bench/racks.py models a required and a preferred partition:
- `count-only`: any N free nodes, picked at random (the kube-scheduler, and gang schedulers that
  admit on the total);
- `tier-0-required`: Kueue TAS with `kueue.x-k8s.io/podset-required-topology:
  gpu.topology.io/network-tier-0`: all pods in one leaf group, the one with the fewest free nodes
  that holds N (BestFit); a job larger than every leaf group is never admitted (`never placed`:
  Kueue leaves it pending for good);
- `tier-0-or-1`: what a user does about that: `required` network-tier-0 for a job some leaf group
  can hold, `required` network-tier-1 for a larger one (here the whole fabric: the free nodes of
  the leaf groups with the most free nodes first, as Kueue fills a domain's children);
- `tier-0-preferred`: `podset-preferred-topology` on the same label: one leaf group where one has
  N free nodes (BestFit), else the leaf groups with the most free nodes first.

Metrics, over the jobs that arrive after the warm-up (the first quarter of arrivals):
- `one leaf group`: share of the placed multi-node jobs (N >= 2) whose pods are all in one leaf
  group: their traffic stays on one leaf switch per rail, and never crosses a spine;
- `groups per job`: mean leaf groups a placed multi-node job spans;
- `never placed`: share of jobs that never start;
- `util`: GPUs busy, time-averaged between the end of the warm-up and the last arrival;
- `frag`: share of jobs that waited while the cluster held N free nodes but no leaf group did;
- `wait`: mean minutes from arrival to start over the placed jobs, and over the 8-node jobs.
Seeded and deterministic: the same seeds give the same tables.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from bench import multinode
from reporter.collect.infiniband_tiers import LEAF_GROUP_PREFIX, group_value

GPUS_PER_NODE = 8
RAILS = 8
"""Leaves per leaf group: one per rail, each node's 8 HCAs one on each."""
CLUSTERS: dict[str, tuple[int, ...]] = {
    "ib": tuple(size for size in range(4, 12) for _ in range(2)),
    "marin": (1, 1, 2, 2, 2, 3, 3, 3, 5, 5, 6, 6, 6, 8, 11),
}
"""Nodes per leaf group."""
POLICIES = ("count-only", "tier-0-required", "tier-0-or-1", "tier-0-preferred")
WATCHED_SIZE = 8
"""The job size whose wait is reported apart: the largest some leaf group of each cluster holds."""
FIRST_LEAF_GUID = 0x0002_C903_00A0_0000


@dataclass(frozen=True, slots=True)
class LeafNode:
    """A node, as its labels describe it."""

    name: str
    tier0: str
    """`gpu.topology.io/network-tier-0`: the node's leaf group."""


def layout(cluster: str = "ib") -> list[LeafNode]:
    """The cluster of the module docstring, groups in the order of `CLUSTERS`."""
    nodes: list[LeafNode] = []
    for group, size in enumerate(CLUSTERS[cluster]):
        leaves = (FIRST_LEAF_GUID + group * RAILS + rail for rail in range(RAILS))
        tier0 = group_value(LEAF_GROUP_PREFIX, leaves)
        nodes.extend(LeafNode(f"leaf{group:02d}-node{slot:02d}", tier0) for slot in range(size))
    return nodes


Chooser = multinode.Chooser[LeafNode]


def _leaf_groups(nodes: list[LeafNode], busy: set[str]) -> dict[str, list[LeafNode]]:
    """The free nodes of each leaf group (every group listed, also a full one)."""
    out: dict[str, list[LeafNode]] = {}
    for node in nodes:
        members = out.setdefault(node.tier0, [])
        if node.name not in busy:
            members.append(node)
    return out


def _best_fit(groups: dict[str, list[LeafNode]], size: int) -> list[LeafNode] | None:
    """The group with the fewest free nodes that still holds `size` (ties: the first by value)."""
    fits = [(len(free), name) for name, free in groups.items() if len(free) >= size]
    if not fits:
        return None
    _, name = min(fits)
    return groups[name][:size]


def _most_free_first(groups: dict[str, list[LeafNode]], size: int) -> list[LeafNode]:
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return [n for _, free in ordered for n in free][:size]


def tier0_required(
    nodes: list[LeafNode], busy: set[str], size: int, rng: random.Random
) -> list[LeafNode] | None:
    return _best_fit(_leaf_groups(nodes, busy), size)


def tier0_or_1(
    nodes: list[LeafNode], busy: set[str], size: int, rng: random.Random
) -> list[LeafNode] | None:
    groups = _leaf_groups(nodes, busy)
    largest = max(len(g) for g in _leaf_groups(nodes, set()).values())
    if size <= largest:
        return _best_fit(groups, size)
    chosen = _most_free_first(groups, size)
    return chosen if len(chosen) == size else None


def tier0_preferred(
    nodes: list[LeafNode], busy: set[str], size: int, rng: random.Random
) -> list[LeafNode] | None:
    groups = _leaf_groups(nodes, busy)
    chosen = _best_fit(groups, size) or _most_free_first(groups, size)
    return chosen if len(chosen) == size else None


CHOOSERS: dict[str, Chooser] = {
    "count-only": multinode.count_only,
    "tier-0-required": tier0_required,
    "tier-0-or-1": tier0_or_1,
    "tier-0-preferred": tier0_preferred,
}


@dataclass(slots=True)
class Result(multinode.Result):
    """What one run measured (see the module docstring for each metric)."""

    one_group: float = 0.0
    groups_per_job: float = 0.0
    never_placed: float = 0.0


COLUMNS = (
    multinode.share("one leaf group (N≥2)", "one_group"),
    multinode.Column("groups per job (N≥2)", "groups_per_job", ".2f"),
    multinode.share("never placed", "never_placed"),
    multinode.share("util", "util"),
    multinode.share("frag", "frag"),
    multinode.Column("wait (min)", "wait", ",.0f"),
    multinode.Column(f"wait {WATCHED_SIZE}-node (min)", "wait_watched", ",.0f"),
)


def simulate(
    nodes: list[LeafNode], jobs: list[multinode.Job], policy: str, load: float, seed: int
) -> Result:
    """Run `jobs` through the cluster `nodes` with one node-choice policy."""
    result = multinode.simulate(
        nodes, jobs, CHOOSERS[policy], WATCHED_SIZE, Result(policy, load, seed)
    )
    tier0 = {n.name: n.tier0 for n in nodes}
    spans = [len({tier0[n] for n in names}) for names in result.measured_multi_node()]
    measured = result.measured
    result.one_group = sum(s == 1 for s in spans) / len(spans) if spans else 0.0
    result.groups_per_job = statistics.fmean(spans) if spans else 0.0
    result.never_placed = len(result.never & measured) / len(measured) if measured else 0.0
    return result


BENCH = multinode.Bench(simulate, POLICIES, COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", choices=sorted(CLUSTERS), default="ib", help="default ib")
    multinode.add_trace_arguments(parser)
    args = parser.parse_args()
    nodes = layout(args.cluster)
    results = BENCH.run_all(
        nodes,
        args.jobs,
        range(1, args.seeds + 1),
        progress=lambda r: print(
            f"{r.load:.0%} seed {r.seed} {r.policy}: one leaf group {r.one_group:.1%} "
            f"never placed {r.never_placed:.1%} util {r.util:.1%}",
            flush=True,
        ),
    )
    print(BENCH.table(results))


if __name__ == "__main__":
    main()
