"""Which free GPUs of a node are wired well, summarised per request size: what a scheduler ranks by.

The static topology says how GPUs are wired; a scheduler asks which *free* GPUs are wired well.
The agent knows the free GPUs (PodResources), runs `best_gpu_set` over them for every request size
k = 1..free, and publishes the result as one small annotation, so that a scheduler extender ranks a
node with a table lookup (`node_score`, `can_fit`) instead of a search.

The annotation value (`encode_availability`), version 1, in ASCII:

    1;<free>;<best k=1>/<best k=2>/.../<best k=len(free)>

- `<free>`: the free GPU indexes as a canonical Linux list string (`0-3,6`); empty for none.
- each `<best k>`: `links.connected.numa.nic.island`, five decimal integers: the link points of
  the best free k-set, 1 if every pair of it is NVLink-connected at full bond (no GPU of it has an
  NVLink down) else 0, the NUMA nodes it spans,
  its NIC points (0 without RDMA NICs), and the size of the free NVLink island it was taken from.

Example (a DGX A100 with GPUs 0-3 and 6 free): `1;0-3,6;0.1.1.4.5/120.1.1.4.5/360.1.2.4.5/...`.
A DGX H100 with all 8 free encodes in about 70 characters; 256 GPUs (the schema's limit) in about
6 KB. `decode_availability` accepts only what `encode_availability` writes, byte for byte, and
bounds every number, so a value someone edited either reads back exactly or raises SchemaError.

It must never do I/O or import kubernetes: the agent, the extender and `bench/placement.py`
share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parsers.cpulist import format_cpulist, parse_cpulist
from parsers.errors import ParseError
from parsers.links import MAX_NVLINKS, LinkKind
from reporter.errors import PlacementError, SchemaError
from reporter.placement import NVLINK_POINTS, PCIE_POINTS, GpuSet, best_gpu_set
from reporter.schema.model import Topology

__all__ = [
    "ALLOCATION_KEY",
    "AVAILABILITY_BUDGET",
    "AVAILABILITY_KEY",
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
    "decode_allocation",
    "decode_availability",
    "encode_allocation",
    "encode_availability",
    "free_set",
    "node_score",
]

AVAILABILITY_KEY = "availability"
"""Annotation key suffix: the full key is f"{prefix}/availability"."""
ALLOCATION_KEY = "allocation"
"""Annotation key suffix of what availability counts and which GPUs claims hold."""
GPU_FREE_LABEL = "gpu-free"
GPU_FREE_NVLINK_MAX_LABEL = "gpu-free-nvlink-max"

FORMAT_VERSION = 1
NEUTRAL_SCORE = 5
"""`node_score` of a node whose availability is missing or damaged: neither for nor against."""
MAX_SCORE = 10
"""kube-scheduler's MaxExtenderPriority: extender scores run 0..10."""

AVAILABILITY_BUDGET = 4_000_000
"""Search work units for all k of one node together (a few seconds of one core at worst)."""

MAX_GPUS = 256
"""The topology schema's limit on GPUs per node; more free GPUs than this is not a real node."""
MAX_TEXT_CHARS = 8192
"""Longer than any value `encode_availability` writes for MAX_GPUS GPUs (about 6 KB)."""
_MAX_PAIR_POINTS = NVLINK_POINTS * MAX_NVLINKS
_CLOSE_NIC_POINTS = PCIE_POINTS[LinkKind.PXB]
"""NIC points from PXB up (PCIe switches only, no host bridge): where GPUDirect RDMA pays."""

_ENTRY = re.compile(r"(\d{1,8})\.([01])\.(\d{1,3})\.(\d)\.(\d{1,3})")


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


@dataclass(frozen=True, slots=True)
class Availability:
    """The free GPUs of a node and the best free set for every request size."""

    free: tuple[int, ...]
    """Free, healthy GPU indexes, ascending."""
    best: tuple[FreeSet, ...]
    """best[k-1] = the best free k-set, for k = 1..len(free)."""


def nvlink_degraded(topology: Topology, index: int) -> bool:
    """Whether GPU `index` has NVLinks down (degraded or all down), as the source observed."""
    health = topology.gpus[index].nvlink
    return health is not None and health.state != "ok"


def free_set(topology: Topology, chosen: GpuSet, free: Iterable[int]) -> FreeSet:
    """Summarise `chosen` (a set of free GPUs) against the free GPUs of `topology`."""
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
    return FreeSet(
        links=chosen.score.links,
        connected=connected,
        numa=len(chosen.numa_nodes),
        nic=chosen.score.nic,
        island=len(reached),
    )


def compute_availability(
    topology: Topology, free: Iterable[int], *, budget: int = AVAILABILITY_BUDGET
) -> Availability:
    """The best free k-set of `topology` for every k, out of the `free` GPU indexes.

    Lost GPUs are dropped from `free`. The k searches share `budget` work units equally (a real
    8- or 16-GPU machine needs a few thousand per k, far below its share); where a share runs out,
    that k is summarised from the best set found, not proven optimal. Raises PlacementError for an
    index that is not a GPU of the topology, or for more than MAX_GPUS free GPUs.
    """
    pool = sorted(set(free))
    n = len(topology.gpus)
    unknown = [i for i in pool if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
    if unknown:
        raise PlacementError(f"free GPUs: GPU {unknown[0]!r} is not on this node")
    usable = tuple(i for i in pool if not topology.gpus[i].lost)
    if len(usable) > MAX_GPUS:
        raise PlacementError(f"{len(usable)} free GPUs is more than a node has (limit {MAX_GPUS})")
    share = max(budget // max(len(usable), 1), 1)
    best = tuple(
        free_set(topology, best_gpu_set(topology, k, usable, budget=share), usable)
        for k in range(1, len(usable) + 1)
    )
    return Availability(free=usable, best=best)


def encode_availability(a: Availability) -> str:
    """The annotation value: compact ASCII, version 1 (see the module docstring)."""
    entries = "/".join(f"{s.links}.{int(s.connected)}.{s.numa}.{s.nic}.{s.island}" for s in a.best)
    return f"{FORMAT_VERSION};{format_cpulist(a.free)};{entries}"


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
    if version != str(FORMAT_VERSION):
        raise SchemaError(
            AVAILABILITY_KEY,
            f"version {version[:16]!r} is not {FORMAT_VERSION}: upgrade the reader or the agent",
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
    best = tuple(_decode_entry(entry, k, len(free)) for k, entry in enumerate(entries, start=1))
    decoded = Availability(free=free, best=best)
    if encode_availability(decoded) != text:
        raise SchemaError(AVAILABILITY_KEY, "is not in canonical form (as the agent writes it)")
    return decoded


def _decode_entry(entry: str, k: int, free: int) -> FreeSet:
    match = _ENTRY.fullmatch(entry)
    if match is None:
        raise SchemaError(
            AVAILABILITY_KEY, f"best set for k={k} {entry[:32]!r} is not links.c.numa.nic.island"
        )
    links, connected, numa, nic, island = (int(g) for g in match.groups())
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
    if problem is not None:
        raise SchemaError(AVAILABILITY_KEY, f"best set for k={k}: {problem}")
    return FreeSet(links=links, connected=bool(connected), numa=numa, nic=nic, island=island)


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


def node_score(a: Availability | None, k: int) -> int:
    """kube-scheduler extender score 0..10 of a node for a pod of k GPUs; larger is better.

    None (no or damaged annotation) and k < 1 give NEUTRAL_SCORE; a node that cannot fit k gives 0.
    Otherwise, by the node's best free k-set, most important first:

    1. NVLink-connected sets (at full bond: no GPU of it with an NVLink down) score 4..10, others,
       degraded NVLink sets included, 1..3;
    2. one NUMA node beats several;
    3. a close RDMA NIC (PXB or PIX, points >= 4) beats a far or no NIC;
    4. a just-big-enough island (island == k) beats a larger one, so whole islands stay free for
       the pods that need them.

    Connected sets rank all three tie-breaks exactly (4 + 0..6; the worst two share 4); the
    others get 1 + one point each for one NUMA node and a close NIC.
    """
    if a is None or k < 1:
        return NEUTRAL_SCORE
    if not can_fit(a, k):
        return 0
    best = a.best[k - 1]
    one_numa = best.numa == 1
    close_nic = best.nic >= _CLOSE_NIC_POINTS
    if best.connected:
        rank = 4 * one_numa + 2 * close_nic + (best.island == k)
        return MAX_SCORE - 6 + max(rank - 1, 0)
    return 1 + one_numa + close_nic


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
