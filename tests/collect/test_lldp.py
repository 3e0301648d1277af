"""Which NICs `network --lldp` reads by default (the RDMA devices' Ethernet ports, from sysfs), how
it asks lldpd (bounded in time and output, and None wherever lldpd cannot answer, so the command
listens itself), and the agent's LLDP source (`--network-lldp`): each way it reads, as a reading
and as its label. The real lldpd is in test_lldp_namespaces.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from parsers.lldp import LldpNeighbour
from reporter.collect import SourceState, lldp
from reporter.collect.lldp import LldpTierSource, lldpd_neighbours, rdma_ethernet_netdevs
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
HEARD = LldpNeighbour("ens1f0", "aa:bb:cc:dd:ee:01", "swp1", "tor-a", 120)


@pytest.mark.parametrize(
    ("files", "lldpd", "listened", "state", "said"),
    [
        (ROCE_PORT, [HEARD], [], SourceState.OK, None),
        (ROCE_PORT, None, [HEARD], SourceState.OK, None),
        (None, None, [], SourceState.NO_DATA, "a simulated machine hears no switch"),
        ({}, None, [], SourceState.NO_DATA, "no RDMA NIC with an Ethernet link layer"),
        (ROCE_PORT, None, [], SourceState.FAILED, "no LLDP neighbour heard on ens1f0 within 35s"),
    ],
    ids=[
        "lldpd hears the ToR: its tier 0",
        "no lldpd: the frames heard give the same tier 0",
        "a simulated machine is no data",
        "a host without a RoCE port is no data",
        "a RoCE port that hears no switch is a failure, saying what to check",
    ],
)
def test_the_agents_lldp_source_reads_tier_0(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str] | None,
    lldpd: list[LldpNeighbour] | None,
    listened: list[LldpNeighbour],
    state: SourceState,
    said: str | None,
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: lldpd)
    monkeypatch.setattr(lldp, "listen", lambda *_: listened)
    source = LldpTierSource(None if files is None else MemoryHostFS(files, {}))
    reading = source.read()
    assert reading.state is state
    assert reading.problem is None if said is None else said in (reading.problem or "")
    if state is SourceState.OK:
        assert reading.value == ethernet_tier_0(["aa:bb:cc:dd:ee:01"])
        assert source.labels(reading.value, "example.com") == {
            f"example.com/{keys.NETWORK_TIER_0}": reading.value
        }
