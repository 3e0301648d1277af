"""The tiers from what a node's HCA ports saw: values, nesting, and the JSON object."""

from __future__ import annotations

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
            2,
            id="a leaf under spines: two tiers",
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
            ),
            id="leaves with no spines: tier 1 the group of its own leaves",
        ),
        pytest.param(
            [_view("mlx5_0", 0x200001, {0x200001, 0x200003})],
            (
                group_value("ib-leaves-", [0x200001]),
                group_value("ib-spines-", [0x200001, 0x200003]),
            ),
            id="a 2-tier fabric: the tiers as derive_tiers finds them",
        ),
    ],
)
def test_the_agent_publishes_both_levels_on_every_node_of_a_fabric(
    views: list[PortView], tiers: tuple[str, ...]
) -> None:
    assert fabric_tiers(views) == tiers
