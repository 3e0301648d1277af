"""The sysfs collector: GPUs, RDMA NICs and NUMA nodes from the kernel's view of the PCI tree.

It works without NVML (no driver in the pod, NVML failing) and fills what NVML never says: the
NICs with their path to every GPU, and the NUMA nodes with their distances. sysfs cannot see
NVLink, so a topology from sysfs alone says so (`nvlink_observed=False`) instead of claiming PCIe.
A GPU's minor number is not in sysfs: the NVIDIA driver writes it in procfs
(`driver/nvidia/gpus/<bdf>/information`), read through a second root when one is given.

Path classes follow nvidia-smi, which counts PCIe switches rather than bridge functions: a root
port, or a switch (its upstream port with its downstream ports), is one hop. PIX: one hop joins
the two devices; PXB: several hops below the host bridge; PHB: the host bridge; NODE: two host
bridges of one NUMA node (and one PCI domain: each Grace root complex is its own domain, and
nvidia-smi reports SYS across them); SYS: across NUMA nodes, or where the node is unknown.
Every read goes through the HostFS handed in; this module never imports pynvml and never writes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog

from parsers.cpulist import parse_cpulist
from parsers.errors import ParseError
from parsers.links import SELF, Link, LinkKind
from parsers.nvidia_proc import parse_device_minor
from parsers.pci import is_pci_address, normalize_pci_address
from parsers.sysfs import parse_distance_row, parse_hex, parse_node_memtotal, parse_numa_node
from reporter.errors import CollectError
from reporter.hostfs import HostFS
from reporter.schema.model import Gpu, Nic, NumaNode, Source, Topology

log = structlog.get_logger(__name__)

T = TypeVar("T")

NVIDIA_VENDOR = 0x10DE
# Display controller subclasses a GPU shows: VGA (0x0300) and 3D controller (0x0302). NVIDIA's
# HD-audio function (0x0403) and NVSwitches (0x0680) are not GPUs; neither is a BMC's VGA of
# another vendor.
GPU_SUBCLASSES = frozenset({0x0300, 0x0302})
_HOST_BRIDGE = re.compile(r"pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})")
_NODE_DIR = re.compile(r"node(\d+)")


@dataclass(frozen=True, slots=True)
class PciPlacement:
    """Where a device sits: its host bridge, the bridges above it, its NUMA node."""

    address: str
    host_bridge: str
    bridges: tuple[str, ...]
    """Bridge functions from the root port down to the device's parent."""
    numa: int | None

    @property
    def domain(self) -> int:
        return int(self.address.split(":")[0], 16)


def _hop(bridge_index: int) -> int:
    """Which hop a bridge belongs to: the root port is hop 0, each upstream+downstream pair one."""
    return 0 if bridge_index == 0 else (bridge_index + 1) // 2


def path_class(a: PciPlacement, b: PciPlacement) -> Link:
    """The PCIe path class between two devices, as nvidia-smi names it."""
    if a.host_bridge != b.host_bridge:
        same_node = a.numa is not None and a.numa == b.numa and a.domain == b.domain
        return Link(LinkKind.NODE if same_node else LinkKind.SYS)
    shared = 0
    while shared < min(len(a.bridges), len(b.bridges)) and a.bridges[shared] == b.bridges[shared]:
        shared += 1
    if shared == 0:
        return Link(LinkKind.PHB)
    common = _hop(shared - 1)
    traversed = (_hop(len(a.bridges) - 1) - common) + (_hop(len(b.bridges) - 1) - common) + 1
    return Link(LinkKind.PIX if traversed == 1 else LinkKind.PXB)


@dataclass(frozen=True, slots=True)
class SysfsGpu:
    place: PciPlacement
    cpus: frozenset[int] | None
    minor: int | None = None
    """From the driver's procfs file; None without the driver or a procfs root."""


@dataclass(frozen=True, slots=True)
class SysfsNic:
    name: str
    place: PciPlacement


@dataclass(frozen=True, slots=True)
class SysfsView:
    """What sysfs shows of the machine."""

    gpus: tuple[SysfsGpu, ...]
    nics: tuple[SysfsNic, ...]
    numa_nodes: tuple[NumaNode, ...]

    def pcie(self) -> tuple[tuple[Link, ...], ...]:
        """The GPU PCIe matrix in PCI bus order (NVML's index order)."""
        return tuple(
            tuple(SELF if i == j else path_class(a.place, b.place) for j, b in enumerate(self.gpus))
            for i, a in enumerate(self.gpus)
        )

    def nic_entries(self, gpu_places: Sequence[PciPlacement | None]) -> tuple[Nic, ...]:
        """NICs with their path to each GPU of `gpu_places` (None: a GPU sysfs does not hold)."""
        nics = []
        for nic in self.nics:
            links = tuple(
                Link(LinkKind.SYS) if g is None else path_class(nic.place, g) for g in gpu_places
            )
            peers = tuple(
                SELF if other.name == nic.name else path_class(nic.place, other.place)
                for other in self.nics
            )
            numa = None if nic.place.numa is None else frozenset({nic.place.numa})
            nics.append(Nic(nic.name, links, pci=nic.place.address, numa=numa, peers=peers))
        return tuple(nics)

    def topology(self) -> Topology | None:
        """The topology sysfs alone can give; None when it holds no NVIDIA GPU."""
        if not self.gpus:
            return None
        pcie = self.pcie()
        gpus = tuple(
            Gpu(
                index=i,
                pci=g.place.address,
                numa=None if g.place.numa is None else frozenset({g.place.numa}),
                cpus=g.cpus,
                minor=g.minor,
            )
            for i, g in enumerate(self.gpus)
        )
        return Topology(
            source=Source.SYSFS,
            gpus=gpus,
            links=pcie,
            pcie=pcie,
            nics=self.nic_entries([g.place for g in self.gpus]),
            numa_nodes=self.numa_nodes,
            nvlink_observed=False,
        )


def _address_key(address: str) -> tuple[int, ...]:
    domain, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16))


class SysfsCollector:
    """Reads GPUs, RDMA NICs and NUMA nodes through a HostFS (and minors through a procfs one)."""

    def __init__(self, hostfs: HostFS, procfs: HostFS | None = None) -> None:
        self._fs = hostfs
        self._proc = procfs

    def _read(self, path: str, parse: Callable[[str], T]) -> T | None:
        try:
            return parse(self._fs.read_text(path))
        except (OSError, ParseError) as e:
            log.debug("sysfs_attribute_unreadable", path=path, error=str(e))
            return None

    def place(self, address: str, device_path: str) -> PciPlacement | None:
        """Resolve a device's symlink into the PCI hierarchy; None where it does not resolve."""
        try:
            real = self._fs.realpath(device_path)
        except OSError as e:
            log.warning("sysfs_device_unresolved", path=device_path, error=str(e))
            return None
        parts = real.split("/")
        roots = [k for k, p in enumerate(parts) if _HOST_BRIDGE.fullmatch(p)]
        chain = parts[roots[0] + 1 :] if roots else []
        if not chain or not all(is_pci_address(p) for p in chain):
            log.warning("sysfs_device_outside_pci_tree", path=device_path, resolved=real)
            return None
        if normalize_pci_address(chain[-1]) != address:
            log.warning("sysfs_device_mismatch", path=device_path, resolved=real)
            return None
        numa = self._read(f"{real}/numa_node", parse_numa_node)
        return PciPlacement(
            address=address,
            host_bridge=parts[roots[0]].lower(),
            bridges=tuple(normalize_pci_address(p) for p in chain[:-1]),
            numa=numa,
        )

    def collect(self) -> SysfsView:
        """Scan the tree. Raises CollectError when the PCI device list cannot be read at all."""
        try:
            entries = self._fs.listdir("bus/pci/devices")
        except OSError as e:
            raise CollectError(
                f"cannot list bus/pci/devices under the sysfs root ({e.strerror or e}): "
                "check --sysfs-root (the host's /sys, mounted at /host/sys in the chart)"
            ) from e
        return SysfsView(self._gpus(entries), self._nics(), self._numa_nodes())

    def _gpus(self, entries: list[str]) -> tuple[SysfsGpu, ...]:
        gpus = []
        for entry in entries:
            if not is_pci_address(entry):
                continue
            address = normalize_pci_address(entry)
            base = f"bus/pci/devices/{entry}"
            vendor = self._read(f"{base}/vendor", lambda t: parse_hex(t, field="vendor"))
            pci_class = self._read(f"{base}/class", lambda t: parse_hex(t, field="class"))
            if vendor != NVIDIA_VENDOR or pci_class is None or pci_class >> 8 not in GPU_SUBCLASSES:
                continue
            place = self.place(address, base)
            if place is None:
                continue
            cpus = self._read(f"{base}/local_cpulist", parse_cpulist)
            gpus.append(SysfsGpu(place, cpus or None, self._minor(address)))
        return tuple(sorted(gpus, key=lambda g: _address_key(g.place.address)))

    def _minor(self, address: str) -> int | None:
        """The driver's minor number of the GPU at `address`; None where procfs does not say."""
        if self._proc is None:
            return None
        path = f"driver/nvidia/gpus/{address}/information"
        try:
            return parse_device_minor(self._proc.read_text(path), field=path)
        except (OSError, ParseError) as e:
            log.debug("procfs_attribute_unreadable", path=path, error=str(e))
            return None

    def _nics(self) -> tuple[SysfsNic, ...]:
        try:
            names = self._fs.listdir("class/infiniband")
        except OSError:
            return ()  # no RDMA stack loaded: no RDMA NICs, not an error
        nics = []
        for name in names:
            try:
                real = self._fs.realpath(f"class/infiniband/{name}/device")
            except OSError as e:
                log.warning("sysfs_nic_unresolved", nic=name, error=str(e))
                continue
            leaf = real.rsplit("/", 1)[-1]
            if not is_pci_address(leaf):
                log.warning("sysfs_nic_not_pci", nic=name, resolved=real)
                continue
            place = self.place(normalize_pci_address(leaf), f"class/infiniband/{name}/device")
            if place is not None:
                nics.append(SysfsNic(name, place))
        return tuple(sorted(nics, key=lambda n: (_address_key(n.place.address), n.name)))

    def _numa_nodes(self) -> tuple[NumaNode, ...]:
        try:
            entries = self._fs.listdir("devices/system/node")
        except OSError:
            return ()
        nodes = []
        for entry in entries:
            match = _NODE_DIR.fullmatch(entry)
            if match is None:
                continue
            base = f"devices/system/node/{entry}"
            cpus = self._read(f"{base}/cpulist", parse_cpulist)
            if cpus is None:
                log.warning("sysfs_numa_node_unreadable", node=entry)
                continue
            distances = self._read(f"{base}/distance", parse_distance_row) or ()
            nodes.append(NumaNode(int(match.group(1)), cpus, distances))
        return tuple(sorted(nodes, key=lambda n: n.id))


def numa_memory(hostfs: HostFS) -> dict[int, int]:
    """MemTotal in bytes of each NUMA node whose `meminfo` reads; a node that does not is absent."""
    try:
        entries = hostfs.listdir("devices/system/node")
    except OSError:
        return {}
    memory = {}
    for entry in entries:
        match = _NODE_DIR.fullmatch(entry)
        if match is None:
            continue
        try:
            memory[int(match.group(1))] = parse_node_memtotal(
                hostfs.read_text(f"devices/system/node/{entry}/meminfo")
            )
        except (OSError, ParseError) as e:
            log.debug("sysfs_attribute_unreadable", path=f"{entry}/meminfo", error=str(e))
    return memory


def pcie_root(hostfs: HostFS, address: str) -> str | None:
    """The PCIe root complex a device sits under, as sysfs names its host bridge (`pci0000:15`):
    koordlet's `pcieID` for a GPU, the form of DRA's `resource.kubernetes.io/pcieRoot`. None where
    `bus/pci/devices/<address>` does not resolve into the PCI tree."""
    try:
        real = hostfs.realpath(f"bus/pci/devices/{address}")
    except OSError as e:
        log.debug("sysfs_device_unresolved", address=address, error=str(e))
        return None
    roots = [p for p in real.split("/") if _HOST_BRIDGE.fullmatch(p)]
    return roots[0].lower() if roots else None
