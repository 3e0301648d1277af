"""What the scheduler did, seen from the node: the quality of the GPU sets running containers hold.

The agent already reads, for availability, which GPUs every container holds (the kubelet's
PodResources: device plugin devices and DRA claims). A container holding two or more of the node's
GPUs has a *set*, judged here against the topology, with no extra read:

- `connected`: every pair of the set is NVLink-joined (`NV<k>` either way), what an all-reduce
  needs to run at NVLink speed;
- `worst`: the farthest path between two GPUs of the set (`NV`, `PIX`, `PXB`, `PHB`, `NODE`,
  `SYS`; with the smallest NVLink bond where every pair is NVLink, `NV12`, for people);
- `numa`: whether its GPUs sit on one NUMA node (`one`, `several`, or `unknown` where a GPU's NUMA
  node is not known).

The metrics count sets by size and quality, never by pod (bounded cardinality). For
`kubectl gpu-topology NODE` the agent also publishes which container holds which set, in the
`gpu-sets` annotation written with availability (`encode_held_sets`): the annotation value,
version 1, in ASCII, is

    1;<namespace>/<pod>/<container>=<gpus>;...

one entry per container holding two or more GPUs, sorted, `<gpus>` a Linux list string
(`0-3,6`). Entries past MAX_HELD_CHARS are left out and counted in a last entry `+<n>`, so a node
packed with small multi-GPU pods never outgrows its Node object. It changes only when containers
start or end holding GPUs, which changes the free GPUs too, so it rides in the availability's own
patch and costs no write of its own (none while idle).

Pure: no I/O; the agent, the kubectl plugin and the tests share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parsers.cpulist import format_cpulist, parse_cpulist
from parsers.errors import ParseError
from parsers.links import LinkKind
from reporter.errors import SchemaError
from reporter.placement import nvlink_reach
from reporter.schema import keys
from reporter.schema.model import MAX_GPUS, Topology

MAX_HELD_CHARS = 16_384
"""The most the entries of `gpu-sets` take; the rest are counted, not listed."""
_VERSION = 1
_MAX_TEXT_CHARS = MAX_HELD_CHARS + 512
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_ENTRY = re.compile(rf"({_DNS_LABEL})/({_DNS_SUBDOMAIN})/({_DNS_LABEL})=([0-9,-]{{1,2048}})")
_MORE = re.compile(r"\+([1-9][0-9]{0,5})")

NUMA_ONE, NUMA_SEVERAL, NUMA_UNKNOWN = "one", "several", "unknown"


@dataclass(frozen=True, slots=True, order=True)
class HeldSet:
    """The GPUs one container holds (device plugin devices and DRA claims together)."""

    namespace: str
    pod: str
    container: str
    gpus: tuple[int, ...]
    """GPU indexes, ascending, two or more."""


@dataclass(frozen=True, slots=True)
class SetQuality:
    """How well a set of GPUs is wired (see the module docstring)."""

    gpus: tuple[int, ...]
    connected: bool
    worst: LinkKind
    worst_token: str
    """`worst` as nvidia-smi prints it: `NV12` (the smallest bond) or `SYS`, ..."""
    numa: str
    """NUMA_ONE, NUMA_SEVERAL or NUMA_UNKNOWN."""


def judge(topology: Topology, gpus: Iterable[int]) -> SetQuality:
    """The quality of the set `gpus` (two or more GPU indexes of `topology`, lost ones too: a
    container can hold a GPU that fell off the bus)."""
    chosen = tuple(sorted(set(gpus)))
    pairs = [topology.link(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    connected = all(
        topology.link(a, b).is_nvlink or topology.link(b, a).is_nvlink
        for i, a in enumerate(chosen)
        for b in chosen[i + 1 :]
    )
    # Closeness grows with distance, and among NVLinks with fewer bonded links.
    worst = max(pairs, key=lambda link: link.closeness)
    homes = {topology.home_numa(i) for i in chosen}
    numa = NUMA_UNKNOWN if None in homes else NUMA_ONE if len(homes) == 1 else NUMA_SEVERAL
    return SetQuality(chosen, connected, worst.kind, worst.token, numa)


def largest_free_connected(topology: Topology, free: Iterable[int]) -> int:
    """The size of the largest set of free GPUs, all pairwise NVLink-joined (lost GPUs dropped): 1
    where free GPUs share no NVLink, 0 with none free. Where the search budget runs out, the free
    NVLink island stands in (`nvlink_reach`), never smaller."""
    return max(nvlink_reach(topology, free)[0].values(), default=0)


def encode_held_sets(sets: Iterable[HeldSet]) -> str:
    """The annotation value (see the module docstring); sets of fewer than two GPUs left out."""
    entries, left_out, size = [], 0, 0
    for s in sorted(x for x in sets if len(x.gpus) >= 2):
        entry = f"{s.namespace}/{s.pod}/{s.container}={format_cpulist(s.gpus)}"
        if left_out or size + len(entry) + 1 > MAX_HELD_CHARS:
            left_out += 1
            continue
        entries.append(entry)
        size += len(entry) + 1
    if left_out:
        entries.append(f"+{left_out}")
    return ";".join([str(_VERSION), *entries])


def decode_held_sets(text: str) -> tuple[tuple[HeldSet, ...], int]:
    """The sets an annotation value lists and how many it left out; exactly what
    `encode_held_sets` writes, nothing else. Raises SchemaError (field `gpu-sets`)."""
    if not isinstance(text, str) or len(text) > _MAX_TEXT_CHARS or not text.isascii():
        raise SchemaError(keys.GPU_SETS, "is not a short ASCII string")
    version, *entries = text.split(";")
    if version != str(_VERSION):
        raise SchemaError(keys.GPU_SETS, f"is not version {_VERSION}")
    left_out = 0
    if entries and (more := _MORE.fullmatch(entries[-1])):
        left_out = int(more.group(1))
        entries.pop()
    sets = []
    for entry in entries:
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise SchemaError(keys.GPU_SETS, f"entry {entry[:80]!r} is not ns/pod/container=GPUs")
        namespace, pod, container, listed = match.groups()
        try:
            gpus = tuple(sorted(parse_cpulist(listed, field=keys.GPU_SETS)))
        except ParseError as e:
            raise SchemaError(keys.GPU_SETS, f"GPUs of {namespace}/{pod}: {e}") from None
        if len(gpus) < 2 or gpus[-1] >= MAX_GPUS:
            raise SchemaError(keys.GPU_SETS, f"GPUs of {namespace}/{pod} are not 2 to {MAX_GPUS}")
        sets.append(HeldSet(namespace, pod, container, gpus))
    decoded = tuple(sets)
    if encode_held_sets(decoded) + (f";+{left_out}" if left_out else "") != text:
        raise SchemaError(keys.GPU_SETS, "is not in canonical form (as the agent writes it)")
    return decoded, left_out
