"""The InfiniBand tiers above a node, from what its HCA ports see of their neighbourhood: pure.

Each compute HCA port's walk (reporter.collect.infiniband) yields a `PortView`: its leaf switch,
the switches its leaf's spines reach, and which of those are cores (a switch with no host on it;
the walk tells them apart). From the views of all the node's ports, every node of a fabric gets
three tiers (`fabric_tiers`), so one Kueue Topology of three levels fits 2-tier and 3-tier fabrics:

- tier 0, the leaf group: the set of leaves over the node's HCAs. In a rail-optimized fabric a
  node's HCAs hang on different leaves (one per rail), and every node of that scalable unit on the
  same set, so the set is the unit the nodes share.
- tier 1, the spine group: the set of leaves the group's spines reach (the pod), not the spines
  themselves. A leaf that lost a spine link sees one spine fewer, so "the spines I see" would
  split a group on one bad cable; the leaves under the spines stay the same as long as each
  leaf keeps one spine link among them. Cores are left out: a spine's cores differ from spine to
  spine in a 3-tier fabric, so a leaf that lost a spine would lose that spine's cores too.
- tier 2, the fabric's top: its subnet managers (SMInfoRecords, reporter.collect.infiniband_sa),
  the same for every node of a subnet, whatever cable is missing. Where no subnet manager runs,
  the cores the spines reach (3-tier), or the spine group's leaves again (2-tier): the same on
  every node while every spine keeps its core links, which is what the SM's absence loses.

A value is a hash of its set, so every node that shares the set gets the same value; tier 1 is a
function of tier 0's leaves (every node of a leaf group walks the same leaves) and tier 2 of the
subnet, so tiers nest. This module never sends a MAD.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEAF_GROUP_PREFIX = "ib-leaves-"
SPINE_GROUP_PREFIX = "ib-spines-"
CORE_GROUP_PREFIX = "ib-cores-"
"""Tier 2 seen by walking: the cores (3-tier), or the spine group's leaves (2-tier)."""
SUBNET_PREFIX = "ib-subnet-"
"""Tier 2 from the subnet manager: the subnet, named by its SMs' port GUIDs."""


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
    """The switches on the spines' live ports: the spine group's leaves, and the cores above."""
    cores: frozenset[int] = frozenset()
    """Those of `under_spines` with no host on them: the cores of a 3-tier fabric."""
    master_sm_lid: int = 0
    """The port's master SM's LID; 0 where no subnet manager has configured the port."""


def group_value(prefix: str, guids: Iterable[int]) -> str:
    """A label value naming a set of GUIDs: the prefix and 16 hex digits of its hash."""
    text = prefix + ",".join(f"{guid:016x}" for guid in sorted(set(guids)))
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:16]


def derive_tiers(
    views: Iterable[PortView], subnet_managers: frozenset[int] = frozenset()
) -> tuple[str, ...]:
    """The node's tier values, closest first: () with no leaf, (leaf group,) with no spines,
    else the leaf group, the spine group and the fabric's top."""
    seen = [view for view in views if view.leaf is not None]
    if not seen:
        return ()
    tiers = [group_value(LEAF_GROUP_PREFIX, (view.leaf for view in seen if view.leaf is not None))]
    under = frozenset().union(*(view.under_spines for view in seen))
    if not under:
        return tuple(tiers)
    cores = frozenset().union(*(view.cores for view in seen))
    pod = under - cores
    tiers.append(group_value(SPINE_GROUP_PREFIX, pod))
    if subnet_managers:
        tiers.append(group_value(SUBNET_PREFIX, subnet_managers))
    else:
        tiers.append(group_value(CORE_GROUP_PREFIX, cores or pod))
    return tuple(tiers)


def fabric_tiers(
    views: Sequence[PortView], subnet_managers: frozenset[int] = frozenset()
) -> tuple[str, ...]:
    """Tiers 0, 1 and 2, as the agent publishes them: every node of a fabric carries all three
    (a scheduler such as Kueue drops a node that lacks a level). A node whose leaves reach no
    spine (a one-switch fabric, or a leaf that lost every spine link) gets as tiers 1 and 2 the
    group of its own leaves, or the subnet for tier 2 where an SM named it: in a one-switch
    fabric the same on every node, and a leaf cut off from the spines a group of its own, which
    it is. () with no leaf."""
    tiers = derive_tiers(views, subnet_managers)
    if len(tiers) != 1:
        return tiers
    leaves = [view.leaf for view in views if view.leaf is not None]
    top = (
        group_value(SUBNET_PREFIX, subnet_managers)
        if subnet_managers
        else group_value(CORE_GROUP_PREFIX, leaves)
    )
    return (*tiers, group_value(SPINE_GROUP_PREFIX, leaves), top)


@dataclass(frozen=True, slots=True)
class SmpCounts:
    """The MADs a discovery sent, by kind: SMPs by attribute (how many got no answer), and the
    SA queries with the reply MADs (RMPP segments) the subnet manager sent back."""

    node_info: int = 0
    port_info: int = 0
    unanswered: int = 0
    """Timed out, or answered with an error status; counted in their attribute too."""
    node_description: int = 0
    sa_queries: int = 0
    sa_replies: int = 0
    """MADs the SA answered with: sent to the node, not by it, so not in `total`."""

    @property
    def smps(self) -> int:
        """Every SMP sent."""
        return self.node_info + self.port_info + self.node_description

    @property
    def total(self) -> int:
        """Every MAD sent: the SMPs and the SA queries."""
        return self.smps + self.sa_queries

    def __add__(self, other: SmpCounts) -> SmpCounts:
        return SmpCounts(
            self.node_info + other.node_info,
            self.port_info + other.port_info,
            self.unanswered + other.unanswered,
            self.node_description + other.node_description,
            self.sa_queries + other.sa_queries,
            self.sa_replies + other.sa_replies,
        )


@dataclass(frozen=True, slots=True)
class Discovery:
    """The node's InfiniBand tiers, the ports they were seen from, its fabric's subnet managers
    (none: no SM answered, or none runs), and what seeing them cost."""

    tiers: tuple[str, ...]
    views: tuple[PortView, ...]
    smps: SmpCounts
    subnet_managers: frozenset[int] = frozenset()


def summarize(
    views: Iterable[PortView], smps: SmpCounts, subnet_managers: frozenset[int] = frozenset()
) -> Discovery:
    """The Discovery of a node whose ports saw `views`, ordered by HCA name and port."""
    ordered = tuple(sorted(views, key=lambda view: (view.name, view.port)))
    return Discovery(derive_tiers(ordered, subnet_managers), ordered, smps, subnet_managers)


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
