"""The InfiniBand tiers above a node, from what its HCA ports see of their neighbourhood: pure.

Each compute HCA port's walk (reporter.collect.infiniband) yields a `PortView`: its leaf switch,
the spines that leaf reaches, and the switches those spines reach in turn. From the views of all
the node's ports:

- tier 0, the leaf group: the set of leaves over the node's HCAs. In a rail-optimized fabric a
  node's HCAs hang on different leaves (one per rail), and every node of that scalable unit on the
  same set, so the set is the unit the nodes share.
- tier 1, the spine group: the set of switches the group's spines reach, not the spines
  themselves. A leaf that lost a spine link sees one spine fewer, so "the spines I see" would
  split a group on one bad cable; the leaves under the spines stay the same as long as each
  leaf keeps one spine link among them.

A value is a hash of its set, so every node that shares the set gets the same value, and tier 1
is a function of tier 0's leaves (every node of a leaf group walks the same leaves), so tiers
nest. This module never sends an SMP.

2-tier fabrics only. In a 3-tier fabric the spines' neighbours are the pod's leaves and the
cores above, and nothing cheap tells them apart (a SHARP Aggregation Node CA hangs on every
switch, so "has a CA" does not make a leaf): tier 1 there still names the pod while every
leaf keeps all its spine links, but a leaf that lost one misses the cores of that spine, and
its nodes get a value of their own. No tier 2 (the cores) yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEAF_GROUP_PREFIX = "ib-leaves-"
SPINE_GROUP_PREFIX = "ib-spines-"


@dataclass(frozen=True, slots=True)
class PortView:
    """What one HCA port's walk saw: the GUIDs of its leaf and of the switches under its spines."""

    name: str
    """The HCA's device name (mlx5_0)."""
    port: int
    port_guid: int
    leaf: int | None
    """None where the port's peer is not a switch (a back-to-back link, or no link)."""
    under_spines: frozenset[int]
    """The switches on the spines' live ports: the spine group's leaves (in a 2-tier fabric)."""


def group_value(prefix: str, guids: Iterable[int]) -> str:
    """A label value naming a set of GUIDs: the prefix and 16 hex digits of its hash."""
    text = prefix + ",".join(f"{guid:016x}" for guid in sorted(set(guids)))
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:16]


def derive_tiers(views: Iterable[PortView]) -> tuple[str, ...]:
    """The node's tier values, closest first: () with no leaf, (leaf group,) with no spines."""
    seen = [view for view in views if view.leaf is not None]
    if not seen:
        return ()
    tiers = [group_value(LEAF_GROUP_PREFIX, (view.leaf for view in seen if view.leaf is not None))]
    under = frozenset().union(*(view.under_spines for view in seen))
    if under:
        tiers.append(group_value(SPINE_GROUP_PREFIX, under))
    return tuple(tiers)


def fabric_tiers(views: Sequence[PortView]) -> tuple[str, ...]:
    """Tier 0 and tier 1, as the agent publishes them: every node of a fabric carries both (a
    scheduler such as Kueue drops a node that lacks a level). A node whose leaves reach no spine
    (a one-switch fabric, or a leaf that lost every spine link) gets as tier 1 the group of its
    own leaves: in a one-switch fabric the same on every node, and a leaf cut off from the spines
    a group of its own, which it is. () with no leaf."""
    tiers = derive_tiers(views)
    if len(tiers) != 1:
        return tiers
    return (*tiers, group_value(SPINE_GROUP_PREFIX, (v.leaf for v in views if v.leaf is not None)))


@dataclass(frozen=True, slots=True)
class SmpCounts:
    """The SMPs a discovery sent, by attribute, and how many of them got no answer."""

    node_info: int = 0
    port_info: int = 0
    unanswered: int = 0
    """Timed out, or answered with an error status; counted in their attribute too."""

    @property
    def total(self) -> int:
        """Every SMP sent."""
        return self.node_info + self.port_info

    def __add__(self, other: SmpCounts) -> SmpCounts:
        return SmpCounts(
            self.node_info + other.node_info,
            self.port_info + other.port_info,
            self.unanswered + other.unanswered,
        )


@dataclass(frozen=True, slots=True)
class Discovery:
    """The node's InfiniBand tiers, the ports they were seen from, and what seeing them cost."""

    tiers: tuple[str, ...]
    views: tuple[PortView, ...]
    smps: SmpCounts


def summarize(views: Iterable[PortView], smps: SmpCounts) -> Discovery:
    """The Discovery of a node whose ports saw `views`, ordered by HCA name and port."""
    ordered = tuple(sorted(views, key=lambda view: (view.name, view.port)))
    return Discovery(derive_tiers(ordered), ordered, smps)


def discovery_json(discovery: Discovery) -> dict[str, object]:
    """The `network --infiniband` object: source, tiers closest first, the HCAs, the MADs sent."""
    return {
        "source": "infiniband",
        "tiers": list(discovery.tiers),
        "hcas": [
            {
                "name": view.name,
                "port": view.port,
                "guid": f"0x{view.port_guid:016x}",
                "leaf": None if view.leaf is None else f"0x{view.leaf:016x}",
            }
            for view in discovery.views
        ],
        "mads": discovery.smps.total,
    }
