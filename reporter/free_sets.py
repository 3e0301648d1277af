"""For every request size k, the free k-set the node's on-node policy takes: what the agent
publishes as its availability (`reporter.schema.availability`, where the annotation's fields are
described).

The static topology says how GPUs are wired; a scheduler asks which *free* GPUs are wired well.
The agent knows the free GPUs (PodResources), asks for every request size k = 1..free which k GPUs
the node will hand out (the on-node policy: the device plugin's choice, `reporter.placement.Policy`)
and summarises each as a `FreeSet`, so that a scheduler extender ranks a node with a table lookup
(`reporter.availability.node_score`) instead of a search.

It must never do I/O or import kubernetes: the agent and `bench/placement.py` share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from reporter.errors import PlacementError
from reporter.placement import GpuSet, Policy, best_gpu_set, nvlink_reach, score_gpu_set
from reporter.schema.availability import Availability, FreeSet
from reporter.schema.model import MAX_GPUS, Topology

AVAILABILITY_BUDGET = 4_000_000
"""Search work units for all k of one node together (a few seconds of one core at worst)."""


def nvlink_degraded(topology: Topology, index: int) -> bool:
    """Whether GPU `index` has NVLinks down (degraded or all down), as the source observed."""
    health = topology.gpus[index].nvlink
    return health is not None and health.state != "ok"


def whole_reach(topology: Topology, *, budget: int = AVAILABILITY_BUDGET) -> dict[int, int]:
    """Per GPU of `topology` (lost ones dropped), its whole-node reach: the size of the largest
    set of the node's GPUs, free or not, all pairwise NVLink-connected, that holds it; what the GPU
    could ever serve connected (`nvlink_reach` over every GPU: where `budget` runs out, the GPU's
    NVLink island stands in, never smaller)."""
    return nvlink_reach(topology, range(len(topology.gpus)), budget=budget)[0]


def free_set(
    topology: Topology,
    chosen: GpuSet,
    free: Iterable[int],
    reach: Mapping[int, int] | None = None,
    whole: Mapping[int, int] | None = None,
) -> FreeSet:
    """Summarise `chosen` (a set of free GPUs) against the free GPUs of `topology`; `reach` is
    `nvlink_reach` of those free GPUs and `whole` is `whole_reach` of the topology (each computed
    here when not given)."""
    pool = set(free)
    gpus = chosen.gpus
    # A degraded GPU still shows NV<k> to its peers, with a lower bond: the set is not whole.
    connected = all(
        topology.links[a][b].is_nvlink or topology.links[b][a].is_nvlink
        for i, a in enumerate(gpus)
        for b in gpus[i + 1 :]
    ) and (len(gpus) < 2 or not any(nvlink_degraded(topology, g) for g in gpus))
    # The island: every free GPU reachable over NVLink from the set, walking free GPUs only.
    reached, stack = set(gpus), list(gpus)
    while stack:
        a = stack.pop()
        for b in pool - reached:
            if topology.links[a][b].is_nvlink or topology.links[b][a].is_nvlink:
                reached.add(b)
                stack.append(b)
    if reach is None:
        reach = nvlink_reach(topology, pool)[0]
    if whole is None:
        whole = whole_reach(topology)
    fit = max(reach[g] for g in gpus)
    return FreeSet(
        links=chosen.score.links,
        connected=connected,
        numa=len(chosen.numa_nodes),
        nic=chosen.score.nic,
        island=len(reached),
        fit=fit,
        # Exact reaches over a superset are never smaller; only a free reach whose budget ran out
        # (its island standing in) can exceed the whole one, and the fit bounds the whole below.
        whole=max(fit, *(whole[g] for g in gpus)),
    )


def compute_availability(
    topology: Topology,
    free: Iterable[int],
    *,
    policy: Policy = Policy.NVIDIA_BESTEFFORT,
    budget: int = AVAILABILITY_BUDGET,
) -> Availability:
    """For every k, the free k-set of `topology` that `policy` takes out of the `free` GPU indexes
    (by default what NVIDIA's device plugin takes, as on most GPU nodes).

    Lost GPUs are dropped from `free`. The k searches, the reach of the free GPUs and the
    whole-node reach of every GPU share `budget` work units equally (a real 8- or 16-GPU machine
    needs a few thousand per k, far below its share); where a share runs out, that k is
    summarised from the best set found, not proven optimal. `nvidia-besteffort` is asked with the
    free GPUs in index order; on a node the kubelet lists them in Go map order and go-gpuallocator
    breaks its ties by that order, so for k = 1, where every GPU ties, the entry describes the GPU
    of the largest reach (any may be taken); where go-gpuallocator answers a padded set the entry
    says fit and whole 0 (the device plugin fails that request) and describes the best set. Raises
    PlacementError for an index that is not
    a GPU of the topology, or for more than MAX_GPUS free GPUs.
    """
    pool = sorted(set(free))
    n = len(topology.gpus)
    unknown = [i for i in pool if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
    if unknown:
        raise PlacementError(f"free GPUs: GPU {unknown[0]!r} is not on this node")
    usable = tuple(i for i in pool if not topology.gpus[i].lost)
    if len(usable) > MAX_GPUS:
        raise PlacementError(f"{len(usable)} free GPUs is more than a node has (limit {MAX_GPUS})")
    share = max(budget // (len(usable) + 2), 1)
    reach = nvlink_reach(topology, usable, budget=share)[0]
    whole = whole_reach(topology, budget=share)
    return Availability(
        free=usable,
        best=tuple(
            _policy_set(topology, k, usable, (reach, whole), policy, share)
            for k in range(1, len(usable) + 1)
        ),
    )


def _policy_set(
    topology: Topology,
    k: int,
    usable: tuple[int, ...],
    reaches: tuple[Mapping[int, int], Mapping[int, int]],
    policy: Policy,
    budget: int,
) -> FreeSet:
    reach, whole = reaches
    try:
        chosen = best_gpu_set(topology, k, usable, policy=policy, budget=budget)
    except PlacementError:
        if policy is not Policy.NVIDIA_BESTEFFORT:
            raise
        best = best_gpu_set(topology, k, usable, budget=budget)
        return replace(free_set(topology, best, usable, reach, whole), fit=0, whole=0)
    if policy is Policy.NVIDIA_BESTEFFORT and k == 1:
        # Every GPU ties for go-gpuallocator: the kubelet's map order picks one.
        chosen = score_gpu_set(topology, [min(usable, key=lambda i: (-reach[i], i))])
    return free_set(topology, chosen, usable, reach, whole)
