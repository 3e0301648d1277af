"""The tiers from what a node's HCA ports saw: values, nesting, and the JSON object."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.collect.infiniband_tiers import (
    PortView,
    SmpCounts,
    derive_tiers,
    discovery_json,
    fabric_tiers,
    group_value,
    summarize,
)
from reporter.schema.fabric import is_label_value

GUIDS = st.integers(1, 2**64 - 1)


def _view(name: str, leaf: int | None, under: set[int]) -> PortView:
    return PortView(name, 1, 0x100001, leaf, frozenset(under))


@pytest.mark.parametrize(
    ("views", "count"),
    [
        pytest.param([], 0, id="no HCA port: no tiers"),
        pytest.param(
            [_view("mlx5_0", None, set())], 0, id="a port whose peer is no switch: no tiers"
        ),
        pytest.param(
            [_view("mlx5_0", 0x200001, set())], 1, id="a leaf with no spines: the leaf group only"
        ),
        pytest.param(
            [_view("mlx5_0", 0x200001, {0x200001, 0x200002})],
            3,
            id="a leaf under spines: three tiers",
        ),
    ],
)
def test_the_tiers_go_as_high_as_the_walk_saw(views: list[PortView], count: int) -> None:
    assert len(derive_tiers(views)) == count


@given(
    leaves=st.lists(GUIDS, min_size=1, max_size=8),
    under=st.sets(GUIDS, min_size=1, max_size=16),
    seed=st.integers(0, 1000),
)
def test_the_values_are_label_values_whatever_the_order_the_ports_come_in(
    leaves: list[int], under: set[int], seed: int
) -> None:
    views = [_view(f"mlx5_{index}", leaf, under) for index, leaf in enumerate(leaves)]
    shuffled = views[:]
    random.Random(seed).shuffle(shuffled)
    tiers = derive_tiers(views)
    assert tiers == derive_tiers(shuffled)
    assert all(is_label_value(value) and len(value) <= 63 for value in tiers)


@given(first=st.sets(GUIDS, min_size=1, max_size=8), second=st.sets(GUIDS, min_size=1, max_size=8))
def test_two_leaf_groups_get_one_value_only_when_they_are_the_same_set(
    first: set[int], second: set[int]
) -> None:
    same = group_value("ib-leaves-", first) == group_value("ib-leaves-", second)
    assert same is (first == second)


def test_a_tier_value_says_its_tier_even_for_the_same_guids() -> None:
    assert group_value("ib-leaves-", {1}) != group_value("ib-spines-", {1})


def test_the_json_object_orders_hcas_and_counts_every_mad() -> None:
    views = [
        PortView("mlx5_1", 1, 0x10000B, None, frozenset()),
        PortView("mlx5_0", 1, 0x100001, 0x200002, frozenset({0x200002, 0x200003})),
    ]
    discovery = summarize(views, SmpCounts(node_info=7, port_info=30, unanswered=2))
    assert discovery_json(discovery) == {
        "source": "infiniband",
        "tiers": [
            group_value("ib-leaves-", {0x200002}),
            group_value("ib-spines-", {0x200002, 0x200003}),
            group_value("ib-cores-", {0x200002, 0x200003}),
        ],
        "hcas": [
            {
                "name": "mlx5_0",
                "port": 1,
                "guid": "0x0000000000100001",
                "leaf": "0x0000000000200002",
            },
            {"name": "mlx5_1", "port": 1, "guid": "0x000000000010000b", "leaf": None},
        ],
        "mads": 37,
    }


@pytest.mark.parametrize(
    ("views", "tiers"),
    [
        pytest.param([], (), id="no HCA port: no tiers"),
        pytest.param(
            [_view("mlx5_0", 0x200001, set()), _view("mlx5_1", 0x200002, set())],
            (
                group_value("ib-leaves-", [0x200001, 0x200002]),
                group_value("ib-spines-", [0x200001, 0x200002]),
                group_value("ib-cores-", [0x200001, 0x200002]),
            ),
            id="leaves with no spines: tiers 1 and 2 the group of its own leaves",
        ),
        pytest.param(
            [_view("mlx5_0", 0x200001, {0x200001, 0x200003})],
            (
                group_value("ib-leaves-", [0x200001]),
                group_value("ib-spines-", [0x200001, 0x200003]),
                group_value("ib-cores-", [0x200001, 0x200003]),
            ),
            id="a 2-tier fabric: the tiers as derive_tiers finds them, tier 2 the spine group's",
        ),
    ],
)
def test_the_agent_publishes_three_levels_on_every_node_of_a_fabric(
    views: list[PortView], tiers: tuple[str, ...]
) -> None:
    assert fabric_tiers(views) == tiers


POD = {0x200001, 0x200002}
CORES = {0x300001, 0x300002}
SMS = frozenset({0x400001})


def _three_tier(leaf: int, cores: set[int]) -> PortView:
    return PortView("mlx5_0", 1, 0x100001, leaf, frozenset(POD | cores), frozenset(cores))


@pytest.mark.parametrize(
    ("views", "managers", "tiers"),
    [
        pytest.param(
            [_three_tier(0x200001, CORES)],
            frozenset(),
            (
                group_value("ib-leaves-", [0x200001]),
                group_value("ib-spines-", POD),
                group_value("ib-cores-", CORES),
            ),
            id="3-tier, no SM: tier 1 the pod's leaves without the cores, tier 2 the cores",
        ),
        pytest.param(
            [_three_tier(0x200001, CORES)],
            SMS,
            (
                group_value("ib-leaves-", [0x200001]),
                group_value("ib-spines-", POD),
                group_value("ib-subnet-", SMS),
            ),
            id="3-tier with an SM: tier 2 the subnet its SMs name",
        ),
        pytest.param(
            [_three_tier(0x200002, {0x300001})],
            SMS,
            (
                group_value("ib-leaves-", [0x200002]),
                group_value("ib-spines-", POD),
                group_value("ib-subnet-", SMS),
            ),
            id="a leaf that lost a spine, and with it a core: tiers 1 and 2 unchanged",
        ),
        pytest.param(
            [_view("mlx5_0", 0x200001, set())],
            SMS,
            (
                group_value("ib-leaves-", [0x200001]),
                group_value("ib-spines-", [0x200001]),
                group_value("ib-subnet-", SMS),
            ),
            id="a leaf cut off from its spines: its own group, in its subnet",
        ),
    ],
)
def test_tier_2_is_the_subnet_where_an_sm_names_it_else_the_cores(
    views: list[PortView], managers: frozenset[int], tiers: tuple[str, ...]
) -> None:
    assert fabric_tiers(views, managers) == tiers
    assert all(is_label_value(value) and len(value) <= 63 for value in tiers)


@given(
    guids=st.lists(GUIDS, unique=True, min_size=2, max_size=16),
    pod_size=st.integers(1, 4),
    managers=st.frozensets(GUIDS, max_size=3),
)
def test_tiers_nest_a_leaf_group_under_one_spine_group_under_one_top(
    guids: list[int], pod_size: int, managers: frozenset[int]
) -> None:
    cores, leaves = {guids[0]}, guids[1:]
    pods = [set(leaves[at : at + pod_size]) for at in range(0, len(leaves), pod_size)]
    parents: dict[str, set[str]] = {}
    for pod in pods:
        for leaf in pod:
            view = PortView("mlx5_0", 1, 1, leaf, frozenset(pod | cores), frozenset(cores))
            tiers = fabric_tiers([view], managers)
            assert len(tiers) == 3
            for child, parent in itertools.pairwise(tiers):
                parents.setdefault(child, set()).add(parent)
    assert all(len(above) == 1 for above in parents.values())
