"""`nvidia-smi topo -m` (and `-mp`) text, as real people paste it, into a typed matrix.

Real pastes are messy: tabs or tabs expanded to spaces, ANSI underline codes in the header, a
header whose tabs were lost (`GPU0GPU1…`), shell prompts, code fences and other `nvidia-smi` output
around the matrix, NICs as `NIC0..` with a `NIC Legend:` or named directly, old drivers' `SOC`,
empty and `N/A` affinity cells. The row labels, not the header, say which column is which; the
header is checked against them. A matrix that is truncated, asymmetric or otherwise damaged raises
`ParseError` naming the line: this module never returns a partial or guessed matrix. The only repair
it makes is splitting a cell of several link tokens whose separating tab was lost (`NV18NV18`),
which is unambiguous, and the repaired matrix must still be complete and symmetric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parsers.cpulist import parse_cpulist
from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from parsers.links import SELF, Link, LinkKind, parse_link, split_fused_links

# A topology paste is a few kilobytes; refusing huge input early bounds time and memory.
MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_DEVICES = 512

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_GPU_LABEL = re.compile(r"GPU([0-9]+)")
_AFFINITY_COLUMNS = {"CPUAffinity": "cpu", "NUMAAffinity": "numa", "GPUNUMAID": "gpu_numa"}
_AFFINITY_TAIL = re.compile(r"(?:CPUAffinity|NUMAAffinity|GPUNUMAID)*")
_LINK_PREFIX = re.compile(r"(?:X|NV[1-9][0-9]?|PIX|PXB|PHB|NODE|SYS|SOC)+")
_NIC_LEGEND = re.compile(r"\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_DRIVER = re.compile(r"Driver Version:\s*([0-9][0-9A-Za-z._-]*)")
# What the v1 schema allows (reporter/schema/topology-v1.schema.json): a NIC is an RDMA device,
# whose kernel name (mlx5_0, ibp12s0, rocep1s0f0, bnxt_re0) is at most 64 of these characters.
NIC_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_DRIVER_CHARS = 64
_TAB = 8


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """One parsed matrix: GPU rows first, then NICs, with per-GPU affinity cells.

    `None` marks a cell the text leaves empty or `N/A`.
    """

    gpu_links: tuple[tuple[Link, ...], ...]
    nic_names: tuple[str, ...]
    nic_links: tuple[tuple[Link, ...], ...]
    """Per NIC, its path to each GPU."""
    nic_peers: tuple[tuple[Link, ...] | None, ...]
    """Per NIC, its path to each NIC; None where the text says `N/A` (our own render only)."""
    cpu_affinity: tuple[frozenset[int] | None, ...]
    numa_affinity: tuple[frozenset[int] | None, ...]
    gpu_numa_id: tuple[int | None, ...]
    pcie_only: bool
    """The `topo -mp` view: NVLinks are not shown, so their absence means nothing."""
    driver: str | None
    header_line: int


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    line: int
    tokens: list[tuple[int, int, str]]
    """(start, end, text) of every token after the label, positions relative to the label."""
    label_end: int


@dataclass(frozen=True, slots=True)
class _SplitRow:
    cells: list[Link | None]
    tail: list[str]


def parse_topo(text: str) -> TopoMatrix:
    """Find and parse the first `nvidia-smi topo -m` matrix in `text`.

    Raises ParseError naming the line and what was expected when there is no matrix, or when the
    matrix found is truncated or damaged.
    """
    if len(text) > MAX_INPUT_BYTES:
        raise ParseError(
            f"input is {len(text)} bytes; an nvidia-smi topology is a few kilobytes "
            f"(limit {MAX_INPUT_BYTES})"
        )
    lines = _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n")).split("\n")
    first_error: ParseError | None = None
    for i, line in enumerate(lines):
        if not _is_header(line, lines, i):
            continue
        try:
            return _parse_block(lines, i)
        except ParseError as e:
            first_error = first_error or e
    if any("ROCm System Management Interface" in line for line in lines):
        raise ParseError(
            "this is rocm-smi output (AMD GPUs), not nvidia-smi; expected the output of "
            "`nvidia-smi topo -m`",
            line=1,
        )
    if first_error is not None:
        raise first_error
    raise ParseError(
        "no nvidia-smi topology matrix found: expected a header line naming GPU0 followed by a row "
        "starting with GPU0 (the output of `nvidia-smi topo -m`)",
        line=len(lines) if text.strip() else 1,
    )


def _is_header(line: str, lines: list[str], i: int) -> bool:
    stripped = line.strip()
    if "GPU0" not in stripped or re.match(r"GPU0\s+X(\s|$)", stripped):
        return False  # no GPU0 at all, or a GPU0 row (its second cell is X) rather than a header
    following = next((x for x in lines[i + 1 :] if x.strip()), "")
    return following.split()[:1] == ["GPU0"]


def _parse_block(lines: list[str], h: int) -> TopoMatrix:
    header = re.sub(r"\s+", "", lines[h])
    rows = _collect_rows(lines, h, header)
    labels = [r.label for r in rows]
    _check_labels(rows, h)
    columns = "".join(labels)
    start = header.find(columns)
    if start < 0 or (
        header[start + len(columns) :]
        and not _AFFINITY_TAIL.fullmatch(header[start + len(columns) :])
    ):
        _raise_header_mismatch(header, labels, rows, h)
    if start > 0 and not _only_noise(header[:start]):
        raise ParseError(
            f"header starts with {excerpt(header[:start])} before GPU0: not a topology header",
            line=h + 1,
        )
    affinity = re.findall("|".join(_AFFINITY_COLUMNS), header[start + len(columns) :])
    if len(set(affinity)) != len(affinity):
        raise ParseError("header repeats an affinity column", line=h + 1)
    n_gpus = sum(1 for label in labels if _GPU_LABEL.fullmatch(label))
    size = len(labels)
    splits = [_row_cells(r, size) for r in rows]
    matrix = [s.cells for s in splits]
    for r, row in enumerate(rows):
        for c, cell in enumerate(matrix[r]):
            if (cell == SELF) != (r == c):
                raise ParseError(
                    f"{row.label}/{labels[c]} is {_token(cell)}: X must be on the diagonal only",
                    line=row.line,
                )
            if cell is None and (r < n_gpus or c < n_gpus):
                raise ParseError(
                    f"{row.label}/{labels[c]} is N/A: GPU paths must be known", line=row.line
                )
            if cell is not None and cell.is_nvlink and (r >= n_gpus or c >= n_gpus):
                raise ParseError(
                    f"{row.label}/{labels[c]} is {cell.token}: a NIC is not reached over NVLink",
                    line=row.line,
                )
    for r in range(size):
        for c in range(r + 1, size):
            a, b = matrix[r][c], matrix[c][r]
            if a is not None and b is not None and a != b:
                raise ParseError(
                    f"{labels[r]}/{labels[c]} is {a.token} but {labels[c]}/{labels[r]} is "
                    f"{b.token}: the matrix must be symmetric (damaged paste?)",
                    line=rows[c].line,
                )
    tails = [_affinity(rows[g], splits[g].tail, affinity) for g in range(n_gpus)]
    return TopoMatrix(
        gpu_links=tuple(tuple(_known(c) for c in matrix[g][:n_gpus]) for g in range(n_gpus)),
        nic_names=_nic_names(lines, rows, h, labels[n_gpus:]),
        nic_links=tuple(tuple(_known(c) for c in matrix[k][:n_gpus]) for k in range(n_gpus, size)),
        nic_peers=tuple(
            None
            if any(c is None for c in matrix[k][n_gpus:])
            else tuple(_known(c) for c in matrix[k][n_gpus:])
            for k in range(n_gpus, size)
        ),
        cpu_affinity=tuple(t[0] for t in tails),
        numa_affinity=tuple(t[1] for t in tails),
        gpu_numa_id=tuple(t[2] for t in tails),
        pcie_only=_is_pcie_only(lines, h, rows, matrix),
        driver=_driver(lines),
        header_line=h + 1,
    )


def _only_noise(prefix: str) -> bool:
    # Prompt fragments never share a line with the header in real output; an empty prefix is the
    # norm. Allow only what tab loss and markdown leave behind.
    return all(ch in "|`>" for ch in prefix)


def _token(cell: Link | None) -> str:
    return "N/A" if cell is None else cell.token


def _known(cell: Link | None) -> Link:
    if cell is None:
        raise ParseError("unknown cell where a path is required")
    return cell


def _collect_rows(lines: list[str], h: int, header: str) -> list[_Row]:
    rows: list[_Row] = []
    for j in range(h + 1, len(lines)):
        line = lines[j]
        if not line.strip():
            if rows:
                break
            continue
        expanded = line.expandtabs(_TAB)
        label = expanded.split()[0]
        if label.startswith(("Legend", "```", "$", "#")) or label.endswith(":"):
            break
        if not _GPU_LABEL.fullmatch(label) and label not in header:
            break
        if len(rows) >= MAX_DEVICES:
            raise ParseError(f"more than {MAX_DEVICES} rows: not a topology", line=j + 1)
        rows.append(_tokenize(expanded, label, j + 1))
    if not rows:
        raise ParseError("header is not followed by matrix rows", line=h + 1)
    return rows


def _tokenize(expanded: str, label: str, line: int) -> _Row:
    origin = expanded.index(label)
    # Positions relative to the label: nvidia-smi starts rows in column 0, so tab stops are
    # multiples of 8 from there even when a paste indents the block.
    tokens = [
        (m.start() - origin, m.end() - origin, m.group())
        for m in re.finditer(r"\S+", expanded[origin:])
    ]
    return _Row(label=label, line=line, tokens=tokens[1:], label_end=tokens[0][1])


def _split_row(row: _Row, size: int) -> _SplitRow:
    # The first `size` cells are paths; what follows is the tail of affinity cells, whose empty
    # cells are recovered from tab stops below. `N/A` is a path cell only in topo-reporter's own
    # render (NIC-to-NIC paths it does not know).
    cells: list[Link | None] = []
    prev_end = row.label_end
    for consumed, (_, end, text) in enumerate(row.tokens):
        if len(cells) >= size:
            return _SplitRow(cells, _tail_cells(row.tokens[consumed:], prev_end))
        if text == "N/A":
            cells.append(None)
        elif (link := _try_link(text)) is not None:
            cells.append(link)
        elif (fused := split_fused_links(text)) is not None:
            cells.extend(fused)
        else:
            prefix = _LINK_PREFIX.match(text)
            rest = text[prefix.end() :] if prefix else ""
            if prefix is None or not re.fullmatch(r"[0-9][0-9,\-]*", rest):
                return _SplitRow(cells, _tail_cells(row.tokens[consumed:], prev_end))
            # `SYS0-71`: the tab between the last path and the CPU affinity was lost.
            cells.extend(split_fused_links(prefix.group(0)) or [parse_link(prefix.group(0))])
            return _SplitRow(cells, [rest, *_tail_cells(row.tokens[consumed + 1 :], end)])
        prev_end = end + 1 if text == "X" else end
    return _SplitRow(cells, [])


def _try_link(text: str) -> Link | None:
    try:
        return parse_link(text)
    except ParseError:
        return None


def _tail_cells(tokens: list[tuple[int, int, str]], prev_end: int) -> list[str]:
    cells: list[str] = []
    for start, end, text in tokens:
        tabs = start // _TAB - prev_end // _TAB if start % _TAB == 0 else 1
        cells.extend([""] * (max(tabs, 1) - 1))
        cells.append(text)
        prev_end = end
    return cells


def _row_cells(row: _Row, size: int) -> _SplitRow:
    split = _split_row(row, size)
    if len(split.cells) < size:
        raise ParseError(
            f"row {row.label} has {len(split.cells)} path cells, expected {size}: the matrix is "
            "truncated or damaged"
            + (f" (next text: {excerpt(split.tail[0])})" if split.tail else ""),
            line=row.line,
        )
    if len(split.cells) > size:
        raise ParseError(
            f"row {row.label} has {len(split.cells)} path cells for {size} columns (damaged?)",
            line=row.line,
        )
    return split


def _check_labels(rows: list[_Row], h: int) -> None:
    seen_nic = False
    expected_gpu = 0
    names: set[str] = set()
    for row in rows:
        if row.label in names:
            raise ParseError(f"row {row.label} appears twice", line=row.line)
        names.add(row.label)
        match = _GPU_LABEL.fullmatch(row.label)
        if match is None:
            seen_nic = True
            continue
        if seen_nic or parse_decimal(match.group(1), field=row.label) != expected_gpu:
            raise ParseError(
                f"row {row.label} out of order: expected GPU{expected_gpu} "
                "(GPU rows come first, in order)",
                line=row.line,
            )
        expected_gpu += 1
    if expected_gpu == 0:
        raise ParseError("no GPU rows under the header", line=h + 1)


def _raise_header_mismatch(header: str, labels: list[str], rows: list[_Row], h: int) -> None:
    columns = "".join(labels)
    rest = header[max(header.find(labels[0]), 0) :]
    if rest.startswith(columns):
        extra = re.split("|".join(_AFFINITY_COLUMNS), rest[len(columns) :])[0]
        raise ParseError(
            f"matrix is truncated: the header names columns {excerpt(extra)} after {labels[-1]} "
            "that have no rows",
            line=rows[-1].line + 1,
        )
    raise ParseError(
        f"header columns do not match the row labels {' '.join(labels)} "
        f"(header reads {excerpt(header)})",
        line=h + 1,
    )


def _affinity(
    row: _Row, tail: list[str], columns: list[str]
) -> tuple[frozenset[int] | None, frozenset[int] | None, int | None]:
    values: dict[str, str] = {}
    cells = list(tail)
    remaining = list(columns)
    if remaining and remaining[0] == "CPUAffinity" and cells:
        # nvidia-smi pads NUMA Affinity and GPU NUMA ID with extra tabs, never CPU Affinity: the
        # first cell is the CPU list even when empty (cgroup-confined job); the rest fill in order.
        values[remaining.pop(0)] = cells.pop(0)
    for cell in (c for c in cells if c):
        if not remaining:
            raise ParseError(
                f"unexpected cell {excerpt(cell)} after the affinity columns", line=row.line
            )
        values[remaining.pop(0)] = cell
    return (
        _set(values.get("CPUAffinity"), row, "CPU Affinity"),
        _set(values.get("NUMAAffinity"), row, "NUMA Affinity"),
        _int(values.get("GPUNUMAID"), row),
    )


def _set(value: str | None, row: _Row, field: str) -> frozenset[int] | None:
    if value is None or value in ("", "N/A"):
        return None
    try:
        return parse_cpulist(value, field=f"{row.label} {field}")
    except ParseError as e:
        raise ParseError(e.reason, line=row.line, field=e.field) from None


def _int(value: str | None, row: _Row) -> int | None:
    if value is None or value in ("", "N/A"):
        return None
    field = f"{row.label} GPU NUMA ID"
    try:
        node = parse_decimal(value, field=field)
    except ParseError as e:
        raise ParseError(e.reason, line=row.line, field=field) from None
    if node > 65535:
        raise ParseError(f"{node} is not a NUMA node id", line=row.line, field=field)
    return node


def _nic_names(
    lines: list[str], rows: list[_Row], h: int, nic_labels: list[str]
) -> tuple[str, ...]:
    legend: dict[str, str] = {}
    in_legend = False
    for line in lines[rows[-1].line :]:
        stripped = line.strip()
        if stripped.startswith("NIC Legend"):
            in_legend = True
            continue
        if not in_legend:
            if _GPU_LABEL.match(stripped) and "GPU0" in stripped and stripped != rows[0].label:
                break  # the next matrix of a longer paste begins: its legend is not ours
            continue
        match = _NIC_LEGEND.match(line)
        if match:
            legend[match.group(1)] = match.group(2)
        elif stripped:
            break
    names = tuple(legend.get(label, label) for label in nic_labels)
    if len(set(names)) != len(names):
        raise ParseError("NIC Legend gives two NICs the same name", line=h + 1)
    for label, name in zip(nic_labels, names, strict=True):
        if not NIC_NAME.fullmatch(name):
            where = f"the NIC Legend names {label}" if label in legend else "a NIC row is named"
            raise ParseError(
                f"{where} {excerpt(name)}: a NIC name is 1 to 64 letters, digits and _ . : - (an "
                "RDMA device such as mlx5_0)",
                line=h + 1,
            )
    return names


def _is_pcie_only(
    lines: list[str], h: int, rows: list[_Row], matrix: list[list[Link | None]]
) -> bool:
    if any(c is not None and c.kind is LinkKind.NV for row in matrix for c in row):
        return False
    command = next(
        (line for line in reversed(lines[max(0, h - 3) : h]) if "nvidia-smi" in line), ""
    )
    if re.search(r"topo\s+(-mp|--matrix_pci)\b", command):
        return True
    legend = lines[rows[-1].line : rows[-1].line + 12]
    has_legend = any(line.strip().startswith("Legend") for line in legend)
    return has_legend and not any("NV#" in line for line in legend)


def _driver(lines: list[str]) -> str | None:
    for number, line in enumerate(lines, 1):
        match = _DRIVER.search(line)
        if match and len(match.group(1)) > MAX_DRIVER_CHARS:
            raise ParseError(
                f"a driver version of {len(match.group(1))} characters: at most {MAX_DRIVER_CHARS}",
                line=number,
            )
        if match:
            return match.group(1)
    return None
