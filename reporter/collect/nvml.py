"""The NVML collector: GPUs, their PCIe paths, NVLinks and affinity, as the driver reports them.

This is the only module that imports `pynvml` (PyPI `nvidia-ml-py`, never the deprecated `pynvml`
package). The collector is handed the NVML module object, so the simulated machine's fake runs
through exactly this code; it catches NVML errors through that object's own `NVMLError_*` classes.
Errors are judged one by one: a call the driver or GPU lacks degrades one field, a lost GPU is
reported lost while the others are reported as usual, a failed init is one line saying what to
check. It never writes anything and never decides what gets published.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from parsers.cpulist import cpus_from_mask_words, parse_cpulist
from parsers.errors import ParseError, excerpt
from parsers.links import SELF, Link, LinkKind, link_from_nvml_level
from parsers.nvidia_proc import MAX_MINOR
from parsers.pci import normalize_pci_address
from parsers.sysfs import parse_hex, parse_numa_node
from reporter.collect import LinkErrors
from reporter.collect.fabricinfo import (
    FABRIC_V2_SIZE,
    FABRIC_V3_SIZE,
    PLATFORM_V2_SIZE,
    decode_fabric,
    decode_platform,
    unreadable_fabric,
)
from reporter.errors import CollectError, NvmlUnavailable
from reporter.hostfs import HostFS
from reporter.schema.model import (
    MAX_GPUS,
    FabricState,
    Gpu,
    GpuFabric,
    NvlinkHealth,
    RackPosition,
    Source,
    Topology,
)

log = structlog.get_logger(__name__)

NvmlModule = Any
"""The `pynvml` module, or a stand-in with its names (the binding ships no type stubs)."""

T = TypeVar("T")

_NVSWITCH_CLASS = 0x0680
# NVML fills an affinity array of unsigned longs; without /sys/devices/system/cpu/possible we size
# it for 4096 CPUs (or NUMA nodes), more than any machine we know.
_FALLBACK_WORDS = 64
_WORD_BITS = 64
# NVML has no more than seven MIG devices per GPU today; the bound keeps a bad answer finite.
_MAX_MIG_SLOTS = 64
# Field IDs of nvml.h (stable: NVML only adds fields), by the name the binding gives them.
_FI_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
# A link count beyond this is garbage: the schema holds link indexes up to 254, and NVML's own
# NVML_NVLINK_MAX_LINKS is 36 today.
_MAX_LINKS = 255
_ERROR_FIELDS = (
    ("replay", 52),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    ("recovery", 59),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
    ("crc_flit", 38),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    ("crc_data", 45),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
)
_FI_RECOVERY_FAILED = 214  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS, per link
# nvmlValueType_t: how to read the value union of a field.
_VALUE_MEMBERS = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

_INIT_HINT = (
    "check that the NVIDIA driver is loaded on the node (nvidia-smi works there), that the pod "
    "runs with the NVIDIA container runtime (runtimeClassName: nvidia), "
    "NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES including utility"
)


def load_pynvml() -> NvmlModule:
    """The real binding. Importing it loads nothing: the library is opened by nvmlInit.

    Raises NvmlUnavailable when the package is not installed.
    """
    try:
        import pynvml  # noqa: PLC0415 (imported only where NVML is wanted, never for --simulate)
    except ImportError as e:
        raise NvmlUnavailable(
            f"the NVML binding is missing ({e}): install the nvidia-ml-py package"
        ) from e
    return pynvml


class _GpuLostError(Exception):
    """Internal: a call said the GPU fell off the bus."""


class LinkCounters:
    """NVLink error counters as the last scan read them, to report what each scan added.

    Owned by the scanner, which lives as long as the agent: the collector itself is made anew for
    every scan. A counter lower than last time was reset (the driver reloaded, the GPU was
    reset): what it reads now is what happened since.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    def deltas(self, gpu: int, key: str, values: dict[str, int]) -> list[LinkErrors]:
        """What each counter of `values` added since the last reading of the GPU `key`."""
        found = []
        for counter, value in values.items():
            before = self._last.get((key, counter))
            self._last[(key, counter)] = value
            if before is None:
                continue  # the first reading is the baseline: nothing to compare it with
            if value < before:
                log.info("nvlink_counter_reset", gpu=gpu, counter=counter, was=before, now=value)
                delta = value
            else:
                delta = value - before
            if delta:
                found.append(LinkErrors(gpu, counter, delta))
        return found


class NvmlCollector:
    """Reads the topology from an NVML module object; sysfs fills locality NVML leaves out."""

    def __init__(
        self, nvml: NvmlModule, hostfs: HostFS, counters: LinkCounters | None = None
    ) -> None:
        self._nvml = nvml
        self._fs = hostfs
        self._counters = counters
        self.link_errors: list[LinkErrors] = []
        """What the NVLink error counters added since the previous scan, after `collect()`."""

    # --- error handling ----------------------------------------------------------------------

    def _degradable(self) -> tuple[type[BaseException], ...]:
        n = self._nvml
        return (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound, n.NVMLError_NoData)

    def _call(self, gpu: int | None, function: str, *args: Any) -> Any:
        """Call `function`; NotSupported/FunctionNotFound give None, GpuIsLost raises _GpuLostError.

        Any other NVML error fails the source: CollectError naming the call and the GPU.
        """
        return self._mapped(gpu, function, lambda: getattr(self._nvml, function)(*args))

    def _mapped(self, gpu: int | None, function: str, operation: Callable[[], T]) -> T | None:
        """`operation()`, which calls `function`, its NVML errors mapped as `_call` says."""
        n = self._nvml
        try:
            return operation()
        except n.NVMLError_GpuIsLost as e:
            raise _GpuLostError(function) from e
        except self._degradable():
            log.debug("nvml_field_unavailable", function=function, gpu=gpu)
            return None
        except n.NVMLError as e:
            where = "" if gpu is None else f" on GPU {gpu}"
            raise CollectError(f"NVML {function}{where} failed: {e} (error {e.value})") from e

    def _first(self, gpu: int, options: list[tuple[str, tuple[Any, ...]]]) -> Any:
        """The first of several equivalent calls that the driver has (FunctionNotFound: next)."""
        n = self._nvml
        for function, args in options:
            try:
                return getattr(n, function)(*args)
            except n.NVMLError_FunctionNotFound:
                continue
            except n.NVMLError_GpuIsLost as e:
                raise _GpuLostError(function) from e
            except self._degradable():
                return None
            except n.NVMLError as e:
                raise CollectError(f"NVML {function} on GPU {gpu} failed: {e}") from e
        return None

    # --- the scan --------------------------------------------------------------------------------

    def collect(self) -> Topology | None:
        """The topology NVML reports; None when NVML works but sees no GPU.

        Raises NvmlUnavailable when NVML does not initialise, CollectError when it fails later.
        """
        n = self._nvml
        try:
            n.nvmlInit()
        except n.NVMLError as e:
            raise NvmlUnavailable(f"NVML did not initialise ({e}): {_INIT_HINT}") from e
        try:
            return self._collect()
        finally:
            try:
                n.nvmlShutdown()
            except n.NVMLError as e:
                log.warning("nvml_shutdown_failed", error=str(e))

    def _collect(self) -> Topology | None:
        driver = self._call(None, "nvmlSystemGetDriverVersion")
        count = self._call(None, "nvmlDeviceGetCount")
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GPUS
        ):
            # Checked before any GPU is asked for: every pair of them is asked for its path.
            raise CollectError(
                f"NVML counts {excerpt(count)} GPUs: no node has that many (at most {MAX_GPUS}); "
                "the driver answered garbage"
            )
        if not count:
            return None
        handles: list[Any] = []
        gpus: list[Gpu] = []
        for index in range(count):
            handle = None
            try:
                handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
                gpus.append(self._gpu(index, handle))
            except _GpuLostError:
                log.warning("nvml_gpu_lost", gpu=index)
                gpus.append(Gpu(index=index, lost=True))
            handles.append(handle)
        pcie = self._pcie(handles, gpus)
        nvlinks, nvswitch = self._nvlinks(handles, gpus)
        links = tuple(
            tuple(
                SELF
                if i == j
                else (Link(LinkKind.NV, nvlinks[i][j]) if nvlinks[i][j] else pcie[i][j])
                for j in range(count)
            )
            for i in range(count)
        )
        return Topology(
            source=Source.NVML,
            gpus=tuple(gpus),
            links=links,
            driver=str(driver) if driver is not None else None,
            pcie=pcie,
            nvswitch=nvswitch,
            nvlink_observed=True,
        )

    def _gpu(self, index: int, handle: Any) -> Gpu:
        """One GPU's identity and locality. Raises _GpuLostError."""
        n = self._nvml
        uuid_ = self._call(index, "nvmlDeviceGetUUID", handle)
        name = self._call(index, "nvmlDeviceGetName", handle)
        pci_info = self._call(index, "nvmlDeviceGetPciInfo", handle)
        pci = _bus_id(pci_info.busId, index) if pci_info is not None else None
        memory = self._call(index, "nvmlDeviceGetMemoryInfo", handle)
        mig_mode = self._call(index, "nvmlDeviceGetMigMode", handle)
        mig = None if mig_mode is None else mig_mode[0] == n.NVML_DEVICE_MIG_ENABLE
        numa = self._numa(index, handle, pci)
        cpus = self._cpus(index, handle, pci)
        gpu_numa = self._call(index, "nvmlDeviceGetNumaNodeId", handle)
        minor = self._call(index, "nvmlDeviceGetMinorNumber", handle)
        if minor is not None and not (isinstance(minor, int) and 0 <= minor <= MAX_MINOR):
            log.warning("nvml_minor_invalid", gpu=index, minor=excerpt(minor))
            minor = None
        return Gpu(
            index=index,
            uuid=str(uuid_) if uuid_ is not None else None,
            pci=pci,
            model=str(name) if name is not None else None,
            numa=numa,
            cpus=cpus,
            mem_mib=int(memory.total) // (1024 * 1024) if memory is not None else None,
            mig=mig,
            gpu_numa=gpu_numa if isinstance(gpu_numa, int) and gpu_numa >= 0 else None,
            mig_devices=self._mig_devices(index, handle) if mig else (),
            minor=minor,
            fabric=self._fabric(index, handle),
        )

    def _mig_devices(self, index: int, handle: Any) -> tuple[str, ...]:
        """UUIDs of the MIG devices on a MIG-enabled GPU, the IDs device plugins advertise.

        A MIG UUID (`MIG-<uuid>` since R470) does not name its parent, so the parent is recorded
        here, where NVML still knows it. Empty slots answer NotFound.
        """
        n = self._nvml
        count = self._call(index, "nvmlDeviceGetMaxMigDeviceCount", handle)
        found: list[str] = []
        for slot in range(min(int(count or 0), _MAX_MIG_SLOTS)):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except n.NVMLError_NotFound:
                continue
            except n.NVMLError_GpuIsLost as e:
                raise _GpuLostError("nvmlDeviceGetMigDeviceHandleByIndex") from e
            except n.NVMLError as e:
                raise CollectError(
                    f"NVML nvmlDeviceGetMigDeviceHandleByIndex (slot {slot}) on GPU {index} "
                    f"failed: {e}"
                ) from e
            uuid_ = self._call(index, "nvmlDeviceGetUUID", mig)
            if uuid_ is not None:
                found.append(str(uuid_))
        return tuple(found)

    def _sysfs(self, pci: str | None, name: str, parse: Callable[[str], T]) -> T | None:
        """A PCI device's sysfs attribute, or None where it is absent or does not parse."""
        if pci is None:
            return None
        try:
            return parse(self._fs.read_text(f"bus/pci/devices/{pci}/{name}"))
        except (OSError, ParseError) as e:
            log.debug("sysfs_attribute_unreadable", pci=pci, attribute=name, error=str(e))
            return None

    def _words(self, path: str) -> int:
        """Array size for NVML's affinity calls, from the kernel's `possible` list at `path`."""
        try:
            possible = parse_cpulist(self._fs.read_text(path), field=path)
        except (OSError, ParseError):
            return _FALLBACK_WORDS
        return max(possible, default=0) // _WORD_BITS + 1

    def _numa(self, index: int, handle: Any, pci: str | None) -> frozenset[int] | None:
        """CPU NUMA nodes local to the GPU.

        sysfs `numa_node` is what the device plugin uses; NVML's memory affinity, which
        nvidia-smi prints, is taken where it agrees with it (it adds a Grace GPU's memory nodes)
        and where sysfs says -1.
        """
        n = self._nvml
        node = self._sysfs(pci, "numa_node", parse_numa_node)
        words = self._words("devices/system/node/possible")
        mask = self._call(
            index, "nvmlDeviceGetMemoryAffinity", handle, words, n.NVML_AFFINITY_SCOPE_NODE
        )
        nodes = cpus_from_mask_words(list(mask)) if mask is not None else frozenset()
        if node is None:
            return nodes or None
        if nodes and node not in nodes:
            log.warning(
                "nvml_sysfs_disagree", gpu=index, field="numa", sysfs=node, nvml=sorted(nodes)
            )
        return nodes if node in nodes else frozenset({node})

    def _cpus(self, index: int, handle: Any, pci: str | None) -> frozenset[int] | None:
        n = self._nvml
        words = self._words("devices/system/cpu/possible")
        mask = self._first(
            index,
            [
                (
                    "nvmlDeviceGetCpuAffinityWithinScope",
                    (handle, words, n.NVML_AFFINITY_SCOPE_NODE),
                ),
                ("nvmlDeviceGetCpuAffinity", (handle, words)),
            ],
        )
        cpus = cpus_from_mask_words(list(mask)) if mask is not None else frozenset()
        local = self._sysfs(pci, "local_cpulist", parse_cpulist)
        if cpus and local is not None and local != cpus:
            log.warning("nvml_sysfs_disagree", gpu=index, field="cpus", pci=pci)
        return cpus or local or None

    def _struct_call(self, index: int, function: str, handle: Any, info: Any) -> bool | None:
        """Call a function that fills `info`: True when filled, None when the GPU or driver has
        none (NotSupported, FunctionNotFound), False when the driver wants another struct
        version. Raises _GpuLostError, CollectError for any other error."""
        n = self._nvml

        def fill() -> bool:
            try:
                getattr(n, function)(handle, ctypes.byref(info))
            except n.NVMLError_ArgumentVersionMismatch:
                return False
            return True

        return self._mapped(index, function, fill)

    def _fabric(self, index: int, handle: Any) -> GpuFabric | None:
        """The GPU's multi-node fabric: the v3 struct (health summary), v2 where the driver
        answers a version mismatch; None where the GPU or driver has no fabric."""
        n = self._nvml
        for name, size, summary in (
            ("c_nvmlGpuFabricInfo_v3_t", FABRIC_V3_SIZE, True),
            ("c_nvmlGpuFabricInfo_v2_t", FABRIC_V2_SIZE, False),
        ):
            layout = getattr(n, name, None)
            if layout is None or ctypes.sizeof(layout) < size:
                return unreadable_fabric(
                    f"the binding's {name} is not NVML's: upgrade nvidia-ml-py"
                )
            info = layout()
            filled = self._struct_call(index, "nvmlDeviceGetGpuFabricInfoV", handle, info)
            if filled is None:
                return None
            if filled:
                fabric = decode_fabric(
                    ctypes.string_at(ctypes.addressof(info), size), summary=summary
                )
                if fabric.problems:
                    log.warning("nvml_fabric_garbage", gpu=index, problems=list(fabric.problems))
                if fabric.state is FabricState.NOT_SUPPORTED:
                    return fabric
                position, problems = self._position(index, handle)
                return dataclasses.replace(
                    fabric, position=position, problems=(*fabric.problems, *problems)
                )
            log.debug("nvml_fabric_struct_older", gpu=index, tried=name)
        return unreadable_fabric("the driver takes neither the v3 nor the v2 fabric struct")

    def _position(self, index: int, handle: Any) -> tuple[RackPosition | None, tuple[str, ...]]:
        """The GPU's place in its rack (Blackwell and newer), and what in it was garbage.

        Only the v2 struct is read: v1 names a rack GUID, not the chassis serial.
        """
        layout = getattr(self._nvml, "c_nvmlPlatformInfo_v2_t", None)
        if layout is None or ctypes.sizeof(layout) < PLATFORM_V2_SIZE:
            return None, ()
        info = layout()
        if not self._struct_call(index, "nvmlDeviceGetPlatformInfo", handle, info):
            return None, ()
        raw = ctypes.string_at(ctypes.addressof(info), PLATFORM_V2_SIZE)
        position, problems = decode_platform(raw)
        if problems:
            log.warning("nvml_platform_garbage", gpu=index, problems=list(problems))
        return position, problems

    def _pcie(self, handles: list[Any], gpus: list[Gpu]) -> tuple[tuple[Link, ...], ...]:
        count = len(handles)
        rows = [[SELF] * count for _ in range(count)]
        for i in range(count):
            for j in range(i + 1, count):
                link = self._pair(i, j, handles, gpus)
                rows[i][j] = rows[j][i] = link
        return tuple(tuple(r) for r in rows)

    def _pair(self, i: int, j: int, handles: list[Any], gpus: list[Gpu]) -> Link:
        # A lost GPU's paths are unknown; SYS, the farthest class, never makes it look close.
        if gpus[i].lost or gpus[j].lost:
            return Link(LinkKind.SYS)
        try:
            level = self._call(i, "nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
        except _GpuLostError:
            log.warning("nvml_gpu_lost", gpu=f"{i} or {j}", function="common ancestor")
            return Link(LinkKind.SYS)
        if level is None:
            return Link(LinkKind.SYS)
        try:
            return link_from_nvml_level(int(level))
        except ValueError as e:
            raise CollectError(f"NVML common ancestor of GPU {i} and GPU {j}: {e}") from e

    def _nvlinks(self, handles: list[Any], gpus: list[Gpu]) -> tuple[list[list[int]], bool]:
        """Bonded NVLinks per GPU pair, counting switch-attached GPUs as nvidia-smi does; each
        GPU's link health is set on `gpus` on the way."""
        count = len(handles)
        by_pci = {g.pci: g.index for g in gpus if g.pci is not None}
        direct = [[0] * count for _ in range(count)]
        switch_links = [0] * count
        for i, handle in enumerate(handles):
            if gpus[i].lost:
                continue
            try:
                walk = self._walk_links(i, handle, by_pci)
                for remote, is_switch in walk.active:
                    if is_switch:
                        switch_links[i] += 1
                    elif remote in by_pci and by_pci[remote] != i:
                        direct[i][by_pci[remote]] += 1
                gpus[i] = dataclasses.replace(gpus[i], nvlink=walk.health)
                if walk.health is not None:
                    self._read_counters(i, handle, gpus[i], walk.health.count)
            except _GpuLostError:
                log.warning("nvml_gpu_lost", gpu=i, function="nvlink")
                gpus[i] = dataclasses.replace(gpus[i], lost=True, nvlink=None)
                direct[i] = [0] * count
                switch_links[i] = 0
        for i in range(count):
            for j in range(count):
                if i != j and switch_links[i] and switch_links[j]:
                    # Through NVSwitches every pair gets the narrower side's bond.
                    direct[i][j] += min(switch_links[i], switch_links[j])
        return direct, any(switch_links)

    def _fields(self, index: int, handle: Any, ids: list[tuple[int, int]]) -> list[int | None]:
        """Field values by (field ID, scope ID), None for each the driver does not give; all None
        where the driver has no field API or the call fails: the fields add to what the scan
        knows (a link count, error counters) and never fail it. Raises _GpuLostError."""
        n = self._nvml
        try:
            values = self._call(index, "nvmlDeviceGetFieldValues", handle, ids)
        except CollectError as e:
            log.warning("nvml_field_values_failed", gpu=index, error=str(e))
            values = None
        if values is None:
            return [None] * len(ids)
        out: list[int | None] = []
        for value in list(values)[: len(ids)]:
            member = _VALUE_MEMBERS.get(int(value.valueType))
            if value.nvmlReturn != n.NVML_SUCCESS or member is None:
                out.append(None)
            else:
                out.append(int(getattr(value.value, member)))
        return out + [None] * (len(ids) - len(out))

    def _link_count(self, index: int, handle: Any) -> int | None:
        """The GPU's own NVLink count; None when the driver does not say, or says more than any
        link index the schema can hold (garbage): then the binding's NVML_NVLINK_MAX_LINKS is
        walked, as before the field was read."""
        (count,) = self._fields(index, handle, [(_FI_LINK_COUNT, 0)])
        if count is None:
            return None
        if not 0 <= count <= _MAX_LINKS:
            log.warning("nvml_link_count_invalid", gpu=index, links=count, most=_MAX_LINKS)
            return None
        bound = int(self._nvml.NVML_NVLINK_MAX_LINKS)
        if count > bound:
            # Newer hardware than the binding knows, or garbage: walked, but counted by the
            # links that answer (see _walk_links).
            log.warning("nvml_link_count_above_binding", gpu=index, links=count, binding=bound)
        return count

    def _walk_links(self, index: int, handle: Any, by_pci: dict[str, int]) -> _LinkWalk:
        """Every link of one GPU: the active ones' far ends, and its health against its own
        link count. A link of that count that says "no such link" is counted down. A count
        above the binding's maximum is in doubt (newer hardware, or garbage): its links are
        walked, and the GPU has the links that answer, as without a count."""
        n = self._nvml
        count = self._link_count(index, handle)
        trusted = count is not None and count <= int(n.NVML_NVLINK_MAX_LINKS)
        walked = count if count is not None else int(n.NVML_NVLINK_MAX_LINKS)
        active: list[tuple[str | None, bool]] = []
        down: list[int] = []
        lost: Counter[int] = Counter()
        answered = 0
        for link in range(walked):
            try:
                state = n.nvmlDeviceGetNvLinkState(handle, link)
            except (n.NVMLError_InvalidArgument, n.NVMLError_NotSupported):
                # The binding's maximum is not the hardware's: no such link.
                if trusted:
                    down.append(link)
                continue
            except n.NVMLError_GpuIsLost as e:
                raise _GpuLostError("nvmlDeviceGetNvLinkState") from e
            except n.NVMLError as e:
                raise CollectError(
                    f"NVML nvmlDeviceGetNvLinkState (link {link}) on GPU {index} failed: {e}"
                ) from e
            answered += 1
            if state == n.NVML_FEATURE_ENABLED:
                active.append(self._far_end(index, handle, link))
                continue
            down.append(link)
            remote, is_switch = self._down_far_end(index, handle, link)
            if not is_switch and remote in by_pci and by_pci[remote] != index:
                lost[by_pci[remote]] += 1
        links = count if trusted and count is not None else answered
        health = (
            NvlinkHealth(links, tuple(down), tuple(sorted(lost.items()))) if links > 0 else None
        )
        return _LinkWalk(active, health)

    def _far_end(self, index: int, handle: Any, link: int) -> tuple[str | None, bool]:
        """(remote PCI address, remote is an NVSwitch) of one link; (None, False) where the
        driver does not say (an inactive link may not)."""
        n = self._nvml
        info = self._call(index, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remote = _bus_id(info.busId, index) if info is not None else None
        kind = self._call(index, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind is None:
            # Drivers before the remote type existed: an NVSwitch shows its PCI class.
            pci_class = self._sysfs(remote, "class", lambda t: parse_hex(t, field="class"))
            return remote, pci_class is not None and pci_class >> 8 == _NVSWITCH_CLASS
        return remote, kind == n.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def _down_far_end(self, index: int, handle: Any, link: int) -> tuple[str | None, bool]:
        """The far end of an inactive link, where the driver still names it; (None, False) for
        any error but a lost GPU: what a down link answers is not NVML's documented ground, and
        a link being down must never fail the scan."""
        try:
            return self._far_end(index, handle, link)
        except CollectError as e:
            log.debug("nvml_down_link_far_end_unknown", gpu=index, link=link, error=str(e))
            return None, False

    def _read_counters(self, index: int, handle: Any, gpu: Gpu, links: int) -> None:
        """NVLink error counters, as deltas since the last scan, where a memory is kept."""
        if self._counters is None:
            return
        ids = [(field, 0) for _, field in _ERROR_FIELDS]
        ids += [(_FI_RECOVERY_FAILED, link) for link in range(links)]
        values = self._fields(index, handle, ids)
        read = {
            name: v for (name, _), v in zip(_ERROR_FIELDS, values, strict=False) if v is not None
        }
        failed = [v for v in values[len(_ERROR_FIELDS) :] if v is not None]
        if failed:
            read["recovery_failed"] = sum(failed)
        key = gpu.uuid or gpu.pci or str(index)
        found = self._counters.deltas(index, key, read)
        for errors in found:
            log.warning("nvlink_errors", gpu=index, counter=errors.counter, added=errors.delta)
        self.link_errors.extend(found)


@dataclasses.dataclass(frozen=True, slots=True)
class _LinkWalk:
    active: list[tuple[str | None, bool]]
    """(remote PCI address, remote is an NVSwitch) of every active link."""
    health: NvlinkHealth | None


def _bus_id(raw: bytes | str, index: int) -> str:
    """NVML's `00000000:18:00.0` as sysfs writes it. Raises CollectError for garbage."""
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else raw
    try:
        return normalize_pci_address(text.rstrip("\x00"), field=f"GPU {index} PCI bus id")
    except ParseError as e:
        raise CollectError(f"NVML returned {e}") from e
