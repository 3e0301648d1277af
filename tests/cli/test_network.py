"""`topo-reporter network --lldp` as a user runs it: the JSON object and the table it prints, the
interfaces it reads by default, and a warning for a NIC that heard nothing. The readers are
replaced here (the real lldpd and sockets are in tests/collect/test_lldp_namespaces.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from parsers.lldp import LldpNeighbour
from reporter import cli
from reporter.schema.network import ethernet_tier_0

TOR_A = LldpNeighbour("ens1f0", "aa:bb:cc:00:00:01", "Ethernet1/7", "leaf-a", 4)
TOR_B = LldpNeighbour("ens1f1", "aa:bb:cc:00:00:02", "swp7", None, 4)


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Sequence[str]]]:
    """lldpd answers nothing; listening hears TOR_A and TOR_B on their NICs. Returns each reader's
    calls with the interfaces it was asked for."""
    calls: list[tuple[str, Sequence[str]]] = []

    def lldpd(socket_path: str, interfaces: Sequence[str]) -> None:
        calls.append(("lldpd", list(interfaces)))

    def listen(interfaces: Sequence[str], wait_s: float) -> list[LldpNeighbour]:
        calls.append(("listen", list(interfaces)))
        return [n for n in (TOR_A, TOR_B) if n.interface in interfaces]

    monkeypatch.setattr("reporter.collect.lldp.lldpd_neighbours", lldpd)
    monkeypatch.setattr("reporter.collect.lldp.listen", listen)
    return calls


def sysfs(root: Path, *netdevs: str) -> Path:
    for i, netdev in enumerate(netdevs):
        port = root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port / "link_layer").write_text("Ethernet\n")
        (port / "gid_attrs" / "ndevs" / "0").write_text(f"{netdev}\n")
    return root


def test_json_is_the_source_the_tier_and_each_interfaces_switch(
    heard: list[tuple[str, Sequence[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["network", "--lldp", "--interface", "ens1f0", "--interface", "ens1f1"]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {
        "source": "lldp",
        "tiers": [ethernet_tier_0(["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02"])],
        "interfaces": [
            {
                "name": "ens1f0",
                "chassis_id": "aa:bb:cc:00:00:01",
                "system_name": "leaf-a",
                "port_id": "Ethernet1/7",
            },
            {
                "name": "ens1f1",
                "chassis_id": "aa:bb:cc:00:00:02",
                "system_name": None,
                "port_id": "swp7",
            },
        ],
    }
    assert heard == [("lldpd", ["ens1f0", "ens1f1"]), ("listen", ["ens1f0", "ens1f1"])]


def test_the_text_format_is_a_table(
    heard: list[tuple[str, Sequence[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "network",
        "--lldp",
        "--format",
        "text",
        "--interface",
        "ens1f0",
        "--interface",
        "ens1f1",
    ]
    assert cli.main(argv) == 0
    tier = ethernet_tier_0(["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02"])
    assert capsys.readouterr().out.splitlines() == [
        f"tier 0: {tier}",
        "NAME    CHASSIS ID         SYSTEM NAME  PORT ID",
        "ens1f0  aa:bb:cc:00:00:01  leaf-a       Ethernet1/7",
        "ens1f1  aa:bb:cc:00:00:02  -            swp7",
    ]


def test_by_default_it_reads_the_rdma_ethernet_ports_and_warns_of_a_silent_one(
    heard: list[tuple[str, Sequence[str]]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = sysfs(tmp_path / "sys", "ens1f0", "ens2f0")
    assert cli.main(["network", "--lldp", "--sysfs-root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert heard[-1] == ("listen", ["ens1f0", "ens2f0"])
    assert json.loads(out)["tiers"] == [ethernet_tier_0(["aa:bb:cc:00:00:01"])]
    assert err == "topo-reporter: warning: ens2f0: no LLDP neighbour heard\n"


def test_lldpds_answer_is_used_without_listening(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def listen(interfaces: Sequence[str], wait_s: float) -> list[LldpNeighbour]:
        raise AssertionError("listened although lldpd answered")

    monkeypatch.setattr("reporter.collect.lldp.lldpd_neighbours", lambda *_: [TOR_B])
    monkeypatch.setattr("reporter.collect.lldp.listen", listen)
    assert cli.main(["network", "--lldp", "--interface", "ens1f1"]) == 0
    assert json.loads(capsys.readouterr().out)["interfaces"][0]["port_id"] == "swp7"
