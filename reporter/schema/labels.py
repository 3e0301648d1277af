"""Labels, annotations and the human matrix: pure projections of one `Topology`.

Label values obey Kubernetes' rules (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both
ends) by construction: they are small integers, fixed words, cluster UUIDs and values checked by
`reporter.schema.fabric`. Nothing here reads the clock.
"""

import re
from collections import Counter
from collections.abc import Sequence

from parsers.cpulist import format_cpulist
from parsers.kubelet import KubeletPolicies
from reporter.schema import keys
from reporter.schema.codec import encode
from reporter.schema.fabric import domain_labels, node_fabric
from reporter.schema.model import SELF, Link, Topology


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


def annotations(topology: Topology, prefix: str = keys.DEFAULT_PREFIX) -> dict[str, str]:
    """The `topology` and `matrix` annotations (the publisher adds `owned`)."""
    return {
        keys.key(prefix, keys.TOPOLOGY): encode(topology),
        keys.key(prefix, keys.MATRIX): describe_matrix(topology),
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


def _cell(value: frozenset[int] | int | None) -> str:
    if value is None:
        return "N/A"
    if isinstance(value, int):
        return str(value)
    return format_cpulist(value) or "N/A"


def _link(cell: Link) -> str:
    return " X " if cell == SELF else cell.token


def render_matrix(topology: Topology) -> str:
    """The `matrix` annotation: the summary, then the matrix as `nvidia-smi topo -m` lays it out.

    Laid out with 8-column tab stops expanded to spaces, so `kubectl describe node` aligns it and
    `topo-reporter parse` reads it back. NIC-to-NIC cells the source does not know read `N/A`.
    """
    n = len(topology.gpus)
    nic_cols = [f"NIC{k}" for k in range(len(topology.nics))]
    with_gpu_numa = any(g.gpu_numa is not None for g in topology.gpus)
    header = ["", *(f"GPU{i}" for i in range(n)), *nic_cols, "CPU Affinity", "NUMA Affinity"]
    if with_gpu_numa:
        header.append("GPU NUMA ID")
    rows = ["\t".join(header)]
    for i, gpu in enumerate(topology.gpus):
        cells = [f"GPU{i}", *(_link(c) for c in topology.links[i])]
        cells += [nic.links[i].token for nic in topology.nics]
        cells += [_cell(gpu.cpus), _cell(gpu.numa)]
        if with_gpu_numa:
            cells.append(_cell(gpu.gpu_numa))
        rows.append("\t".join(cells))
    for k, nic in enumerate(topology.nics):
        peers = (
            [_link(c) for c in nic.peers]
            if nic.peers is not None
            else [" X " if j == k else "N/A" for j in range(len(topology.nics))]
        )
        rows.append("\t".join([nic_cols[k], *(c.token for c in nic.links), *peers]))
    lines = [summary(topology), *(r.expandtabs(8).rstrip() for r in rows)]
    # Without "NV#" the legend marks a PCIe-only view, as `nvidia-smi topo -mp` does.
    lines += [
        "",
        "Legend: X = self, NV# = # bonded NVLinks, PIX < PXB < PHB < NODE < SYS (PCIe)"
        if topology.nvlink_observed
        else "Legend: X = self, PIX < PXB < PHB < NODE < SYS (PCIe only: NVLinks not observed)",
    ]
    if topology.nics:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {col}: {nic.name}" for col, nic in zip(nic_cols, topology.nics, strict=True)]
    return "\n".join(lines) + "\n"


DESCRIBE_WIDTH = 138
"""`kubectl describe node` cuts each line of a multi-line annotation to 138 characters + `...`."""

_Column = tuple[str, Sequence[str]]
"""A table column: its header and one cell per row."""


def _widths(rows: Sequence[str], columns: Sequence[_Column]) -> list[int]:
    return [max(map(len, rows), default=0)] + [
        max(len(header), *map(len, cells)) for header, cells in columns
    ]


def _table(rows: Sequence[str], columns: Sequence[_Column]) -> list[str]:
    """Row labels, then each column as wide as its widest cell, one space apart."""
    widths = _widths(rows, columns)
    lines = [["", *(header for header, _ in columns)]]
    lines += [[label, *(cells[r] for _, cells in columns)] for r, label in enumerate(rows)]
    return [
        " ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]


def _chunked(rows: Sequence[str], columns: Sequence[_Column], width: int) -> list[str]:
    """`_table`, split into several tables (blank-line apart) where the columns are too many.

    Only matrix columns come here (cells of at most a few characters), so every chunk fits.
    """
    label, *widths = _widths(rows, columns)
    out: list[str] = []
    start = 0
    while start < len(columns):
        end, used = start + 1, label + 1 + widths[start]
        while end < len(columns) and used + 1 + widths[end] <= width:
            used += 1 + widths[end]
            end += 1
        out += [*([""] if out else []), *_table(rows, columns[start:end])]
        start = end
    return out


def _fits(lines: Sequence[str], width: int) -> bool:
    return all(len(line) <= width for line in lines)


def _wrap(line: str, width: int, indent: str = "      ") -> list[str]:
    """`line` in pieces of at most `width`, broken after a space or a comma (cpulists have no
    spaces), continued under `indent`; a piece with neither is cut where the width ends."""
    out = []
    while len(line) > width:
        space = line.rfind(" ", len(indent) + 1, width)
        cut = max(space, line.rfind(",", len(indent), width - 1) + 1)
        if cut <= len(indent):
            cut = width
        out.append(line[:cut].rstrip())
        line = indent + line[cut:].lstrip()
    out.append(line)
    return out


def _plain(text: str) -> str:
    """`text` in printable ASCII: kubectl counts bytes, and a newline would start a line of its
    own; models and NIC names come from the machine (or a decoded annotation), not from us."""
    ascii_text = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if c.isprintable() else "?" for c in ascii_text)


def _nearest_nics(topology: Topology, gpu: int) -> str:
    """The NIC(s) closest to `gpu` and their path: `NIC0 PIX`, `NIC2,NIC3 NODE`, `all SYS`."""
    cells = [nic.links[gpu] for nic in topology.nics]
    best = min(cells, key=lambda c: c.closeness)
    nearest = [f"NIC{k}" for k, c in enumerate(cells) if c == best]
    names = "all" if len(nearest) == len(cells) > 1 else ",".join(nearest)
    return f"{names} {best.token}"


def describe_matrix(topology: Topology, width: int = DESCRIBE_WIDTH) -> str:
    """The `matrix` annotation: the summary, then the matrix made for `kubectl describe node`.

    Every line is at most `width` characters, so kubectl shows it whole. Columns are aligned and
    hold nvidia-smi's tokens. GPU rows carry the NIC columns and the CPU and NUMA affinity where
    they fit; otherwise the NICs go below as rows (NIC to GPU, as nvidia-smi prints them) and the
    affinity as one line per GPU with its nearest NIC. NIC-to-NIC paths are left to the `topology`
    annotation, which holds everything: this one is for reading.
    """
    n = len(topology.gpus)
    lines = _wrap(_plain(summary(topology)), width, indent="  ")
    if n == 0:
        return "\n".join(lines) + "\n"
    gpus = [f"GPU{i}" for i in range(n)]
    nics = [f"NIC{k}" for k in range(len(topology.nics))]
    to_gpu = [[_link(row[j]).strip() for row in topology.links] for j in range(n)]
    nic_to_gpu = [[nic.links[j].token for nic in topology.nics] for j in range(n)]
    nic_columns = [(nics[k], [c.token for c in nic.links]) for k, nic in enumerate(topology.nics)]
    affinity: list[_Column] = [
        ("CPU Affinity", [_cell(g.cpus) for g in topology.gpus]),
        ("NUMA Affinity", [_cell(g.numa) for g in topology.gpus]),
    ]
    if any(g.gpu_numa is not None for g in topology.gpus):
        affinity.append(("GPU NUMA ID", [_cell(g.gpu_numa) for g in topology.gpus]))
    beside = [(gpus[j], to_gpu[j]) for j in range(n)]
    below = [(gpus[j], [*to_gpu[j], *nic_to_gpu[j]]) for j in range(n)]
    pad = [""] * len(nics)
    layouts: list[tuple[list[str], bool]] = [
        (_table(gpus, [*beside, *nic_columns, *affinity]), False),
        (_table(gpus, [*beside, *nic_columns]), True),
        (_table([*gpus, *nics], [*below, *((h, [*c, *pad]) for h, c in affinity)]), False),
    ]
    body, affinity_below = next(
        ((table, lines_below) for table, lines_below in layouts if _fits(table, width)),
        (_chunked([*gpus, *nics], below, width), True),
    )
    lines += body
    if affinity_below:
        columns = [(h, c) for h, c in affinity if h != "CPU Affinity"]
        if topology.nics:
            columns.append(("Nearest NIC", [_nearest_nics(topology, i) for i in range(n)]))
        columns.append(affinity[0])
        lines += [""]
        for line in _table(gpus, columns):
            lines += _wrap(line, width)
    lines += [
        "",
        "Legend: NV# = # bonded NVLinks, PIX < PXB < PHB < NODE < SYS"
        if topology.nvlink_observed
        else "Legend: PIX < PXB < PHB < NODE < SYS (PCIe only: NVLinks not observed)",
    ]
    if topology.nics:
        names = [_plain(nic.name) for nic in topology.nics]
        lines += _wrap(_nic_legend(names), width, indent="  ")
    return "\n".join(lines) + "\n"


def _nic_legend(names: Sequence[str]) -> str:
    """`NIC Legend: NIC0=mlx5_0 NIC1=ib1 ...`; NICs named `<stem><k>` after their column k (the
    usual `mlx5_0`..`mlx5_7`) read in one phrase, since every byte goes to every Node watcher."""
    numbered = [re.fullmatch(r"(.*\D)(0|[1-9]\d*)", name) for name in names]
    stems = {m.group(1) if m else None for m in numbered}
    if (
        len(names) > 1
        and len(stems) == 1
        and all(m is not None and m.group(2) == str(k) for k, m in enumerate(numbered))
    ):
        return f"NIC Legend: NIC<k> = {stems.pop()}<k>, k = 0-{len(names) - 1}"
    return "NIC Legend: " + " ".join(f"NIC{k}={name}" for k, name in enumerate(names))
