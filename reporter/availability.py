"""Which free GPUs of a node are wired well, summarised per request size: what a scheduler ranks by.

The static topology says how GPUs are wired; a scheduler asks which *free* GPUs are wired well.
The agent knows the free GPUs (PodResources), asks for every request size k = 1..free which k GPUs
the node will hand out (the on-node policy: the device plugin's choice, `reporter.placement.Policy`)
and publishes the result as one small annotation, so that a scheduler extender ranks a node with a
table lookup (`node_score`, `can_fit`) instead of a search.

The annotation value (`encode_availability`), version 3, in ASCII:

    3;<free>;<k=1>/<k=2>/.../<k=len(free)>

- `<free>`: the free GPU indexes as a canonical Linux list string (`0-3,6`); empty for none.
- each `<k>`: `links.connected.numa.nic.island.fit.whole`, seven decimal integers about the k-set
  the on-node policy takes: its link points, 1 if every pair of it is NVLink-connected at full bond
  (no GPU of it has an NVLink down) else 0, the NUMA nodes it spans, its NIC points (0 without
  RDMA NICs), the size of the free NVLink island it is taken from, and its fit: the largest
  reach among its GPUs, a GPU's reach being the size of the largest set of free GPUs, all
  pairwise NVLink-connected, that holds it (1 without a free NVLink peer). A connected set of fit
  k uses a connected set whole, or takes GPUs nobody else could use connected; a larger fit cuts
  into a larger connected set. Then `whole`: the same largest reach among its GPUs, the reach
  taken over every GPU of the node, free or not (lost ones aside; `whole_reach`), so the largest
  connected set of the whole node the set cuts into; never below the fit (where a search budget
  ran out, the island stands in for a reach, never smaller). Fit and whole 0: the on-node policy
  fails a k-GPU request here (go-gpuallocator's padded answer, `reporter.gpuallocator`); the other
  fields then describe the best set.

Versions 1 (`1;<free>;links.connected.numa.nic.island`, the best k-set, no fit) and 2
(`2;<free>;links.connected.numa.nic.island.fit`, no whole) are still read: `FreeSet.fit` (version
1) and `FreeSet.whole` (versions 1 and 2) are None, and `node_score` takes the fit for the whole,
the island, never smaller, for the fit.

Example (a DGX A100 with GPUs 0-3 and 6 free, policy `best`):
`3;0-3,6;0.1.1.4.5.5.8/120.1.1.4.5.5.8/360.1.2.1.5.5.8/...`. A DGX H100 with all 8 free encodes in
136 characters; 256 GPUs (the schema's limit) in under 7.1 KB, every number at its largest.
`decode_availability` accepts only what `encode_availability` writes (any of the three versions),
byte for byte, and bounds every number, so a value someone edited either reads back exactly or
raises SchemaError.

It must never do I/O or import kubernetes: the agent, the extender and `bench/placement.py`
share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from parsers.cpulist import format_cpulist, parse_cpulist
from parsers.errors import ParseError
from parsers.integers import parse_decimal
from parsers.links import MAX_NVLINKS
from reporter.errors import PlacementError, SchemaError
from reporter.placement import (
    NVLINK_POINTS,
    PCIE_POINTS,
    GpuSet,
    Policy,
    best_gpu_set,
    nvlink_reach,
    score_gpu_set,
)
from reporter.schema.model import MAX_GPUS, Topology

__all__ = [
    "ALLOCATION_KEY",
    "AVAILABILITY_BUDGET",
    "AVAILABILITY_KEY",
    "CONNECTED_WAIT_S",
    "DEVICE_PLUGIN_ONLY",
    "FORMAT_VERSION",
    "MAX_GPUS",
    "MAX_TEXT_CHARS",
    "NEUTRAL_SCORE",
    "Allocation",
    "Availability",
    "FreeSet",
    "availability_labels",
    "can_fit",
    "compute_availability",
    "connected_capacity",
    "connected_now",
    "decode_allocation",
    "decode_availability",
    "encode_allocation",
    "encode_availability",
    "free_set",
    "holds_for_connected",
    "node_score",
    "whole_reach",
]

AVAILABILITY_KEY = "availability"
"""Annotation key suffix: the full key is f"{prefix}/availability"."""
ALLOCATION_KEY = "allocation"
"""Annotation key suffix of what availability counts and which GPUs claims hold."""
GPU_FREE_LABEL = "gpu-free"
GPU_FREE_NVLINK_MAX_LABEL = "gpu-free-nvlink-max"

FORMAT_VERSION = 3
"""The version `encode_availability` writes; `decode_availability` reads it and versions 1 and 2."""
NEUTRAL_SCORE = 5
"""`node_score` of a node whose availability is missing or damaged: neither for nor against."""

AVAILABILITY_BUDGET = 4_000_000
"""Search work units for all k of one node together (a few seconds of one core at worst)."""

CONNECTED_WAIT_S = 7200.0
"""How long, from its creation, the extender holds back a pod of k >= 2 GPUs for an NVLink-connected
set by default (`holds_for_connected`), where taking a set that is not connected now is all it
could do. Two hours: in the simulated cluster at 80% offered load beside MostAllocated, the least
any of 40 seeds kept connected rose from 93.9% to 96.4%, mean waits 12.3 to 12.6 minutes, 1% of
those pods held; one hour left a seed at 93.3% (bench/README.md: holding leaves the unconnected
GPUs to one-GPU pods, which then stay off the NVLink nodes)."""

MAX_TEXT_CHARS = 8192
"""Longer than any value `encode_availability` writes for MAX_GPUS GPUs (under 7.1 KB)."""
_MAX_PAIR_POINTS = NVLINK_POINTS * MAX_NVLINKS

_ENTRY = re.compile(
    r"([0-9]{1,8})\.([01])\.([0-9]{1,3})\.([0-9])\.([0-9]{1,3})(?:\.([0-9]{1,3}))?(?:\.([0-9]{1,3}))?"
)
_FORMS = {1: "links.c.numa.nic.island", 2: "links.c.numa.nic.island.fit"}
_FORMS[3] = _FORMS[2] + ".whole"


@dataclass(frozen=True, slots=True)
class FreeSet:
    """The best free k-set of a node, summarised."""

    links: int
    """Link points of the set (reporter.placement.Score.links)."""
    connected: bool
    """Every pair of the set is NVLink-connected at full bond: no GPU of it has an NVLink down
    (true for one GPU: it has no pair to miss)."""
    numa: int
    """NUMA nodes the set spans (>= 1; GPUs of unknown NUMA node count as one)."""
    nic: int
    """NIC points (Score.nic): the closest RDMA NIC's path to the farthest GPU; 0 without NICs."""
    island: int
    """Size of the free NVLink island the set was taken from (k..free): the free GPUs reachable
    over NVLink from the set, with the set; 1 for one GPU without NVLink."""
    fit: int | None = None
    """The largest reach among the set's GPUs (see the module docstring; 1..island); 0 where the
    on-node policy fails a request of this size; None when read from a version-1 value."""
    whole: int | None = None
    """The largest whole-node reach among the set's GPUs (`whole_reach`; fit..MAX_GPUS): the
    largest connected set of the node, free or not, the set cuts into; 0 with fit 0; None when
    read from a version-1 or version-2 value."""


@dataclass(frozen=True, slots=True)
class Availability:
    """The free GPUs of a node and the best free set for every request size."""

    free: tuple[int, ...]
    """Free, healthy GPU indexes, ascending."""
    best: tuple[FreeSet, ...]
    """best[k-1] = the free k-set the on-node policy takes, for k = 1..len(free) (the best one in
    version 1 and with policy `best`)."""


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


def encode_availability(a: Availability) -> str:
    """The annotation value: compact ASCII, version 3 (see the module docstring); an Availability
    read from an older value is written back in its version: 1 without a fit, 2 without a whole."""
    if any(s.fit is None for s in a.best):
        return _encode(a, 1)
    return _encode(a, 2 if any(s.whole is None for s in a.best) else FORMAT_VERSION)


def _encode(a: Availability, version: int) -> str:
    entries = "/".join(
        f"{s.links}.{int(s.connected)}.{s.numa}.{s.nic}.{s.island}"
        + ("" if version == 1 else f".{s.fit}")
        + ("" if version < 3 else f".{s.whole}")
        for s in a.best
    )
    return f"{version};{format_cpulist(a.free)};{entries}"


def decode_availability(text: str) -> Availability:
    """Read an annotation value back; exactly what `encode_availability` writes, nothing else.

    Raises SchemaError (field `availability`) on anything malformed, inconsistent or too large.
    """
    if not isinstance(text, str):
        raise SchemaError(AVAILABILITY_KEY, f"is a {type(text).__name__}, not a string")
    if len(text) > MAX_TEXT_CHARS:
        raise SchemaError(
            AVAILABILITY_KEY, f"{len(text)} characters is too long (limit {MAX_TEXT_CHARS})"
        )
    if not text.isascii():
        raise SchemaError(AVAILABILITY_KEY, "holds non-ASCII characters")
    parts = text.split(";")
    if len(parts) != 3:
        raise SchemaError(AVAILABILITY_KEY, "is not version;free;best (two ';' separators)")
    version, free_text, best_text = parts
    if version not in ("1", "2", str(FORMAT_VERSION)):
        raise SchemaError(
            AVAILABILITY_KEY,
            f"version {version[:16]!r} is not 1, 2 or {FORMAT_VERSION}: upgrade the reader or the "
            "agent",
        )
    try:
        free = tuple(sorted(parse_cpulist(free_text, field=AVAILABILITY_KEY)))
    except ParseError as e:
        raise SchemaError(AVAILABILITY_KEY, f"free GPUs: {e}") from None
    if len(free) > MAX_GPUS or (free and free[-1] >= MAX_GPUS):
        raise SchemaError(AVAILABILITY_KEY, f"free GPUs beyond the limit of {MAX_GPUS}")
    entries = best_text.split("/") if best_text else []
    if len(entries) != len(free):
        raise SchemaError(
            AVAILABILITY_KEY, f"{len(entries)} best sets for {len(free)} free GPUs (one per k)"
        )
    best = tuple(
        _decode_entry(entry, k, len(free), int(version)) for k, entry in enumerate(entries, start=1)
    )
    decoded = Availability(free=free, best=best)
    if _encode(decoded, int(version)) != text:
        raise SchemaError(AVAILABILITY_KEY, "is not in canonical form (as the agent writes it)")
    return decoded


def _decode_entry(entry: str, k: int, free: int, version: int) -> FreeSet:
    match = _ENTRY.fullmatch(entry)
    fields = None if match is None else [g for g in match.groups() if g is not None]
    if fields is None or len(fields) != 4 + version:
        raise SchemaError(
            AVAILABILITY_KEY, f"best set for k={k} {entry[:32]!r} is not {_FORMS[version]}"
        )
    # The pattern admits only short ASCII digit runs: parse_decimal cannot refuse them.
    values = [parse_decimal(g, field=AVAILABILITY_KEY) for g in fields]
    links, connected, numa, nic, island = values[:5]
    fit = values[5] if version >= 2 else None
    whole = values[6] if version >= 3 else None
    pairs = k * (k - 1) // 2
    problem = None
    if not pairs <= links <= pairs * _MAX_PAIR_POINTS:
        problem = f"{links} link points is impossible for {pairs} pairs"
    elif connected and links < pairs * NVLINK_POINTS:
        problem = f"{links} link points cannot be NVLink-connected"
    elif not 1 <= numa <= k:
        problem = f"{numa} NUMA nodes is impossible for {k} GPUs"
    elif nic > max(PCIE_POINTS.values()):
        problem = f"{nic} NIC points is beyond the closest path"
    elif not k <= island <= free:
        problem = f"island of {island} is impossible for {k} of {free} free GPUs"
    elif k == 1 and not connected:
        problem = "one GPU is always connected"
    elif fit is not None and fit > island:
        problem = f"a fit of {fit} is beyond its island of {island}"
    elif fit is not None and connected and 0 < fit < k:
        problem = f"a fit of {fit} is impossible for {k} connected GPUs"
    elif whole is not None and whole > MAX_GPUS:
        problem = f"a whole-node reach of {whole} is beyond the limit of {MAX_GPUS} GPUs"
    elif whole is not None and fit == 0 and whole != 0:
        problem = f"a whole-node reach of {whole} where the on-node policy fails (fit 0) is not 0"
    elif whole is not None and fit is not None and whole < fit:
        problem = f"a whole-node reach of {whole} is below its fit of {fit}"
    if problem is not None:
        raise SchemaError(AVAILABILITY_KEY, f"best set for k={k}: {problem}")
    return FreeSet(
        links=links,
        connected=bool(connected),
        numa=numa,
        nic=nic,
        island=island,
        fit=fit,
        whole=whole,
    )


def availability_labels(a: Availability, prefix: str) -> dict[str, str]:
    """The two labels a plain nodeAffinity can select on.

    `gpu-free`: free GPUs. `gpu-free-nvlink-max`: the largest k >= 2 whose best free set is
    NVLink-connected, 0 when none is (one GPU alone is not counted: it needs no link).
    """
    nvlink_max = max(
        (k for k, s in enumerate(a.best, start=1) if k >= 2 and s.connected), default=0
    )
    return {
        f"{prefix}/{GPU_FREE_LABEL}": str(len(a.free)),
        f"{prefix}/{GPU_FREE_NVLINK_MAX_LABEL}": str(nvlink_max),
    }


def can_fit(a: Availability | None, k: int) -> bool:
    """Whether the node has k free GPUs; True when we cannot read it (never filter blindly)."""
    return a is None or k <= len(a.free)


def connected_now(a: Availability | None, k: int) -> bool:
    """Whether the node hands a pod of k GPUs an NVLink-connected set now: k free GPUs, and the
    k-set its on-node policy takes is connected (not a set the policy fails to hand out, fit 0).
    False when we cannot read it."""
    if a is None or not 1 <= k <= len(a.free):
        return False
    chosen = a.best[k - 1]
    return chosen.connected and chosen.fit != 0


def connected_capacity(a: Availability | None) -> int:
    """The largest connected set of the whole node, free or not, that one of its free GPUs
    belongs to (the largest whole-node reach among the sets its policy takes; a version-1 or 2
    value's fit or island stands in, never smaller); 0 with no free GPU or when we cannot read
    it. A node of capacity >= k can give a pod of k GPUs a connected set once the pods beside
    its free GPUs end: a reason to wait for it."""
    if a is None:
        return 0
    return max(
        (
            s.whole if s.whole is not None else s.fit if s.fit is not None else s.island
            for s in a.best
        ),
        default=0,
    )


def holds_for_connected(
    k: int, waited_s: float, limit_s: float, *, connected: bool, capable: bool
) -> bool:
    """Whether the extender holds a pod of k GPUs back for an NVLink-connected set: a pod of
    k >= 2 GPUs that has waited less than `limit_s`, when no candidate node hands it a connected
    set now (`connected`: some candidate does, `connected_now`) but some node of the cluster
    could once its pods end (`capable`: some node's `connected_capacity` is >= k). A cluster
    without such a node never holds a pod (it would wait for nothing); a limit of 0 never holds.
    `waited_s` comes from two clocks (the pod's creation by the API server's, now by ours): a
    negative wait is skew and counts as none, a skew past the limit holds nothing. The default
    limit and what holding buys and costs: CONNECTED_WAIT_S."""
    return k >= 2 and -limit_s < waited_s < limit_s and not connected and capable


def node_score(a: Availability | None, k: int) -> int:
    """kube-scheduler extender score 0..10 of a node for a pod of k GPUs; larger is better.

    None (no or damaged annotation) and k < 1 give NEUTRAL_SCORE; a node that cannot fit k gives 0.
    Otherwise, by the k-set the node's on-node policy takes (`Availability.best[k-1]`), read twice
    in this table: with its whole-node fit `whole` (the largest connected set of the node, free or
    not, that it cuts into) and with its free fit `fit` (the same among the free GPUs alone):

    | the set                                               | class                        |
    |-------------------------------------------------------|------------------------------|
    | NVLink-connected, fit k (a connected set used whole)  | 10 on one NUMA node, else 9  |
    | NVLink-connected, fit up to 2k                        | 7 on one NUMA node, else 6   |
    | NVLink-connected, a larger fit                        | 4                            |
    | not connected, cutting into no connected set (fit 1)  | 2                            |
    | not connected otherwise; the on-node policy fails (0) | 1                            |

    The score is two parts the whole-node class and one part the free class, rounded up:
    ceil((2 * whole class + free class) / 3). Connected means at full bond: a set with a GPU whose
    NVLinks are down is not connected.

    Fit first: the pod takes from the node where it cuts into the smallest connected sets (best
    fit), so that the nodes whose GPUs can form large connected sets stay for the pods that need
    them, and so the policy that will run matters. The whole-node fit keeps small pods off the
    NVSwitch nodes: one GPU of an NVSwitch node, however full, scores 6 or less for a 1-GPU pod, a
    lone PCIe GPU 10. The free fit still prefers, among nodes of one wiring, the one whose free
    GPUs the set uses up (a pair on a DGX with 2 free: 6, on an empty one: 4), which the
    kube-scheduler's default LeastAllocated would otherwise undo (bench/README.md measures the
    weights against each fit alone). Older values stand in: a version-2 value has no whole and
    scores its free class (the ranking before version 3); a version-1 value has no fit either,
    its island, never smaller, stands in.
    """
    if a is None or k < 1:
        return NEUTRAL_SCORE
    if not can_fit(a, k):
        return 0
    chosen = a.best[k - 1]
    free = _fit_class(chosen, k, chosen.island if chosen.fit is None else chosen.fit)
    if chosen.whole is None:
        return free
    # Two parts the whole-node fit, one part the free fit, rounded up (bench/README.md measures
    # the weights against each alone, beside MostAllocated and LeastAllocated).
    return (2 * _fit_class(chosen, k, chosen.whole) + free + 2) // 3


def _fit_class(chosen: FreeSet, k: int, fit: int) -> int:
    """`node_score`'s table, read with one fit."""
    if fit == 0:
        return 1
    if not chosen.connected:
        return 2 if fit == 1 else 1
    if fit > 2 * k:
        return 4
    base = 9 if fit == k else 6
    return base + (chosen.numa == 1)


ALLOCATION_SOURCES = ("device-plugin", "dra")
"""What availability can count, in the order the annotation lists them (the reader's names)."""
_ALLOCATION_VERSION = 1
_MAX_ALLOCATION_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Allocation:
    """How the node's free GPUs were counted, and which of its GPUs DRA claims hold.

    The annotation value (`encode_allocation`), version 1: `1;<sources>;<claimed>`, e.g.
    `1;dra;0-1,5`: `<sources>` lists what availability counts (`device-plugin`: the kubelet's
    device plugin allocations; `dra`: ResourceClaims' devices), comma-separated; `<claimed>` the
    GPU indexes claims hold, as a Linux list string, empty for none. Written with availability,
    so it costs no write of its own: a claim that comes or goes changes the free GPUs too. Absent
    where availability counts the device plugin's allocations only (DEVICE_PLUGIN_ONLY), as it
    did before DRA.
    """

    sources: tuple[str, ...]
    claimed: tuple[int, ...] = ()


DEVICE_PLUGIN_ONLY = Allocation(("device-plugin",))
"""What a Node without an `allocation` annotation (but with availability) was counted from."""


def encode_allocation(a: Allocation) -> str:
    """The annotation value (see Allocation)."""
    return f"{_ALLOCATION_VERSION};{','.join(a.sources)};{format_cpulist(a.claimed)}"


def decode_allocation(text: str) -> Allocation:
    """Read an annotation value back; exactly what `encode_allocation` writes, nothing else.

    Raises SchemaError (field `allocation`) on anything else.
    """
    if not isinstance(text, str) or len(text) > _MAX_ALLOCATION_CHARS or not text.isascii():
        raise SchemaError(ALLOCATION_KEY, "is not a short ASCII string")
    parts = text.split(";")
    if len(parts) != 3 or parts[0] != str(_ALLOCATION_VERSION):
        raise SchemaError(ALLOCATION_KEY, f"is not {_ALLOCATION_VERSION};sources;claimed GPUs")
    sources = tuple(parts[1].split(",")) if parts[1] else ()
    if sources != tuple(s for s in ALLOCATION_SOURCES if s in sources):
        raise SchemaError(
            ALLOCATION_KEY,
            f"sources {parts[1][:40]!r} are not some of {','.join(ALLOCATION_SOURCES)}",
        )
    try:
        claimed = tuple(sorted(parse_cpulist(parts[2], field=ALLOCATION_KEY)))
    except ParseError as e:
        raise SchemaError(ALLOCATION_KEY, f"claimed GPUs: {e}") from None
    if claimed and claimed[-1] >= MAX_GPUS:
        raise SchemaError(ALLOCATION_KEY, f"claimed GPUs beyond the limit of {MAX_GPUS}")
    decoded = Allocation(sources=sources, claimed=claimed)
    if encode_allocation(decoded) != text:
        raise SchemaError(ALLOCATION_KEY, "is not in canonical form (as the agent writes it)")
    return decoded
