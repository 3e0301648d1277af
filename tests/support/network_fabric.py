"""An InfiniBand fabric described as its tree (leaf groups under spine groups under core groups),
and each node's network-tier labels made from it by our own projection,
`reporter.schema.network.tier_labels`, as the agent publishes them: tier 0 the leaf group
(`ib-leaves-<16 hex>`), tier 1 the spine group (`ib-spines-<16 hex>`), tier 2 the core group.

The description is the truth the consumer tests compare with: which leaf group, spine group and
core group each node is under, read from the description, never from the Node objects.
`MARIN` is marin#6950's 64 H100 nodes in 15 leaf groups of 1 to 11 nodes (the group sizes of
tests/support/leaf_groups.py), here under 4 spine groups under 2 core groups.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

from reporter.schema.network import tier_labels
from tests.support.leaf_groups import GROUP_SIZES, PREFIX

LEVEL_PREFIXES = ("ib-leaves-", "ib-spines-", "ib-cores-")
"""Each tier's value prefix, closest first (the agent's InfiniBand forms)."""


def _value(tier: int, path: str) -> str:
    return LEVEL_PREFIXES[tier] + hashlib.sha256(path.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Fabric:
    """A fat tree by its groups: `leaf_group_sizes[g]` nodes in leaf group g, under spine group
    `spine_of_leaf[g]`, itself under core group `core_of_spine[s]`."""

    name: str
    leaf_group_sizes: tuple[int, ...]
    spine_of_leaf: tuple[int, ...]
    core_of_spine: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.spine_of_leaf) == len(self.leaf_group_sizes)
        assert set(self.spine_of_leaf) == set(range(len(self.core_of_spine)))

    @property
    def nodes(self) -> list[str]:
        return [
            f"{self.name}-l{g:02d}-n{i:02d}"
            for g, size in enumerate(self.leaf_group_sizes)
            for i in range(size)
        ]

    def leaf_index(self, node: str) -> int:
        return int(node.rsplit("-l", 1)[1].split("-n", maxsplit=1)[0])

    def leaf(self, g: int) -> str:
        return _value(0, f"{self.name}/leaf/{g}")

    def spine(self, s: int) -> str:
        return _value(1, f"{self.name}/spine/{s}")

    def core(self, c: int) -> str:
        return _value(2, f"{self.name}/core/{c}")

    def tiers(self, node: str) -> tuple[str, str, str]:
        """The node's tier values, closest first, as the agent publishes them."""
        g = self.leaf_index(node)
        s = self.spine_of_leaf[g]
        return (self.leaf(g), self.spine(s), self.core(self.core_of_spine[s]))

    def labels(self, node: str) -> dict[str, str]:
        """The node's network-tier labels under our keys, made by our projection."""
        return tier_labels(self.tiers(node), PREFIX, "topo-reporter")

    def leaf_group_of(self, node: str) -> str:
        return self.leaf(self.leaf_index(node))

    def tree(self) -> dict[str, dict[str, dict[str, set[str]]]]:
        """Core value -> spine value -> leaf value -> its nodes."""
        out: dict[str, dict[str, dict[str, set[str]]]] = {}
        for node in self.nodes:
            leaf, spine, core = self.tiers(node)
            out.setdefault(core, {}).setdefault(spine, {}).setdefault(leaf, set()).add(node)
        return out

    def roomy_leaf_groups(self, free: Iterable[str], pods: int) -> set[str]:
        """The leaf groups with at least `pods` of the `free` nodes (one pod a whole node)."""
        count: dict[str, int] = {}
        for node in free:
            group = self.leaf_group_of(node)
            count[group] = count.get(group, 0) + 1
        return {g for g, n in count.items() if n >= pods}


MARIN = Fabric(
    "marin",
    GROUP_SIZES,
    spine_of_leaf=tuple(g % 4 for g in range(len(GROUP_SIZES))),
    core_of_spine=(0, 0, 1, 1),
)


def free_nodes(fabric: Fabric, seed: int, pods: int) -> frozenset[str]:
    """Which of the fabric's nodes are free in trial `seed`, chosen by the seed alone: seed 0
    every node; seed 1 at most `pods - 1` of each leaf group (no group can take `pods`); others
    each node free with a chance drawn per seed from 30 to 95 %, so that some trials leave every
    roomy group roomy, others one or two, some none."""
    nodes = fabric.nodes
    if seed == 0:
        return frozenset(nodes)
    rng = random.Random(seed)
    if seed == 1:
        return frozenset(n for n in nodes if int(n.rsplit("-n", 1)[1]) < pods - 1)
    chance = rng.choice((0.3, 0.5, 0.7, 0.95))
    return frozenset(n for n in nodes if rng.random() < chance)
