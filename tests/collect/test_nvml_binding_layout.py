"""The installed nvidia-ml-py against NVIDIA's C header: struct layouts, constants, names.

The driver writes the fabric and platform structs at the C header's offsets; a binding that
declares them otherwise makes NVML answer into the wrong bytes (wrong clique, wrong state: every
nvidia-ml-py before 13.580.65 had such a defect, research/fabric-and-consumers.md §1). This test
loads the binding that is installed and fails here, not in a rack, when a release breaks it.

The C offsets below were measured with gcc's `offsetof` (x86-64) over NVIDIA's nvml.h as
NVIDIA/go-nvml carries it, gen/nvml/nvml.h at commit 2f9e261 (synced to CUDA 13.3, 2026-07-01):
nvmlGpuFabricInfo_v2_t (line 3924), nvmlGpuFabricInfo_v3_t (line 3942), nvmlPlatformInfo_v2_t
(line 1462). The version macros encode the sizes: nvmlGpuFabricInfo_v2 = 0x02000024 (36 bytes),
nvmlGpuFabricInfo_v3 = 0x03000028 (40), nvmlPlatformInfo_v2 = 0x0200002c (44).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from reporter.collect import fabricinfo
from reporter.collect.simulate import fake_nvml

C_FABRIC_V2 = {
    "version": (0, 4),
    "clusterUuid": (4, 16),
    "status": (20, 4),
    "cliqueId": (24, 4),
    "state": (28, 1),
    "healthMask": (32, 4),
}
C_FABRIC_V3 = {**C_FABRIC_V2, "healthSummary": (36, 1)}
C_PLATFORM_V2 = {
    "version": (0, 4),
    "ibGuid": (4, 16),
    "chassisSerialNumber": (20, 16),
    "slotNumber": (36, 1),
    "trayIndex": (37, 1),
    "hostId": (38, 1),
    "peerType": (39, 1),
    "moduleId": (40, 1),
}
C_STRUCTS = [
    ("c_nvmlGpuFabricInfo_v2_t", C_FABRIC_V2, 36, "nvmlGpuFabricInfo_v2", 0x02000024),
    ("c_nvmlGpuFabricInfo_v3_t", C_FABRIC_V3, 40, "nvmlGpuFabricInfo_v3", 0x03000028),
    ("c_nvmlPlatformInfo_v2_t", C_PLATFORM_V2, 44, "nvmlPlatformInfo_v2", 0x0200002C),
]


def layout(struct: Any) -> dict[str, tuple[int, int]]:
    return {
        name: (getattr(struct, name).offset, getattr(struct, name).size)
        for name, _ in struct._fields_
    }


def matches_c(struct: Any, c_layout: dict[str, tuple[int, int]]) -> list[str]:
    """Fields whose offset differs from C, or whose size does (`state` is declared wider than
    C's byte in every release: read as a byte, it is right as long as it starts there)."""
    found = layout(struct)
    wrong = []
    for name, (offset, size) in c_layout.items():
        got = found.get(name)
        if got is None or got[0] != offset or (got[1] != size and name != "state"):
            wrong.append(f"{name}: binding {got}, C {(offset, size)}")
    return wrong


@pytest.mark.parametrize(("name", "c_layout", "size", "macro", "version"), C_STRUCTS)
def test_the_installed_bindings_struct_is_the_c_headers(
    name: str, c_layout: dict[str, tuple[int, int]], size: int, macro: str, version: int
) -> None:
    struct = getattr(pynvml, name)
    assert matches_c(struct, c_layout) == []
    assert ctypes.sizeof(struct) == size
    if "clusterUuid" in c_layout:
        # Bytes, not c_char: a c_char array reads back cut at the first zero byte (12.570.86 to
        # 12.575.51), and a cluster UUID may hold one.
        fields = dict(struct._fields_)
        assert fields["clusterUuid"]._type_ is ctypes.c_uint8
    assert getattr(pynvml, macro) == version
    assert struct().version == version


@pytest.mark.parametrize(("name", "c_layout", "size", "macro", "version"), C_STRUCTS)
def test_the_fake_binding_declares_the_structs_as_the_real_one(
    name: str, c_layout: dict[str, tuple[int, int]], size: int, macro: str, version: int
) -> None:
    assert layout(getattr(fake_nvml, name)) == layout(getattr(pynvml, name))
    assert getattr(fake_nvml, macro) == version


def test_the_collector_reads_at_the_offsets_written_down_here() -> None:
    assert fabricinfo.FABRIC_V2_LAYOUT == C_FABRIC_V2
    assert fabricinfo.FABRIC_V3_LAYOUT == C_FABRIC_V3
    assert fabricinfo.PLATFORM_V2_LAYOUT == C_PLATFORM_V2
    sizes = (fabricinfo.FABRIC_V2_SIZE, fabricinfo.FABRIC_V3_SIZE, fabricinfo.PLATFORM_V2_SIZE)
    assert sizes == (36, 40, 44)


def test_a_binding_with_the_old_defect_would_fail_this_test() -> None:
    # nvidia-ml-py 12.575.51's legacy struct: clusterUuid as c_char * 80 (the UUID buffer size).
    class Broken(ctypes.Structure):
        _fields_ = (
            ("version", ctypes.c_uint),
            ("clusterUuid", ctypes.c_char * 80),
            ("status", ctypes.c_uint),
            ("cliqueId", ctypes.c_uint),
            ("state", ctypes.c_uint),
            ("healthMask", ctypes.c_uint),
        )

    assert matches_c(Broken, C_FABRIC_V2) == [
        "clusterUuid: binding (4, 80), C (4, 16)",
        "status: binding (84, 4), C (20, 4)",
        "cliqueId: binding (88, 4), C (24, 4)",
        "state: binding (92, 4), C (28, 1)",
        "healthMask: binding (96, 4), C (32, 4)",
    ]


C_MASK_FIELDS = {
    # NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* and _WIDTH_* of the same nvml.h (lines 3828-3885)...
    "degraded bandwidth": (0, 0x3),
    "route recovery": (2, 0x3),
    "route unhealthy": (4, 0x3),
    "access timeout recovery": (6, 0x3),
    "incorrect configuration": (8, 0xF),
    "partition assigned": (12, 0x3),
    # ...and the fabric manager's state, which that header lacks: nvidia-ml-py 13.615.71's
    # NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE / _WIDTH_GFM_STATE.
    "fabric manager": (14, 0x3),
}


def test_the_health_mask_is_decoded_by_the_c_headers_layout() -> None:
    # Not by the binding's constants: 13.580.65 (the floor) declares every width as 0x11.
    assert {f.name: (f.shift, f.width) for f in fabricinfo.MASK_FIELDS} == C_MASK_FIELDS
    states = {code: state.value for code, state in fabricinfo.STATES.items()}
    assert states == {
        pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not-supported",
        pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not-started",
        pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in-progress",
        pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
    }
    assert sorted(fabricinfo.SUMMARIES) == [
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
    ]


def test_the_binding_has_every_name_the_collector_calls() -> None:
    for function in (
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetPlatformInfo",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetNvLinkState",
    ):
        assert callable(getattr(pynvml, function)), function
    assert issubclass(pynvml.NVMLError_ArgumentVersionMismatch, pynvml.NVMLError)
    assert pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH).value == 25
    fields = {
        "NVML_FI_DEV_NVLINK_LINK_COUNT": 91,
        "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 52,
        "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 59,
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 38,
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 45,
        "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS": 214,
    }
    for name, value in fields.items():
        assert getattr(pynvml, name) == value == getattr(fake_nvml, name), name
