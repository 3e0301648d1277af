"""The matrix text: a topology as people read it, in nvidia-smi's tokens.

Two renderers of one `Topology`: `render_matrix`, nvidia-smi's own layout (the CLI's `--format
matrix`, which `topo-reporter parse` reads back), and `describe_matrix`, the `matrix` annotation,
laid out for `kubectl describe node` (no line longer than it shows). Pure: nothing here is read
back by a program; the `topology` annotation holds everything.
"""

import re
from collections.abc import Sequence

from parsers.cpulist import format_cpulist
from reporter.schema.labels import summary
from reporter.schema.model import SELF, Link, Topology


def _cell(value: frozenset[int] | int | None) -> str:
    if value is None:
        return "N/A"
    if isinstance(value, int):
        return str(value)
    return format_cpulist(value) or "N/A"


def _link(cell: Link) -> str:
    return " X " if cell == SELF else cell.token


def render_matrix(topology: Topology) -> str:
    """The CLI's `--format matrix`: the summary, then the matrix as `nvidia-smi topo -m` prints it.

    Laid out with 8-column tab stops expanded to spaces, as nvidia-smi's own output is when piped,
    so `topo-reporter parse` reads it back. NIC-to-NIC cells the source does not know read `N/A`.
    The `matrix` annotation is `describe_matrix`, not this.
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
