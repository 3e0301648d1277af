"""Reading a Node's network tiers back from its labels: every `<prefix>/network-tier-<N>`, any N,
nothing else."""

from __future__ import annotations

import pytest

from reporter.schema.network import network_tiers, tier_of_key

P = "gpu.topology.io"


@pytest.mark.parametrize(
    ("key", "tier"),
    [
        (f"{P}/network-tier-0", 0),
        (f"{P}/network-tier-1", 1),
        (f"{P}/network-tier-12", 12),
        (f"{P}/network-tier-01", None),
        (f"{P}/network-tier-", None),
        (f"{P}/network-tier-123", None),
        (f"{P}/network-tier-1a", None),
        (f"{P}/network-tier-\u0661", None),
        (f"{P}/network-tier--1", None),
        ("example.com/network-tier-0", None),
        ("network-tier-0", None),
        (f"{P}/nvlink-partition", None),
    ],
    ids=[
        "tier 0",
        "tier 1",
        "a two-digit tier",
        "a leading zero is not the same key",
        "no number",
        "past two digits",
        "not a number",
        "a non-ASCII digit",
        "a sign",
        "another prefix",
        "no prefix",
        "another key",
    ],
)
def test_which_keys_name_a_tier(key: str, tier: int | None) -> None:
    assert tier_of_key(key, P) == tier


def test_a_nodes_tiers_are_its_non_empty_tier_labels_closest_first() -> None:
    labels = {
        f"{P}/network-tier-1": "ib-spines-2",
        f"{P}/network-tier-0": "ib-leaves-1",
        f"{P}/network-tier-2": "",
        f"{P}/count": "8",
        "example.com/network-tier-3": "theirs",
    }
    tiers = network_tiers(labels, P)
    assert tiers == {0: "ib-leaves-1", 1: "ib-spines-2"}
    assert list(tiers) == [0, 1]
