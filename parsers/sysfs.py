"""Values of single sysfs files, as text: ids, classes, `numa_node`, `distance` rows, `meminfo`.

The caller reads the file; these functions only judge the text. Unknown is None, never -1.
"""

from __future__ import annotations

import re

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal, parse_hex_digits


def parse_int(text: str, *, field: str) -> int:
    """A decimal integer file. Raises ParseError naming `field`."""
    return parse_decimal(text.strip(), field=field, signed=True)


def parse_hex(text: str, *, field: str) -> int:
    """A `0x`-prefixed hex file such as `vendor` (`0x10de`) or `class` (`0x030200`).

    Raises ParseError naming `field`.
    """
    value = text.strip()
    if not value.lower().startswith("0x"):
        raise ParseError(f"{excerpt(value)} is not a 0x-prefixed hex number", field=field)
    return parse_hex_digits(value[2:], field=field)


def parse_numa_node(text: str, *, field: str = "numa_node") -> int | None:
    """A device's `numa_node`: -1 (no locality reported: VMs, single-socket boards) is None.

    Raises ParseError naming `field` for a non-integer or a number below -1.
    """
    node = parse_int(text, field=field)
    if node < -1:
        raise ParseError(f"{node} is not a NUMA node", field=field)
    return None if node == -1 else node


def parse_distance_row(text: str, *, field: str = "distance") -> tuple[int, ...]:
    """A NUMA node's `distance` file: space-separated SLIT distances (`10 21`).

    Raises ParseError naming `field`.
    """
    parts = text.split()
    if not parts:
        raise ParseError("empty distance row", field=field)
    row = tuple(parse_int(p, field=field) for p in parts)
    if any(d < 0 or d > 255 for d in row):
        raise ParseError(f"{excerpt(text.strip())}: SLIT distances lie in 0..255", field=field)
    return row


_MEMTOTAL = re.compile(r"^Node\s+[0-9]+\s+MemTotal:\s+([0-9]{1,15})\s+kB\s*$", re.MULTILINE)


def parse_node_memtotal(text: str, *, field: str = "meminfo") -> int:
    """A NUMA node's `meminfo` file: its MemTotal in bytes (`Node 0 MemTotal: 263862504 kB`).

    Raises ParseError naming `field` when the line is missing or not a number of kB.
    """
    match = _MEMTOTAL.search(text)
    if match is None:
        raise ParseError("no `Node N MemTotal: <n> kB` line", field=field)
    return parse_decimal(match.group(1), field=field) * 1024
