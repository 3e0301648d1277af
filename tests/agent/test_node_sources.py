"""The node-source seam: a source plugged into the one tuple (reporter.assembly.config_node_sources)
adds its labels beside the topology's and the kubelet's, is read on its own cadence, and its
failure (a FAILED reading, or a read that raises) takes away only its own labels, shows in its
metric and in /readyz, and never stops the topology from being published or the loop from running.

The source here is a toy defined in this test, never in product code: what a new source is to
write, and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from parsers.lldp import LldpNeighbour
from reporter.assembly import config_node_sources
from reporter.collect import NodeReading, NodeSource, SourceState
from reporter.collect.kubelet import KubeletReading, read_kubelet
from reporter.schema import keys
from reporter.schema.labels import kubelet_labels
from reporter.schema.labels import labels as topology_labels
from reporter.schema.network import ethernet_tier_0
from reporter.serve.metrics import Metrics
from reporter.settings import Settings
from tests.support.agent_support import (
    NODE,
    PREFIX,
    ClockedStop,
    FakeClock,
    FakeScanner,
    WireAgent,
    Wired,
    ok,
    topology,
)
from tests.support.kube_double import ApiServerDouble

KUBELET_CONFIG = Path(__file__).parents[1] / "fixtures" / "kubelet" / "gpu-single-numa-node.yaml"
TOY_LABEL = f"{PREFIX}/toy-tier"
TOY_INTERVAL_S = 150.0
"""Slower than the topology's 60 s interval: read at the steps at 0, 180 and 360 s of seven."""
TOY_READ_S = 0.25
"""How long each read takes on the fake clock."""


@dataclass
class ToySource:
    """A node source answering what `answers` says, one answer per read: a value, an error text
    (FAILED) or an exception (a read that breaks its promise not to raise); each read takes
    TOY_READ_S on `clock`."""

    answers: list[str | Exception]
    clock: FakeClock = field(default_factory=FakeClock)
    reads: int = 0
    name = "toy"
    interval_s = TOY_INTERVAL_S
    lacking = "no toy-tier label"

    def read(self) -> NodeReading[str]:
        answer = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        self.clock.advance(TOY_READ_S)
        if isinstance(answer, Exception):
            raise answer
        if answer.startswith("error: "):
            return NodeReading(None, SourceState.FAILED, answer.removeprefix("error: "))
        return NodeReading(answer)

    def labels(self, value: str, prefix: str) -> dict[str, str]:
        return {f"{prefix}/toy-tier": value}


def _wired(wire: WireAgent, kubeconfig: Path, toy: ToySource, **kwargs: object) -> Wired:
    """The agent as `run` builds it, with the toy added to the one tuple of node sources."""
    kubelet = Settings(node=NODE, prefix=PREFIX, kubelet_config=str(KUBELET_CONFIG))
    sources: tuple[NodeSource[Any], ...] = (*config_node_sources(kubelet), toy)
    wired: Wired = wire(kubeconfig, FakeScanner([ok(topology())]), node_sources=sources, **kwargs)
    return wired


def _success(metrics: Metrics, source: str) -> float | None:
    return metrics.registry.get_sample_value("topo_reporter_source_success", {"source": source})


def test_a_toy_source_in_the_tuple_adds_its_one_label_beside_the_topologys_and_the_kubelets(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    clock = FakeClock()
    w = _wired(wire, kubeconfig, ToySource(["leaf-7"], clock), clock=clock)
    assert w.agent.step()
    node = apiserver.labels(NODE)
    ours = {k: v for k, v in node.items() if k.startswith(f"{PREFIX}/")}
    policies = read_kubelet(KUBELET_CONFIG).policies
    assert policies is not None
    kubelet = kubelet_labels(policies, PREFIX)
    assert kubelet[f"{PREFIX}/{keys.TOPOLOGY_MANAGER_POLICY}"] == "single-numa-node"
    assert ours == topology_labels(topology(), PREFIX, NODE) | kubelet | {TOY_LABEL: "leaf-7"}
    assert _success(w.metrics, "toy") == 1
    assert _success(w.metrics, "kubelet_config") == 1
    duration = w.metrics.registry.get_sample_value(
        "topo_reporter_source_duration_seconds", {"source": "toy"}
    )
    assert duration == TOY_READ_S


def test_a_source_is_read_on_its_own_cadence_not_at_every_scan(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    toy = ToySource(["leaf-1", "leaf-2", "leaf-3"])
    w = _wired(wire, kubeconfig, toy)
    seen = []
    for _ in range(7):  # steps at 0, 60, ..., 360 s
        assert w.agent.step()
        seen.append(apiserver.labels(NODE)[TOY_LABEL])
        w.clock.advance(60)
    assert toy.reads == 3
    assert seen == ["leaf-1"] * 3 + ["leaf-2"] * 3 + ["leaf-3"]
    assert w.scanner.calls == 7


@pytest.mark.parametrize(
    ("failure", "problem"),
    [
        ("error: no fabric manager answered", "no fabric manager answered"),
        (RuntimeError("the toy broke"), "RuntimeError: the toy broke"),
    ],
    ids=["a FAILED reading", "a read that raises"],
)
def test_a_failing_source_takes_only_its_own_label_away_and_says_so_in_its_metric_and_readyz(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    wire: WireAgent,
    failure: str | Exception,
    problem: str,
) -> None:
    toy = ToySource(["leaf-7", failure, "leaf-8"])
    w = _wired(wire, kubeconfig, toy)
    assert w.agent.step()
    before = apiserver.labels(NODE)
    w.clock.advance(TOY_INTERVAL_S)
    with capture_logs() as logs:
        assert w.agent.step()  # the topology is still published: the step succeeds
    after = apiserver.labels(NODE)
    assert TOY_LABEL not in after
    assert after == {k: v for k, v in before.items() if k != TOY_LABEL}
    assert _success(w.metrics, "toy") == 0
    assert _success(w.metrics, "kubelet_config") == 1
    assert _success(w.metrics, "nvml") == 1
    verdict = w.state.readiness()
    assert verdict.ok
    assert verdict.reason == f"ok; no toy-tier label: {problem}"
    assert [(e["event"], e["error"]) for e in logs if e["event"] == "toy_unreadable"] == [
        ("toy_unreadable", problem)
    ]
    # It answers again: its label comes back, the metric and /readyz clear.
    w.clock.advance(TOY_INTERVAL_S)
    assert w.agent.step()
    assert apiserver.labels(NODE)[TOY_LABEL] == "leaf-8"
    assert _success(w.metrics, "toy") == 1
    assert w.state.readiness().reason == "ok"


def test_a_source_that_keeps_raising_never_stops_the_loop(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    clock = FakeClock()
    stop = ClockedStop(clock, waits=5)
    toy = ToySource([RuntimeError("always")])
    w = _wired(wire, kubeconfig, toy, clock=clock, stop=stop, interval_s=TOY_INTERVAL_S)
    w.agent.run()
    assert len(stop.waited) == 5
    assert toy.reads == 5
    assert w.scanner.calls == 5
    assert w.state.readiness().ok
    assert apiserver.labels(NODE)[f"{PREFIX}/{keys.COUNT}"] == "8"
    assert _success(w.metrics, "toy") == 0


def test_the_kubelet_source_is_read_at_every_step_and_an_absent_config_is_no_failure(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path, wire: WireAgent
) -> None:
    calls: list[None] = []

    def reader() -> KubeletReading:
        calls.append(None)
        return read_kubelet(tmp_path / "absent.yaml")

    w = wire(kubeconfig, FakeScanner([ok(topology())]), kubelet=reader)
    for _ in range(3):
        assert w.agent.step()
        w.clock.advance(60)
    assert len(calls) == 3
    assert _success(w.metrics, "kubelet_config") == 1


@pytest.mark.parametrize(
    ("on", "published"),
    [(False, False), (True, True)],
    ids=["off by default: no LLDP source, no tier label", "--network-lldp: tier 0 on the Node"],
)
def test_network_lldp_publishes_tier_0_from_the_roce_ports_switch(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    tmp_path: Path,
    wire: WireAgent,
    monkeypatch: pytest.MonkeyPatch,
    on: bool,
    published: bool,
) -> None:
    roce = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (roce / "gid_attrs" / "ndevs").mkdir(parents=True)
    (roce / "link_layer").write_text("Ethernet\n")
    (roce / "gid_attrs" / "ndevs" / "0").write_text("ens1f0\n")
    tor = LldpNeighbour("ens1f0", "aa:bb:cc:dd:ee:01", "swp1", "tor-a", 120)
    monkeypatch.setattr("reporter.collect.lldp.lldpd_neighbours", lambda *_: [tor])
    config = Settings(
        node=NODE,
        prefix=PREFIX,
        kubelet_config=str(KUBELET_CONFIG),
        sysfs_root=str(tmp_path / "sys"),
        network_lldp=on,
    )
    sources = config_node_sources(config)
    w = wire(kubeconfig, FakeScanner([ok(topology())]), node_sources=sources)
    assert w.agent.step()
    tier = apiserver.labels(NODE).get(f"{PREFIX}/{keys.NETWORK_TIER_0}")
    assert tier == (ethernet_tier_0(["aa:bb:cc:dd:ee:01"]) if published else None)
    assert (_success(w.metrics, "lldp") == 1) is published
