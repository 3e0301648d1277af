"""A fake `pynvml` module built from a simulated machine, with faults one can inject.

It has the real binding's function names, argument order, return types (str, ints, ctypes
arrays and structures with the same field names, `busId` as bytes) and exceptions (`NVMLError` with
`.value`, one subclass per `NVML_ERROR_*`, built the way nvidia-ml-py 13 builds them, so
`NVMLError(15)` is an `NVMLError_GpuIsLost`). The NVML collector is handed this object instead of
the `pynvml` module and runs unchanged. It never imports `pynvml`: only reporter.collect.nvml does.
"""

from __future__ import annotations

import ctypes
import string
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from reporter.collect.fabricinfo import PLATFORM_V2_LAYOUT
from reporter.collect.simulate.machine import MAX_MIG_DEVICES, FabricSpec, Machine, PciFunction

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_UNKNOWN = 999

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_AFFINITY_SCOPE_NODE = 0
NVML_AFFINITY_SCOPE_SOCKET = 1

NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024  # noqa: N816 (the binding's name)
nvmlGpuFabricInfo_v3 = 0x03000028  # noqa: N816
nvmlPlatformInfo_v2 = 0x0200002C  # noqa: N816

NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS = 214
COUNTER_FIELDS = {
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
}
"""The NVLink error counters `Faults.counters` sets, by field ID; recovery failures (per link,
field 214) are served on link 0."""

# The binding that ships with nvidia-ml-py 13 walks 36 links; 12.x bindings say 18, old ones 12.
DEFAULT_NVLINK_MAX_LINKS = 36


class NVMLError(Exception):
    """The binding's error: `NVMLError(code)` becomes the subclass for that code."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}  # noqa: N815 (the binding's name)
    value: int

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _error_classes() -> dict[str, type[NVMLError]]:
    """`NVMLError_GpuIsLost` and its siblings, named from the codes as the binding names them."""
    module = sys.modules[__name__]
    classes: dict[str, type[NVMLError]] = {}
    for name in dir(module):
        if not name.startswith("NVML_ERROR_"):
            continue
        code = getattr(module, name)
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace(
            "_", ""
        )

        def make_new(val: int) -> Any:
            def new(error_class: type[NVMLError], *args: object) -> NVMLError:
                obj = Exception.__new__(error_class)
                obj.value = val
                return obj

            return new

        cls = type(class_name, (NVMLError,), {"__new__": make_new(code)})
        cls.__module__ = __name__
        classes[class_name] = cls
        NVMLError._valClassMapping[code] = cls
    return classes


ERROR_CLASSES = _error_classes()


class nvmlPciInfo_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    )


class c_nvmlMemory_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    )

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
        ("healthSummary", ctypes.c_uint8),
    )

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


# nvidia-ml-py 13 keeps the unversioned name on the v2 struct, as here.
c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t  # noqa: N816 (the binding's name)


class c_nvmlPlatformInfo_v2_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    """As the binding declares it: `c_char` fields, which read back cut at a zero byte."""

    _fields_ = (
        ("version", ctypes.c_uint),
        ("ibGuid", ctypes.c_char * 16),
        ("chassisSerialNumber", ctypes.c_char * 16),
        ("slotNumber", ctypes.c_char),
        ("trayIndex", ctypes.c_char),
        ("hostId", ctypes.c_char),
        ("peerType", ctypes.c_char),
        ("moduleId", ctypes.c_char),
    )

    def __init__(self) -> None:
        super().__init__(version=nvmlPlatformInfo_v2)


class c_nvmlValue_t(ctypes.Union):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    )


class c_nvmlFieldValue_t(ctypes.Structure):  # noqa: N801 (the binding's name)
    _fields_ = (
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    )


@dataclass(frozen=True)
class Faults:
    """What goes wrong on the simulated machine.

    `init` is an NVML_ERROR_* code raised by nvmlInit; `lost` GPUs raise GpuIsLost from every call
    (their handles included); `calls` maps (function name, GPU index or None for every GPU) to the
    code that call raises; `links_down` maps a GPU to how many of its NVLinks are inactive (its
    last ones; as many as it has or more: all), on top of what the profile's `links_down` says;
    `old_driver` drops the functions an old driver lacks (FunctionNotFound), as r470 lacks the
    remote device type. `visible` is the GPUs the container runtime hands the pod
    (`NVIDIA_VISIBLE_DEVICES`), by machine index; NVML numbers them 0..k-1 and does not know the
    others; None means all. `counters` sets a GPU's NVLink error counters (`replay`, `recovery`,
    `crc_flit`, `crc_data`, `recovery_failed`; 0 when not set). `fabric_v2_only` is a driver
    (R550 to R565) that knows the v2 fabric struct only: the v3 one is a version mismatch.
    `link_count` makes a GPU's NVML_FI_DEV_NVLINK_LINK_COUNT answer a number of its own (garbage,
    or more links than its profile wires), whatever links the GPU really has.
    """

    init: int | None = None
    lost: frozenset[int] = frozenset()
    calls: Mapping[tuple[str, int | None], int] = field(default_factory=dict)
    links_down: Mapping[int, int] = field(default_factory=dict)
    old_driver: bool = False
    visible: frozenset[int] | None = None
    counters: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    fabric_v2_only: bool = False
    link_count: Mapping[int, int] = field(default_factory=dict)


_OLD_DRIVER_MISSING = frozenset(
    {
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetCpuAffinityWithinScope",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetPlatformInfo",
    }
)


@dataclass(frozen=True)
class FakeHandle:
    """What `nvmlDeviceGetHandleByIndex` returns: opaque to the caller."""

    index: int


@dataclass(frozen=True)
class FakeMigHandle:
    """What `nvmlDeviceGetMigDeviceHandleByIndex` returns: the parent GPU's index and the slot.

    It carries the parent's `index`, so a fault on the parent (lost, a failing call) hits it too.
    """

    index: int
    slot: int


def _nvml_bus_id(address: str) -> bytes:
    """NVML's spelling of a PCI address: 8-digit domain, upper case (`00000000:B7:00.0`)."""
    domain, bus, rest = address.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}".encode()


def _pci_info(address: str) -> nvmlPciInfo_t:
    domain, bus, rest = address.split(":")
    info = nvmlPciInfo_t()
    info.busId = _nvml_bus_id(address)
    info.busIdLegacy = _nvml_bus_id(address)[-12:]
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    return info


def _mask(members: frozenset[int], words: int) -> ctypes.Array[ctypes.c_ulonglong]:
    array = (ctypes.c_ulonglong * words)()
    for m in members:
        if m < words * 64:
            array[m // 64] |= 1 << (m % 64)
    return array


def common_ancestor_level(a: PciFunction, b: PciFunction) -> int:
    """What NVML answers for two devices of the simulated tree, from its bridge units.

    NVML counts PCIe switches, not bridge functions: SINGLE is one switch (or root port) between
    the two, MULTIPLE several without the host bridge, then HOSTBRIDGE, NODE, SYSTEM.
    """
    if a.host_bridge != b.host_bridge:
        same_node = a.numa is not None and a.numa == b.numa and a.domain == b.domain
        return NVML_TOPOLOGY_NODE if same_node else NVML_TOPOLOGY_SYSTEM
    shared = 0
    while shared < min(len(a.hops), len(b.hops)) and a.hops[shared] == b.hops[shared]:
        shared += 1
    if shared == 0:
        return NVML_TOPOLOGY_HOSTBRIDGE
    traversed = (len(a.hops) - shared) + (len(b.hops) - shared) + 1
    return NVML_TOPOLOGY_SINGLE if traversed == 1 else NVML_TOPOLOGY_MULTIPLE


class FakeNvml:
    """A stand-in for the `pynvml` module, answering for one simulated machine."""

    def __init__(
        self,
        machine: Machine,
        faults: Faults | None = None,
        *,
        nvlink_max_links: int = DEFAULT_NVLINK_MAX_LINKS,
    ) -> None:
        self.machine = machine
        self.faults = faults or Faults()
        self.NVML_NVLINK_MAX_LINKS = nvlink_max_links
        self.initialized = False
        self.calls: list[str] = []
        module = sys.modules[__name__]
        for name in dir(module):
            if name.startswith("NVML_") and name != "NVML_NVLINK_MAX_LINKS":
                setattr(self, name, getattr(module, name))
        # The binding's error classes and structures, under the binding's names.
        exported: dict[str, Any] = {
            **ERROR_CLASSES,
            "NVMLError": NVMLError,
            "nvmlPciInfo_t": nvmlPciInfo_t,
            "c_nvmlMemory_t": c_nvmlMemory_t,
            "c_nvmlGpuFabricInfoV_t": c_nvmlGpuFabricInfoV_t,
            "c_nvmlGpuFabricInfo_v2_t": c_nvmlGpuFabricInfo_v2_t,
            "c_nvmlGpuFabricInfo_v3_t": c_nvmlGpuFabricInfo_v3_t,
            "c_nvmlPlatformInfo_v2_t": c_nvmlPlatformInfo_v2_t,
            "c_nvmlFieldValue_t": c_nvmlFieldValue_t,
            "nvmlGpuFabricInfo_v2": nvmlGpuFabricInfo_v2,
            "nvmlGpuFabricInfo_v3": nvmlGpuFabricInfo_v3,
            "nvmlPlatformInfo_v2": nvmlPlatformInfo_v2,
        }
        for name, value in exported.items():
            setattr(self, name, value)

    # --- plumbing -----------------------------------------------------------------------------

    def _enter(self, function: str, handle: FakeHandle | None = None) -> None:
        self.calls.append(function)
        if self.faults.old_driver and function in _OLD_DRIVER_MISSING:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        index = None if handle is None else handle.index
        if index is not None and index in self.faults.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        for key in ((function, index), (function, None)):
            if key in self.faults.calls:
                raise NVMLError(self.faults.calls[key])

    def _gpu(self, handle: FakeHandle) -> tuple[Any, PciFunction]:
        return self.machine.gpus[handle.index], self.machine.gpu_functions[handle.index]

    # --- the binding's functions -----------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 (the binding's name)
        self.calls.append("nvmlInit")
        if self.faults.init is not None:
            raise NVMLError(self.faults.init)
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.machine.driver

    def _visible(self) -> list[int]:
        """Machine indexes of the GPUs NVML sees, in its order (PCI bus order, as the machine's)."""
        every = range(len(self.machine.gpus))
        visible = self.faults.visible
        return list(every) if visible is None else [i for i in every if i in visible]

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        visible = self._visible()
        if not 0 <= index < len(visible):
            self._enter("nvmlDeviceGetHandleByIndex")
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = FakeHandle(visible[index])
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: FakeHandle | FakeMigHandle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetUUID", FakeHandle(handle.index))
        gpu = self.machine.gpus[handle.index]
        if isinstance(handle, FakeMigHandle):
            return str(gpu.mig_devices[handle.slot])
        return str(gpu.uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetName", handle)
        return str(self._gpu(handle)[0].model)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> nvmlPciInfo_t:  # noqa: N802
        self._enter("nvmlDeviceGetPciInfo", handle)
        return _pci_info(self._gpu(handle)[1].address)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> c_nvmlMemory_t:  # noqa: N802
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        total = int(self._gpu(handle)[0].mem_mib) * 1024 * 1024
        return c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:  # noqa: N802
        self._enter("nvmlDeviceGetMigMode", handle)
        mig = self._gpu(handle)[0].mig
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        mig = self._gpu(handle)[0].mig
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG_DEVICES if mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeMigHandle:  # noqa: N802
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        gpu = self._gpu(device)[0]
        if not gpu.mig or not 0 <= index < MAX_MIG_DEVICES:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # an empty slot, as NVML says for it
        return FakeMigHandle(device.index, index)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: FakeHandle, device2: FakeHandle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._enter("nvmlDeviceGetTopologyCommonAncestor", device2)
        return common_ancestor_level(self._gpu(device1)[1], self._gpu(device2)[1])

    def _link(self, handle: FakeHandle, link: int) -> Any:
        ends = self._gpu(handle)[0].nvlinks
        if not ends:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(ends):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return ends[link]

    def _links_down(self, index: int) -> int:
        gpu = self.machine.gpus[index]
        return max(gpu.links_down, self.faults.links_down.get(index, 0))

    def nvmlDeviceGetNvLinkState(self, device: FakeHandle, link: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkState", device)
        ends = self._gpu(device)[0].nvlinks
        self._link(device, link)
        down = link >= len(ends) - self._links_down(device.index)
        return NVML_FEATURE_DISABLED if down else NVML_FEATURE_ENABLED

    def nvmlDeviceGetFieldValues(  # noqa: N802
        self,
        handle: FakeHandle,
        fieldIds: list[int | tuple[int, int]],  # noqa: N803
    ) -> ctypes.Array[c_nvmlFieldValue_t]:
        self._enter("nvmlDeviceGetFieldValues", handle)
        gpu = self._gpu(handle)[0]
        counters = self.faults.counters.get(handle.index, {})
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        for slot, requested in enumerate(fieldIds):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value = values[slot]
            value.fieldId, value.scopeId = field_id, scope
            if not gpu.nvlinks:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            elif field_id == NVML_FI_DEV_NVLINK_LINK_COUNT:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = self.faults.link_count.get(handle.index, len(gpu.nvlinks))
            elif field_id in COUNTER_FIELDS or field_id == (
                NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS
            ):
                name = COUNTER_FIELDS.get(field_id, "recovery_failed")
                count = counters.get(name, 0) if name != "recovery_failed" or scope == 0 else 0
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = count
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return int(self._gpu(handle)[0].minor)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: FakeHandle, link: int) -> nvmlPciInfo_t:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", device)
        end = self._link(device, link)
        if end.switch is not None:
            return _pci_info(self.machine.nvswitches[end.switch])
        return _pci_info(self.machine.gpu_functions[end.gpu].address)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeHandle, link: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        end = self._link(handle, link)
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if end.switch else NVML_NVLINK_DEVICE_TYPE_GPU

    def _check_scope(self, scope: int) -> None:
        if scope not in (NVML_AFFINITY_SCOPE_NODE, NVML_AFFINITY_SCOPE_SOCKET):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCpuAffinityWithinScope(  # noqa: N802
        self,
        handle: FakeHandle,
        cpu_set_size: int,
        scope: int,
    ) -> ctypes.Array[ctypes.c_ulonglong]:
        self._enter("nvmlDeviceGetCpuAffinityWithinScope", handle)
        self._check_scope(scope)
        return _mask(self.machine.cpus_of(self._gpu(handle)[0].memory_affinity), cpu_set_size)

    def nvmlDeviceGetCpuAffinity(  # noqa: N802
        self,
        handle: FakeHandle,
        cpu_set_size: int,
    ) -> ctypes.Array[ctypes.c_ulonglong]:
        self._enter("nvmlDeviceGetCpuAffinity", handle)
        return _mask(self.machine.cpus_of(self._gpu(handle)[0].memory_affinity), cpu_set_size)

    def nvmlDeviceGetMemoryAffinity(  # noqa: N802
        self,
        handle: FakeHandle,
        node_set_size: int,
        scope: int,
    ) -> ctypes.Array[ctypes.c_ulonglong]:
        self._enter("nvmlDeviceGetMemoryAffinity", handle)
        self._check_scope(scope)
        return _mask(self._gpu(handle)[0].memory_affinity or frozenset(), node_set_size)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNumaNodeId", handle)
        node = self._gpu(handle)[0].gpu_numa
        if node is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(node)

    def _fabric(self, device: FakeHandle) -> FabricSpec:
        spec: FabricSpec | None = self._gpu(device)[0].fabric
        if spec is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return spec

    def nvmlDeviceGetGpuFabricInfoV(self, device: FakeHandle, gpuFabricInfo: Any) -> int:  # noqa: N802, N803
        self._enter("nvmlDeviceGetGpuFabricInfoV", device)
        spec = self._fabric(device)
        # The binding hands the argument straight to C, so callers pass ctypes.byref(info).
        info = gpuFabricInfo._obj
        known = {nvmlGpuFabricInfo_v2} | (
            set() if self.faults.fabric_v2_only else {nvmlGpuFabricInfo_v3}
        )
        if info.version not in known:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.clusterUuid[:] = list(spec.cluster_uuid)
        info.status = spec.status
        info.cliqueId = spec.clique
        info.state = spec.state
        info.healthMask = spec.health_mask
        if info.version == nvmlGpuFabricInfo_v3:
            info.healthSummary = spec.health_summary
        return NVML_SUCCESS

    def nvmlDeviceGetPlatformInfo(self, device: FakeHandle, platformInfo: Any) -> int:  # noqa: N802, N803
        self._enter("nvmlDeviceGetPlatformInfo", device)
        spec = self._fabric(device)
        if not spec.has_position:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = platformInfo._obj
        if info.version != nvmlPlatformInfo_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        # Written as the driver writes the C struct: bytes at their offsets, the serial NUL-padded
        # and cut to its 16 bytes.
        serial = (spec.chassis_serial or b"")[:16].ljust(16, b"\x00")
        base = ctypes.addressof(info)
        ctypes.memmove(base + PLATFORM_V2_LAYOUT["chassisSerialNumber"][0], serial, 16)
        for name, value in (
            ("slotNumber", spec.slot),
            ("trayIndex", spec.tray),
            ("hostId", spec.host_id),
        ):
            ctypes.memmove(base + PLATFORM_V2_LAYOUT[name][0], bytes([value or 0]), 1)
        return NVML_SUCCESS
