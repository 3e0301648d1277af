"""The one `Topology` every source produces and every projection reads.

Collectors (NVML, sysfs), the `nvidia-smi topo -m` parser and the annotation decoder all build this
model; labels, annotations and the human matrix are pure functions of it. It holds observations
only: nothing derived is stored except what a source says it observed (NVSwitch links).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from parsers.links import SELF, Link, LinkKind

__all__ = [
    "MAX_GPUS",
    "SELF",
    "FabricHealth",
    "FabricState",
    "Gpu",
    "GpuFabric",
    "Link",
    "LinkKind",
    "Nic",
    "NumaNode",
    "NvlinkHealth",
    "RackPosition",
    "Source",
    "Topology",
]


MAX_GPUS = 256
"""GPUs of one node the schema holds (`gpus` maxItems): more is not a node but garbage."""


class Source(enum.Enum):
    """Where a topology came from; it decides what the topology can know."""

    NVML = "nvml"
    SYSFS = "sysfs"
    NVIDIA_SMI = "nvidia-smi"


class FabricState(enum.Enum):
    """Where a GPU is in joining its NVLink fabric (NVML's `NVML_GPU_FABRIC_STATE_*`)."""

    NOT_SUPPORTED = "not-supported"
    NOT_STARTED = "not-started"
    IN_PROGRESS = "in-progress"
    COMPLETED = "completed"
    UNKNOWN = "unknown"
    """A value NVML does not define: the driver or the binding answered garbage."""


class FabricHealth(enum.Enum):
    """NVML's own summary of a GPU's fabric health (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`)."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    LIMITED_CAPACITY = "limited-capacity"


@dataclass(frozen=True, slots=True)
class RackPosition:
    """Where a GPU sits in its rack, as `nvmlDeviceGetPlatformInfo` says (Blackwell and newer).

    `None` is a value the platform did not give, or gave as garbage (then named in the GPU's
    fabric `problems`).
    """

    chassis_serial: str | None = None
    """Serial number of the chassis (the rack): a label value, `[A-Za-z0-9._-]`."""
    slot: int | None = None
    """Physical slot in the chassis, switch trays counted."""
    tray: int | None = None
    """Index among the compute trays of the chassis."""
    host_id: int | None = None
    """Index of the host (node) within its slot."""


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's multi-node NVLink fabric, decoded from `nvmlDeviceGetGpuFabricInfoV`.

    Only what the driver said, checked: a value that cannot be right (an undefined state, a
    cluster UUID of the wrong size, the clique 2^32-1, health-mask bits NVML does not define, a
    rack serial with control characters) is dropped or marked `unknown`, and `problems` says
    what it was. Nothing here is derived from other GPUs: `reporter.schema.fabric` judges the node.
    """

    state: FabricState
    cluster_uuid: str | None = None
    """The fabric's cluster UUID, lower-case and dashed; None when all zero (NVLink without a
    multi-node fabric, as NVIDIA's own tools read it) or unreadable."""
    clique: int | None = None
    """The clique (partition) ID within the cluster; None when unreadable (the cluster UUID is
    then None too: a GPU with an all-zero cluster UUID keeps its clique)."""
    error: int | None = None
    """NVML's status of the fabric probe when it is not NVML_SUCCESS (only meaningful when the
    state is completed)."""
    health: FabricHealth | None = None
    """NVML's health summary; None where the driver does not give one (the v2 struct)."""
    conditions: tuple[str, ...] = ()
    """The health mask's fields that say something is wrong, by name (`degraded-bandwidth`,
    `route-unhealthy`, ...), in `reporter.schema.fabric.CONDITIONS` order."""
    position: RackPosition | None = None
    problems: tuple[str, ...] = ()
    """What the driver answered that could not be taken as it was, one short line each."""

    @property
    def attached(self) -> bool:
        """Member of a multi-node fabric, by the rule GPU Feature Discovery applies before it
        writes `nvidia.com/gpu.clique`: completed, no error, a non-zero cluster UUID."""
        return (
            self.state is FabricState.COMPLETED
            and self.error is None
            and self.cluster_uuid is not None
            and self.clique is not None
        )

    @property
    def clique_id(self) -> str | None:
        """`<clusterUuid>.<cliqueId>`, byte for byte GFD's `nvidia.com/gpu.clique`, if attached."""
        if not self.attached:
            return None
        return f"{self.cluster_uuid}.{self.clique}"


@dataclass(frozen=True, slots=True)
class NvlinkHealth:
    """One GPU's NVLinks against its own link count (`NVML_FI_DEV_NVLINK_LINK_COUNT`)."""

    count: int
    """The NVLinks the GPU has."""
    down: tuple[int, ...] = ()
    """Indexes of the links that are not active, ascending."""
    lost: tuple[tuple[int, int], ...] = ()
    """(peer GPU index, links) of the direct bonds the down links belonged to, where the driver
    still names the far end; links to NVSwitches lower every pair's bond instead, which `links`
    shows."""

    @property
    def active(self) -> int:
        return self.count - len(self.down)

    @property
    def state(self) -> str:
        """`ok` (every link active), `degraded` (some down) or `down` (none active)."""
        if not self.down:
            return "ok"
        return "down" if self.active <= 0 else "degraded"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU. `None` means the source does not say."""

    index: int
    uuid: str | None = None
    pci: str | None = None
    model: str | None = None
    numa: frozenset[int] | None = None
    """CPU NUMA nodes local to the GPU (usually one; several on GB200)."""
    cpus: frozenset[int] | None = None
    mem_mib: int | None = None
    mig: bool | None = None
    gpu_numa: int | None = None
    """The NUMA node that is the GPU's own memory (coherent Grace systems)."""
    mig_devices: tuple[str, ...] = ()
    """UUIDs (`MIG-…`) of the MIG devices carved from this GPU: the IDs a device plugin hands out
    under MIG, which say nothing of their parent themselves."""
    lost: bool = False
    """NVML reported the GPU lost (fallen off the bus): published deliberately."""
    minor: int | None = None
    """The driver's minor number: the GPU's device file is `/dev/nvidia<minor>`, and NVIDIA's DRA
    driver names it `gpu-<minor>`."""
    fabric: GpuFabric | None = None
    """The multi-node NVLink fabric as this GPU reports it; None: the GPU has none."""
    nvlink: NvlinkHealth | None = None
    """Its NVLinks' health; None where the GPU has no NVLink or the source cannot see them."""

    @property
    def clique(self) -> str | None:
        """Multi-node NVLink fabric membership, `<clusterUuid>.<cliqueId>`, when attached."""
        return None if self.fabric is None else self.fabric.clique_id


@dataclass(frozen=True, slots=True)
class Nic:
    """One RDMA device and its path to each GPU (GPUDirect RDMA placement)."""

    name: str
    links: tuple[Link, ...]
    pci: str | None = None
    numa: frozenset[int] | None = None
    peers: tuple[Link, ...] | None = None
    """Path to each NIC, in `Topology.nics` order (`X` for itself), when the source knows it."""


@dataclass(frozen=True, slots=True)
class NumaNode:
    """A NUMA node with its CPUs and its SLIT distance row."""

    id: int
    cpus: frozenset[int]
    distances: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """A node's GPU topology as one source observed it.

    `links[i][j]` is the closest path from GPU i to GPU j with NVLink hiding PCIe, as
    `nvidia-smi topo -m` shows; `pcie` the PCIe-only matrix (`topo -mp`) where the source knows it.
    """

    source: Source
    gpus: tuple[Gpu, ...]
    links: tuple[tuple[Link, ...], ...]
    driver: str | None = None
    pcie: tuple[tuple[Link, ...], ...] | None = None
    nics: tuple[Nic, ...] = ()
    numa_nodes: tuple[NumaNode, ...] = ()
    nvswitch: bool = False
    """NVLinks go through NVSwitches (observed by NVML, inferred from a uniform all-to-all text)."""
    nvlink_observed: bool = True
    """False when the source cannot see NVLink (sysfs, `topo -mp`): absence of NV is not news."""
    _islands: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problem = _matrix_problem(self.links, len(self.gpus), "links")
        if problem is None and self.pcie is not None:
            problem = _matrix_problem(self.pcie, len(self.gpus), "pcie")
            if problem is None and any(c.is_nvlink for row in self.pcie for c in row):
                problem = "pcie holds an NVLink cell"
        if problem is None:
            problem = _nic_problem(self.nics, len(self.gpus))
        if problem is None and [g.index for g in self.gpus] != list(range(len(self.gpus))):
            problem = "GPU indices are not 0..n-1 in order"
        if problem is not None:
            raise ValueError(problem)
        object.__setattr__(self, "_islands", _nvlink_islands(self.links))

    @property
    def islands(self) -> tuple[tuple[int, ...], ...]:
        """NVLink islands of two or more GPUs: connected components of the NVLink graph."""
        return self._islands

    @property
    def largest_island(self) -> int:
        """GPUs in the largest NVLink island: 1 where no GPU has an NVLink peer (each GPU is an
        island of its own), 0 without GPUs."""
        return max(map(len, self._islands), default=min(len(self.gpus), 1))

    def link(self, a: int, b: int) -> Link:
        return self.links[a][b]

    def home_numa(self, index: int) -> int | None:
        """The CPU NUMA node a GPU belongs to, for alignment and counting; None when unknown.

        A GB200 GPU lists its Grace node with its own memory nodes (`0,3-9,11-17`): the home is the
        lowest listed node that has CPUs, or the lowest listed node when CPUs are not known.
        """
        nodes = self.gpus[index].numa
        if not nodes:
            return None
        with_cpus = {n.id for n in self.numa_nodes if n.cpus}
        candidates = nodes & with_cpus if with_cpus else nodes
        return min(candidates or nodes)


def _matrix_problem(matrix: Sequence[Sequence[Link]], n: int, name: str) -> str | None:
    if len(matrix) != n:
        return f"{name} has {len(matrix)} rows for {n} GPUs"
    for i, row in enumerate(matrix):
        if len(row) != n:
            return f"{name}[{i}] has {len(row)} cells for {n} GPUs"
        for j, cell in enumerate(row):
            if (cell == SELF) != (i == j):
                return f"{name}[{i}][{j}] is {cell.token}: X belongs on the diagonal and only there"
    return None


def _nic_problem(nics: Sequence[Nic], n_gpus: int) -> str | None:
    names = [nic.name for nic in nics]
    if len(set(names)) != len(names):
        return "NIC names are not unique"
    for k, nic in enumerate(nics):
        if len(nic.links) != n_gpus:
            return f"nics[{k}] has {len(nic.links)} links for {n_gpus} GPUs"
        if any(c == SELF or c.is_nvlink for c in nic.links):
            return f"nics[{k}] links hold X or NVLink: a NIC reaches GPUs over PCIe"
        if nic.peers is not None:
            if len(nic.peers) != len(nics):
                return f"nics[{k}] has {len(nic.peers)} peers for {len(nics)} NICs"
            for j, cell in enumerate(nic.peers):
                if (cell == SELF) != (j == k) or cell.is_nvlink:
                    return f"nics[{k}].peers[{j}] is {cell.token}"
    return None


def _nvlink_islands(links: Sequence[Sequence[Link]]) -> tuple[tuple[int, ...], ...]:
    n = len(links)
    seen = [False] * n
    islands: list[tuple[int, ...]] = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        stack, members = [start], [start]
        while stack:
            a = stack.pop()
            for b in range(n):
                # Either side reporting NVLink joins the pair: one end down still wires it.
                if not seen[b] and (links[a][b].is_nvlink or links[b][a].is_nvlink):
                    seen[b] = True
                    stack.append(b)
                    members.append(b)
        if len(members) > 1:
            islands.append(tuple(sorted(members)))
    return tuple(islands)
