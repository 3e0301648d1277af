"""The availability annotation, read and written: the best free set per request size as the agent
publishes it, the two labels projected from it, and the allocation annotation beside it.

The agent computes it (`reporter.free_sets`); the extender and `bench/placement.py` rank nodes by
it (`reporter.availability`). The annotation value (`encode_availability`), version 3, in ASCII:

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
  taken over every GPU of the node, free or not (lost ones aside;
  `reporter.free_sets.whole_reach`), so the largest connected set of the whole node the set cuts
  into; never below the fit (where a search budget ran out, the island stands in for a reach,
  never smaller). Fit and whole 0: the on-node policy fails a k-GPU request here
  (go-gpuallocator's padded answer, `reporter.gpuallocator`); the other fields then describe the
  best set.

Versions 1 (`1;<free>;links.connected.numa.nic.island`, the best k-set, no fit) and 2
(`2;<free>;links.connected.numa.nic.island.fit`, no whole) are still read: `FreeSet.fit` (version
1) and `FreeSet.whole` (versions 1 and 2) are None, and `reporter.availability.node_score` takes
the fit for the whole, the island, never smaller, for the fit.

Example (a DGX A100 with GPUs 0-3 and 6 free, policy `best`):
`3;0-3,6;0.1.1.4.5.5.8/120.1.1.4.5.5.8/360.1.2.1.5.5.8/...`. A DGX H100 with all 8 free encodes in
136 characters; 256 GPUs (the schema's limit) in under 7.1 KB, every number at its largest.
`decode_availability` accepts only what `encode_availability` writes (any of the three versions),
byte for byte, and bounds every number, so a value someone edited either reads back exactly or
raises SchemaError.

It must never do I/O or import kubernetes: the agent, the extender, the kubectl plugin and the
doctor read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parsers.cpulist import format_cpulist, parse_cpulist
from parsers.errors import ParseError
from parsers.integers import parse_decimal
from parsers.links import MAX_NVLINKS, LinkKind
from reporter.errors import SchemaError
from reporter.schema import keys
from reporter.schema.model import MAX_GPUS

NVLINK_POINTS = 10
"""Points per bonded NVLink of a pair."""
PCIE_POINTS = {
    LinkKind.PIX: 5,
    LinkKind.PXB: 4,
    LinkKind.PHB: 3,
    LinkKind.NODE: 2,
    LinkKind.SYS: 1,
}
"""Points of a pair (or a NIC path) by PCIe path class. These two are `reporter.placement`'s
scoring, and the units of the annotation's `links` and `nic` fields, which the decoder bounds by
them: a change to either is a change of the annotation's format."""

FORMAT_VERSION = 3
"""The version `encode_availability` writes; `decode_availability` reads it and versions 1 and 2."""

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
        raise SchemaError(keys.AVAILABILITY, f"is a {type(text).__name__}, not a string")
    if len(text) > MAX_TEXT_CHARS:
        raise SchemaError(
            keys.AVAILABILITY, f"{len(text)} characters is too long (limit {MAX_TEXT_CHARS})"
        )
    if not text.isascii():
        raise SchemaError(keys.AVAILABILITY, "holds non-ASCII characters")
    parts = text.split(";")
    if len(parts) != 3:
        raise SchemaError(keys.AVAILABILITY, "is not version;free;best (two ';' separators)")
    version, free_text, best_text = parts
    if version not in ("1", "2", str(FORMAT_VERSION)):
        raise SchemaError(
            keys.AVAILABILITY,
            f"version {version[:16]!r} is not 1, 2 or {FORMAT_VERSION}: upgrade the reader or the "
            "agent",
        )
    try:
        free = tuple(sorted(parse_cpulist(free_text, field=keys.AVAILABILITY)))
    except ParseError as e:
        raise SchemaError(keys.AVAILABILITY, f"free GPUs: {e}") from None
    if len(free) > MAX_GPUS or (free and free[-1] >= MAX_GPUS):
        raise SchemaError(keys.AVAILABILITY, f"free GPUs beyond the limit of {MAX_GPUS}")
    entries = best_text.split("/") if best_text else []
    if len(entries) != len(free):
        raise SchemaError(
            keys.AVAILABILITY, f"{len(entries)} best sets for {len(free)} free GPUs (one per k)"
        )
    best = tuple(
        _decode_entry(entry, k, len(free), int(version)) for k, entry in enumerate(entries, start=1)
    )
    decoded = Availability(free=free, best=best)
    if _encode(decoded, int(version)) != text:
        raise SchemaError(keys.AVAILABILITY, "is not in canonical form (as the agent writes it)")
    return decoded


def _decode_entry(entry: str, k: int, free: int, version: int) -> FreeSet:
    match = _ENTRY.fullmatch(entry)
    fields = None if match is None else [g for g in match.groups() if g is not None]
    if fields is None or len(fields) != 4 + version:
        raise SchemaError(
            keys.AVAILABILITY, f"best set for k={k} {entry[:32]!r} is not {_FORMS[version]}"
        )
    # The pattern admits only short ASCII digit runs: parse_decimal cannot refuse them.
    values = [parse_decimal(g, field=keys.AVAILABILITY) for g in fields]
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
        raise SchemaError(keys.AVAILABILITY, f"best set for k={k}: {problem}")
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
        keys.key(prefix, keys.GPU_FREE): str(len(a.free)),
        keys.key(prefix, keys.GPU_FREE_NVLINK_MAX): str(nvlink_max),
    }


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
        raise SchemaError(keys.ALLOCATION, "is not a short ASCII string")
    parts = text.split(";")
    if len(parts) != 3 or parts[0] != str(_ALLOCATION_VERSION):
        raise SchemaError(keys.ALLOCATION, f"is not {_ALLOCATION_VERSION};sources;claimed GPUs")
    sources = tuple(parts[1].split(",")) if parts[1] else ()
    if sources != tuple(s for s in ALLOCATION_SOURCES if s in sources):
        raise SchemaError(
            keys.ALLOCATION,
            f"sources {parts[1][:40]!r} are not some of {','.join(ALLOCATION_SOURCES)}",
        )
    try:
        claimed = tuple(sorted(parse_cpulist(parts[2], field=keys.ALLOCATION)))
    except ParseError as e:
        raise SchemaError(keys.ALLOCATION, f"claimed GPUs: {e}") from None
    if claimed and claimed[-1] >= MAX_GPUS:
        raise SchemaError(keys.ALLOCATION, f"claimed GPUs beyond the limit of {MAX_GPUS}")
    decoded = Allocation(sources=sources, claimed=claimed)
    if encode_allocation(decoded) != text:
        raise SchemaError(keys.ALLOCATION, "is not in canonical form (as the agent writes it)")
    return decoded
