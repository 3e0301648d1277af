"""The SA's answers judged: a GetTableResp's records, its reply MADs, and the SMs it names."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.errors import ParseError
from reporter.collect.infiniband_sa import (
    ATTRIBUTE_SMINFO_RECORD,
    METHOD_GET_TABLE,
    METHOD_GET_TABLE_RESP,
    SA_CLASS,
    decode_table,
    encode_get_table,
    sm_guids,
)


def _reply(
    records: list[bytes], *, words: int = 4, method: int = METHOD_GET_TABLE_RESP, status: int = 0
) -> bytes:
    head = bytearray(56)
    struct.pack_into(">BBBBHHQH", head, 0, 1, SA_CLASS, 2, method, status, 0, 7, 0x18)
    struct.pack_into(">H", head, 44, words)
    return bytes(head) + b"".join(records)


def _sminfo(guid: int) -> bytes:
    return struct.pack(">HHQ", 5, 0, guid).ljust(32, b"\0")


def test_a_get_table_asks_every_record_of_its_attribute() -> None:
    mad = encode_get_table(ATTRIBUTE_SMINFO_RECORD, 0x1234)
    assert len(mad) == 256
    assert struct.unpack_from(">BBBBHHQH", mad, 0) == (
        1,
        SA_CLASS,
        2,
        METHOD_GET_TABLE,
        0,
        0,
        0x1234,
        ATTRIBUTE_SMINFO_RECORD,
    )
    assert struct.unpack_from(">Q", mad, 48)[0] == 0


@pytest.mark.parametrize(
    ("records", "guids", "segments"),
    [
        pytest.param([], frozenset(), 1, id="no SM: no record, one reply MAD"),
        pytest.param([_sminfo(0x200000)], frozenset({0x200000}), 1, id="one SM"),
        pytest.param(
            [_sminfo(0x200000 + n) for n in range(7)],
            frozenset(0x200000 + n for n in range(7)),
            2,
            id="seven SMs: 224 bytes, two RMPP segments",
        ),
        pytest.param(
            [_sminfo(0x200000), _sminfo(0)], frozenset({0x200000}), 1, id="a record of GUID 0"
        ),
    ],
)
def test_the_records_name_the_subnets_sms(
    records: list[bytes], guids: frozenset[int], segments: int
) -> None:
    table = decode_table(_reply(records, words=4 if records else 0), ATTRIBUTE_SMINFO_RECORD)
    assert len(table.records) == len(records)
    assert table.segments == segments
    assert sm_guids(table) == guids


@pytest.mark.parametrize(
    ("mad", "message"),
    [
        pytest.param(b"\1" * 40, "at least 56", id="short"),
        pytest.param(_reply([], method=METHOD_GET_TABLE), "not a GetTableResp", id="a request"),
        pytest.param(_reply([], status=0x0400), "status 0x0400", id="an error status"),
        pytest.param(_reply([_sminfo(1)], words=0), "AttributeOffset 0", id="no record size"),
    ],
)
def test_a_bad_answer_is_a_parse_error(mad: bytes, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        decode_table(mad, ATTRIBUTE_SMINFO_RECORD)


@given(
    head=st.binary(min_size=0, max_size=64),
    words=st.integers(min_value=0, max_value=0xFFFF),
    body=st.binary(max_size=2048),
)
def test_any_answer_decodes_to_bounded_records_or_raises_parse_error(
    head: bytes, words: int, body: bytes
) -> None:
    """Whatever an SM (or anything on QP1 with our TID) answers: records that lie inside the
    answer, at most one per 8 bytes of it, or a ParseError, never another exception."""
    for mad in (head + body, _reply([body], words=words)):
        try:
            table = decode_table(mad, ATTRIBUTE_SMINFO_RECORD)
        except ParseError:
            continue
        assert sum(map(len, table.records)) <= max(0, len(mad) - 56)
        assert len(table.records) <= max(0, len(mad) - 56) // 8
        assert len(sm_guids(table)) <= len(table.records)
        assert table.segments >= 1
