"""Tier 0's value: the group of ToR switches a node's compute NICs hear, the same on every node
hearing the same set, different for another set, always a valid label value."""

from __future__ import annotations

import re

import pytest

from reporter.schema.network import ethernet_tier_0

LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
TOR_A, TOR_B, TOR_C = "aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02", "aa:bb:cc:00:00:03"


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ([TOR_A, TOR_B], [TOR_B, TOR_A], True),
        ([TOR_A, TOR_B], [TOR_A, TOR_B, TOR_B], True),
        ([TOR_A], [TOR_B], False),
        ([TOR_A, TOR_B], [TOR_A], False),
        ([TOR_A, TOR_B], [TOR_A, TOR_C], False),
        (["ab", "c"], ["a", "bc"], False),
    ],
    ids=[
        "the same two switches heard in another order: one group",
        "a switch heard on two NICs counts once",
        "two different switches: two groups",
        "a node hearing one of a pair is not in the pair's group",
        "a pair sharing one switch with another pair: two groups",
        "IDs are not run together: ab+c is not a+bc",
    ],
)
def test_nodes_share_tier_0_exactly_when_they_hear_the_same_switches(
    one: list[str], other: list[str], same: bool
) -> None:
    assert (ethernet_tier_0(one) == ethernet_tier_0(other)) is same


def test_the_value_is_a_label_value_and_stable_across_versions() -> None:
    value = ethernet_tier_0([TOR_B, TOR_A])
    assert LABEL_VALUE.fullmatch(value)
    # Pinned: a new version computing another value would move every node to a new group.
    assert value == "eth-98b36622bec46c07"


def test_no_switch_is_no_tier() -> None:
    with pytest.raises(ValueError, match="at least one switch"):
        ethernet_tier_0([])
