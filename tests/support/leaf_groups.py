"""The cluster of marin#6950 as Node objects: 64 DGX H100 nodes under an InfiniBand fabric in 15
leaf groups of 1 to 11 nodes, only two of which (11 and 8 nodes) can ever take a gang of 8 whole
nodes; with some GPUs taken, by seed. The group sizes are the issue's, as bench/leaf_groups.py's
`marin` cluster has them; its two superpods are not mapped to leaf groups there, so tier 1 here is
one spine group over them all.

Each Node carries what the agent publishes on a simulated DGX H100 (its labels, an availability
annotation of the GPUs left free) and the fabric's `network-tier-0` (leaf group) and
`network-tier-1` (spine group) labels. The truth beside it (`LeafCluster`) is what the tests count
from scratch: each node's leaf group and free GPUs, read from the choices made here, not from the
objects.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reporter.collect import build_scanner
from reporter.free_sets import compute_availability
from reporter.schema import keys
from reporter.schema.availability import encode_availability
from reporter.schema.labels import labels
from reporter.schema.model import Topology

PREFIX = keys.DEFAULT_PREFIX
GROUP_SIZES = (1, 1, 2, 2, 2, 3, 3, 3, 5, 5, 6, 6, 6, 8, 11)
"""Nodes per leaf group, as the user found them."""
GPUS = 8
SPINE = "ib-spines-5d1c0aa5e8f2b731"
"""One spine group over every leaf: a 2-tier fabric."""


@functools.cache
def dgx_h100() -> Topology:
    topology = build_scanner("auto", Path("/nonexistent"), "dgx-h100").scan().topology
    assert topology is not None
    return topology


def leaf(group: int) -> str:
    """Leaf group `group`'s tier-0 value, in the agent's InfiniBand form."""
    return f"ib-leaves-{group:016x}"


@dataclass(frozen=True, slots=True)
class LeafCluster:
    nodes: list[dict[str, Any]]
    """The Node objects."""
    group: dict[str, str]
    """Node name to its leaf group (its tier-0 value)."""
    free: dict[str, int | None]
    """Node name to its free GPUs (None: no availability annotation, known nowhere)."""


def leaf_cluster(seed: int | None) -> LeafCluster:
    """The 64 nodes with GPUs taken at random by `seed`: about half the nodes wholly free, a
    quarter with some GPUs taken, a sixth busy, and a few without availability. Seed None: every
    GPU free."""
    rng = random.Random(seed)
    topology = dgx_h100()
    out = LeafCluster([], {}, {})
    for g, size in enumerate(GROUP_SIZES):
        for i in range(size):
            name = f"h100-{g:02d}-{i:02d}"
            choice = 0.5 if seed is None else rng.random()
            node_labels = labels(topology, PREFIX, name) | {
                keys.key(PREFIX, keys.NETWORK_TIER_0): leaf(g),
                f"{PREFIX}/network-tier-1": SPINE,
            }
            annotations: dict[str, str] = {}
            free: tuple[int, ...] | None
            if choice < 0.05:
                free = None
            elif choice < 0.55:
                free = tuple(range(GPUS))
            elif choice < 0.8:
                free = tuple(sorted(rng.sample(range(GPUS), rng.randint(1, GPUS - 1))))
            else:
                free = ()
            if free is not None:
                value = encode_availability(compute_availability(topology, free))
                annotations[keys.key(PREFIX, keys.AVAILABILITY)] = value
            out.nodes.append(
                {
                    "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
                    "status": {"capacity": {keys.GPU_RESOURCE: str(GPUS)}},
                }
            )
            out.group[name] = leaf(g)
            out.free[name] = None if free is None else len(free)
    return out
