"""LLDP (IEEE 802.1AB) as a node hears its switches: a raw frame, or lldpd's `lldpcli -f json0
show neighbors` answer, to the neighbour each interface hears.

Both readers give the same `LldpNeighbour` for the same switch: a chassis or port ID is written as
lldpcli writes it (a MAC address as lower-case `aa:bb:cc:dd:ee:ff`, a network address as its IP
text, a name as its text), so a node reading lldpd and one listening itself name a switch alike.

Everything a switch sends is text someone else chose. A name or ID reaches a terminal, a log or a
label only through `printable`: a control character (an escape sequence, a carriage return, C1,
DEL) or a byte that is not UTF-8 becomes a visible `\\xNN` escape, and a backslash is doubled, so
what is printed cannot act on a terminal and cannot be confused with what was sent.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from parsers.documents import load_json
from parsers.errors import ParseError

ETHERTYPE_LLDP = 0x88CC
ETHERNET_HEADER_BYTES = 14
MAX_LLDPDU_BYTES = 1500
"""An LLDPDU fits one untagged Ethernet payload (802.1AB 8.1)."""
MAX_FRAME_BYTES = ETHERNET_HEADER_BYTES + MAX_LLDPDU_BYTES
MAX_LLDPCLI_CHARS = 4 * 1024 * 1024
"""lldpcli's answer for a host's few ports is a few KiB per neighbour; more is not lldpcli."""
MAX_NEIGHBOURS = 256
"""More neighbours than any host has ports: an answer beyond it is refused, not kept."""

_TLV_END, _TLV_CHASSIS, _TLV_PORT, _TLV_TTL, _TLV_SYSTEM_NAME = 0, 1, 2, 3, 5
_CHASSIS_MAC, _CHASSIS_ADDRESS = 4, 5
_PORT_MAC, _PORT_ADDRESS = 3, 4
_IANA_IPV4, _IANA_IPV6 = 1, 2


@dataclass(frozen=True, slots=True)
class LldpNeighbour:
    """What one interface hears of the switch at its other end, each text printable."""

    interface: str
    chassis_id: str
    """The switch's chassis ID: the same on each of its ports, so it names the switch."""
    port_id: str
    """The switch's port this interface is cabled to."""
    system_name: str | None
    """The switch's name as it announces it; None when it sends none."""
    ttl_s: int | None = None
    """How long the switch said this holds (0: it is leaving); None where lldpd read it."""


def printable(raw: bytes | str) -> str:
    """`raw` as text safe on a terminal and in a log: UTF-8 decoded, every character Python does
    not call printable (controls, C1, DEL, line and paragraph separators) and every byte that is
    not UTF-8 written as a `\\xNN` or `\\uNNNN` escape, a backslash as two."""
    text = _decoded(raw) if isinstance(raw, bytes) else raw.replace("\\", "\\\\")
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _decoded(raw: bytes) -> str:
    """`raw` decoded as UTF-8, a backslash doubled, each byte that is not UTF-8 as `\\xNN`."""
    out: list[str] = []
    rest = raw
    while rest:
        try:
            out.append(rest.decode("utf-8").replace("\\", "\\\\"))
            break
        except UnicodeDecodeError as e:
            out.append(rest[: e.start].decode("utf-8").replace("\\", "\\\\"))
            out.extend(f"\\x{b:02x}" for b in rest[e.start : e.end])
            rest = rest[e.end :]
    return "".join(out)


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _address(raw: bytes) -> str:
    """An 802.1AB network address: an IANA family byte, then the address."""
    family, address = raw[:1], raw[1:]
    if family == bytes([_IANA_IPV4]) and len(address) == 4:
        return str(ipaddress.IPv4Address(address))
    if family == bytes([_IANA_IPV6]) and len(address) == 16:
        return str(ipaddress.IPv6Address(address))
    return _mac(raw)


def _id_text(value: bytes, subtype: int, mac: int, address: int) -> str:
    if subtype == mac and len(value) == 6:
        return _mac(value)
    if subtype == address:
        return _address(value)
    return printable(value)


def parse_frame(frame: bytes, interface: str) -> LldpNeighbour:
    """The neighbour an LLDP Ethernet frame (header included, as a packet socket reads it) from
    `interface` announces. Raises ParseError for anything that is not one well-formed LLDPDU of
    at most 1500 bytes starting with its chassis ID, port ID and TTL."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ParseError(f"an LLDP frame is at most {MAX_FRAME_BYTES} bytes, this is {len(frame)}")
    if len(frame) < ETHERNET_HEADER_BYTES:
        raise ParseError(f"{len(frame)} bytes is shorter than an Ethernet header")
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype != ETHERTYPE_LLDP:
        raise ParseError(f"EtherType {ethertype:#06x} is not LLDP's {ETHERTYPE_LLDP:#06x}")
    tlvs = _tlvs(frame[ETHERNET_HEADER_BYTES:])
    if [t for t, _ in tlvs[:3]] != [_TLV_CHASSIS, _TLV_PORT, _TLV_TTL]:
        raise ParseError("an LLDPDU starts with its chassis ID, port ID and TTL TLVs")
    (_, chassis), (_, port), (_, ttl) = tlvs[:3]
    if not 2 <= len(chassis) <= 256 or not 2 <= len(port) <= 256:
        raise ParseError("a chassis or port ID TLV holds a subtype and 1 to 255 bytes")
    if len(ttl) != 2:
        raise ParseError(f"the TTL TLV holds 2 bytes, not {len(ttl)}")
    names = [value for kind, value in tlvs[3:] if kind == _TLV_SYSTEM_NAME]
    return LldpNeighbour(
        interface=interface,
        chassis_id=_id_text(chassis[1:], chassis[0], _CHASSIS_MAC, _CHASSIS_ADDRESS),
        port_id=_id_text(port[1:], port[0], _PORT_MAC, _PORT_ADDRESS),
        system_name=printable(names[0]) if names else None,
        ttl_s=int.from_bytes(ttl, "big"),
    )


def _tlvs(lldpdu: bytes) -> list[tuple[int, bytes]]:
    """The TLVs of an LLDPDU up to its End TLV (or its last byte), as (type, value)."""
    found: list[tuple[int, bytes]] = []
    at = 0
    while at < len(lldpdu):
        if at + 2 > len(lldpdu):
            raise ParseError(f"a TLV header cut short at byte {at} of the LLDPDU")
        header = int.from_bytes(lldpdu[at : at + 2], "big")
        kind, length = header >> 9, header & 0x1FF
        value = lldpdu[at + 2 : at + 2 + length]
        if len(value) != length:
            raise ParseError(f"TLV type {kind} at byte {at} claims {length} bytes, past the end")
        if kind == _TLV_END:
            break
        found.append((kind, value))
        at += 2 + length
    return found


def parse_lldpcli(text: str | bytes) -> list[LldpNeighbour]:
    """The neighbours in `lldpcli -f json0 show neighbors` output (json0: every level a list,
    whatever the number of interfaces and neighbours). Raises ParseError for any other shape."""
    document = load_json(text, max_chars=MAX_LLDPCLI_CHARS)
    neighbours: list[LldpNeighbour] = []
    for lldp in _list(document, "lldp", "the answer"):
        interfaces = lldp.get("interface", []) if isinstance(lldp, dict) else None
        if not isinstance(interfaces, list):
            raise ParseError("lldp[].interface is not a list")
        for interface in interfaces:
            if len(neighbours) == MAX_NEIGHBOURS:
                raise ParseError(f"more than {MAX_NEIGHBOURS} neighbours")
            neighbours.append(_neighbour(interface))
    return neighbours


def _neighbour(interface: Any) -> LldpNeighbour:
    if not isinstance(interface, dict) or not isinstance(interface.get("name"), str):
        raise ParseError("an interface without a name")
    name = printable(interface["name"])
    chassis = _one(interface, "chassis", name)
    port = _one(interface, "port", name)
    names = chassis.get("name", [])
    system_name = _value(names[0], f"{name}: chassis name") if names else None
    return LldpNeighbour(
        interface=name,
        chassis_id=_value(_one(chassis, "id", name), f"{name}: chassis id"),
        port_id=_value(_one(port, "id", name), f"{name}: port id"),
        system_name=system_name,
    )


def _list(value: Any, key: str, where: str) -> list[Any]:
    items = value.get(key) if isinstance(value, dict) else None
    if not isinstance(items, list):
        raise ParseError(f"{where}: {key} is not a list")
    return items


def _one(value: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    items = _list(value, key, where)
    if not items or not isinstance(items[0], dict):
        raise ParseError(f"{where}: {key} is empty")
    first: dict[str, Any] = items[0]
    return first


def _value(item: Any, where: str) -> str:
    value = item.get("value") if isinstance(item, dict) else None
    if not isinstance(value, str) or not value:
        raise ParseError(f"{where}: no value")
    return printable(value)
