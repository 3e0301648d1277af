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

__all__ = ["SELF", "Gpu", "Link", "LinkKind", "Nic", "NumaNode", "Source", "Topology"]


class Source(enum.Enum):
    """Where a topology came from; it decides what the topology can know."""

    NVML = "nvml"
    SYSFS = "sysfs"
    NVIDIA_SMI = "nvidia-smi"


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
    clique: str | None = None
    """Multi-node NVLink fabric membership, `<clusterUuid>.<cliqueId>`."""
    mig_devices: tuple[str, ...] = ()
    """UUIDs (`MIG-…`) of the MIG devices carved from this GPU: the IDs a device plugin hands out
    under MIG, which say nothing of their parent themselves."""
    lost: bool = False
    """NVML reported the GPU lost (fallen off the bus): published deliberately."""


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
