"""The LLDP source in the agent's loop (`run --network-lldp`), against the API server double: a
listen never holds the loop (the GPU topology is published while it waits, and its tier when it is
over), and an up RoCE port that hears no neighbour is told as a `RoCEPortSilent` Warning Event,
which `topo-reporter doctor --node` then shows. The listen is a double here, released by the test:
the real sockets and lldpd are in test_lldp_namespaces.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reporter.assembly import config_node_sources
from reporter.cli import main
from reporter.collect import NodeSource, lldp
from reporter.collect.lldp import LldpTierSource
from reporter.schema import keys
from reporter.schema.network import ethernet_tier_0
from reporter.settings import Settings
from tests.collect.test_lldp import HEARD, Listening
from tests.support.agent_support import NODE, PREFIX, FakeScanner, WireAgent, ok, topology
from tests.support.kube_double import ApiServerDouble

TIER_0 = f"{PREFIX}/{keys.NETWORK_TIER_0}"
COUNT = f"{PREFIX}/{keys.COUNT}"


def roce_sysfs(root: Path, *ports: str) -> Path:
    """A sysfs tree with one RDMA device per netdev in `ports`, its link layer Ethernet."""
    for i, netdev in enumerate(ports):
        port = root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port / "link_layer").write_text("Ethernet\n")
        (port / "gid_attrs" / "ndevs" / "0").write_text(f"{netdev}\n")
    return root


def lldp_sources(sysfs: Path, *, once: bool = False) -> tuple[NodeSource[Any], ...]:
    config = Settings(
        node=NODE,
        prefix=PREFIX,
        kubelet_config="/nonexistent",
        sysfs_root=str(sysfs),
        network_lldp=True,
        once=once,
    )
    return config_node_sources(config)


def test_the_topology_is_published_while_the_listen_waits_and_tier_0_when_it_is_over(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    tmp_path: Path,
    wire: WireAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: None)
    listening = Listening([HEARD])
    monkeypatch.setattr(lldp, "listen", listening)
    sources = lldp_sources(roce_sysfs(tmp_path / "sys", "ens1f0"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]), node_sources=sources)
    assert w.agent.step()
    assert listening.entered.wait(30)
    # The listen still waits (the test has not released it): the GPUs are on the Node already.
    labels = apiserver.labels(NODE)
    assert labels[COUNT] == "8"
    assert TIER_0 not in labels
    w.clock.advance(60)
    assert w.agent.step()  # one step later, still waiting: published as before
    assert TIER_0 not in apiserver.labels(NODE)
    listening.finish()
    w.clock.advance(60)
    assert w.agent.step()
    assert apiserver.labels(NODE)[TIER_0] == ethernet_tier_0([HEARD.chassis_id])
    assert len(listening.threads) == 1


def test_run_once_waits_for_the_listen_its_one_step_publishes(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    tmp_path: Path,
    wire: WireAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: None)
    listening = Listening([HEARD])
    listening.released.set()
    monkeypatch.setattr(lldp, "listen", listening)
    sources = lldp_sources(roce_sysfs(tmp_path / "sys", "ens1f0"), once=True)
    w = wire(kubeconfig, FakeScanner([ok(topology())]), node_sources=sources)
    assert w.agent.step()
    assert apiserver.labels(NODE)[TIER_0] == ethernet_tier_0([HEARD.chassis_id])


def test_an_up_port_that_hears_nothing_is_told_once_and_the_doctor_shows_it(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    admin_kubeconfig: Path,
    tmp_path: Path,
    wire: WireAgent,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # lldpd answers for ens1f0 only; ens1f1 is up and hears nothing.
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: [HEARD])
    monkeypatch.setattr(lldp, "is_up", lambda name: name in ("ens1f0", "ens1f1"))
    sources = lldp_sources(roce_sysfs(tmp_path / "sys", "ens1f0", "ens1f1"))
    w = wire(kubeconfig, FakeScanner([ok(topology())]), node_sources=sources)
    for _ in range(3):
        assert w.agent.step()
        w.clock.advance(lldp.AGENT_INTERVAL_S)
    assert apiserver.labels(NODE)[TIER_0] == ethernet_tier_0([HEARD.chassis_id])
    told = [e for e in apiserver.events if e["reason"] == "RoCEPortSilent"]
    assert len(told) == 1  # once, not at every read
    assert told[0]["type"] == "Warning"
    assert told[0]["message"].startswith(
        "RoCE ports ens1f1 are up but hear no LLDP neighbour: their switch is missing from "
        "network-tier-0"
    )
    assert "Evidence: ens1f1: up, lldpd hears no neighbour there. Fix: " in told[0]["message"]
    assert "disable-fw-lldp on" in told[0]["message"]
    # The agent's Event is what the doctor, off the node, knows of it.
    apiserver.add_pod(
        "gpu-topology",
        f"topo-reporter-{NODE}",
        node=NODE,
        ready=True,
        labels={"app.kubernetes.io/name": "topo-reporter"},
    )
    capsys.readouterr()  # what the agent's loop printed
    status = main(
        ["doctor", "--kubeconfig", str(admin_kubeconfig), "--node", NODE, "--format", "json"]
    )
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    silent = [f for f in node["findings"] if f["code"] == "roce-port-silent"]
    assert status == 0
    assert [f["summary"] for f in silent] == [told[0]["message"].split(". Evidence: ")[0]]
    (evidence,) = silent[0]["evidence"]
    assert evidence.startswith("the agent's RoCEPortSilent Event of ")
    assert evidence.endswith(": ens1f1: up, lldpd hears no neighbour there")
    assert "mlxconfig" in silent[0]["fix"]
    # The other port hears its switch again: the finding goes, and coming back is told again.
    assert isinstance(sources[1], LldpTierSource)
    both = [HEARD, HEARD.__class__("ens1f1", "aa:bb:cc:dd:ee:02", "swp2", "tor-b", 120)]
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: both)
    assert w.agent.step()
    assert sources[1].silent == ()
    monkeypatch.setattr(lldp, "lldpd_neighbours", lambda *_: [HEARD])
    w.clock.advance(lldp.AGENT_INTERVAL_S)
    assert w.agent.step()
    assert len([e for e in apiserver.events if e["reason"] == "RoCEPortSilent"]) == 2
