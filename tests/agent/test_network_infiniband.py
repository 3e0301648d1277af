"""`--network-infiniband` through the agent against the apiserver double: tiers 0, 1 and 2 on the
Node, under our keys or Topograph's (`--network-label-style`), no write when a scan finds the
same, and a failed scan withdraws the tiers while the loop goes on.

The fabric is a double of `discover` (`DiscoverDouble`): ibsim serves umad to a process run under
its preload, not to the agent's own; tests/cli/test_network_infiniband.py runs the real discovery
on ibsim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reporter.assembly import config_node_sources
from reporter.collect.infiniband import (
    AGENT_INTERVAL_S,
    AGENT_TOTAL_S,
    NO_PAIRED_HCA,
    InfinibandTierSource,
)
from reporter.collect.infiniband_tiers import (
    CORE_GROUP_PREFIX,
    LEAF_GROUP_PREFIX,
    SPINE_GROUP_PREFIX,
    Discovery,
    PortView,
    SmpCounts,
    group_value,
    summarize,
)
from reporter.errors import CollectError
from reporter.publish.patch import owned
from reporter.schema import keys
from reporter.serve.metrics import Metrics
from reporter.settings import Settings
from tests.support.agent_support import NODE, PREFIX, FakeScanner, WireAgent, Wired, ok, topology
from tests.support.kube_double import ApiServerDouble

KUBELET_CONFIG = Path(__file__).parents[1] / "fixtures" / "kubelet" / "gpu-single-numa-node.yaml"
LEAF_A, LEAF_B = 0x2000000000000A01, 0x2000000000000A02
OURS = [f"{PREFIX}/{name}" for name in keys.NETWORK_TIERS]
TOPOGRAPH = [f"fabric.topograph.run/tier-{n}" for n in range(3)]
TWO_TIER = summarize(
    [
        PortView("mlx5_0", 1, 0x100001, LEAF_A, frozenset({LEAF_A, LEAF_B})),
        PortView("mlx5_1", 1, 0x100002, LEAF_B, frozenset({LEAF_A, LEAF_B})),
    ],
    SmpCounts(node_info=8, port_info=8),
)
"""A rail-optimized node: two HCAs on two leaves, under spines that reach both leaves."""
TIERS = (
    group_value(LEAF_GROUP_PREFIX, [LEAF_A, LEAF_B]),
    group_value(SPINE_GROUP_PREFIX, [LEAF_A, LEAF_B]),
    group_value(CORE_GROUP_PREFIX, [LEAF_A, LEAF_B]),
)


@dataclass
class DiscoverDouble:
    """A double of reporter.collect.infiniband.discover: one answer per call (a Discovery, or a
    CollectError it raises), the last repeated; it records the HCAs and the time bound each call
    was given."""

    answers: list[Discovery | CollectError]
    bounds: list[float] = field(default_factory=list)
    hcas: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, names: Sequence[str], total_s: float) -> Discovery:
        answer = self.answers[min(len(self.bounds), len(self.answers) - 1)]
        self.bounds.append(total_s)
        self.hcas.append(tuple(names))
        if isinstance(answer, CollectError):
            raise answer
        return answer


def _source(config: Settings, fabric: DiscoverDouble) -> InfinibandTierSource:
    """The source `run` builds from `config`, with the double in place of the fabric and the
    node's two HCAs named (this machine's sysfs pairs no HCA with a GPU)."""
    sources = config_node_sources(config)
    found = [s for s in sources if isinstance(s, InfinibandTierSource)]
    assert len(found) == 1, sources
    return InfinibandTierSource(
        found[0].simulated,
        found[0].total_s,
        found[0].label_style,
        hcas=("mlx5_0", "mlx5_1"),
        scan=fabric,
    )


def _wired(wire: WireAgent, kubeconfig: Path, source: InfinibandTierSource) -> Wired:
    wired: Wired = wire(
        kubeconfig,
        FakeScanner([ok(topology())]),
        node_sources=(source,),
        network_label_style=source.label_style,
    )
    return wired


def _settings(**kwargs: object) -> Settings:
    return Settings(
        node=NODE, prefix=PREFIX, kubelet_config=str(KUBELET_CONFIG), **kwargs
    ).validate()


def _success(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "topo_reporter_source_success", {"source": "infiniband"}
    )


def test_off_by_default_no_infiniband_source() -> None:
    sources = config_node_sources(_settings())
    assert not [s for s in sources if isinstance(s, InfinibandTierSource)]


@pytest.mark.parametrize(
    ("style", "written", "absent"),
    [("topo-reporter", OURS, TOPOGRAPH), ("topograph", TOPOGRAPH, OURS)],
    ids=["our keys: <prefix>/network-tier-0, -1, -2", "topograph: fabric.topograph.run/tier-0-2"],
)
def test_tiers_0_1_and_2_on_the_node_under_the_styles_keys_and_listed_as_owned(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    wire: WireAgent,
    style: str,
    written: list[str],
    absent: list[str],
) -> None:
    fabric = DiscoverDouble([TWO_TIER])
    config = _settings(network_infiniband=True, network_label_style=style)
    w = _wired(wire, kubeconfig, _source(config, fabric))
    assert w.agent.step()
    labels = apiserver.labels(NODE)
    assert [labels.get(k) for k in written] == list(TIERS)
    assert not set(absent) & set(labels)
    foreign = frozenset(TOPOGRAPH) if style == "topograph" else frozenset()
    assert set(written) <= owned(apiserver.annotations(NODE), PREFIX, foreign)
    assert fabric.bounds == [AGENT_TOTAL_S]
    assert _success(w.metrics) == 1


def test_a_second_identical_scan_makes_no_node_write(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    fabric = DiscoverDouble([TWO_TIER])
    w = _wired(wire, kubeconfig, _source(_settings(network_infiniband=True), fabric))
    assert w.agent.step()
    before = len(apiserver.writes())
    assert before > 0
    w.clock.advance(AGENT_INTERVAL_S)
    assert w.agent.step()
    assert len(fabric.bounds) == 2, "the source was not read again"
    assert len(apiserver.writes()) == before


def test_a_failed_scan_withdraws_the_tiers_and_the_loop_goes_on(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    lost = CollectError("the InfiniBand scan ran out of its 30 s")
    fabric = DiscoverDouble([TWO_TIER, lost, TWO_TIER])
    w = _wired(wire, kubeconfig, _source(_settings(network_infiniband=True), fabric))
    seen = []
    for _ in range(3):
        assert w.agent.step()  # the topology is published whatever the fabric does
        labels = apiserver.labels(NODE)
        seen.append(tuple(labels.get(k) for k in OURS))
        w.clock.advance(AGENT_INTERVAL_S)
    assert seen == [TIERS, (None, None, None), TIERS]
    assert _success(w.metrics) == 1


def test_a_switch_back_to_our_keys_leaves_every_topograph_key_to_the_operator(
    apiserver: ApiServerDouble, kubeconfig: Path, wire: WireAgent
) -> None:
    fabric = DiscoverDouble([TWO_TIER])
    first = _settings(network_infiniband=True, network_label_style="topograph")
    assert _wired(wire, kubeconfig, _source(first, fabric)).agent.step()
    apiserver.edit_node(NODE, {"metadata": {"labels": {"fabric.topograph.run/tier-2": "core"}}})
    then = _wired(wire, kubeconfig, _source(_settings(network_infiniband=True), fabric))
    assert then.agent.step()
    labels = apiserver.labels(NODE)
    assert [labels.get(k) for k in OURS] == list(TIERS)
    # Under the default style no Topograph key is the agent's to delete, even those it wrote and
    # its `owned` list still names (docs/network.md: remove them by hand where Topograph is gone).
    assert {k: v for k, v in labels.items() if k.startswith("fabric.topograph.run/")} == {
        **dict(zip(TOPOGRAPH, TIERS, strict=True)),
        "fabric.topograph.run/tier-2": "core",
    }


@pytest.mark.parametrize(
    ("simulated", "answer", "problem"),
    [
        (True, TWO_TIER, "a simulated machine has no HCA"),
        (False, TWO_TIER, NO_PAIRED_HCA),
    ],
    ids=["simulated machine", "no HCA named, and no topology to pair one with a GPU"],
)
def test_no_port_is_no_data_not_a_failure(simulated: bool, answer: Discovery, problem: str) -> None:
    reading = InfinibandTierSource(simulated, scan=DiscoverDouble([answer])).read()
    assert (reading.value, reading.state.value, reading.problem) == (None, "no_data", problem)


def test_ports_that_reach_no_switch_are_a_failure() -> None:
    lone = summarize([PortView("mlx5_0", 1, 0x100001, None, frozenset())], SmpCounts())
    reading = InfinibandTierSource(False, hcas=("mlx5_0",), scan=DiscoverDouble([lone])).read()
    assert (reading.state.value, reading.problem) == (
        "failed",
        "no InfiniBand port of mlx5_0 is cabled to a switch: check the links (ibstat)",
    )


@pytest.mark.parametrize(
    ("style", "key"),
    [("topo-reporter", OURS[0]), ("topograph", TOPOGRAPH[0])],
    ids=["our key", "topograph's key"],
)
def test_the_lldp_source_takes_the_same_label_style(style: str, key: str) -> None:
    config = _settings(network_lldp=True, network_label_style=style)
    lldp = [s for s in config_node_sources(config) if s.name == "lldp"]
    assert [s.labels("eth-1", PREFIX) for s in lldp] == [{key: "eth-1"}]
