"""The switches a node's compute NICs are cabled to, heard by LLDP.

Two ways, the first that answers: lldpd on the host, asked with `lldpcli -f json0 show neighbors`
(bounded in time and in output), and where it does not run or hears none of the interfaces,
LLDP frames (EtherType 0x88cc) read from the interfaces themselves with a packet socket, for at
most a given wait. The socket needs CAP_NET_RAW and the host's network namespace (a pod's
`hostNetwork: true`); it sees a copy of every frame, so it works beside a running lldpd too.

The compute NICs are, unless named, the RDMA devices' ports whose link layer is Ethernet (RoCE),
as sysfs tells through a HostFS: `class/infiniband/<dev>/ports/<n>/link_layer`, and the port's
netdev from `ports/<n>/gid_attrs/ndevs/0`, else the device's `device/net/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence

from parsers.errors import ParseError
from parsers.lldp import (
    ETHERTYPE_LLDP,
    MAX_FRAME_BYTES,
    MAX_LLDPCLI_CHARS,
    LldpNeighbour,
    parse_frame,
    parse_lldpcli,
)
from reporter.collect import NodeReading, SourceState
from reporter.errors import CollectError
from reporter.hostfs import HostFS
from reporter.schema.network import ethernet_tier_0, tier_labels

LLDPCLI_TIMEOUT_S = 5.0
"""lldpcli answers from lldpd's memory in milliseconds; a hung daemon must not hang us."""
LLDP_MULTICAST = bytes.fromhex("0180c200000e")
"""The nearest-bridge address: LLDP's destination, which a switch never forwards."""
_SOL_PACKET = 263
_PACKET_ADD_MEMBERSHIP = 1
_PACKET_MR_MULTICAST = 0
_PACKET_OUTGOING = 4
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_RUNNING = 0x40
_NETDEV_NAME = re.compile(r"[^\s/:]{1,15}")
"""A Linux interface name: at most 15 bytes (IFNAMSIZ - 1), no whitespace, slash or colon."""


def hear(interfaces: Sequence[str], lldpd_socket: str, wait_s: float) -> list[LldpNeighbour]:
    """The switch each of `interfaces` hears: lldpd's neighbours where it runs and hears them,
    else LLDP frames heard within `wait_s`. Raises CollectError when none hears a switch, an
    interface does not exist, or the socket is not allowed."""
    heard = lldpd_neighbours(lldpd_socket, interfaces) or listen(interfaces, wait_s)
    if not heard:
        raise CollectError(_nothing_heard(interfaces, wait_s))
    return heard


def _nothing_heard(interfaces: Sequence[str], wait_s: float) -> str:
    return (
        f"no LLDP neighbour heard on {', '.join(interfaces)} within {wait_s:g}s: is LLDP on "
        "at the switch, and does the NIC's own LLDP agent keep the frames from the host "
        "(docs/network.md)?"
    )


def is_up(interface: str) -> bool:
    """Whether `interface`, in this network namespace, is up and has its link (IFF_UP and
    IFF_RUNNING, as `ip link` shows UP and LOWER_UP); False where there is no such interface."""
    request = struct.pack("16s24x", interface.encode("utf-8", "replace")[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe, _SIOCGIFFLAGS, request)
        except OSError:
            return False
    flags: int = struct.unpack_from("H", answer, 16)[0]
    return flags & _IFF_UP != 0 and flags & _IFF_RUNNING != 0


def rdma_ethernet_netdevs(fs: HostFS) -> list[str]:
    """The netdevs of the RDMA ports whose link layer is Ethernet, sorted, each once; none where
    the host has no RDMA device or sysfs does not say."""
    found: set[str] = set()
    try:
        devices = fs.listdir("class/infiniband")
    except OSError:
        return []
    for device in devices:
        base = f"class/infiniband/{device}"
        try:
            ports = fs.listdir(f"{base}/ports")
        except OSError:
            continue
        for port in ports:
            try:
                link_layer = fs.read_text(f"{base}/ports/{port}/link_layer").strip()
            except OSError:
                continue
            if link_layer == "Ethernet":
                found.update(_port_netdevs(fs, base, port))
    return sorted(found)


def _port_netdevs(fs: HostFS, base: str, port: str) -> list[str]:
    try:
        names = [fs.read_text(f"{base}/ports/{port}/gid_attrs/ndevs/0").strip()]
    except OSError:
        try:
            names = fs.listdir(f"{base}/device/net")
        except OSError:
            names = []
    return [n for n in names if _NETDEV_NAME.fullmatch(n)]


def lldpd_neighbours(socket_path: str, interfaces: Sequence[str]) -> list[LldpNeighbour] | None:
    """What lldpd (listening on `socket_path`) hears on `interfaces`; None where no lldpcli is
    installed or no lldpd answers, or its answer does not read."""
    lldpcli = shutil.which("lldpcli")
    if lldpcli is None:
        return None
    command = [lldpcli, "-u", socket_path, "-f", "json0", "show", "neighbors"]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None
    # Killed at the deadline with anything it started (which could hold its output open), the
    # reader below sees the end of its output at once.
    timer = threading.Timer(LLDPCLI_TIMEOUT_S, _kill_group, (process,))
    timer.start()
    with process:
        try:
            assert process.stdout is not None
            answer = process.stdout.read(MAX_LLDPCLI_CHARS + 1)
            if len(answer) > MAX_LLDPCLI_CHARS:
                _kill_group(process)
            status = process.wait()
        finally:
            timer.cancel()
    if status != 0 or len(answer) > MAX_LLDPCLI_CHARS:
        return None
    try:
        heard = parse_lldpcli(answer)
    except ParseError:
        return None
    wanted = set(interfaces)
    return [n for n in heard if n.interface in wanted]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def listen(interfaces: Sequence[str], wait_s: float) -> list[LldpNeighbour]:
    """The first neighbour each of `interfaces` hears within `wait_s` seconds (in their order;
    those that hear none are left out). Frames that do not parse, that we send ourselves, or that
    announce a neighbour leaving (TTL 0) are passed over. Raises CollectError where an interface
    does not exist or the socket is not allowed (CAP_NET_RAW)."""
    sockets: dict[int, tuple[str, socket.socket]] = {}
    try:
        for name in interfaces:
            listener = _open(name)
            sockets[listener.fileno()] = (name, listener)
        heard: dict[str, LldpNeighbour] = {}
        gone: set[str] = set()
        deadline = time.monotonic() + wait_s
        while len(heard) + len(gone) < len(sockets):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waiting = [
                fd for fd, (name, _) in sockets.items() if name not in heard and name not in gone
            ]
            ready, _, _ = select.select(waiting, [], [], left)
            for fd in ready:
                name, listener = sockets[fd]
                try:
                    neighbour = _received(listener, name)
                except OSError:
                    # The interface went down under the listen (ENETDOWN): it hears no more.
                    gone.add(name)
                    continue
                if neighbour is not None:
                    heard[name] = neighbour
        return [heard[name] for name in interfaces if name in heard]
    finally:
        for _, listener in sockets.values():
            listener.close()


def _open(interface: str) -> socket.socket:
    """A packet socket receiving LLDP on `interface`, joined to LLDP's multicast address."""
    try:
        index = socket.if_nametoindex(interface)
    except OSError:
        raise CollectError(
            f"no network interface {interface!r} here: name one `ip link` lists (with "
            "--interface), in the host's network namespace (hostNetwork: true in a pod)"
        ) from None
    try:
        listener = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE_LLDP))
    except PermissionError:
        raise CollectError(
            "listening for LLDP needs a raw socket (CAP_NET_RAW): run as root, or grant the "
            "capability"
        ) from None
    try:
        listener.bind((interface, ETHERTYPE_LLDP))
        membership = struct.pack(
            "iHH8s", index, _PACKET_MR_MULTICAST, len(LLDP_MULTICAST), LLDP_MULTICAST
        )
        listener.setsockopt(_SOL_PACKET, _PACKET_ADD_MEMBERSHIP, membership)
    except OSError as e:
        listener.close()
        raise CollectError(
            f"cannot listen for LLDP on {interface}: {os.strerror(e.errno or 0)}"
        ) from None
    listener.setblocking(False)
    return listener


def _received(listener: socket.socket, interface: str) -> LldpNeighbour | None:
    try:
        frame, address = listener.recvfrom(MAX_FRAME_BYTES + 1)
    except BlockingIOError:
        return None
    if address[2] == _PACKET_OUTGOING:
        return None
    try:
        neighbour = parse_frame(frame, interface)
    except ParseError:
        return None
    return neighbour if neighbour.ttl_s else None


AGENT_INTERVAL_S = 600.0
"""How often the agent reads tier 0: a re-cabled rack is rare, and each read may listen."""
AGENT_WAIT_S = 35.0
"""How long the agent listens where lldpd does not answer: one default LLDP interval and some.
The listen runs on a thread of its own, never in the topology loop."""
AGENT_LLDPD_SOCKET = "/run/lldpd.socket"
SILENT_BY_LLDPD = "lldpd hears no neighbour there"


class LldpTierSource:
    """Tier 0 of the Ethernet/RoCE fabric as a node source (`--network-lldp`), every
    AGENT_INTERVAL_S: the RDMA Ethernet ports `fs` shows, heard as `topo-reporter network
    --lldp` hears them. A host without such a port is no data; ports that hear no switch, a
    failure. A simulated machine hears no switch: its `fs` is None, and it reads no data.

    Asking lldpd takes milliseconds (at most LLDPCLI_TIMEOUT_S) and is done in the read. Where
    lldpd does not answer, the read starts listening (up to `wait_s`) on a thread of its own and
    returns at once, with the last reading (a first one has no value yet): the topology loop
    publishes meanwhile, and the next read, at the loop's next step, takes what was heard.

    `silent` holds, after each reading, the ports that are up but heard no neighbour, each with
    how it was asked: the agent reports them (the `roce-port-silent` finding).

    What it must never do: hold the loop for a listen (but with `await_listen`, for `run
    --once`), or drop its labels while it listens again."""

    name = "lldp"
    lacking = "network tier 0 unknown"

    def __init__(
        self,
        fs: HostFS | None,
        lldpd_socket: str = AGENT_LLDPD_SOCKET,
        wait_s: float = AGENT_WAIT_S,
        label_style: str = "topo-reporter",
        *,
        await_listen: bool = False,
    ) -> None:
        """`label_style`: one of reporter.schema.network.NETWORK_LABEL_STYLES. `await_listen`:
        the read waits for its listen (`run --once`, which has no next step to take it at)."""
        self.fs = fs
        self.lldpd_socket = lldpd_socket
        self.wait_s = wait_s
        self.label_style = label_style
        self.await_listen = await_listen
        self.silent: tuple[tuple[str, str], ...] = ()
        """(port, how it was asked) of each up port that heard no neighbour at the last
        reading."""
        self._last: NodeReading[str] = NodeReading(None, SourceState.NO_DATA)
        self._lock = threading.Lock()
        self._listening: tuple[str, ...] | None = None
        """The ports a listen under way (or finished, not yet taken) is for."""
        self._listened: list[LldpNeighbour] | CollectError | None = None
        """What the listen heard, once it is over."""

    @property
    def interval_s(self) -> float | None:
        """AGENT_INTERVAL_S; None (the loop's next step) while a listen is under way, so that
        what it hears is taken as soon as it is over."""
        return None if self._listening is not None else AGENT_INTERVAL_S

    def read(self) -> NodeReading[str]:
        if self.fs is None:
            return NodeReading(None, SourceState.NO_DATA, "a simulated machine hears no switch")
        interfaces = rdma_ethernet_netdevs(self.fs)
        if not interfaces:
            return NodeReading(None, SourceState.NO_DATA, "no RDMA NIC with an Ethernet link layer")
        with self._lock:
            listening, listened = self._listening, self._listened
        if listening is not None:
            if listened is None:
                return self._last  # still listening: what was heard before stands
            with self._lock:
                self._listening = self._listened = None
            silent_because = f"no LLDP frame within {self.wait_s:g}s"
            return self._reading(listening, listened, silent_because)
        answer = lldpd_neighbours(self.lldpd_socket, interfaces)
        if answer:
            return self._reading(tuple(interfaces), answer, SILENT_BY_LLDPD)
        self._listening = tuple(interfaces)
        listener = threading.Thread(
            target=self._listen, args=(self._listening,), name="lldp-listen", daemon=True
        )
        listener.start()
        if not self.await_listen:
            return self._last
        # The listen ends by itself within wait_s; the margin only keeps a broken one finite.
        listener.join(self.wait_s + LLDPCLI_TIMEOUT_S)
        return self.read()

    def _listen(self, interfaces: tuple[str, ...]) -> None:
        try:
            heard: list[LldpNeighbour] | CollectError = listen(interfaces, self.wait_s)
        except CollectError as e:
            heard = e
        except Exception as e:
            # Whatever breaks, the listen must end with an answer: a thread that died without
            # one would leave the source listening for ever.
            heard = CollectError(f"listening for LLDP failed: {type(e).__name__}: {e}")
        with self._lock:
            self._listened = heard

    def _reading(
        self,
        interfaces: tuple[str, ...],
        heard: list[LldpNeighbour] | CollectError,
        silent_because: str,
    ) -> NodeReading[str]:
        if isinstance(heard, CollectError):
            self.silent = ()
            self._last = NodeReading(None, SourceState.FAILED, str(heard))
            return self._last
        found = {n.interface for n in heard}
        self.silent = tuple((i, silent_because) for i in interfaces if i not in found and is_up(i))
        if heard:
            self._last = NodeReading(ethernet_tier_0(n.chassis_id for n in heard))
        else:
            problem = _nothing_heard(interfaces, self.wait_s)
            self._last = NodeReading(None, SourceState.FAILED, problem)
        return self._last

    def labels(self, value: str, prefix: str) -> dict[str, str]:
        return tier_labels((value,), prefix, self.label_style)
