"""LLDP frames and lldpcli's json0 answer to the neighbour each interface hears, and the text a
switch chose made safe to print."""

from __future__ import annotations

import json

import pytest

from parsers.errors import ParseError
from parsers.lldp import MAX_FRAME_BYTES, LldpNeighbour, parse_frame, parse_lldpcli, printable

HEADER = bytes.fromhex("0180c200000efed2187bdeed88cc")
MAC = bytes.fromhex("fed2187bdeed")


def tlv(kind: int, value: bytes) -> bytes:
    return ((kind << 9) | len(value)).to_bytes(2, "big") + value


def frame(*tlvs: bytes, header: bytes = HEADER) -> bytes:
    return header + b"".join(tlvs)


CHASSIS_MAC = tlv(1, b"\x04" + MAC)
PORT_LOCAL = tlv(2, b"\x07Ethernet1/7")
TTL_120 = tlv(3, (120).to_bytes(2, "big"))
END = tlv(0, b"")


@pytest.mark.parametrize(
    ("received", "neighbour"),
    [
        (
            frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, tlv(5, b"leaf-sw-01"), END),
            LldpNeighbour("c0", "fe:d2:18:7b:de:ed", "Ethernet1/7", "leaf-sw-01", 120),
        ),
        (
            frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, END),
            LldpNeighbour("c0", "fe:d2:18:7b:de:ed", "Ethernet1/7", None, 120),
        ),
        (
            frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, tlv(4, b"to gpu-node-01"), tlv(5, b"sw")),
            LldpNeighbour("c0", "fe:d2:18:7b:de:ed", "Ethernet1/7", "sw", 120),
        ),
        (
            frame(tlv(1, b"\x05\x01\x0a\x00\x00\x01"), tlv(2, b"\x03" + MAC), TTL_120, END),
            LldpNeighbour("c0", "10.0.0.1", "fe:d2:18:7b:de:ed", None, 120),
        ),
        (
            frame(tlv(1, b"\x05\x02" + bytes(15) + b"\x01"), tlv(2, b"\x05swp7"), TTL_120),
            LldpNeighbour("c0", "::1", "swp7", None, 120),
        ),
        (
            frame(tlv(1, b"\x07rack-12"), PORT_LOCAL, tlv(3, b"\x00\x00"), END),
            LldpNeighbour("c0", "rack-12", "Ethernet1/7", None, 0),
        ),
        (
            frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, tlv(5, b"evil\x1b]0;owned\x07\r\n\\x41\xff")),
            LldpNeighbour(
                "c0",
                "fe:d2:18:7b:de:ed",
                "Ethernet1/7",
                "evil\\x1b]0;owned\\x07\\x0d\\x0a\\\\x41\\xff",
                120,
            ),
        ),
        (
            frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, END, b"trailing padding"),
            LldpNeighbour("c0", "fe:d2:18:7b:de:ed", "Ethernet1/7", None, 120),
        ),
    ],
    ids=[
        "a switch's frame: MAC chassis, local port, TTL, system name",
        "no system name is None",
        "the port description is passed over",
        "a chassis named by IPv4 address, a port by MAC",
        "a chassis named by IPv6 address, a port by interface name",
        "a locally named chassis; TTL 0, a switch leaving, is read as 0",
        "an escape sequence, CR LF, a backslash and a byte not UTF-8 in the name: all escaped",
        "what follows the End TLV is padding",
    ],
)
def test_a_frame_names_the_switch(received: bytes, neighbour: LldpNeighbour) -> None:
    assert parse_frame(received, "c0") == neighbour


@pytest.mark.parametrize(
    ("received", "said"),
    [
        (frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, tlv(5, b"x" * 511) * 3), "at most 1514 bytes"),
        (HEADER[:10], "shorter than an Ethernet header"),
        (frame(CHASSIS_MAC, header=HEADER[:12] + b"\x08\x00"), "is not LLDP's"),
        (frame(PORT_LOCAL, CHASSIS_MAC, TTL_120), "starts with its chassis ID, port ID and TTL"),
        (frame(CHASSIS_MAC, PORT_LOCAL), "starts with its chassis ID"),
        (frame(CHASSIS_MAC, PORT_LOCAL, TTL_120)[:-1], "claims 2 bytes, past the end"),
        (frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, b"\x0a"), "cut short"),
        (frame(tlv(1, b"\x04"), PORT_LOCAL, TTL_120), "a subtype and 1 to 255 bytes"),
        (frame(CHASSIS_MAC, PORT_LOCAL, tlv(3, b"\x00")), "the TTL TLV holds 2 bytes, not 1"),
    ],
    ids=[
        "longer than one Ethernet payload",
        "shorter than the Ethernet header",
        "another EtherType",
        "the mandatory TLVs out of order",
        "no TTL",
        "a TLV longer than the frame",
        "half a TLV header at the end",
        "a chassis ID with no value",
        "a one-byte TTL",
    ],
)
def test_a_frame_that_is_no_lldpdu_is_refused(received: bytes, said: str) -> None:
    with pytest.raises(ParseError, match=said.replace("(", r"\(")):
        parse_frame(received, "c0")


def test_the_largest_lldpdu_reads() -> None:
    head = frame(CHASSIS_MAC, PORT_LOCAL, TTL_120, tlv(5, b"leaf"))
    # Port descriptions (at most 255 bytes each) fill it to one full Ethernet payload.
    room = MAX_FRAME_BYTES - len(head)
    filler = [tlv(4, b"d" * 253)] * (room // 255) + [tlv(4, b"d" * (room % 255 - 2))]
    largest = head + b"".join(filler)
    assert len(largest) == MAX_FRAME_BYTES
    assert parse_frame(largest, "c0").system_name == "leaf"
    with pytest.raises(ParseError, match="at most 1514 bytes"):
        parse_frame(largest + b"\x00", "c0")


def json0(*interfaces: dict[str, object]) -> str:
    return json.dumps({"lldp": [{"interface": list(interfaces)}]})


def interface(name: str, chassis: str, system: str | None, port: str) -> dict[str, object]:
    """One interface as lldpcli 1.0.16 writes it with `-f json0` (its other keys left out)."""
    names = [] if system is None else [{"value": system}]
    return {
        "name": name,
        "via": "LLDP",
        "chassis": [{"id": [{"type": "mac", "value": chassis}], "name": names}],
        "port": [{"id": [{"type": "local", "value": port}], "ttl": [{"value": "4"}]}],
    }


@pytest.mark.parametrize(
    ("answer", "neighbours"),
    [
        (
            json0(interface("c0", "2e:2b:b8:ba:63:42", "tor-a", "Ethernet1/1")),
            [LldpNeighbour("c0", "2e:2b:b8:ba:63:42", "Ethernet1/1", "tor-a")],
        ),
        (
            json0(
                interface("c0", "aa:aa:aa:aa:aa:01", "tor-a", "swp1"),
                interface("c1", "aa:aa:aa:aa:aa:02", None, "swp1"),
            ),
            [
                LldpNeighbour("c0", "aa:aa:aa:aa:aa:01", "swp1", "tor-a"),
                LldpNeighbour("c1", "aa:aa:aa:aa:aa:02", "swp1", None),
            ],
        ),
        ('{"lldp": [{}]}', []),
        (
            json0(interface("c0", "aa:aa:aa:aa:aa:01", "tor\u001b[2J\u0085", "p\u2028")),
            [LldpNeighbour("c0", "aa:aa:aa:aa:aa:01", "p\\u2028", "tor\\x1b[2J\\x85")],
        ),
    ],
    ids=[
        "one neighbour, as lldpcli printed it here",
        "two interfaces, one switch without a name",
        "lldpd hearing no one",
        "control characters lldpcli passed through are escaped",
    ],
)
def test_lldpcli_json0_names_each_interfaces_switch(
    answer: str, neighbours: list[LldpNeighbour]
) -> None:
    assert parse_lldpcli(answer) == neighbours


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ('{"lldp": {"interface": {}}}', "lldp is not a list"),
        ('{"lldp": [{"interface": {"c0": {}}}]}', "interface is not a list"),
        ('{"lldp": [{"interface": [{"chassis": []}]}]}', "an interface without a name"),
        ('{"lldp": [{"interface": [{"name": "c0", "chassis": []}]}]}', "c0: chassis is empty"),
        (
            json0({"name": "c0", "chassis": [{"id": [{"type": "mac"}]}], "port": [{"id": [{}]}]}),
            "c0: chassis id: no value",
        ),
        (json0(*[interface("c0", "a", "b", "c")] * 257), "more than 256 neighbours"),
        ("not json", "Expecting value"),
    ],
    ids=[
        "-f json's shape, not json0's",
        "interfaces keyed by name",
        "an interface with no name",
        "no chassis",
        "a chassis ID without its value",
        "more neighbours than a host has ports",
        "not JSON",
    ],
)
def test_an_answer_of_another_shape_is_refused(answer: str, said: str) -> None:
    with pytest.raises(ParseError, match=said):
        parse_lldpcli(answer)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"leaf-sw-01", "leaf-sw-01"),
        ("caf\u00e9", "caf\u00e9"),
        (b"a\\b", "a\\\\b"),
        (b"\xff\\", "\\xff\\\\"),
        (b"\x1b[31m\x7f\x00", "\\x1b[31m\\x7f\\x00"),
        ("\u009b\u2029\U000e0001", "\\x9b\\u2029\\U000e0001"),
    ],
    ids=[
        "a plain name is itself",
        "UTF-8 letters stay",
        "a backslash is doubled",
        "a byte not UTF-8 is escaped; a backslash after it doubled",
        "ESC, DEL and NUL are escaped",
        "C1 CSI, a paragraph separator and an invisible tag are escaped",
    ],
)
def test_printable_leaves_nothing_a_terminal_acts_on(raw: bytes | str, shown: str) -> None:
    assert printable(raw) == shown
    assert shown.isprintable()
