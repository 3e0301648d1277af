"""Subnet administration (SA) through umad: one question to the subnet manager, the fabric's SMs.

The node's tier 2 names the top of its fabric, one value for every node of that subnet, and no
walk of a node's neighbourhood can give it stably: in a 3-tier fabric a spine-core cable lost
hides that core from the whole pod below the spine, whatever the pod's nodes walk. The subnet
manager knows the whole subnet, so the node asks it (research/network-tiers.md §1a): a SubnAdm
GetTable of SMInfoRecords, the subnet's managers, master and standbys, the same answer for every
node of the subnet and unchanged by a failover or a broken cable. One request MAD; the answer
is a record of 32 bytes per SM, so one reply MAD in any fabric with up to six SMs.

It speaks umad as reporter.collect.infiniband does, on an fd that module opened: a GMP agent
for management class 0x03 on QP1, addressed to the master SM's LID (PortInfo's MasterSMLID). An
agent registered for RMPP has the kernel reassemble a reply of several segments into one read.
The SA is a GMP service any port may ask: it needs the same umad device, nothing more.
"""

from __future__ import annotations

import fcntl
import math
import os
import select
import struct
import time
from dataclasses import dataclass

from parsers.errors import ParseError
from reporter.errors import CollectError

UMAD_HDR_BYTES = 56
IB_USER_MAD_REGISTER_AGENT = 0xC01C1B01
MAD_BYTES = 256
SA_CLASS = 0x03
SA_CLASS_VERSION = 2
RMPP_VERSION = 1
METHOD_GET_TABLE = 0x12
METHOD_GET_TABLE_RESP = 0x92
ATTRIBUTE_SMINFO_RECORD = 0x18
QP1 = 1
QP1_QKEY = 0x80010000
SA_HEADER_BYTES = 56
"""The common MAD header (24), the RMPP header (12), SM_Key (8), AttributeOffset and a reserved
half-word (4) and ComponentMask (8): a record starts at byte 56."""
SA_SEGMENT_DATA_BYTES = 200
"""Record bytes one SA MAD carries: a reply longer than that comes in RMPP segments."""
SMINFO_RECORD_GUID_OFFSET = 4
"""SMInfoRecord: LID, 2 reserved bytes, then SMInfo, which opens with the SM's port GUID."""
REPLY_BUFFER_BYTES = UMAD_HDR_BYTES + 65536
TID_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SaTable:
    """A GetTable's records, and the MADs its answer took (RMPP segments, at least one)."""

    records: tuple[bytes, ...]
    segments: int


def encode_get_table(attribute: int, tid: int) -> bytes:
    """A SubnAdmGetTable of every record of `attribute` (no component mask)."""
    mad = bytearray(MAD_BYTES)
    struct.pack_into(
        ">BBBBHHQHHI",
        mad,
        0,
        1,
        SA_CLASS,
        SA_CLASS_VERSION,
        METHOD_GET_TABLE,
        0,
        0,
        tid & TID_MASK,
        attribute,
        0,
        0,
    )
    return bytes(mad)


def decode_table(mad: bytes, attribute: int) -> SaTable:
    """The records of a GetTableResp for `attribute`. Raises ParseError for a MAD that is not
    one, an error status, or a record size that does not fit."""
    if len(mad) < SA_HEADER_BYTES:
        raise ParseError(f"{len(mad)} bytes, an SA MAD has at least 56", field="sa")
    base, mgmt_class, _, method, status, _, _, replied = struct.unpack_from(">BBBBHHQH", mad, 0)
    if (base, mgmt_class, method, replied) != (1, SA_CLASS, METHOD_GET_TABLE_RESP, attribute):
        raise ParseError(
            f"not a GetTableResp of attribute {attribute:#x} (class {mgmt_class:#x}, method "
            f"{method:#x}, attribute {replied:#x})",
            field="sa",
        )
    if status != 0:
        raise ParseError(f"the SA answered status {status:#06x}", field="sa")
    words = struct.unpack_from(">H", mad, 44)[0]
    data = mad[SA_HEADER_BYTES:]
    if words == 0:
        if any(data):
            raise ParseError("records without a record size (AttributeOffset 0)", field="sa")
        return SaTable((), 1)
    size = words * 8
    records = tuple(data[at : at + size] for at in range(0, len(data) - size + 1, size))
    return SaTable(records, max(1, math.ceil(len(data) / SA_SEGMENT_DATA_BYTES)))


def sm_guids(table: SaTable) -> frozenset[int]:
    """The port GUIDs of the SMs in SMInfoRecords."""
    found = set()
    for record in table.records:
        if len(record) >= SMINFO_RECORD_GUID_OFFSET + 8:
            guid = struct.unpack_from(">Q", record, SMINFO_RECORD_GUID_OFFSET)[0]
            if guid:
                found.add(guid)
    return frozenset(found)


class SaClient:
    """An SA agent on an open umad fd: one GetTable at a time, its answer within a timeout."""

    def __init__(self, fd: int, device: str, timeout_s: float) -> None:
        self.fd = fd
        self.timeout_s = timeout_s
        self.next_tid = 1
        fields = (0, 0, 0, 0, 0, QP1, SA_CLASS, SA_CLASS_VERSION, b"\0\0\0", RMPP_VERSION)
        request = bytearray(struct.pack("=I4IBBB3sB", *fields).ljust(28, b"\0"))
        try:
            fcntl.ioctl(fd, IB_USER_MAD_REGISTER_AGENT, request, True)
        except OSError as error:
            raise CollectError(
                f"{device} refused an SA agent: {error.strerror}; the subnet manager cannot "
                "be asked"
            ) from error
        self.agent = struct.unpack_from("=I", request)[0]

    def get_table(self, sm_lid: int, attribute: int) -> SaTable:
        """Every record of `attribute` from the SA at `sm_lid`. Raises CollectError where no
        good answer comes within the timeout."""
        tid = self.next_tid
        self.next_tid = self.next_tid % TID_MASK + 1
        header = bytearray(UMAD_HDR_BYTES)
        struct.pack_into("=IIIII", header, 0, self.agent, 0, int(self.timeout_s * 1000), 0, 0)
        struct.pack_into(">IIH", header, 20, QP1, QP1_QKEY, sm_lid)
        os.write(self.fd, bytes(header) + encode_get_table(attribute, tid))
        deadline = time.monotonic() + self.timeout_s
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            if not poller.poll(left * 1000):
                break
            packet = os.read(self.fd, REPLY_BUFFER_BYTES)
            mad = packet[UMAD_HDR_BYTES:]
            if len(mad) < SA_HEADER_BYTES or struct.unpack_from(">Q", mad, 8)[0] & TID_MASK != tid:
                continue
            if struct.unpack_from("=I", packet, 4)[0] != 0:
                break
            try:
                return decode_table(mad, attribute)
            except ParseError as error:
                raise CollectError(
                    f"the subnet manager at LID {sm_lid} gave a bad answer: {error}"
                ) from error
        raise CollectError(
            f"the subnet manager at LID {sm_lid} did not answer within {self.timeout_s:g} s; "
            "check that it runs (sminfo) or give the scan more time"
        )
