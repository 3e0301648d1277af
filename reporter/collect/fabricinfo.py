"""NVML's fabric and platform structs, read from their bytes at the C header's offsets, and decoded.

`nvmlDeviceGetGpuFabricInfoV` and `nvmlDeviceGetPlatformInfo` fill a caller's struct. The Python
binding declared these structs wrongly for years (research/fabric-and-consumers.md §1: an 80-byte
`clusterUuid`, a `c_char` array cut at the first zero byte), so the collector hands the driver the
binding's struct and reads the answer as bytes at the offsets of NVIDIA's C header, which a test
also checks the installed binding against. Decoding is pure and judges every value: a state NVML
does not define, a cluster UUID of the wrong size, the clique 2^32-1, health-mask bits without a
meaning, a rack serial that is not a label value, become `unknown` or None with a problem line,
never a value someone would group nodes by. This module never calls NVML and never imports pynvml.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from parsers.errors import excerpt
from reporter.schema.fabric import CONDITIONS, is_label_value
from reporter.schema.model import FabricHealth, FabricState, GpuFabric, RackPosition

# C layouts, from NVIDIA's nvml.h as NVIDIA/go-nvml gen/nvml/nvml.h @2f9e261 (CUDA 13.3) carries
# it, measured with gcc's offsetof on x86-64: (offset, size) per field, and the struct's size.
# nvmlGpuFabricInfo_v2 = 0x02000024 and _v3 = 0x03000028 encode the same sizes (36, 40).
FABRIC_V2_LAYOUT = {
    "version": (0, 4),
    "clusterUuid": (4, 16),
    "status": (20, 4),
    "cliqueId": (24, 4),
    "state": (28, 1),
    "healthMask": (32, 4),
}
FABRIC_V2_SIZE = 36
FABRIC_V3_LAYOUT = {**FABRIC_V2_LAYOUT, "healthSummary": (36, 1)}
FABRIC_V3_SIZE = 40
PLATFORM_V2_LAYOUT = {
    "version": (0, 4),
    "ibGuid": (4, 16),
    "chassisSerialNumber": (20, 16),
    "slotNumber": (36, 1),
    "trayIndex": (37, 1),
    "hostId": (38, 1),
    "peerType": (39, 1),
    "moduleId": (40, 1),
}
PLATFORM_V2_SIZE = 44

NVML_SUCCESS = 0
STATES = {
    0: FabricState.NOT_SUPPORTED,
    1: FabricState.NOT_STARTED,
    2: FabricState.IN_PROGRESS,
    3: FabricState.COMPLETED,
}
"""NVML_GPU_FABRIC_STATE_*."""
SUMMARIES = {
    1: FabricHealth.HEALTHY,
    2: FabricHealth.UNHEALTHY,
    3: FabricHealth.LIMITED_CAPACITY,
}
"""NVML_GPU_FABRIC_HEALTH_SUMMARY_* (0 is NOT_SUPPORTED: no summary)."""
INVALID_CLIQUE = 2**32 - 1
"""A clique ID of all ones: no partition NVML could assign, read as unreadable."""


@dataclass(frozen=True, slots=True)
class MaskField:
    """One field of the fabric health mask: `(mask >> shift) & width`."""

    name: str
    shift: int
    width: int
    fine: frozenset[int]
    """Values that say all is well (0, NOT_SUPPORTED, says nothing and is fine too)."""
    bad: dict[int, str]
    """Values that name a condition of `reporter.schema.fabric.CONDITIONS`."""


# NVML_GPU_FABRIC_HEALTH_MASK_* of nvml.h (go-nvml @2f9e261); the fabric-manager field is in
# nvidia-ml-py 13.615.71's pynvml.py (NVML_GPU_FABRIC_HEALTH_MASK_*_GFM_STATE), not in that header.
MASK_FIELDS = (
    MaskField("degraded bandwidth", 0, 0x3, frozenset({2}), {1: "degraded-bandwidth"}),
    MaskField("route recovery", 2, 0x3, frozenset({2}), {1: "route-recovery"}),
    MaskField("route unhealthy", 4, 0x3, frozenset({2}), {1: "route-unhealthy"}),
    MaskField("access timeout recovery", 6, 0x3, frozenset({2}), {1: "access-timeout-recovery"}),
    MaskField(
        "incorrect configuration",
        8,
        0xF,
        frozenset({1}),
        {
            2: "incorrect-sysguid",
            3: "incorrect-chassis-serial",
            4: "no-partition",
            5: "insufficient-nvlinks",
            6: "incompatible-gpu-firmware",
            7: "invalid-location",
            8: "gpu-state-invalid",
        },
    ),
    MaskField("partition assigned", 12, 0x3, frozenset({1}), {2: "partition-not-assigned"}),
    MaskField("fabric manager", 14, 0x3, frozenset({1}), {2: "fabric-manager-disconnected"}),
)
_KNOWN_BITS = sum(f.width << f.shift for f in MASK_FIELDS)
MASK_INVALID = "health-mask-invalid"


def decode_health_mask(mask: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(conditions, problems) of a health mask; bits or values NVML does not define add the
    `health-mask-invalid` condition and a problem naming them."""
    found: set[str] = set()
    problems: list[str] = []
    for field in MASK_FIELDS:
        value = (mask >> field.shift) & field.width
        if value == 0 or value in field.fine:
            continue
        if value in field.bad:
            found.add(field.bad[value])
        else:
            problems.append(f"health mask {mask:#x}: {field.name} value {value} is not defined")
    stray = mask & ~_KNOWN_BITS & 0xFFFFFFFF
    if stray:
        problems.append(f"health mask {mask:#x}: bits {stray:#x} are not defined")
    if problems:
        found.add(MASK_INVALID)
    return tuple(c for c in CONDITIONS if c in found), tuple(problems)


def health_mask(conditions: tuple[str, ...] | list[str]) -> int:
    """The mask a driver reports for `conditions`: every field supported, those named set.

    Raises ValueError for a name that is no mask condition.
    """
    mask = 0
    chosen: dict[str, int] = {}
    for name in conditions:
        field = next((f for f in MASK_FIELDS if name in f.bad.values()), None)
        if field is None:
            raise ValueError(f"{excerpt(name)} is not a fabric health condition")
        chosen[field.name] = next(v for v, n in field.bad.items() if n == name)
    for field in MASK_FIELDS:
        mask |= chosen.get(field.name, min(field.fine)) << field.shift
    return mask


def _word(raw: bytes, offset: int) -> int:
    value: int = struct.unpack_from("=I", raw, offset)[0]
    return value


def decode_fabric(raw: bytes, *, summary: bool) -> GpuFabric:
    """A GPU's fabric from the bytes of a filled v3 (`summary`) or v2 struct.

    Raises ValueError when `raw` is shorter than the struct.
    """
    size = FABRIC_V3_SIZE if summary else FABRIC_V2_SIZE
    if len(raw) < size:
        raise ValueError(f"fabric info is {len(raw)} bytes, the C struct {size}")
    problems: list[str] = []
    code = raw[FABRIC_V2_LAYOUT["state"][0]]
    state = STATES.get(code, FabricState.UNKNOWN)
    if state is FabricState.UNKNOWN:
        problems.append(f"fabric state {code} is not one NVML defines")
    start, width = FABRIC_V2_LAYOUT["clusterUuid"]
    cluster_bytes = raw[start : start + width]
    clique: int | None = _word(raw, FABRIC_V2_LAYOUT["cliqueId"][0])
    cluster: str | None = None
    if any(cluster_bytes):
        cluster = str(uuid.UUID(bytes=cluster_bytes))
    elif clique and state is FabricState.COMPLETED:
        # NVIDIA's tools read a zero cluster UUID as NVLink without a multi-node fabric; a
        # clique beside it is a contradiction worth saying (the node stays its own domain).
        problems.append(f"cluster UUID is all zero beside clique {clique}: no multi-node fabric")
    if clique == INVALID_CLIQUE:
        problems.append(f"clique {INVALID_CLIQUE} (2^32-1) is no partition")
        clique = None
    status = _word(raw, FABRIC_V2_LAYOUT["status"][0])
    conditions, mask_problems = decode_health_mask(_word(raw, FABRIC_V2_LAYOUT["healthMask"][0]))
    problems += mask_problems
    health = None
    if summary:
        value = raw[FABRIC_V3_LAYOUT["healthSummary"][0]]
        health = SUMMARIES.get(value)
        if health is None and value != 0:
            problems.append(f"health summary {value} is not one NVML defines")
    return GpuFabric(
        state=state,
        cluster_uuid=cluster,
        clique=clique,
        error=None if status == NVML_SUCCESS else status,
        health=health,
        conditions=conditions,
        problems=tuple(problems),
    )


def unreadable_fabric(problem: str) -> GpuFabric:
    """A GPU whose fabric answer cannot be read at all: state unknown, nothing to group by."""
    return GpuFabric(state=FabricState.UNKNOWN, problems=(problem,))


def decode_platform(raw: bytes) -> tuple[RackPosition, tuple[str, ...]]:
    """(position, problems) from the bytes of a filled nvmlPlatformInfo_v2_t.

    The chassis serial is NUL-padded ASCII (13 bytes on Blackwell): one that fills all 16 bytes
    cannot be told from a longer one cut short, and one that is not a label value (control
    characters, spaces) is not published; either is None with a problem. Raises ValueError when
    `raw` is shorter than the struct.
    """
    if len(raw) < PLATFORM_V2_SIZE:
        raise ValueError(f"platform info is {len(raw)} bytes, the C struct {PLATFORM_V2_SIZE}")
    start, width = PLATFORM_V2_LAYOUT["chassisSerialNumber"]
    field = raw[start : start + width]
    problems: list[str] = []
    serial: str | None = None
    if b"\x00" not in field:
        problems.append(f"chassis serial fills all {width} bytes: cut short or garbage")
    else:
        text = field.split(b"\x00", 1)[0].decode("ascii", errors="replace")
        if text and is_label_value(text):
            serial = text
        elif text:
            problems.append(f"chassis serial {text!a} is not a label value")
    return (
        RackPosition(
            chassis_serial=serial,
            slot=raw[PLATFORM_V2_LAYOUT["slotNumber"][0]],
            tray=raw[PLATFORM_V2_LAYOUT["trayIndex"][0]],
            host_id=raw[PLATFORM_V2_LAYOUT["hostId"][0]],
        ),
        tuple(problems),
    )
