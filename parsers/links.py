"""The link vocabulary: how two devices on a node are joined, closest first.

`nvidia-smi topo -m` tokens and NVML's `nvmlDeviceGetTopologyCommonAncestor` levels both map onto
`Link` here and nowhere else, so the parser and the collectors cannot disagree about a path.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal


class LinkKind(enum.Enum):
    """A path class, in the order of closeness that `nvidia-smi topo -m` documents."""

    X = "X"
    NV = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"

    @property
    def rank(self) -> int:
        """0 for the device itself, growing with distance."""
        return _RANK[self]


_RANK = {kind: i for i, kind in enumerate(LinkKind)}

# The largest NVLink bond that has shipped is 18 links; 72 leaves room for future parts while still
# rejecting garbage such as NV9999 in damaged pastes.
MAX_NVLINKS = 72

_TOKEN = re.compile(r"X|NV([1-9][0-9]?)|PIX|PXB|PHB|NODE|SYS|SOC")

# nvmlGpuTopologyLevel_t: INTERNAL (two GPUs on one board) is as close as a single switch.
_NVML_LEVELS = {
    0: LinkKind.PIX,  # NVML_TOPOLOGY_INTERNAL
    10: LinkKind.PIX,  # NVML_TOPOLOGY_SINGLE
    20: LinkKind.PXB,  # NVML_TOPOLOGY_MULTIPLE
    30: LinkKind.PHB,  # NVML_TOPOLOGY_HOSTBRIDGE
    40: LinkKind.NODE,  # NVML_TOPOLOGY_NODE (formerly CPU)
    50: LinkKind.SYS,  # NVML_TOPOLOGY_SYSTEM
}


@dataclass(frozen=True, slots=True)
class Link:
    """One cell of the matrix: a path kind, and for NVLink the number of bonded links."""

    kind: LinkKind
    nvlinks: int = 0

    def __post_init__(self) -> None:
        if (self.kind is LinkKind.NV) != (self.nvlinks > 0):
            raise ValueError(
                f"NVLink count {self.nvlinks} does not fit link kind {self.kind.value}"
            )

    @property
    def token(self) -> str:
        """The cell as `nvidia-smi topo -m` prints it (`NV18`, `PIX`, `X`)."""
        if self.kind is LinkKind.NV:
            return f"NV{self.nvlinks}"
        return str(self.kind.value)

    @property
    def closeness(self) -> tuple[int, int]:
        """Sort key, smaller is closer: more bonded NVLinks beat fewer, any NVLink beats PCIe."""
        return (self.kind.rank, -self.nvlinks)

    @property
    def is_nvlink(self) -> bool:
        return self.kind is LinkKind.NV

    def __str__(self) -> str:
        return self.token


SELF = Link(LinkKind.X)


def parse_link(token: str) -> Link:
    """Parse one matrix cell; `SOC` (drivers before 384) reads as `SYS`.

    Raises ParseError for anything else.
    """
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise ParseError(
            f"{excerpt(token)} is not a link (expected X, NV<n>, PIX, PXB, PHB, NODE, SYS or SOC)"
        )
    if match.group(1) is not None:
        count = parse_decimal(match.group(1), field="link")
        if count > MAX_NVLINKS:
            raise ParseError(f"{excerpt(token)}: more than {MAX_NVLINKS} bonded NVLinks")
        return Link(LinkKind.NV, count)
    if token == "SOC":
        return Link(LinkKind.SYS)
    return Link(LinkKind(token))


def split_fused_links(cell: str) -> list[Link] | None:
    """Split a cell made of several link tokens whose separating tab was lost (`NV18NV18`).

    Returns None when the cell is not such a concatenation. The split is unambiguous because every
    token starts with a letter and NVLink counts are digit runs.
    """
    if not cell or _TOKEN.fullmatch(cell):
        return None
    pos = 0
    links: list[Link] = []
    while pos < len(cell):
        match = _TOKEN.match(cell, pos)
        if match is None:
            return None
        try:
            links.append(parse_link(match.group(0)))
        except ParseError:
            return None  # a piece beyond any hardware (`NV730`): not two fused cells
        pos = match.end()
    return links


def link_from_nvml_level(level: int) -> Link:
    """Map an `nvmlGpuTopologyLevel_t` value to a PCIe link class.

    Raises ValueError for a level NVML does not define.
    """
    try:
        return Link(_NVML_LEVELS[level])
    except KeyError:
        raise ValueError(f"unknown NVML topology level {level}") from None
