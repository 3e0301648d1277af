"""Directed-route SMPs: the Get's bytes, the GetResp judged, NodeInfo, PortInfo and NodeDescription
decoded."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.errors import ParseError
from parsers.smp import (
    MAD_BYTES,
    Attribute,
    NodeType,
    PortInfo,
    decode_node_description,
    decode_node_info,
    decode_port_info,
    decode_reply,
    encode_get,
    request_tid,
)


def _as_reply(
    mad: bytes, *, status: int = 0x8000, method: int = 0x81, mgmt_class: int = 0x81
) -> bytes:
    reply = bytearray(mad)
    reply[1] = mgmt_class
    reply[3] = method
    struct.pack_into(">H", reply, 4, status)
    return bytes(reply)


@pytest.mark.parametrize(
    ("path", "attribute", "modifier"),
    [
        pytest.param((0,), Attribute.NODE_INFO, 0, id="the node itself: no hops"),
        pytest.param((0, 1), Attribute.NODE_INFO, 0, id="the leaf: one hop out of port 1"),
        pytest.param((0, 2, 17), Attribute.PORT_INFO, 36, id="a spine's port 36: two hops"),
    ],
)
def test_a_get_carries_its_path_attribute_and_modifier(
    path: tuple[int, ...], attribute: Attribute, modifier: int
) -> None:
    mad = encode_get(path, attribute, modifier, tid=0x1234)
    assert len(mad) == MAD_BYTES
    assert mad[:4] == bytes([1, 0x81, 1, 1])
    assert mad[6:8] == bytes([0, len(path) - 1])
    assert struct.unpack_from(">QH", mad, 8) == (0x1234, attribute)
    assert struct.unpack_from(">I", mad, 20)[0] == modifier
    assert struct.unpack_from(">HH", mad, 32) == (0xFFFF, 0xFFFF)
    assert mad[128 : 128 + len(path)] == bytes(path)
    assert not any(mad[128 + len(path) :])


@pytest.mark.parametrize(
    "path",
    [
        pytest.param((), id="empty"),
        pytest.param((1, 2), id="not starting with 0"),
        pytest.param((0, 0), id="port 0 as a hop"),
        pytest.param((0, 255), id="port 255"),
        pytest.param((0,) + (1,) * 64, id="64 hops"),
    ],
)
def test_a_path_that_is_no_directed_route_is_refused(path: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="directed path"):
        encode_get(path, Attribute.NODE_INFO, 0, 1)


@pytest.mark.parametrize(
    ("modifier", "tid"),
    [
        pytest.param(2**32, 1, id="a modifier past 32 bits"),
        pytest.param(0, 2**32, id="a TID past the sender's 32 bits: the kernel owns the rest"),
        pytest.param(-1, 1, id="a negative modifier"),
    ],
)
def test_a_modifier_or_tid_out_of_range_is_refused(modifier: int, tid: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_get((0, 1), Attribute.PORT_INFO, modifier, tid)


@given(
    path=st.lists(st.integers(1, 254), max_size=63).map(lambda ports: (0, *ports)),
    tid=st.integers(0, 2**32 - 1),
    kernel=st.integers(0, 2**32 - 1),
    attribute=st.sampled_from(Attribute),
)
def test_a_reply_names_its_get_whatever_the_kernel_put_in_the_tids_high_half(
    path: tuple[int, ...], tid: int, kernel: int, attribute: Attribute
) -> None:
    mad = bytearray(_as_reply(encode_get(path, attribute, 0, tid)))
    mad[8:12] = kernel.to_bytes(4, "big")
    assert request_tid(bytes(mad)) == tid
    reply = decode_reply(bytes(mad))
    assert (reply.attribute, reply.status) == (attribute, 0)


@pytest.mark.parametrize(
    ("mad", "message"),
    [
        pytest.param(b"\1" * 100, "100 bytes", id="short"),
        pytest.param(
            _as_reply(encode_get((0,), Attribute.NODE_INFO, 0, 1), method=1),
            "method 0x1",
            id="a Get, not a GetResp",
        ),
        pytest.param(
            _as_reply(encode_get((0,), Attribute.NODE_INFO, 0, 1), mgmt_class=1),
            "class 0x1",
            id="LID-routed class",
        ),
        pytest.param(
            _as_reply(encode_get((0,), Attribute.NODE_INFO, 0, 1), status=0),
            "direction bit",
            id="outbound",
        ),
    ],
)
def test_what_is_no_directed_route_getresp_is_refused(mad: bytes, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        decode_reply(mad)


def test_a_reply_status_keeps_its_code_without_the_direction_bit() -> None:
    reply = decode_reply(
        _as_reply(encode_get((0, 1), Attribute.PORT_INFO, 3, 9), status=0x8000 | 0x1C)
    )
    assert reply.status == 0x1C


def _node_info(node_type: int, ports: int, local_port: int = 3) -> bytes:
    return struct.pack(
        ">BBBBQQQHHIB", 1, 1, node_type, ports, 0x20, 0x200003, 0x200004, 8, 0, 0xA1, local_port
    ).ljust(64, b"\0")


def test_node_info_gives_type_ports_guids_and_the_port_entered_by() -> None:
    info = decode_node_info(_node_info(2, 36, local_port=17))
    assert (info.node_type, info.num_ports, info.node_guid, info.port_guid, info.local_port) == (
        NodeType.SWITCH,
        36,
        0x200003,
        0x200004,
        17,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(_node_info(9, 36), "node type 9", id="unknown node type"),
        pytest.param(_node_info(1, 0), "no ports", id="no ports"),
        pytest.param(b"\0" * 20, "20 bytes", id="short"),
    ],
)
def test_node_info_that_names_no_node_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        decode_node_info(data)


@pytest.mark.parametrize(
    ("state_byte", "phys_byte", "link_up"),
    [
        pytest.param(0x24, 0x52, True, id="Active, LinkUp"),
        pytest.param(0x22, 0x52, True, id="Initialize, LinkUp: no subnet manager yet"),
        pytest.param(0x21, 0x22, False, id="Down, Polling: nothing plugged"),
        pytest.param(0x21, 0x52, False, id="Down though LinkUp"),
        pytest.param(0x24, 0x32, False, id="Disabled"),
    ],
)
def test_port_info_says_whether_a_peer_is_there(
    state_byte: int, phys_byte: int, link_up: bool
) -> None:
    data = bytearray(64)
    data[32], data[33] = state_byte, phys_byte
    info = decode_port_info(bytes(data))
    assert info == PortInfo(state_byte & 0xF, phys_byte >> 4)
    assert info.link_up is link_up


@given(mad=st.binary(max_size=300))
def test_any_bytes_decode_or_raise_parse_error(mad: bytes) -> None:
    for decode in (decode_reply, decode_node_info, decode_port_info, decode_node_description):
        with contextlib.suppress(ParseError):
            decode(mad)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        pytest.param(
            b"leaf-1 MF0;ib-leaf-1:MQM9700/U1".ljust(64, b"\0"),
            "leaf-1 MF0;ib-leaf-1:MQM9700/U1",
            id="a switch's name, ended by NULs",
        ),
        pytest.param(b"x" * 64, "x" * 64, id="64 bytes without a NUL: all of them"),
        pytest.param(
            b"\x1b[2J\x1b]0;t\x07a\\b\r\x7f\0junk".ljust(64, b"\0"),
            "\\x1b[2J\\x1b]0;t\\x07a\\\\b\\x0d\\x7f",
            id="control characters escaped, a backslash doubled, nothing after the NUL",
        ),
        pytest.param(
            bytes(range(0x80, 0xC0)),
            "".join(f"\\x{b:02x}" for b in range(0x80, 0xC0)),
            id="64 bytes that are not UTF-8, each escaped",
        ),
        pytest.param("Ünïcode".encode().ljust(64, b"\0"), "Ünïcode", id="UTF-8 kept"),
    ],
)
def test_a_node_description_is_printable_text(raw: bytes, text: str) -> None:
    assert decode_node_description(raw) == text
    assert decode_node_description(raw).isprintable()


def test_a_node_description_of_short_data_is_refused() -> None:
    with pytest.raises(ParseError, match="63 bytes, NodeDescription has 64"):
        decode_node_description(bytes(63))


@given(st.binary(min_size=64, max_size=64))
def test_any_node_description_is_one_printable_line(raw: bytes) -> None:
    assert decode_node_description(raw).isprintable()
