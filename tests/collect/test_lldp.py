"""Which NICs `network --lldp` reads by default (the RDMA devices' Ethernet ports, from sysfs), how
it asks lldpd (bounded in time and output, and None wherever lldpd cannot answer, so the command
listens itself), and the agent's LLDP source (`--network-lldp`): each way it reads, as a reading
and as its label. The real lldpd is in test_lldp_namespaces.py."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from parsers.lldp import LldpNeighbour
from reporter.collect import NodeReading, SourceState, lldp
from reporter.collect.lldp import LldpTierSource, lldpd_neighbours, rdma_ethernet_netdevs
from reporter.errors import CollectError
from reporter.hostfs import MemoryHostFS
from reporter.schema import keys
from reporter.schema.network import ethernet_tier_0

IB = "class/infiniband"
SLEEP, HEAD, TR = (shutil.which(tool) for tool in ("sleep", "head", "tr"))


def port(device: str, n: int, link_layer: str, ndev: str | None) -> dict[str, str]:
    files = {f"{IB}/{device}/ports/{n}/link_layer": f"{link_layer}\n"}
    if ndev is not None:
        files[f"{IB}/{device}/ports/{n}/gid_attrs/ndevs/0"] = f"{ndev}\n"
    return files


@pytest.mark.parametrize(
    ("files", "netdevs"),
    [
        (
            {**port("mlx5_0", 1, "Ethernet", "ens1f0"), **port("mlx5_1", 1, "Ethernet", "ens1f1")},
            ["ens1f0", "ens1f1"],
        ),
        (
            {**port("mlx5_0", 1, "InfiniBand", None), **port("mlx5_1", 1, "Ethernet", "ens2")},
            ["ens2"],
        ),
        (
            {
                **port("mlx5_0", 1, "Ethernet", None),
                f"{IB}/mlx5_0/device/net/enp65s0f0/ifindex": "4",
            },
            ["enp65s0f0"],
        ),
        (
            {**port("mlx5_0", 1, "Ethernet", "ens1"), **port("mlx5_bond_0", 1, "Ethernet", "ens1")},
            ["ens1"],
        ),
        (
            {
                **port("mlx5_0", 1, "Ethernet", "bad name/../x"),
                **port("mlx5_1", 1, "Ethernet", "e"),
            },
            ["e"],
        ),
        ({f"{IB}/mlx5_0/node_guid": "x"}, []),
        ({"class/net/eth0/mtu": "1500"}, []),
    ],
    ids=[
        "two RoCE ports, each its netdev",
        "an InfiniBand port is not read by LLDP",
        "no gid netdev: the device's net/ directory names it",
        "two RDMA devices on one netdev (a bond) name it once",
        "a netdev name that cannot be one is left out",
        "an RDMA device without ports",
        "no RDMA device at all",
    ],
)
def test_the_compute_nics_are_the_rdma_ethernet_ports(
    files: dict[str, str], netdevs: list[str]
) -> None:
    assert rdma_ethernet_netdevs(MemoryHostFS(files, {})) == netdevs


def fake_lldpcli(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "lldpcli"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


ANSWER = json.dumps(
    {
        "lldp": [
            {
                "interface": [
                    {
                        "name": name,
                        "chassis": [{"id": [{"type": "mac", "value": "aa:bb:cc:dd:ee:01"}]}],
                        "port": [{"id": [{"type": "local", "value": f"swp{i}"}]}],
                    }
                    for i, name in enumerate(["c0", "mgmt0"])
                ]
            }
        ]
    }
)


@pytest.mark.parametrize(
    ("body", "heard"),
    [
        (f"echo '{ANSWER}'", [LldpNeighbour("c0", "aa:bb:cc:dd:ee:01", "swp0", None)]),
        ("echo '{\"lldp\": [{}]}'", []),
        ("echo 'unable to connect to socket' >&2; exit 1", None),
        ("echo 'not json'", None),
        (f"{SLEEP} 30; echo '{ANSWER}'", None),
        (f"echo '{ANSWER}'; {HEAD} -c 5000000 /dev/zero | {TR} '\\0' ' '", None),
    ],
    ids=[
        "lldpd's neighbours, of the interfaces asked for only",
        "lldpd hears no one",
        "no lldpd answers on the socket",
        "an answer that does not read",
        "lldpcli hangs: killed at its deadline, what it would say later unread",
        "an answer padded past what lldpcli writes: refused",
    ],
)
def test_lldpd_is_asked_within_bounds(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    heard: list[LldpNeighbour] | None,
) -> None:
    fake_lldpcli(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(lldp, "LLDPCLI_TIMEOUT_S", 0.5)
    assert lldpd_neighbours(str(tmp_path / "lldpd.socket"), ["c0"]) == heard


def test_no_lldpcli_installed_is_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert lldpd_neighbours("/run/lldpd.socket", ["c0"]) is None


ROCE_PORT = port("mlx5_0", 1, "Ethernet", "ens1f0")
TWO_PORTS = {**ROCE_PORT, **port("mlx5_1", 1, "Ethernet", "ens1f1")}
HEARD = LldpNeighbour("ens1f0", "aa:bb:cc:dd:ee:01", "swp1", "tor-a", 120)
TWO = ("ens1f0", "ens1f1")


@dataclass
class Listening:
    """A double of `listen` that answers `heard` once released, and the threads it ran on."""

    heard: list[LldpNeighbour] | Exception
    released: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __call__(self, interfaces: Sequence[str], wait_s: float) -> list[LldpNeighbour]:
        self.threads.append(threading.current_thread())
        self.entered.set()
        assert self.released.wait(30), "the test never released the listen"
        if isinstance(self.heard, Exception):
            raise self.heard
        return self.heard

    def finish(self) -> None:
        """Let the listen answer, and wait until its thread has handed the answer over."""
        self.released.set()
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive()


def read_through(source: LldpTierSource) -> NodeReading[str]:
    """One reading as the agent's loop gets it: a read, and where it started a listen, the read
    at the loop's next step once the listen is over."""
    reading = source.read()
    listening = lldp.listen
    if source.interval_s is None:  # a listen is under way: read again at the next step
        assert isinstance(listening, Listening)
        assert listening.entered.wait(30)
        listening.finish()
        reading = source.read()
    return reading


@pytest.mark.parametrize(
    ("files", "lldpd", "listened", "state", "said"),
    [
        (ROCE_PORT, [HEARD], [], SourceState.OK, None),
        (ROCE_PORT, None, [HEARD], SourceState.OK, None),
        (None, None, [], SourceState.NO_DATA, "a simulated machine hears no switch"),
        ({}, None, [], SourceState.NO_DATA, "no RDMA NIC with an Ethernet link layer"),
        (ROCE_PORT, None, [], SourceState.FAILED, "no LLDP neighbour heard on ens1f0 within 35s"),
        (
            ROCE_PORT,
            None,
            CollectError("listening for LLDP needs a raw socket (CAP_NET_RAW)"),
            SourceState.FAILED,
            "listening for LLDP needs a raw socket (CAP_NET_RAW)",
        ),
        (
            ROCE_PORT,
            None,
            MemoryError("the listen broke"),
            SourceState.FAILED,
            "listening for LLDP failed: MemoryError: the listen broke",
        ),
    ],
    ids=[
        "lldpd hears the ToR: its tier 0",
        "no lldpd: the frames heard give the same tier 0",
        "a simulated machine is no data",
        "a host without a RoCE port is no data",
        "a RoCE port that hears no switch is a failure, saying what to check",
        "a listen that cannot be made is a failure, saying why",
        "a listen that breaks still ends, as a failure",
    ],
)
def test_the_agents_lldp_source_reads_tier_0(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str] | None,
    lldpd: list[LldpNeighbour] | None,
    listened: list[LldpNeighbour] | Exception,
    state: SourceState,
    said: str | None,
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: lldpd)
    monkeypatch.setattr(lldp, "listen", Listening(listened))
    source = LldpTierSource(None if files is None else MemoryHostFS(files, {}))
    reading = read_through(source)
    assert reading.state is state
    assert reading.problem is None if said is None else said in (reading.problem or "")
    assert source.interval_s == lldp.AGENT_INTERVAL_S
    if state is SourceState.OK:
        assert reading.value == ethernet_tier_0(["aa:bb:cc:dd:ee:01"])
        assert source.labels(reading.value, "example.com") == {
            f"example.com/{keys.NETWORK_TIER_0}": reading.value
        }


def test_a_listen_never_holds_the_read_and_what_was_heard_stands_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: None)
    first = Listening([HEARD])
    monkeypatch.setattr(lldp, "listen", first)
    source = LldpTierSource(MemoryHostFS(ROCE_PORT, {}))
    # The first read starts the listen and returns while it waits: nothing heard yet.
    assert source.read() == NodeReading(None, SourceState.NO_DATA)
    assert source.interval_s is None
    assert first.entered.wait(30)
    # Read again before it is over: still nothing, and no second listen.
    assert source.read() == NodeReading(None, SourceState.NO_DATA)
    assert len(first.threads) == 1
    first.finish()
    heard = source.read()
    assert heard.value == ethernet_tier_0([HEARD.chassis_id])
    assert source.interval_s == lldp.AGENT_INTERVAL_S
    # Ten minutes later it listens again, and keeps the tier it heard while it does.
    again = Listening([])
    monkeypatch.setattr(lldp, "listen", again)
    assert source.read() == heard
    assert again.entered.wait(30)
    again.finish()
    assert source.read().state is SourceState.FAILED


@pytest.mark.parametrize(
    ("lldpd", "listened", "up", "silent"),
    [
        ([HEARD], [], {"ens1f0", "ens1f1"}, [("ens1f1", lldp.SILENT_BY_LLDPD)]),
        (None, [HEARD], {"ens1f0", "ens1f1"}, [("ens1f1", "no LLDP frame within 35s")]),
        (None, [HEARD], {"ens1f0"}, []),
        (None, [], {"ens1f0", "ens1f1"}, [(p, "no LLDP frame within 35s") for p in TWO]),
        (None, CollectError("no CAP_NET_RAW"), {"ens1f0", "ens1f1"}, []),
    ],
    ids=[
        "lldpd hears one port of two: the other, up, is silent",
        "a listen hears one port of two: the other, up, is silent",
        "a port that is down is not silent: it is down",
        "no port hears: both silent, and the reading failed",
        "a listen that could not be made says nothing of the ports",
    ],
)
def test_the_up_ports_that_hear_no_neighbour_are_told(
    monkeypatch: pytest.MonkeyPatch,
    lldpd: list[LldpNeighbour] | None,
    listened: list[LldpNeighbour] | CollectError,
    up: set[str],
    silent: list[tuple[str, str]],
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: lldpd)
    monkeypatch.setattr(lldp, "listen", Listening(listened))
    monkeypatch.setattr(lldp, "is_up", lambda name: name in up)
    source = LldpTierSource(MemoryHostFS(TWO_PORTS, {}))
    read_through(source)
    assert list(source.silent) == silent


def test_is_up_reads_the_interfaces_flags() -> None:
    assert lldp.is_up("lo")
    assert not lldp.is_up("absent0")
    assert not lldp.is_up("x" * 40)


def test_with_await_listen_the_one_read_waits_for_its_listen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `run --once` has no next step: its one read must carry what the listen heard.
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: None)
    listening = Listening([HEARD])
    listening.released.set()
    monkeypatch.setattr(lldp, "listen", listening)
    source = LldpTierSource(MemoryHostFS(ROCE_PORT, {}), await_listen=True)
    assert source.read().value == ethernet_tier_0([HEARD.chassis_id])
    assert source.interval_s == lldp.AGENT_INTERVAL_S
    assert len(listening.threads) == 1
