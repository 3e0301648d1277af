"""The extender's capacity per network group (issue 43, item 6): over marin#6950's 64 H100 nodes
in 15 leaf groups, `topo_reporter_extender_network_group_free_nodes{tier,group}` against a count
from scratch; kept as nodes move and go; bounded in series whatever the labels say."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from reporter.extender.cache import NodeCache
from reporter.extender.server import MAX_NETWORK_SERIES, ExtenderMetrics
from reporter.publish.watch import NodeAnnotation, WatchEvent, node_annotation
from tests.extender.test_metrics import FREE as FREE_GPUS
from tests.extender.test_metrics import text
from tests.support.leaf_groups import GPUS, GROUP_SIZES, PREFIX, SPINE, leaf, leaf_cluster
from tests.support.node_events import Event, events, replay

KEY = f"{PREFIX}/availability"
TIER_0 = f"{PREFIX}/network-tier-0"
FREE = "topo_reporter_extender_network_group_free_nodes"
UNLISTED = "topo_reporter_extender_network_groups_unlisted"


def network_gauges(metrics: ExtenderMetrics) -> tuple[dict[tuple[str, str], float], float]:
    """The free-node gauge by (tier, group), and the count of groups left out."""
    free: dict[tuple[str, str], float] = {}
    unlisted = -1.0
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == FREE:
                free[s.labels["tier"], s.labels["group"]] = s.value
            elif s.name == UNLISTED:
                unlisted = s.value
    return free, unlisted


def test_the_cluster_is_marin_6950s_shape() -> None:
    cluster = leaf_cluster(0)
    sizes = Counter(cluster.group.values())
    assert len(cluster.nodes) == 64
    assert len(sizes) == 15
    assert min(sizes.values()) == 1
    assert max(sizes.values()) == 11
    assert sum(n >= 8 for n in sizes.values()) == 2


@pytest.mark.parametrize("seed", range(4), ids=[f"seed {s}" for s in range(4)])
def test_whole_free_nodes_per_leaf_group_equal_a_count_from_scratch(seed: int) -> None:
    cluster = leaf_cluster(seed)
    cache = NodeCache(PREFIX)
    cache.replace(node_annotation(n, KEY) for n in cluster.nodes)
    free, unlisted = network_gauges(ExtenderMetrics(cache))
    want = {("0", leaf(g)): 0.0 for g in range(len(GROUP_SIZES))}
    for name, group in cluster.group.items():
        want["0", group] += cluster.free[name] == GPUS
    want["1", SPINE] = float(sum(f == GPUS for f in cluster.free.values()))
    assert free == want
    assert unlisted == 0
    members = Counter(cluster.group.values())
    assert cache.network_capacity() == {
        **{(0, g): (members[g], int(want["0", g])) for g in members},
        (1, SPINE): (64, int(want["1", SPINE])),
    }


def test_a_node_that_moves_leaf_group_or_goes_moves_in_the_counts() -> None:
    cache = NodeCache(PREFIX)

    def node(name: str, group: str, free: str) -> NodeAnnotation:
        labels = {TIER_0: group, f"{PREFIX}/count": "8"}
        return NodeAnnotation(name, text(free), {"metadata": {"labels": labels}}, None, 8)

    cache.replace([node("a", "leaf-1", "whole"), node("b", "leaf-1", "four")])
    assert cache.network_capacity() == {(0, "leaf-1"): (2, 1)}
    cache.apply(WatchEvent("MODIFIED", node("a", "leaf-2", "whole"), "2"))
    assert cache.network_capacity() == {(0, "leaf-1"): (1, 0), (0, "leaf-2"): (1, 1)}
    cache.apply(WatchEvent("MODIFIED", node("b", "leaf-1", "whole"), "3"))
    assert cache.network_capacity() == {(0, "leaf-1"): (1, 1), (0, "leaf-2"): (1, 1)}
    cache.apply(WatchEvent("DELETED", node("a", "leaf-2", "whole"), "4"))
    assert cache.network_capacity() == {(0, "leaf-1"): (1, 1)}
    unlabelled = NodeAnnotation("b", text("whole"), {"metadata": {"labels": {}}}, None, 8)
    cache.apply(WatchEvent("MODIFIED", unlabelled, "5"))
    assert cache.network_capacity() == {}


def test_labels_of_one_value_per_node_make_at_most_the_capped_series() -> None:
    # A labeller writing each node's own name as its leaf group: the series stop at the cap and
    # the rest are counted, not listed.
    extra = 3
    nodes = [
        NodeAnnotation(
            f"n{i:05d}", text("whole"), {"metadata": {"labels": {TIER_0: f"g{i:05d}"}}}, None, 8
        )
        for i in range(MAX_NETWORK_SERIES + extra)
    ]
    cache = NodeCache(PREFIX)
    cache.replace(nodes)
    free, unlisted = network_gauges(ExtenderMetrics(cache))
    assert len(free) == MAX_NETWORK_SERIES
    assert unlisted == extra
    assert ("0", f"g{MAX_NETWORK_SERIES - 1:05d}") in free
    assert ("0", f"g{MAX_NETWORK_SERIES:05d}") not in free


NAMES = ["a", "b", "c"]
STATES = st.tuples(
    st.sampled_from([*FREE_GPUS, None]),
    st.sampled_from([None, "leaf-1", "leaf-2"]),
    st.sampled_from([None, "spine-1"]),
)
EVENTS = events(NAMES, STATES)
State = tuple[str | None, str | None, str | None]


def watched(name: str, state: State) -> NodeAnnotation:
    free, leaf_group, spine = state
    labels = {f"{PREFIX}/network-tier-{t}": v for t, v in enumerate([leaf_group, spine]) if v}
    return NodeAnnotation(
        name, None if free is None else text(free), {"metadata": {"labels": labels}}, None, 8
    )


@given(st.lists(EVENTS, max_size=24))
def test_the_group_counts_kept_as_nodes_change_equal_a_count_from_scratch(
    drawn: list[Event],
) -> None:
    vouched = set(NAMES)
    cache = NodeCache(PREFIX, vouched=vouched.__contains__)
    cache.replace([])
    nodes: dict[str, State] = {}
    for event in drawn:
        nodes = replay(cache, nodes, vouched, event, watched)
        want: dict[tuple[int, str], tuple[int, int]] = {}
        for n, (free, *groups) in nodes.items():
            whole = free == "whole" and n in vouched
            for tier, group in enumerate(groups):
                if group is not None:
                    count, wholes = want.get((tier, group), (0, 0))
                    want[tier, group] = (count + 1, wholes + whole)
        assert cache.network_capacity() == want
