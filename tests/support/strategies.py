"""Hypothesis strategies for topologies, shared by the parser, codec and scheduler-library tests."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from hypothesis import strategies as st

from parsers.links import SELF, Link, LinkKind
from reporter.schema.fabric import CONDITIONS
from reporter.schema.model import (
    FabricHealth,
    FabricState,
    Gpu,
    GpuFabric,
    Nic,
    NumaNode,
    NvlinkHealth,
    RackPosition,
    Source,
    Topology,
)
from reporter.schema.normalize import infer_nvswitch

T = TypeVar("T")

PCIE_KINDS = [LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE, LinkKind.SYS]

pcie_links = st.sampled_from([Link(k) for k in PCIE_KINDS])
any_links = st.one_of(pcie_links, st.integers(1, 18).map(lambda k: Link(LinkKind.NV, k)))
cpu_sets = st.frozensets(st.integers(0, 255), min_size=1, max_size=40)
node_sets = st.frozensets(st.integers(0, 33), min_size=1, max_size=4)
nic_names = st.from_regex(r"[a-z][a-z0-9]{0,5}_[0-9]{1,2}", fullmatch=True)


@st.composite
def symmetric_matrix(draw: st.DrawFn, n: int, cells: st.SearchStrategy[Link]) -> tuple:
    grid = [[SELF] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            grid[a][b] = grid[b][a] = draw(cells)
    return tuple(tuple(row) for row in grid)


@st.composite
def text_topologies(draw: st.DrawFn, max_gpus: int = 10) -> Topology:
    """Topologies that `nvidia-smi topo -m` text can carry completely (source nvidia-smi)."""
    n = draw(st.integers(1, max_gpus))
    pcie_only = draw(st.booleans())
    links = draw(symmetric_matrix(n, pcie_links if pcie_only else any_links))
    gpus = tuple(
        Gpu(
            index=i,
            cpus=draw(st.none() | cpu_sets),
            numa=draw(st.none() | node_sets),
            gpu_numa=draw(st.none() | st.integers(0, 64)),
        )
        for i in range(n)
    )
    names = draw(st.lists(nic_names, max_size=6, unique=True))
    peers = draw(symmetric_matrix(len(names), pcie_links))
    nics = tuple(
        Nic(
            name=name,
            links=tuple(draw(pcie_links) for _ in range(n)),
            peers=peers[k],
        )
        for k, name in enumerate(names)
    )
    return Topology(
        source=Source.NVIDIA_SMI,
        gpus=gpus,
        links=links,
        pcie=links if pcie_only else None,
        nics=nics,
        nvswitch=infer_nvswitch(links),
        nvlink_observed=not pcie_only,
    )


uuids = st.uuids().map(lambda u: f"GPU-{u}")
pci_addresses = st.tuples(
    st.sampled_from([0, 1, 0x10000]), st.integers(0, 255), st.integers(0, 31), st.integers(0, 7)
).map(lambda t: f"{t[0]:0{4 if t[0] <= 0xFFFF else 8}x}:{t[1]:02x}:{t[2]:02x}.{t[3]}")


label_values = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,14}[A-Za-z0-9])?", fullmatch=True)
bytes_ = st.none() | st.integers(0, 255)
rack_positions = st.builds(
    RackPosition,
    chassis_serial=st.none() | label_values,
    slot=bytes_,
    tray=bytes_,
    host_id=bytes_,
)
problem_lines = st.from_regex(r"[ -~]{1,60}", fullmatch=True).filter(lambda t: t.strip() != "")


@st.composite
def gpu_fabrics(draw: st.DrawFn) -> GpuFabric:
    """Every shape a GPU's fabric can take: any state, attached or not, garbage marked."""
    unreadable = draw(st.booleans())
    cluster = None if unreadable else draw(st.none() | st.uuids().map(str))
    return GpuFabric(
        state=draw(st.sampled_from(list(FabricState))),
        cluster_uuid=cluster,
        clique=None if unreadable else draw(st.integers(0, 2**32 - 2)),
        error=draw(st.none() | st.integers(1, 999)),
        health=draw(st.none() | st.sampled_from(list(FabricHealth))),
        conditions=tuple(
            draw(st.lists(st.sampled_from(list(CONDITIONS)), max_size=3, unique=True))
        ),
        position=draw(st.none() | rack_positions),
        problems=tuple(draw(st.lists(problem_lines, max_size=2))),
    )


@st.composite
def nvlink_healths(draw: st.DrawFn, index: int, n: int) -> NvlinkHealth:
    count = draw(st.integers(1, 36))
    down = draw(st.lists(st.integers(0, count - 1), max_size=4, unique=True))
    peers = [p for p in range(n) if p != index]
    lost = draw(
        st.lists(st.tuples(st.sampled_from(peers), st.integers(1, 4)), max_size=2)
        if peers
        else st.just([])
    )
    return NvlinkHealth(count=count, down=tuple(sorted(down)), lost=tuple(lost))


def _unique_identities(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """The GPUs with every UUID, PCI address, minor and MIG device held by its first GPU only (a
    later GPU drawn with one loses it): the decoder refuses a node where two GPUs share one."""
    seen: set[object] = set()

    def first(value: T | None) -> T | None:
        if value is None or value in seen:
            return None
        seen.add(value)
        return value

    return tuple(
        replace(
            gpu,
            uuid=first(gpu.uuid),
            pci=first(gpu.pci),
            minor=first(gpu.minor),
            mig_devices=tuple(m for m in gpu.mig_devices if first(m) is not None),
        )
        for gpu in gpus
    )


@st.composite
def topologies(draw: st.DrawFn, max_gpus: int = 10, max_nics: int = 5) -> Topology:
    """Any valid topology, every optional field exercised."""
    n = draw(st.integers(0, max_gpus))
    links = draw(symmetric_matrix(n, any_links))
    source = draw(st.sampled_from(list(Source)))
    gpus = tuple(
        Gpu(
            index=i,
            uuid=draw(st.none() | uuids),
            pci=draw(st.none() | pci_addresses),
            model=draw(
                st.none() | st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"])
            ),
            numa=draw(st.none() | node_sets),
            cpus=draw(st.none() | st.frozensets(st.integers(0, 255), max_size=40)),
            mem_mib=draw(st.none() | st.integers(0, 200_000)),
            mig=draw(st.none() | st.booleans()),
            gpu_numa=draw(st.none() | st.integers(0, 64)),
            mig_devices=tuple(
                draw(st.lists(uuids.map(lambda u: f"MIG-{u[4:]}"), max_size=3, unique=True))
            ),
            lost=draw(st.booleans()),
            minor=draw(st.none() | st.integers(0, 254)),
            fabric=draw(st.none() | gpu_fabrics()),
            nvlink=draw(st.none() | nvlink_healths(i, n)),
        )
        for i in range(n)
    )
    gpus = _unique_identities(gpus)
    names = draw(st.lists(nic_names, max_size=max_nics, unique=True))
    peers = draw(symmetric_matrix(len(names), pcie_links))
    nics = tuple(
        Nic(
            name=name,
            links=tuple(draw(pcie_links) for _ in range(n)),
            pci=draw(st.none() | pci_addresses),
            numa=draw(st.none() | node_sets),
            peers=draw(st.none() | st.just(peers[k])),
        )
        for k, name in enumerate(names)
    )
    node_ids = draw(st.lists(st.integers(0, 16), max_size=4, unique=True))
    numa_nodes = tuple(
        NumaNode(
            id=i,
            cpus=draw(st.frozensets(st.integers(0, 255), max_size=30)),
            distances=tuple(draw(st.integers(10, 40)) for _ in node_ids),
        )
        for i in sorted(node_ids)
    )
    pcie = draw(st.none() | symmetric_matrix(n, pcie_links))
    return Topology(
        source=source,
        driver=draw(st.none() | st.sampled_from(["550.54.15", "580.105.08"])),
        gpus=gpus,
        links=links,
        pcie=pcie,
        nics=nics,
        numa_nodes=numa_nodes,
        nvswitch=draw(st.booleans()),
        nvlink_observed=draw(st.booleans()),
    )
