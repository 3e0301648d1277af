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

from reporter.collect.simulate.machine import MAX_MIG_DEVICES, Machine, PciFunction

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


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t  # noqa: N816 (the binding's name)


@dataclass(frozen=True)
class Faults:
    """What goes wrong on the simulated machine.

    `init` is an NVML_ERROR_* code raised by nvmlInit; `lost` GPUs raise GpuIsLost from every call
    (their handles included); `calls` maps (function name, GPU index or None for every GPU) to the
    code that call raises; `links_down` GPUs report every NVLink inactive; `old_driver` drops the
    functions an old driver lacks (FunctionNotFound), as r470 lacks the remote device type.
    `visible` is the GPUs the container runtime hands the pod (`NVIDIA_VISIBLE_DEVICES`), by
    machine index; NVML numbers them 0..k-1 and does not know the others; None means all.
    """

    init: int | None = None
    lost: frozenset[int] = frozenset()
    calls: Mapping[tuple[str, int | None], int] = field(default_factory=dict)
    links_down: frozenset[int] = frozenset()
    old_driver: bool = False
    visible: frozenset[int] | None = None


_OLD_DRIVER_MISSING = frozenset(
    {
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetCpuAffinityWithinScope",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetNumaNodeId",
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

    def nvmlDeviceGetNvLinkState(self, device: FakeHandle, link: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkState", device)
        self._link(device, link)
        down = device.index in self.faults.links_down
        return NVML_FEATURE_DISABLED if down else NVML_FEATURE_ENABLED

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

    def nvmlDeviceGetGpuFabricInfoV(self, device: FakeHandle, fabric_info: Any) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuFabricInfoV", device)
        clique = self._gpu(device)[0].clique
        if clique is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        # The binding hands the argument straight to C, so callers pass ctypes.byref(info).
        info = fabric_info._obj
        cluster, clique_id = clique
        info.clusterUuid[:] = list(bytes.fromhex(cluster.replace("-", "")))
        info.status = NVML_SUCCESS
        info.cliqueId = clique_id
        info.state = NVML_GPU_FABRIC_STATE_COMPLETED
        return NVML_SUCCESS
