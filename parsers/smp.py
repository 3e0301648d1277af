"""Directed-route subnet management packets (SMPs): the Get a node sends, the GetResp it reads.

InfiniBand's SMPs are 256-byte MADs (IBA vol. 1, 14.2.1.2, "directed route SMP format"): a
24-byte common header, the M_Key, the directed-route LIDs and hop fields, 64 bytes of attribute
data at offset 64 and the initial path at 128. This module builds the Get for one attribute at
one directed path and judges the reply's bytes; it never opens a device (reporter.collect.infiniband
does). Directed routes need no LIDs, so it works with no subnet manager.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from parsers.errors import ParseError
from parsers.lldp import printable

MAD_BYTES = 256
SMP_DATA_OFFSET = 64
SMP_DATA_BYTES = 64
INITIAL_PATH_OFFSET = 128
MAX_PATH_PORTS = 64
"""The initial path holds 64 bytes: index 0 is unused (always 0), so at most 63 hops."""

BASE_VERSION = 1
CLASS_DIRECTED_ROUTE = 0x81
CLASS_VERSION = 1
METHOD_GET = 0x01
METHOD_GET_RESP = 0x81
PERMISSIVE_LID = 0xFFFF
DIRECTION_BIT = 0x8000
"""Status bit 15 of a directed-route SMP: set on the way back."""
STATUS_CODE_MASK = 0x7FFF
TID_MASK = 0xFFFFFFFF
"""The TID bits a sender owns: the kernel's umad writes its agent's own into the high 32."""


class Attribute(enum.IntEnum):
    """The SMP attributes the node's discovery reads."""

    NODE_DESCRIPTION = 0x10
    NODE_INFO = 0x11
    PORT_INFO = 0x15


class NodeType(enum.IntEnum):
    """NodeInfo's NodeType."""

    CA = 1
    SWITCH = 2
    ROUTER = 3


MAX_PORT = 254
"""The highest port number (IBA 14.2.5.3: port 255 is reserved): NumPorts is a byte, so a switch
can claim 255 ports, but a directed route cannot name port 255."""
PORT_STATE_DOWN = 1
PHYS_STATE_LINK_UP = 5


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The NodeInfo fields the walk uses (IBA 14.2.5.3)."""

    node_type: NodeType
    num_ports: int
    node_guid: int
    port_guid: int
    local_port: int
    """The port the SMP entered this node by."""


@dataclass(frozen=True, slots=True)
class PortInfo:
    """The link state of one port (IBA 14.2.5.6)."""

    port_state: int
    """1 Down, 2 Initialize, 3 Armed, 4 Active (0: no change, never in a GetResp)."""
    phys_state: int
    """5 LinkUp; 2 Polling, 3 Disabled and the others: no link."""

    @property
    def link_up(self) -> bool:
        """Whether a peer is there to ask: a physical link, and a logical one past Down."""
        return self.phys_state == PHYS_STATE_LINK_UP and self.port_state > PORT_STATE_DOWN


def encode_get(path: tuple[int, ...], attribute: Attribute, modifier: int, tid: int) -> bytes:
    """A directed-route SubnGet of `attribute` at `path` (ports out, the first entry 0).

    Raises ValueError for a path that is not 0 followed by 0-63 ports of 1-254, or a modifier or
    TID out of range: the caller built it, so that is a bug, not input.
    """
    if not path or path[0] != 0 or len(path) > MAX_PATH_PORTS:
        raise ValueError(f"a directed path starts with 0 and has at most 63 hops, not {path}")
    if any(not 1 <= port <= 254 for port in path[1:]):
        raise ValueError(f"a directed path's ports are 1-254, not {path}")
    if not 0 <= modifier <= 0xFFFFFFFF or not 0 <= tid <= TID_MASK:
        raise ValueError(f"modifier {modifier} or TID {tid} out of range")
    mad = bytearray(MAD_BYTES)
    hop_count = len(path) - 1
    struct.pack_into(
        ">BBBBHBBQHHI",
        mad,
        0,
        BASE_VERSION,
        CLASS_DIRECTED_ROUTE,
        CLASS_VERSION,
        METHOD_GET,
        0,  # status (D bit clear: outbound)
        0,  # hop pointer
        hop_count,
        tid,
        int(attribute),
        0,
        modifier,
    )
    struct.pack_into(">QHH", mad, 24, 0, PERMISSIVE_LID, PERMISSIVE_LID)
    mad[INITIAL_PATH_OFFSET : INITIAL_PATH_OFFSET + len(path)] = bytes(path)
    return bytes(mad)


def request_tid(mad: bytes) -> int:
    """The sender's part of a MAD's TID (the low 32 bits): how a reply names its Get."""
    return int(struct.unpack_from(">Q", mad, 8)[0]) & TID_MASK


@dataclass(frozen=True, slots=True)
class SmpReply:
    """A GetResp judged: its attribute, status code (0: success) and attribute data."""

    attribute: int
    status: int
    data: bytes


def decode_reply(mad: bytes) -> SmpReply:
    """The GetResp in `mad`. Raises ParseError for a short MAD or one that is not a DR GetResp."""
    if len(mad) < MAD_BYTES:
        raise ParseError(f"{len(mad)} bytes, a MAD has {MAD_BYTES}", field="smp")
    base, mgmt_class, _, method, status, _, _, _, attribute = struct.unpack_from(
        ">BBBBHBBQH", mad, 0
    )
    if base != BASE_VERSION or mgmt_class != CLASS_DIRECTED_ROUTE or method != METHOD_GET_RESP:
        raise ParseError(
            f"not a DR GetResp (base {base}, class {mgmt_class:#x}, method {method:#x})",
            field="smp",
        )
    if not status & DIRECTION_BIT:
        raise ParseError("a GetResp without the direction bit set", field="smp")
    data = bytes(mad[SMP_DATA_OFFSET : SMP_DATA_OFFSET + SMP_DATA_BYTES])
    return SmpReply(attribute, status & STATUS_CODE_MASK, data)


def decode_node_info(data: bytes) -> NodeInfo:
    """NodeInfo from an SMP's attribute data. Raises ParseError for an unknown node type or
    a node without ports."""
    if len(data) < 40:
        raise ParseError(f"{len(data)} bytes, NodeInfo has 40", field="NodeInfo")
    _, _, node_type, num_ports, _, node_guid, port_guid, _, _, _, local_port = struct.unpack_from(
        ">BBBBQQQHHIB", data, 0
    )
    try:
        kind = NodeType(node_type)
    except ValueError:
        raise ParseError(
            f"node type {node_type} is none of CA, switch, router", field="NodeInfo"
        ) from None
    if num_ports == 0:
        raise ParseError("a node with no ports", field="NodeInfo")
    return NodeInfo(kind, num_ports, node_guid, port_guid, local_port)


def decode_port_info(data: bytes) -> PortInfo:
    """PortInfo's link state from an SMP's attribute data. Raises ParseError for short data."""
    if len(data) < 34:
        raise ParseError(f"{len(data)} bytes, PortInfo has at least 34", field="PortInfo")
    return PortInfo(port_state=data[32] & 0x0F, phys_state=data[33] >> 4)


@dataclass(frozen=True, slots=True)
class PortLids:
    """A CA port's own LID and its master SM's (IBA 14.2.5.6): both 0 until a subnet manager has
    configured the subnet."""

    lid: int
    master_sm_lid: int


def decode_port_lids(data: bytes) -> PortLids:
    """A port's LID and MasterSMLID from PortInfo's attribute data. Raises ParseError for short
    data."""
    if len(data) < 20:
        raise ParseError(f"{len(data)} bytes, PortInfo has at least 20", field="PortInfo")
    lid, master_sm_lid = struct.unpack_from(">HH", data, 16)
    return PortLids(lid, master_sm_lid)


AGGREGATION_NODE = b"Aggregation Node"
"""What a SHARP Aggregation Node's NodeDescription says (`Mellanox Technologies Aggregation
Node`): the CA inside a Quantum switch, not a host."""


def is_aggregation_node(data: bytes) -> bool:
    """Whether NodeDescription's attribute data (64 bytes, NUL-padded) names an Aggregation Node."""
    return AGGREGATION_NODE in data.split(b"\0", 1)[0]


def decode_node_description(data: bytes) -> str:
    """NodeDescription (IBA 14.2.5.2) from an SMP's attribute data, as printable text: 64 bytes,
    ended by a NUL or not at all, nominally UTF-8 but whatever the switch's firmware or its
    administrator wrote. A control character or a byte that is not UTF-8 becomes a visible
    escape (parsers.lldp.printable), so a description reaching a log or a terminal cannot act on
    it. Raises ParseError for short data."""
    if len(data) < SMP_DATA_BYTES:
        raise ParseError(
            f"{len(data)} bytes, NodeDescription has {SMP_DATA_BYTES}", field="NodeDescription"
        )
    return printable(bytes(data[:SMP_DATA_BYTES]).split(b"\0", 1)[0])
