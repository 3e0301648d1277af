"""Turn what a source observed into the one `Topology`: here, parsed `nvidia-smi` text.

Text carries links and affinity cells only; everything else (UUIDs, PCI addresses, models,
NUMA distances) stays None or empty, as the schema says for fields the source does not know.
"""

from __future__ import annotations

from parsers.links import Link
from parsers.nvsmi import TopoMatrix
from reporter.schema.model import Gpu, Nic, Source, Topology

# No GPU has ever had more than 18 NVLink ports (H100, B200, GB200). When every pair is bonded with
# k links and k x (GPUs - 1) exceeds that, the links cannot be direct: they go through NVSwitches.
MAX_DIRECT_NVLINKS_PER_GPU = 18


def infer_nvswitch(links: tuple[tuple[Link, ...], ...]) -> bool:
    """Whether an all-to-all NVLink matrix can only be wired through NVSwitches."""
    n = len(links)
    pairs = [links[a][b] for a in range(n) for b in range(n) if a != b]
    if n < 2 or not all(c.is_nvlink for c in pairs):
        return False
    return min(c.nvlinks for c in pairs) * (n - 1) > MAX_DIRECT_NVLINKS_PER_GPU


def topology_from_matrix(matrix: TopoMatrix) -> Topology:
    """The model of a parsed `nvidia-smi topo -m` (or `-mp`) matrix."""
    gpus = tuple(
        Gpu(
            index=i,
            numa=matrix.numa_affinity[i],
            cpus=matrix.cpu_affinity[i],
            gpu_numa=matrix.gpu_numa_id[i],
        )
        for i in range(len(matrix.gpu_links))
    )
    nics = tuple(
        Nic(name=name, links=links, peers=peers)
        for name, links, peers in zip(
            matrix.nic_names, matrix.nic_links, matrix.nic_peers, strict=True
        )
    )
    return Topology(
        source=Source.NVIDIA_SMI,
        driver=matrix.driver,
        gpus=gpus,
        links=matrix.gpu_links,
        pcie=matrix.gpu_links if matrix.pcie_only else None,
        nics=nics,
        nvswitch=infer_nvswitch(matrix.gpu_links),
        nvlink_observed=not matrix.pcie_only,
    )
