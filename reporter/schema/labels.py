"""The labels and the one-line summary: pure projections of one `Topology`.

Label values obey Kubernetes' rules (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both
ends) by construction: they are small integers, fixed words, cluster UUIDs and values checked by
`reporter.schema.fabric`. Nothing here reads the clock. The annotations are written by
reporter.schema.annotations, the matrix text by reporter.schema.matrix.
"""

from collections import Counter

from parsers.kubelet import KubeletPolicies
from reporter.schema import keys
from reporter.schema.fabric import domain_labels, node_fabric
from reporter.schema.model import Topology


def interconnect(topology: Topology) -> str:
    """The best fabric joining all GPUs: nvswitch, nvlink, pcie, none or unknown."""
    n = len(topology.gpus)
    if not topology.nvlink_observed:
        return "unknown"
    if n <= 1:
        return "none"
    all_pairs_nv = all(topology.links[a][b].is_nvlink for a in range(n) for b in range(n) if a != b)
    if topology.nvswitch and all_pairs_nv:
        return "nvswitch"
    if any(c.is_nvlink for row in topology.links for c in row):
        return "nvlink"
    return "pcie"


def gpus_per_numa(topology: Topology) -> Counter[int]:
    """How many GPUs each CPU NUMA node holds (GPUs of unknown locality are not counted)."""
    homes = (topology.home_numa(g.index) for g in topology.gpus)
    return Counter(h for h in homes if h is not None)


def nvlink_health(topology: Topology) -> str | None:
    """`ok`, `degraded` (a GPU lost some of its NVLinks) or `down` (a GPU has none active left);
    None where no GPU's links are known. Lost GPUs are the `gpu-lost` finding's, and GPUs in MIG
    mode are left out: NVML reports their NVLinks down (DCGM notes it), and MIG uses none."""
    if not topology.nvlink_observed:
        return None
    states = {
        g.nvlink.state
        for g in topology.gpus
        if g.nvlink is not None and g.nvlink.count > 0 and not g.lost and not g.mig
    }
    for word in ("down", "degraded", "ok"):
        if word in states:
            return word
    return None


def fabric_labels(topology: Topology, node: str | None) -> dict[str, str]:
    """The multi-node fabric's labels by name: both domain labels (a node without a fabric is its
    own domain when `node` is known), `fabric-health` where a GPU has a fabric, and the rack
    position the GPUs agree on."""
    fabric = node_fabric(topology)
    found = domain_labels(fabric, node)
    out = {
        name: found[part]
        for name, part in ((keys.NVLINK_DOMAIN, "domain"), (keys.NVLINK_PARTITION, "partition"))
        if part in found
    }
    if fabric.health is not None:
        out[keys.FABRIC_HEALTH] = fabric.health
    position = fabric.position
    if position is not None:
        values = (
            (keys.RACK_SERIAL, position.chassis_serial),
            (keys.RACK_SLOT, position.slot),
            (keys.RACK_TRAY, position.tray),
            (keys.RACK_HOST, position.host_id),
        )
        out |= {name: str(value) for name, value in values if value is not None}
    return out


def labels(
    topology: Topology, prefix: str = keys.DEFAULT_PREFIX, node: str | None = None
) -> dict[str, str]:
    """The node labels of docs/schema.md's table, keyed by full label key.

    `node` is the Node's name: a node without a multi-node fabric is its own NVLink domain, named
    after it; without a name (a pasted matrix) those two labels are left out.
    """
    n = len(topology.gpus)
    out = {
        keys.COUNT: str(n),
        keys.INTERCONNECT: interconnect(topology),
    }
    if topology.nvlink_observed:
        out[keys.NVLINK_ISLAND_SIZE] = str(topology.largest_island)
        out[keys.NVLINK_ISLANDS] = str(len(topology.islands))
    per_numa = gpus_per_numa(topology)
    if per_numa:
        out[keys.NUMA_NODES] = str(len(per_numa))
        out[keys.MAX_GPUS_PER_NUMA] = str(max(per_numa.values()))
    out[keys.RDMA_NICS] = str(len(topology.nics))
    link_health = nvlink_health(topology)
    if link_health is not None:
        out[keys.NVLINK_HEALTH] = link_health
    out |= fabric_labels(topology, node)
    out[keys.SCHEMA] = f"v{keys.SCHEMA_VERSION}"
    return {keys.key(prefix, name): value for name, value in out.items()}


def kubelet_labels(policies: KubeletPolicies, prefix: str = keys.DEFAULT_PREFIX) -> dict[str, str]:
    """The kubelet's alignment policies as labels, so a scheduler can see what admission will do."""
    return {
        keys.key(prefix, keys.TOPOLOGY_MANAGER_POLICY): policies.topology_manager_policy,
        keys.key(prefix, keys.TOPOLOGY_MANAGER_SCOPE): policies.topology_manager_scope,
        keys.key(prefix, keys.CPU_MANAGER_POLICY): policies.cpu_manager_policy,
    }


def summary(topology: Topology) -> str:
    """One line an operator reads first: `8x NVIDIA H100 80GB HBM3, NVSwitch NV18, ...`."""
    n = len(topology.gpus)
    if n == 0:
        return "no GPUs"
    models = Counter(g.model or "GPU" for g in topology.gpus)
    parts = [", ".join(f"{count}x {model}" for model, count in models.items())]
    fabric = interconnect(topology)
    counts = sorted({c.nvlinks for row in topology.links for c in row if c.is_nvlink}, reverse=True)
    bonds = "/".join(f"NV{k}" for k in counts)
    parts.append(
        {
            "nvswitch": f"NVSwitch {bonds}",
            "nvlink": f"NVLink {bonds}, {len(topology.islands)} island(s), largest "
            f"{topology.largest_island}",
            "pcie": "PCIe only",
            "none": "single GPU",
            "unknown": "NVLink not observed (PCIe view only)",
        }[fabric]
    )
    per_numa = gpus_per_numa(topology)
    parts.append(f"{len(per_numa)} NUMA nodes" if per_numa else "NUMA locality unknown")
    parts.append(f"{len(topology.nics)} RDMA NICs" if topology.nics else "no RDMA NICs")
    lost = [f"GPU{g.index}" for g in topology.gpus if g.lost]
    if lost:
        parts.append(f"LOST: {' '.join(lost)}")
    down = [
        f"GPU{g.index} {len(g.nvlink.down)}/{g.nvlink.count}"
        for g in topology.gpus
        if g.nvlink is not None and g.nvlink.down and not g.lost
    ]
    if down:
        parts.append(f"NVLINKS DOWN: {' '.join(down)}")
    return ", ".join(parts)
