"""InfiniBand discovery from the node: directed-route SMPs from each compute HCA port, through umad.

The node asks only its own neighbourhood (research/network-tiers.md §1a): its leaf (NodeInfo at
`0,<port>`), the leaf's ports (PortInfo on each), the node behind each live leaf port (NodeInfo),
and the same two steps once more from every spine found. Each switch found above the spines is
then a leaf of the pod or a core: its ports are asked in turn until one tells (`_is_core`). What
it sends is bounded by the radix of its leaves and spines and by the switches they reach, never
by the number of hosts, and capped by a budget; each SMP waits at most a timeout. Last, where a
subnet manager configured the port, one SA query names the subnet's SMs
(reporter.collect.infiniband_sa). reporter.collect.infiniband_tiers turns all that into tiers.

It speaks the kernel's umad interface (`/dev/infiniband/umad<N>`, `/sys/class/infiniband_mad`)
with the standard library only. Every open goes through libc's `open` by ctypes, not `os.open`:
CPython calls `open64`, which ibsim's umad2sim preload (the tests' simulated fabric) does not
wrap, while the kernel serves both alike. It never writes to a device beyond its own SMPs and SA
query, and never sends a Set.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import math
import os
import select
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from parsers.errors import ParseError
from parsers.smp import (
    MAD_BYTES,
    MAX_PORT,
    TID_MASK,
    Attribute,
    NodeInfo,
    NodeType,
    PortInfo,
    decode_node_description,
    decode_node_info,
    decode_port_info,
    decode_port_lids,
    decode_reply,
    encode_get,
    is_aggregation_node,
    request_tid,
)
from reporter.collect import NodeReading, SourceState
from reporter.collect.infiniband_sa import ATTRIBUTE_SMINFO_RECORD, SaClient, sm_guids
from reporter.collect.infiniband_tiers import (
    Discovery,
    PortView,
    SmpCounts,
    fabric_tiers,
    summarize,
)
from reporter.collect.sysfs import SysfsCollector
from reporter.errors import CollectError
from reporter.hostfs import HostFS
from reporter.schema.model import LinkKind, Topology
from reporter.schema.network import tier_labels

log = structlog.get_logger(__name__)

MAX_UMAD_DEVICES = 64
"""umad<N> probed, 0 to 63: a node has a few HCAs, each with a port or two."""
DEFAULT_BUDGET = 16384
"""SMPs a discovery may send per HCA port it walks from. A 64-port leaf under 32 64-port spines
costs about 4,300 when every port is live, and telling apart the switches above (leaf or core) a
few more for each: about 8,300 in a 3-tier fabric whose spines reach 1,024 cores; a leaf already
walked from another port is not walked again."""
DEFAULT_TIMEOUT_S = 0.5
SMP_TRIES = 2
"""Each SMP is sent at most twice: one lost on a busy fabric is sent again, one unanswered twice
is a port that stopped answering."""
SA_TIMEOUT_S = 2.0
"""The subnet manager's answer: one query a scan, from an SM that may be answering thousands."""
MAX_LEVELS = 2
"""The hops a walk goes up: the leaf, then the spines and what they reach (leaves and cores)."""
STRANGERS_FOR_A_CORE = 2
"""Switches a switch above the spines links to that are none of the node's spines: two make it a
core. A leaf of the pod links only to the pod's spines, and the node misses at most one of
those when one of its own leaf's spine links is down."""

UMAD_HDR_BYTES = 56
"""struct ib_user_mad_hdr_old: the layout of a file that never enabled P_Key indexes."""
IB_USER_MAD_REGISTER_AGENT = 0xC01C1B01
"""_IOWR(0x1b, 1, struct ib_user_mad_reg_req), a 28-byte struct."""
SYSFS_MAD = "/sys/class/infiniband_mad"
SYSFS_IB = "/sys/class/infiniband"
DEV_UMAD = "/dev/infiniband"


@dataclass(frozen=True, slots=True)
class UmadPort:
    """One HCA port and the umad device that sends SMPs from it."""

    name: str
    port: int
    device: str


class _Libc:
    """libc's open/read/close by ctypes: the calls an LD_PRELOAD (umad2sim) can see."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)

    def open(self, path: str, flags: int) -> int:
        """The fd, or raises OSError with the errno."""
        fd = int(self.lib.open(path.encode(), flags))
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), path)
        return fd

    def read_text(self, path: str) -> str | None:
        """A small sysfs file's text, stripped; None where it cannot be read."""
        try:
            fd = self.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            buffer = ctypes.create_string_buffer(256)
            count = int(self.lib.read(fd, buffer, 256))
        finally:
            self.lib.close(fd)
        return buffer.raw[:count].decode("ascii", "replace").strip() if count > 0 else None


def list_ports(
    names: Sequence[str] | None = None, libc: _Libc | None = None
) -> tuple[UmadPort, ...]:
    """The InfiniBand HCA ports this process can send SMPs from: all, or those of `names`.

    Raises CollectError when a name in `names` has no umad device here.
    """
    libc = libc or _Libc()
    found: list[UmadPort] = []
    for index in range(MAX_UMAD_DEVICES):
        name = libc.read_text(f"{SYSFS_MAD}/umad{index}/ibdev")
        port_text = libc.read_text(f"{SYSFS_MAD}/umad{index}/port")
        if name is None or port_text is None or not port_text.isdigit():
            continue
        # RoCE ports have umad devices too, but no QP0: an SMP from them only times out.
        layer = libc.read_text(f"{SYSFS_IB}/{name}/ports/{port_text}/link_layer")
        if layer is not None and layer != "InfiniBand":
            continue
        found.append(UmadPort(name, int(port_text), f"{DEV_UMAD}/umad{index}"))
    if names is None:
        return tuple(found)
    missing = sorted(set(names) - {port.name for port in found})
    if missing:
        have = ", ".join(sorted({port.name for port in found})) or "none"
        raise CollectError(
            f"no InfiniBand umad device for HCA {', '.join(missing)} (found: {have}); "
            "name HCAs from /sys/class/infiniband_mad/umad*/ibdev"
        )
    return tuple(port for port in found if port.name in names)


@dataclass
class _Counter:
    """The SMPs sent so far, against the budget: shared by every port of one discovery."""

    budget: int
    total_s: float | None = None
    """The whole discovery's time, from the first SMP; None: only each SMP's timeout bounds it."""
    node_info: int = 0
    port_info: int = 0
    node_description: int = 0
    unanswered: int = 0
    deadline: float = math.inf

    def __post_init__(self) -> None:
        if self.total_s is not None:
            self.deadline = time.monotonic() + self.total_s

    def left_s(self) -> float:
        """What is left of the discovery's time (inf without a total)."""
        return self.deadline - time.monotonic()

    def charge(self, attribute: Attribute) -> None:
        if self.left_s() <= 0:
            raise CollectError(
                f"the scan ran out of its {self.total_s:g} s before it had seen its "
                "leaves' and spines' ports: the fabric answers slowly or not at all; check the "
                "ports' state (ibstat) or give it more time"
            )
        if self.node_info + self.port_info + self.node_description >= self.budget:
            raise CollectError(
                f"the scan stopped at its budget of {self.budget} SMPs before it had "
                "seen its leaves' and spines' ports; the fabric's switches have more ports than "
                "expected: raise the budget"
            )
        if attribute is Attribute.NODE_INFO:
            self.node_info += 1
        elif attribute is Attribute.NODE_DESCRIPTION:
            self.node_description += 1
        else:
            self.port_info += 1

    def counts(self) -> SmpCounts:
        return SmpCounts(
            self.node_info, self.port_info, self.unanswered, node_description=self.node_description
        )


class _SmpChannel:
    """One umad device with an agent for directed-route SMPs: Get, then wait for its GetResp."""

    def __init__(self, libc: _Libc, port: UmadPort, counter: _Counter, timeout_s: float) -> None:
        self.port = port
        self.counter = counter
        self.timeout_s = timeout_s
        self.next_tid = 1
        self.answered = True
        """Whether the last SMP got a GetResp at all: its error status is an answer (a switch
        refusing a port it does not have), its absence a port that stopped answering."""
        device = port.device
        try:
            self.fd = libc.open(device, os.O_RDWR)
        except OSError as error:
            raise self.stopped(
                f"cannot open {device}: {error.strerror}; the container needs the device "
                "(and a device-cgroup rule for c 231:* rw)"
            ) from error
        self.libc = libc
        request = bytearray(
            struct.pack("=I4IBBB3sB", 0, 0, 0, 0, 0, 0, 0x81, 1, b"\0\0\0", 0).ljust(28, b"\0")
        )
        try:
            fcntl.ioctl(self.fd, IB_USER_MAD_REGISTER_AGENT, request, True)
        except OSError as error:
            self.close()
            # The kernel's ib_register_mad_agent answers EPROTONOSUPPORT where the port has no
            # QP0; other errors are a device that is not umad at all.
            why = (
                "the port has no subnet management QP (QP0): an SR-IOV VF's or a VM's HCA has none"
                if error.errno == errno.EPROTONOSUPPORT
                else "it is not a umad device with subnet management (QP0), as an SR-IOV VF's or "
                "a VM's HCA is not"
            )
            raise self.stopped(
                f"{device} refused an SMP agent ({error.strerror}): {why}; walk from an HCA of "
                "the host itself (name it with --network-infiniband-hcas), or leave InfiniBand "
                "discovery off on this node"
            ) from error
        self.agent = struct.unpack_from("=I", request)[0]

    def close(self) -> None:
        self.libc.lib.close(self.fd)

    def stopped(self, why: str) -> CollectError:
        """The scan's one line for `why` it stopped: the HCA and port first, what it had sent
        last."""
        counter = self.counter
        sent = counter.node_info + counter.port_info + counter.node_description
        return CollectError(
            f"InfiniBand scan from {self.port.name} port {self.port.port}: {why} "
            f"[{sent} SMPs sent, {counter.unanswered} unanswered]"
        )

    def get(self, path: tuple[int, ...], attribute: Attribute, modifier: int = 0) -> bytes | None:
        """The attribute's data, or None where no good answer came: an error status at once, no
        answer after SMP_TRIES sends of `timeout_s` each."""
        for _ in range(SMP_TRIES):
            self.answered, data = self._send(path, attribute, modifier)
            if self.answered:
                break
        if data is None:
            self.counter.unanswered += 1
        return data

    def _send(
        self, path: tuple[int, ...], attribute: Attribute, modifier: int
    ) -> tuple[bool, bytes | None]:
        """(whether a GetResp came, its data where its status is 0)."""
        self.counter.charge(attribute)
        tid = self.next_tid
        self.next_tid = self.next_tid % TID_MASK + 1
        header = bytearray(UMAD_HDR_BYTES)
        struct.pack_into("=IIIII", header, 0, self.agent, 0, int(self.timeout_s * 1000), 0, 0)
        struct.pack_into(">IIH", header, 20, 0, 0, 0xFFFF)
        os.write(self.fd, bytes(header) + encode_get(path, attribute, modifier, tid))
        deadline = time.monotonic() + min(self.timeout_s, self.counter.left_s())
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            if not poller.poll(left * 1000):
                break
            packet = os.read(self.fd, UMAD_HDR_BYTES + 256)
            mad = packet[UMAD_HDR_BYTES:]
            # A late answer to an earlier SMP that timed out is not ours: keep waiting.
            if len(mad) < MAD_BYTES or request_tid(mad) != tid:
                continue
            # A non-zero umad status is the kernel handing back our Get unanswered (ETIMEDOUT).
            if struct.unpack_from("=I", packet, 4)[0] != 0:
                break
            try:
                reply = decode_reply(mad)
            except ParseError:
                return True, None
            return True, reply.data if reply.status == 0 else None
        return False, None

    def node_info(self, path: tuple[int, ...]) -> NodeInfo | None:
        data = self.get(path, Attribute.NODE_INFO)
        try:
            return None if data is None else decode_node_info(data)
        except ParseError:
            self.counter.unanswered += 1
            return None

    def port_info(self, path: tuple[int, ...], port: int) -> PortInfo | None:
        data = self.get(path, Attribute.PORT_INFO, port)
        try:
            return None if data is None else decode_port_info(data)
        except ParseError:
            self.counter.unanswered += 1
            return None

    def switch_name(self, path: tuple[int, ...], switch: NodeInfo) -> str:
        """The switch at `path` for a log line: its GUID, and its NodeDescription where it
        answers (escaped: a switch's description is whatever its firmware or admin wrote)."""
        name = f"switch 0x{switch.node_guid:016x}"
        try:
            data = self.get(path, Attribute.NODE_DESCRIPTION)
        except CollectError:
            return name
        return name if data is None else f'{name} "{decode_node_description(data)}"'

    def aggregation_node(self, path: tuple[int, ...]) -> bool:
        """Whether the CA at `path` is a switch's SHARP Aggregation Node (by NodeDescription)."""
        data = self.get(path, Attribute.NODE_DESCRIPTION)
        return data is not None and is_aggregation_node(data)


def _neighbour_switches(
    channel: _SmpChannel, path: tuple[int, ...], switch: NodeInfo
) -> dict[int, tuple[tuple[int, ...], NodeInfo]]:
    """The switches on `switch`'s live ports, but the one `path` came in by and the switch
    itself (a cable from one of its ports to another): GUID -> path, info.

    A peer that does not answer its NodeInfo is left out, as a missing link is (a host's hung
    HCA, or a spine going away: the tiers stand one missing link), unless no switch at all
    answers behind `switch` (every spine silent: the tiers above would be lost, so it raises
    CollectError); a port whose PortInfo the switch refuses with an error status is left out.
    A port whose PortInfo goes unanswered is not: the walk would miss what is behind it, so it
    raises CollectError naming the switch. A switch claiming more than MAX_PORT ports is walked
    to MAX_PORT, with a warning: a directed route cannot name port 255."""
    if switch.num_ports > MAX_PORT:
        log.warning(
            "infiniband_switch_ports_beyond_254",
            switch=f"0x{switch.node_guid:016x}",
            num_ports=switch.num_ports,
            walked=MAX_PORT,
        )
    found: dict[int, tuple[tuple[int, ...], NodeInfo]] = {}
    silent: list[int] = []
    for port in range(1, min(switch.num_ports, MAX_PORT) + 1):
        if port == switch.local_port:
            continue
        state = channel.port_info(path, port)
        if state is None and not channel.answered:
            raise CollectError(
                f"{channel.switch_name(path, switch)} did not answer PortInfo of its port {port} "
                f"({SMP_TRIES} tries of {channel.timeout_s:g} s): the switch or the link to it "
                "stopped answering during the scan; check the links (iblinkinfo), and the scan "
                "runs again at its next read"
            )
        if state is None or not state.link_up:
            continue
        peer = channel.node_info((*path, port))
        if peer is None:
            silent.append(port)
        elif peer.node_type is NodeType.SWITCH and peer.node_guid != switch.node_guid:
            found.setdefault(peer.node_guid, ((*path, port), peer))
    if silent and not found:
        raise CollectError(
            f"no switch behind {channel.switch_name(path, switch)} answered: nothing answered "
            f"NodeInfo behind its live port{'s' if len(silent) > 1 else ''} "
            f"{', '.join(map(str, silent))}, and the tiers above it would be lost; check those "
            "links (iblinkinfo), and the scan runs again at its next read"
        )
    return found


@dataclass
class _Seen:
    """What one discovery already asked, by GUID, so a second port under the same leaf or
    spines sends nothing more for them."""

    under_leaf: dict[int, frozenset[int]] = field(default_factory=dict)
    spine_neighbours: dict[int, frozenset[int]] = field(default_factory=dict)
    reached: dict[int, tuple[tuple[int, ...], NodeInfo]] = field(default_factory=dict)
    """The switches on the spines' ports this port's walk found first, with the path to each
    from this port: the leaves and cores still to be told apart."""
    cores: set[int] = field(default_factory=set)
    """Switches above the spines with no host on them."""


def _walk_port(channel: _SmpChannel, port: UmadPort, seen: _Seen, levels: int) -> PortView:
    """What `port` sees. Raises CollectError where its own HCA or the node at the other end of
    its link does not answer (a compute HCA left out would change the leaf group), a switch
    stops answering, or the scan's SMPs or time run out."""
    own = channel.node_info((0,))
    if own is None:
        raise CollectError(
            "the HCA did not answer its own NodeInfo within the timeout; check that the port is "
            "up (ibstat)"
        )
    leaf_path = (0, port.port)
    leaf = channel.node_info(leaf_path)
    if leaf is None:
        answer = (
            "the other end of its link answered with no NodeInfo (an error status)"
            if channel.answered
            else "nothing answered at the other end of its link "
            f"({SMP_TRIES} tries of {channel.timeout_s:g} s)"
        )
        raise CollectError(
            f"{answer}: the link is down, or went down "
            f"during the scan; check it (ibstat {port.name} {port.port}), or leave this HCA out "
            "(--network-infiniband-hcas)"
        )
    if leaf.node_type is not NodeType.SWITCH:
        return PortView(port.name, port.port, own.port_guid, None, frozenset())
    if levels == 1:
        return PortView(port.name, port.port, own.port_guid, leaf.node_guid, frozenset())
    if leaf.node_guid not in seen.under_leaf:
        under: set[int] = set()
        for guid, (spine_path, spine) in _neighbour_switches(channel, leaf_path, leaf).items():
            if guid not in seen.spine_neighbours:
                beyond = _neighbour_switches(channel, spine_path, spine)
                seen.reached.update(beyond)
                seen.spine_neighbours[guid] = frozenset(beyond) | {leaf.node_guid}
            under |= seen.spine_neighbours[guid]
        seen.under_leaf[leaf.node_guid] = frozenset(under)
    return PortView(
        port.name, port.port, own.port_guid, leaf.node_guid, seen.under_leaf[leaf.node_guid]
    )


def _is_core(
    channel: _SmpChannel, path: tuple[int, ...], switch: NodeInfo, spines: frozenset[int]
) -> bool:
    """Whether the switch at `path`, above the node's spines, is a core rather than a leaf:
    whether no host hangs on it. Its ports are asked in turn until a host answers (a leaf), or
    STRANGERS_FOR_A_CORE switches that are none of `spines` do (a core: a leaf links only to
    its pod's spines), or none is left (a core, or a leaf with no host up: neither shapes a
    tier). An Aggregation Node is no host."""
    strangers = 0
    for port in range(1, min(switch.num_ports, MAX_PORT) + 1):
        if port == switch.local_port:
            continue
        state = channel.port_info(path, port)
        if state is None or not state.link_up:
            continue
        peer = channel.node_info((*path, port))
        if peer is None:
            continue
        if peer.node_type is NodeType.CA:
            if not channel.aggregation_node((*path, port)):
                return False
        elif peer.node_guid not in spines:
            strangers += 1
            if strangers >= STRANGERS_FOR_A_CORE:
                return True
    return True


def _classify(channel: _SmpChannel, seen: _Seen, leaves: set[int]) -> None:
    """Tell the switches this port's walk found above its spines apart: cores into seen.cores."""
    spines = frozenset(seen.spine_neighbours)
    for guid, (path, switch) in sorted(seen.reached.items()):
        if guid not in leaves and guid not in spines and _is_core(channel, path, switch, spines):
            seen.cores.add(guid)
    seen.reached.clear()


def _master_sm_lid(channel: _SmpChannel, port: UmadPort) -> int:
    """The port's master SM's LID from its own PortInfo; 0 where no SM has configured it."""
    data = channel.get((0,), Attribute.PORT_INFO, port.port)
    if data is None:
        return 0
    lids = decode_port_lids(data)
    return lids.master_sm_lid if lids.lid else 0


def walk_ports(
    ports: Sequence[UmadPort],
    *,
    levels: int = MAX_LEVELS,
    budget: int = DEFAULT_BUDGET,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    total_s: float | None = None,
) -> tuple[tuple[PortView, ...], SmpCounts]:
    """What each of `ports` sees of its neighbourhood, and the SMPs that cost. `levels` bounds
    the hops: 1 asks only the port's leaf (1 hop, 2 SMPs a port); 2 also the ports of the leaf
    and of its spines, who is behind them (3 hops), and whether each switch above the spines is
    a leaf or a core (its ports until one tells, 4 hops). `budget` SMPs a port, shared by all
    of them. Each SMP waits at most `timeout_s`, and the whole walk at most `total_s` where given.

    Raises ValueError for `levels` other than 1 or 2; CollectError, in one line that starts
    with the HCA and port, when a device does not open or takes no SMP agent, a port or the
    node across its link does not answer, a switch stops answering, or the walk reaches its SMP
    budget or its time.
    """
    if levels not in range(1, MAX_LEVELS + 1):
        raise ValueError(f"levels is 1 (the leaf group) or 2 (and the spine group), not {levels}")
    libc = _Libc()
    counter = _Counter(budget * max(1, len(ports)), total_s)
    seen = _Seen()
    views: list[PortView] = []
    for port in ports:
        channel = _SmpChannel(libc, port, counter, timeout_s)
        try:
            view = _walk_port(channel, port, seen, levels)
            if levels == MAX_LEVELS:
                leaves = {v.leaf for v in (*views, view) if v.leaf is not None}
                _classify(channel, seen, leaves)
                view = replace(
                    view,
                    cores=view.under_spines & frozenset(seen.cores),
                    master_sm_lid=0 if view.leaf is None else _master_sm_lid(channel, port),
                )
            views.append(view)
        except CollectError as error:
            raise channel.stopped(str(error)) from error
        finally:
            channel.close()
    return tuple(views), counter.counts()


def ask_subnet_manager(
    ports: Sequence[UmadPort], views: Sequence[PortView], timeout_s: float = SA_TIMEOUT_S
) -> tuple[frozenset[int], SmpCounts]:
    """The subnet's SMs, asked of the master SM of the first port an SM configured (a node's
    compute HCAs share one subnet), and what asking cost; none where no SM configured a port.
    Raises CollectError where the SM does not answer: a node that published the walked tier 2
    instead would split its subnet's tier 2 in two."""
    for port, view in zip(ports, views, strict=True):
        if not view.master_sm_lid:
            continue
        libc = _Libc()
        try:
            fd = libc.open(port.device, os.O_RDWR)
        except OSError as error:
            raise CollectError(f"cannot open {port.device}: {error.strerror}") from error
        try:
            table = SaClient(fd, port.device, timeout_s).get_table(
                view.master_sm_lid, ATTRIBUTE_SMINFO_RECORD
            )
        finally:
            libc.lib.close(fd)
        return sm_guids(table), SmpCounts(sa_queries=1, sa_replies=table.segments)
    return frozenset(), SmpCounts()


def discover(
    names: Sequence[str] | None = None,
    *,
    levels: int = MAX_LEVELS,
    budget: int = DEFAULT_BUDGET,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    total_s: float | None = None,
) -> Discovery:
    """The node's InfiniBand tiers from its HCA ports: all it can use, or those of `names`.

    No HCA port is no data: a Discovery with no tiers. Raises ValueError and CollectError as
    walk_ports does, and CollectError for a name with no umad device or a subnet manager that
    does not answer; `total_s` bounds the SA query too.
    """
    started = time.monotonic()
    ports = list_ports(names)
    views, smps = walk_ports(
        ports, levels=levels, budget=budget, timeout_s=timeout_s, total_s=total_s
    )
    sa_timeout_s = max(timeout_s, SA_TIMEOUT_S)
    if total_s is not None:
        sa_timeout_s = min(sa_timeout_s, total_s - (time.monotonic() - started))
        if sa_timeout_s <= 0 and any(view.master_sm_lid for view in views):
            raise CollectError(
                f"the InfiniBand scan ran out of its {total_s:g} s before it could ask the "
                "subnet manager: give it more time"
            )
    managers, asked = ask_subnet_manager(ports, views, sa_timeout_s)
    return summarize(views, smps + asked, managers)


def gpu_paired_hcas(topology: Topology) -> tuple[str, ...]:
    """The RDMA devices `topology` pairs with a GPU, sorted: for each GPU, every NIC whose PCIe
    path to it is the closest any NIC has, where that path stays under one CPU socket (PIX, PXB,
    PHB or NODE; not SYS). That is the NIC the GPU's GPUDirect RDMA traffic takes; a storage
    HCA in a slot of the CPU's own, farther from every GPU than a compute HCA, is none."""
    if not topology.nics:
        return ()
    paired: set[str] = set()
    for gpu in range(len(topology.gpus)):
        closest = min((nic.links[gpu] for nic in topology.nics), key=lambda c: c.closeness)
        if closest.kind is LinkKind.SYS:
            continue
        paired.update(nic.name for nic in topology.nics if nic.links[gpu] == closest)
    return tuple(sorted(paired))


def compute_hcas(sysfs: HostFS) -> tuple[str, ...]:
    """The InfiniBand HCAs of the node's topology (as the sysfs collector builds it) that it
    pairs with a GPU: gpu_paired_hcas, less those whose ports sysfs says are Ethernet (RoCE:
    LLDP's fabric). () where sysfs shows no NVIDIA GPU or no RDMA device.

    Raises CollectError where sysfs cannot be read at all."""
    topology = SysfsCollector(sysfs).collect().topology()
    if topology is None or not topology.nics:
        return ()
    return tuple(name for name in gpu_paired_hcas(topology) if not _ethernet(sysfs, name))


def _ethernet(sysfs: HostFS, name: str) -> bool:
    try:
        ports = sysfs.listdir(f"class/infiniband/{name}/ports")
        layers = {sysfs.read_text(f"class/infiniband/{name}/ports/{p}/link_layer") for p in ports}
    except OSError:
        return False
    return bool(layers) and {layer.strip() for layer in layers} == {"Ethernet"}


AGENT_INTERVAL_S = 600.0
"""The agent reads the fabric every 10 minutes: a leaf or spine group changes with recabling."""
AGENT_TOTAL_S = 30.0
"""The agent's bound on one whole scan: its topology loop waits for it. A 2-tier fabric of 64-port
switches costs a few thousand SMPs, each answered in well under a millisecond."""


NO_PAIRED_HCA = (
    "no InfiniBand HCA here is one the topology pairs with a GPU (its closest RDMA NIC short of "
    "SYS): none is walked, so no storage HCA is taken for a compute one; name the compute HCAs "
    "with --network-infiniband-hcas"
)


@dataclass(frozen=True, slots=True)
class InfinibandTierSource:
    """Tiers 0, 1 and 2 of the InfiniBand fabric as a node source (`--network-infiniband`),
    every AGENT_INTERVAL_S: what `topo-reporter network --infiniband` finds from the node's
    compute HCAs, all three tiers always (reporter.collect.infiniband_tiers.fabric_tiers). The
    compute HCAs are those of `hcas` (`--network-infiniband-hcas`), else those the topology read
    from `sysfs` pairs with a GPU (compute_hcas): a storage HCA must not group every node under
    its storage switch. A simulated machine, a node with no InfiniBand port, or none paired with
    a GPU, is no data; a scan that fails or reaches no switch, a failure, in one line that names
    the HCA, what happened and what to do."""

    simulated: bool
    total_s: float = AGENT_TOTAL_S
    label_style: str = "topo-reporter"
    """One of reporter.schema.network.NETWORK_LABEL_STYLES."""
    hcas: tuple[str, ...] = ()
    """The compute HCAs by name; empty: those the topology pairs with a GPU."""
    sysfs: HostFS | None = None
    """The host's sysfs, the topology's; None: no topology, so only `hcas` are walked."""
    scan: Callable[[Sequence[str], float], Discovery] = field(
        default=lambda names, total_s: discover(names, total_s=total_s)
    )
    """The discovery, given the HCAs and its time bound: a test's double stands in for the
    fabric."""

    name = "infiniband"
    interval_s = AGENT_INTERVAL_S
    lacking = "network tiers 0, 1 and 2 unknown"

    def read(self) -> NodeReading[tuple[str, ...]]:
        if self.simulated:
            return NodeReading(None, SourceState.NO_DATA, "a simulated machine has no HCA")
        try:
            names = self.hcas or (compute_hcas(self.sysfs) if self.sysfs is not None else ())
            if not names:
                return NodeReading(None, SourceState.NO_DATA, NO_PAIRED_HCA)
            found = self.scan(names, self.total_s)
        except CollectError as e:
            return NodeReading(None, SourceState.FAILED, str(e))
        tiers = fabric_tiers(found.views, found.subnet_managers)
        if not tiers:
            return NodeReading(
                None,
                SourceState.FAILED,
                f"no InfiniBand port of {', '.join(names)} is cabled to a switch: check the "
                "links (ibstat)",
            )
        return NodeReading(tiers)

    def labels(self, value: tuple[str, ...], prefix: str) -> dict[str, str]:
        return tier_labels(value, prefix, self.label_style)
