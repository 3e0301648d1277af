"""Fuzzing the LLDP readers: any bytes a wire delivers, and any frame a switch can build with any
name in it, end in a neighbour whose every text is printable, or in ParseError; any set of chassis
IDs gives a valid label value. Budgets from tests/support/fuzz.py; no test asserts a time."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from parsers.errors import ParseError
from parsers.lldp import MAX_FRAME_BYTES, LldpNeighbour, parse_frame, parse_lldpcli
from reporter.schema.network import ethernet_tier_0
from tests.support.fuzz import fuzz

HEADER = bytes.fromhex("0180c200000efed2187bdeed88cc")
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _printable(neighbour: LldpNeighbour) -> None:
    texts = [neighbour.chassis_id, neighbour.port_id, neighbour.system_name or ""]
    assert all(text.isprintable() for text in texts), neighbour


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A frame of TLVs with any types, subtypes and values, the mandatory ones first mostly."""

    def tlv(kind: int, value: bytes) -> bytes:
        return ((kind << 9) | len(value)).to_bytes(2, "big") + value

    values = st.binary(max_size=300)
    parts = []
    if draw(st.integers(0, 5)):
        parts += [tlv(1, draw(st.binary(min_size=1, max_size=256))), tlv(2, draw(values))]
        parts.append(tlv(3, draw(st.binary(min_size=0, max_size=3))))
    for _ in range(draw(st.integers(0, 6))):
        parts.append(tlv(draw(st.integers(0, 127)), draw(values)))
    body = b"".join(parts)
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(body)))
        body = body[:cut]
    return HEADER + body


@fuzz(300)
@given(st.one_of(st.binary(max_size=MAX_FRAME_BYTES + 20), frames()))
def test_any_frame_is_a_printable_neighbour_or_parse_error(received: bytes) -> None:
    try:
        neighbour = parse_frame(received, "c0")
    except ParseError:
        return
    _printable(neighbour)


@fuzz(200)
@given(st.binary(max_size=255), st.binary(min_size=1, max_size=255))
def test_any_name_and_id_a_switch_sends_reads_printable(name: bytes, chassis: bytes) -> None:
    def tlv(kind: int, value: bytes) -> bytes:
        return ((kind << 9) | len(value)).to_bytes(2, "big") + value

    received = HEADER + tlv(1, b"\x07" + chassis) + tlv(2, b"\x07p1") + tlv(3, b"\x00\x04")
    neighbour = parse_frame(received + tlv(5, name), "c0")
    _printable(neighbour)
    assert neighbour.system_name is not None
    # Nothing is lost: a name that needed no escape is itself.
    try:
        sent = name.decode("utf-8")
    except UnicodeDecodeError:
        assert "\\x" in neighbour.system_name
        return
    if sent.isprintable() and "\\" not in sent:
        assert neighbour.system_name == sent


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@fuzz(200)
@given(
    st.one_of(
        st.text(max_size=200),
        _JSON.map(json.dumps),
        st.dictionaries(st.sampled_from(["lldp"]), _JSON).map(json.dumps),
    )
)
def test_any_lldpcli_answer_is_neighbours_or_parse_error(answer: str) -> None:
    try:
        neighbours = parse_lldpcli(answer)
    except ParseError:
        return
    for neighbour in neighbours:
        _printable(neighbour)


@fuzz(200)
@given(st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=20))
def test_any_set_of_chassis_ids_is_a_valid_label_value_whatever_its_order(ids: list[str]) -> None:
    value = ethernet_tier_0(ids)
    assert LABEL_VALUE.fullmatch(value)
    assert len(value) <= 63
    assert ethernet_tier_0(reversed(ids + ids)) == value
