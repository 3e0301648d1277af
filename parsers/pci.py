"""PCI addresses: NVML writes `00000000:18:00.0`, sysfs `0000:18:00.0`; we keep one form."""

from __future__ import annotations

import re

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_hex_digits

_ADDRESS = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"\.(?P<fn>[0-7])"
)


def normalize_pci_address(text: str, *, field: str = "pci") -> str:
    """Return `dddd:bb:dd.f` in lower case; a domain wider than 16 bits keeps all 8 digits.

    Raises ParseError naming `field` for anything that is not a PCI address.
    """
    match = _ADDRESS.fullmatch(text.strip())
    if match is None:
        raise ParseError(
            f"{excerpt(text.strip())} is not a PCI address like 0000:18:00.0", field=field
        )
    domain = parse_hex_digits(match.group("domain") or "0", field=field)
    device = parse_hex_digits(match.group("dev"), field=field)
    if device > 0x1F:
        raise ParseError(
            f"{excerpt(text.strip())}: device number {device:#x} exceeds 0x1f", field=field
        )
    bus = parse_hex_digits(match.group("bus"), field=field)
    width = 4 if domain <= 0xFFFF else 8
    return f"{domain:0{width}x}:{bus:02x}:{device:02x}.{match.group('fn')}"


def is_pci_address(text: str) -> bool:
    """Whether `text` is a PCI address in any accepted spelling (sysfs directory names, say)."""
    return _ADDRESS.fullmatch(text.strip()) is not None
