"""A simulated machine: a YAML profile read once into the hardware it describes.

A profile says how a machine is wired, at the level a hardware manual draws it: host bridges on
NUMA nodes, root ports, PCIe switches and the GPUs, NICs and NVSwitches behind them, NVLink bonds
(GPU to GPU, or GPU to NVSwitch), CPUs per NUMA node. PCI bus numbers are handed out the way
firmware enumerates them (depth first), unless the profile pins one. From a `Machine` come both the
fake `pynvml` and the fake sysfs tree, so the two collectors see one machine.

This module only reads profiles; it never touches the real host.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from parsers.cpulist import parse_cpulist
from parsers.documents import load_yaml
from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal, parse_hex_digits
from parsers.nvidia_proc import MAX_MINOR
from reporter.collect.fabricinfo import health_mask
from reporter.errors import ConfigError
from reporter.inputs import read_bounded

PROFILE_SUFFIX = ".yaml"

DEFAULT_NUMA_MEM_GIB = 1024
"""A profile's NUMA node memory unless it says `mem_gib`: a DGX H100's 2 TiB over two sockets."""

# The largest shipped profile is 3 KiB; a hand-written one is a few more.
MAX_PROFILE_BYTES = 1024 * 1024
# An A100 or H100 splits into at most seven MIG devices; NVML's GetMaxMigDeviceCount says 7.
MAX_MIG_DEVICES = 7

# PCI ids used for the devices a profile names; vendors matter (the sysfs collector filters on
# them), device ids only make the tree look like a real one.
NVIDIA = 0x10DE
CLASS_3D = 0x030200
CLASS_VGA = 0x030000
CLASS_AUDIO = 0x040300
CLASS_NVSWITCH = 0x068000
CLASS_BRIDGE = 0x060400
_BRIDGE_VENDOR = {"root": 0x8086, "switch": 0x10B5, "bridge": 0x1A03}
_OTHER = {
    # kind: (vendor, class), the devices real GPU servers hold that are not GPUs
    "nvme": (0x144D, 0x010802),
    "bmc-vga": (0x1A03, CLASS_VGA),
    "ethernet": (0x8086, 0x020000),
    "ena": (0x1D0F, 0x020000),
}
_NIC_VENDOR = {"mellanox": (0x15B3, 0x020700), "efa": (0x1D0F, 0x020000)}


@dataclass(frozen=True, slots=True)
class PciFunction:
    """One PCI function as the tree holds it."""

    address: str
    """`dddd:bb:dd.f`, lower case, as sysfs names it."""
    path: str
    """Its directory under the sysfs root: `devices/pci0000:00/0000:00:01.0/0000:01:00.0`."""
    vendor: int
    device: int
    pci_class: int
    host_bridge: str
    numa: int | None
    hops: tuple[int, ...]
    """The bridge units (root port, each switch) between the host bridge and the device."""
    gpu: int | None = None
    nic: str | None = None
    nvswitch: str | None = None

    @property
    def domain(self) -> int:
        return int(self.address.split(":")[0], 16)


@dataclass(frozen=True, slots=True)
class NumaSpec:
    id: int
    cpus: frozenset[int]
    distances: tuple[int, ...]
    mem_gib: int = DEFAULT_NUMA_MEM_GIB
    """The node's MemTotal: NodeResourceTopology zones carry it (`run --simulate … --nrt`)."""


@dataclass(frozen=True, slots=True)
class NvlinkEnd:
    """The far end of one NVLink: a GPU index or an NVSwitch name."""

    gpu: int | None = None
    switch: str | None = None


FABRIC_STATES = {"not-supported": 0, "not-started": 1, "in-progress": 2, "completed": 3}
"""A profile's `fabric.state` words as NVML's NVML_GPU_FABRIC_STATE_* codes (or an int, raw)."""
FABRIC_HEALTH = {"healthy": 1, "unhealthy": 2, "limited-capacity": 3, "degraded": 3}
"""A profile's `fabric.health` as NVML's health summary; `degraded` is limited capacity with the
`degraded-bandwidth` condition (unless `conditions` names others)."""
_FABRIC_KEYS = frozenset(
    {
        "cluster_uuid",
        "clique",
        "state",
        "health",
        "conditions",
        "chassis_serial",
        "slot",
        "tray",
        "host_id",
        "health_mask",
        "status",
    }
)


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """What a simulated GPU's driver answers for its fabric and platform, raw as NVML gives it.

    Values are kept as the profile gives them within what NVML's C structs can carry (a byte
    for the state, 32 bits for the clique and the mask), so a profile can serve garbage as a
    broken driver or binding would, and the collector's checks meet it.
    """

    cluster_uuid: bytes
    clique: int
    state: int
    status: int = 0
    health_summary: int = 1
    health_mask: int = 0
    chassis_serial: bytes | None = None
    """Served through the 16-byte C field: longer is cut there, as a driver's would be."""
    slot: int | None = None
    tray: int | None = None
    host_id: int | None = None

    @property
    def has_position(self) -> bool:
        """The platform reports a rack position (`nvmlDeviceGetPlatformInfo` answers)."""
        return any(v is not None for v in (self.chassis_serial, self.slot, self.tray, self.host_id))


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    model: str
    mem_mib: int
    mig: bool | None
    """None: the GPU cannot do MIG (NVML answers NotSupported)."""
    memory_affinity: frozenset[int] | None
    """NUMA nodes NVML reports as the GPU's memory affinity; None: NVML reports none (VMs)."""
    gpu_numa: int | None
    nvlinks: tuple[NvlinkEnd, ...]
    fabric: FabricSpec | None
    """The multi-node NVLink fabric (profile `fabric`, `gpus[].fabric`); None: the GPU has none."""
    mig_devices: tuple[str, ...] = ()
    """UUIDs of the MIG devices created on the GPU (profile `mig_devices: N`, with `mig: true`)."""
    minor: int = 0
    """The driver's minor number (`/dev/nvidia<minor>`): profile `minor`, by default the index."""
    links_down: int = 0
    """How many of its NVLinks are inactive (profile `links_down`): the last ones it has."""


@dataclass(frozen=True, slots=True)
class Machine:
    """Everything a profile says, with addresses assigned."""

    name: str
    description: str
    driver: str
    cpus_possible: frozenset[int]
    numa_nodes: tuple[NumaSpec, ...]
    functions: tuple[PciFunction, ...]
    gpus: tuple[GpuSpec, ...]
    nvswitches: Mapping[str, str]
    """NVSwitch name to PCI address (off-node switches of a rack have one too, not in the tree)."""
    gpu_functions: tuple[PciFunction, ...] = field(init=False)

    def __post_init__(self) -> None:
        by_gpu = {f.gpu: f for f in self.functions if f.gpu is not None}
        object.__setattr__(self, "gpu_functions", tuple(by_gpu[g.index] for g in self.gpus))

    def cpus_of(self, nodes: frozenset[int] | None) -> frozenset[int]:
        """CPUs local to a set of NUMA nodes; every CPU when the locality is unknown."""
        if nodes is None:
            return self.cpus_possible
        return frozenset(c for n in self.numa_nodes if n.id in nodes for c in n.cpus)


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """A shipped profile, as `topo-reporter profiles` lists it."""

    name: str
    description: str


def _profiles_dir() -> Any:
    return resources.files("reporter.collect.simulate").joinpath("profiles")


def list_profiles() -> list[ProfileInfo]:
    """The profiles shipped in the package, sorted by name."""
    infos = []
    for entry in _profiles_dir().iterdir():
        if entry.name.endswith(PROFILE_SUFFIX):
            data = load_yaml(entry.read_text(encoding="utf-8"))
            infos.append(ProfileInfo(entry.name[: -len(PROFILE_SUFFIX)], str(data["description"])))
    return sorted(infos, key=lambda p: p.name)


def load_machine(profile: str) -> Machine:
    """Load a shipped profile by name, or a profile file by path (`./my-box.yaml`).

    Raises ConfigError naming the profile for an unknown name or a profile that does not read.
    """
    if profile.endswith((".yaml", ".yml")) or "/" in profile:
        name = Path(profile).stem
        text = read_bounded(
            profile, limit=MAX_PROFILE_BYTES, what="machine profile", error=ConfigError
        )
    else:
        entry = _profiles_dir().joinpath(profile + PROFILE_SUFFIX)
        if not entry.is_file():
            names = ", ".join(p.name for p in list_profiles())
            raise ConfigError(
                f"unknown simulated machine {excerpt(profile)}; choose one of: {names}"
            )
        name, text = profile, entry.read_text(encoding="utf-8")
    try:
        data = load_yaml(text, max_chars=MAX_PROFILE_BYTES)
    except ParseError as e:
        raise ConfigError(f"machine profile {profile}: {e}") from None
    return machine_from_profile(name, data, source=profile)


def shipped_profile(name: str) -> Any:
    """The document of a shipped profile, to build others from. Raises ConfigError if unknown."""
    entry = _profiles_dir().joinpath(name + PROFILE_SUFFIX)
    if not entry.is_file():
        raise ConfigError(f"unknown simulated machine {excerpt(name)}")
    return load_yaml(entry.read_text(encoding="utf-8"))


def machine_from_profile(name: str, data: Any, *, source: str | None = None) -> Machine:
    """The machine a profile document (what a profile file holds, parsed) describes; `name`
    seeds its GPU UUIDs. Raises ConfigError naming the profile (`source`, else `name`)."""
    try:
        return _build(name, data)
    except (ParseError, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # Whatever the profile's shape, one line: a wrong type deep in it is a KeyError or an
        # AttributeError here, not a bug.
        raise ConfigError(f"machine profile {source or name}: {e}") from None


def _build(name: str, data: Any) -> Machine:
    if not isinstance(data, dict):
        raise ValueError("a profile is a YAML mapping")
    numa_known = bool(data.get("numa_known", True))
    numa_nodes = tuple(
        NumaSpec(
            _whole(n["id"], "numa_nodes.id"),
            parse_cpulist(str(n["cpus"]), field=f"numa_nodes[{n['id']}].cpus"),
            tuple(_whole(d, "numa_nodes.distances") for d in n.get("distances", [])),
            _whole(n.get("mem_gib", DEFAULT_NUMA_MEM_GIB), "numa_nodes.mem_gib"),
        )
        for n in data["numa_nodes"]
    )
    possible = (
        parse_cpulist(str(data["cpus"]), field="cpus")
        if "cpus" in data
        else frozenset(c for n in numa_nodes for c in n.cpus)
    )
    defaults = data.get("gpu", {})
    builder = _TreeBuilder(numa_known, bool(defaults.get("audio", False)))
    for bridge in data["pcie"]:
        builder.host_bridge(bridge)
    functions = tuple(builder.functions)
    gpu_functions = sorted(
        (f for f in functions if f.gpu is not None), key=lambda f: _address_key(f.address)
    )
    if [f.gpu for f in gpu_functions] != list(range(len(gpu_functions))):
        raise ValueError("GPUs must be numbered 0..n-1 in PCI bus order, as NVML numbers them")
    nvswitches = {f.nvswitch: f.address for f in functions if f.nvswitch is not None}
    for switch in data.get("nvswitches", []):
        nvswitches[str(switch["name"])] = str(switch["pci"])
    links = _nvlinks(data.get("nvlink", []), len(gpu_functions), nvswitches)
    overrides = {_whole(g["index"], "gpus.index"): g for g in data.get("gpus", [])}
    fabric = data.get("fabric")
    if fabric is not None and not isinstance(fabric, dict):
        raise ValueError("fabric: a mapping of cluster_uuid, clique, state, health, ...")
    gpus = []
    for f in gpu_functions:
        assert f.gpu is not None  # filtered above; narrows the type
        spec = {**defaults, **overrides.get(f.gpu, {})}
        affinity: frozenset[int] | None
        if "memory_affinity" in spec:
            affinity = parse_cpulist(str(spec["memory_affinity"]), field="memory_affinity")
        else:
            affinity = None if f.numa is None else frozenset({f.numa})
        gpus.append(
            GpuSpec(
                index=f.gpu,
                uuid=str(
                    spec.get("uuid")
                    or f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'topo-reporter/{name}/{f.gpu}')}"
                ),
                model=str(spec["model"]),
                mem_mib=_whole(spec["mem_mib"], "mem_mib"),
                mig=None if spec.get("mig") is None else bool(spec["mig"]),
                memory_affinity=affinity,
                gpu_numa=None
                if spec.get("gpu_numa") is None
                else _whole(spec["gpu_numa"], "gpu_numa"),
                nvlinks=links[f.gpu],
                fabric=_fabric(f.gpu, fabric, overrides.get(f.gpu, {})),
                mig_devices=_mig_devices(name, f.gpu, spec),
                minor=_bounded(spec.get("minor", f.gpu), 0, MAX_MINOR, f"gpus[{f.gpu}].minor"),
                links_down=_bounded(spec.get("links_down", 0), 0, 255, f"gpus[{f.gpu}].links_down"),
            )
        )
    return Machine(
        name=name,
        description=str(data["description"]),
        driver=str(data["driver"]),
        cpus_possible=possible,
        numa_nodes=numa_nodes,
        functions=functions,
        gpus=tuple(gpus),
        nvswitches=nvswitches,
    )


def _whole(value: object, name: str) -> int:
    """A profile's whole number: a YAML integer as it is, text through the one bounded parser."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_decimal(str(value), field=name, signed=True)


def _bounded(value: Any, low: int, high: int, field: str) -> int:
    """An integer of a profile within [low, high]. Raises ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{field}: {excerpt(value)} is not an integer in {low}..{high}")
    return value


def _fabric(gpu: int, node: dict[str, Any] | None, override: dict[str, Any]) -> FabricSpec | None:
    """The fabric of one GPU: the profile's `fabric`, with the GPU's own `fabric` keys over it
    (`fabric: null` on a GPU takes it away). Raises ValueError naming the field."""
    if "fabric" in override:
        mine = override["fabric"]
        if mine is None:
            return None
        if not isinstance(mine, dict):
            raise ValueError(f"gpus[{gpu}].fabric: a mapping, or null for no fabric")
        spec = {**(node or {}), **mine}
    elif node is None:
        return None
    else:
        spec = node
    where = f"fabric (GPU {gpu})"
    unknown = sorted(set(spec) - _FABRIC_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {excerpt(unknown[0])}")
    try:
        cluster = uuid.UUID(str(spec["cluster_uuid"])).bytes
    except ValueError:
        raise ValueError(
            f"{where}.cluster_uuid: {excerpt(spec['cluster_uuid'])} is not a UUID (16 bytes, as "
            "NVML's clusterUuid holds)"
        ) from None
    state = spec.get("state", "completed")
    if isinstance(state, str):
        if state not in FABRIC_STATES:
            raise ValueError(f"{where}.state: one of {', '.join(FABRIC_STATES)}, or a number")
        state = FABRIC_STATES[state]
    health = str(spec.get("health", "healthy"))
    if health not in FABRIC_HEALTH:
        raise ValueError(f"{where}.health: one of {', '.join(FABRIC_HEALTH)}")
    conditions = spec.get("conditions")
    if conditions is None:
        conditions = ["degraded-bandwidth"] if health == "degraded" else []
    if not isinstance(conditions, list):
        raise ValueError(f"{where}.conditions: a list of condition names")
    mask = health_mask([str(c) for c in conditions])
    serial = spec.get("chassis_serial")
    return FabricSpec(
        cluster_uuid=cluster,
        clique=_bounded(spec["clique"], 0, 2**32 - 1, f"{where}.clique"),
        state=_bounded(state, 0, 255, f"{where}.state"),
        status=_bounded(spec.get("status", 0), 0, 2**32 - 1, f"{where}.status"),
        health_summary=FABRIC_HEALTH[health],
        health_mask=_bounded(spec.get("health_mask", mask), 0, 2**32 - 1, f"{where}.health_mask"),
        chassis_serial=None if serial is None else str(serial).encode("utf-8"),
        slot=_optional_byte(spec.get("slot"), f"{where}.slot"),
        tray=_optional_byte(spec.get("tray"), f"{where}.tray"),
        host_id=_optional_byte(spec.get("host_id"), f"{where}.host_id"),
    )


def _optional_byte(value: Any, field: str) -> int | None:
    return None if value is None else _bounded(value, 0, 255, field)


def _mig_devices(name: str, gpu: int, spec: dict[str, Any]) -> tuple[str, ...]:
    """Stable UUIDs for the `mig_devices` MIG devices a profile asks for on one GPU."""
    count = _whole(spec.get("mig_devices", 0), "mig_devices")
    if count and not spec.get("mig"):
        raise ValueError(f"GPU {gpu} has mig_devices but not mig: true")
    if not 0 <= count <= MAX_MIG_DEVICES:
        raise ValueError(f"GPU {gpu}: mig_devices must be 0..{MAX_MIG_DEVICES}")
    return tuple(
        f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'topo-reporter/{name}/{gpu}/mig/{k}')}"
        for k in range(count)
    )


def _nvlinks(
    bonds: Sequence[Mapping[str, Any]], n_gpus: int, nvswitches: Mapping[str, str]
) -> list[tuple[NvlinkEnd, ...]]:
    """Per GPU, the far end of each link index, in the order the profile wires them."""
    links: list[list[NvlinkEnd]] = [[] for _ in range(n_gpus)]
    for bond in bonds:
        count = _whole(bond["links"], "nvlink.links")
        gpus = (
            list(range(n_gpus))
            if bond.get("gpus") == "all"
            else [_whole(g, "nvlink.gpus") for g in bond["gpus"]]
        )
        if any(g >= n_gpus for g in gpus):
            raise ValueError(f"NVLink bond {bond} names a GPU the profile does not have")
        if "switches" in bond:
            for switch in bond["switches"]:
                if switch not in nvswitches:
                    raise ValueError(f"NVLink bond names unknown NVSwitch {excerpt(switch)}")
                for g in gpus:
                    links[g].extend([NvlinkEnd(switch=str(switch))] * count)
        else:
            a, b = gpus
            links[a].extend([NvlinkEnd(gpu=b)] * count)
            links[b].extend([NvlinkEnd(gpu=a)] * count)
    return [tuple(ends) for ends in links]


def _address_key(address: str) -> tuple[int, ...]:
    domain, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16))


class _TreeBuilder:
    """Hands out bus numbers depth first and records every function with its bridge units."""

    def __init__(self, numa_known: bool, gpu_audio: bool) -> None:
        self.numa_known = numa_known
        self.gpu_audio = gpu_audio
        self.functions: list[PciFunction] = []
        self._units = 0
        self._next_bus = 0
        self._domain = 0
        self._bridge = ""
        self._numa: int | None = None

    def _unit(self) -> int:
        self._units += 1
        return self._units

    def _bus(self, node: Mapping[str, Any]) -> int:
        if "bus" in node:
            bus = _whole(node["bus"], "bus")
            self._next_bus = max(self._next_bus, bus + 1)
            return bus
        bus = self._next_bus
        self._next_bus += 1
        if bus > 0xFF:
            raise ValueError(f"host bridge {self._bridge} runs out of bus numbers")
        return bus

    def _address(self, bus: int, slot: str) -> str:
        dev, fn = slot.split(".")
        width = 4 if self._domain <= 0xFFFF else 8
        device = parse_hex_digits(dev, field="slot")
        return f"{self._domain:0{width}x}:{bus:02x}:{device:02x}.{_whole(fn, 'slot')}"

    def host_bridge(self, spec: Mapping[str, Any]) -> None:
        domain, bus = str(spec["host_bridge"]).split(":")
        self._domain = parse_hex_digits(domain, field="host_bridge")
        root_bus = parse_hex_digits(bus, field="host_bridge")
        width = 4 if self._domain <= 0xFFFF else 8
        self._bridge = f"pci{self._domain:0{width}x}:{root_bus:02x}"
        self._numa = _whole(spec["numa"], "numa") if self.numa_known and "numa" in spec else None
        self._next_bus = root_bus + 1
        slot = 0
        for port in spec.get("root_ports", []):
            slot += 1
            at = str(port.get("at", f"{slot:02x}.0"))
            address = self._address(root_bus, at)
            path = f"devices/{self._bridge}/{address}"
            hops = (self._unit(),)
            self._add(address, path, "root", hops)
            self._place(self._only_child(port), self._bus(port), path, hops)
        for device in spec.get("on_bus", []):
            slot += 1
            at = str(device.get("at", f"{slot:02x}.0"))
            self._endpoint(device, root_bus, at, f"devices/{self._bridge}", ())

    def _add(
        self,
        address: str,
        path: str,
        bridge_kind: str,
        hops: tuple[int, ...],
    ) -> None:
        self.functions.append(
            PciFunction(
                address,
                path,
                _BRIDGE_VENDOR[bridge_kind],
                0x1,
                CLASS_BRIDGE,
                self._bridge,
                self._numa,
                hops,
            )
        )

    @staticmethod
    def _only_child(port: Mapping[str, Any]) -> Mapping[str, Any]:
        return {k: v for k, v in port.items() if k not in ("at", "bus")}

    def _place(self, node: Mapping[str, Any], bus: int, parent: str, hops: tuple[int, ...]) -> None:
        """Put the device `node` at slot 00.0 of `bus` behind the bridge at `parent`."""
        if "switch" in node:
            up = self._address(bus, "00.0")
            up_path = f"{parent}/{up}"
            unit = (*hops, self._unit())
            self._add(up, up_path, "switch", unit)
            inner = self._bus({})
            for i, child in enumerate(node["switch"]):
                at = str(child.get("at", f"{i:02x}.0"))
                down = self._address(inner, at)
                down_path = f"{up_path}/{down}"
                self._add(down, down_path, "switch", unit)
                self._place(self._only_child(child), self._bus(child), down_path, unit)
        elif "bridge" in node:
            address = self._address(bus, "00.0")
            path = f"{parent}/{address}"
            unit = (*hops, self._unit())
            self._add(address, path, "bridge", unit)
            self._place(node["bridge"], self._bus(node["bridge"]), path, unit)
        else:
            self._endpoint(node, bus, "00.0", parent, hops)

    def _endpoint(
        self, node: Mapping[str, Any], bus: int, slot: str, parent: str, hops: tuple[int, ...]
    ) -> None:
        dev = slot.split(".", maxsplit=1)[0]

        def add(fn: int, vendor: int, pci_class: int, **role: Any) -> None:
            address = self._address(bus, f"{dev}.{fn}")
            self.functions.append(
                PciFunction(
                    address,
                    f"{parent}/{address}",
                    vendor,
                    0x2,
                    pci_class,
                    self._bridge,
                    self._numa,
                    hops,
                    **role,
                )
            )

        if "gpu" in node:
            add(
                0,
                NVIDIA,
                _whole(node.get("class", CLASS_3D), "class"),
                gpu=_whole(node["gpu"], "gpu"),
            )
            if self.gpu_audio:
                add(1, NVIDIA, CLASS_AUDIO)
        elif "nic" in node:
            names = node["nic"] if isinstance(node["nic"], list) else [node["nic"]]
            vendor, pci_class = _NIC_VENDOR[str(node.get("vendor", "mellanox"))]
            for fn, name in enumerate(names):
                add(fn, vendor, pci_class, nic=str(name))
        elif "nvswitch" in node:
            add(0, NVIDIA, CLASS_NVSWITCH, nvswitch=str(node["nvswitch"]))
        elif "other" in node:
            vendor, pci_class = _OTHER[str(node["other"])]
            add(0, vendor, pci_class)
        else:
            raise ValueError(f"unknown PCI tree node {dict(node)}")
