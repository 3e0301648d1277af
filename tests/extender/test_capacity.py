"""The extender's capacity gauges (issue 31, item 2) over 20 simulated NVL72 racks, against a
from-scratch count: `topo_reporter_extender_connected_capable_nodes{gpus}` and
`topo_reporter_extender_partition_free_nodes{partition}`.

Every node is what the agent publishes for its simulated tray (labels from the real scan, an
availability of a chosen set of free GPUs), read through the extender's own parsing of a listed
Node object and its cache, and rendered by its /metrics registry. The expectation counts free GPUs
and labels directly.
"""

from __future__ import annotations

import functools
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from reporter.collect import build_scanner
from reporter.collect.simulate.racks import rack_nodes, write_profiles
from reporter.commands.gpu_topology import capacity, capacity_text
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics
from reporter.free_sets import compute_availability
from reporter.publish.watch import WatchEvent, node_annotation
from reporter.schema.availability import encode_availability
from reporter.schema.labels import labels
from reporter.schema.model import Topology

PREFIX = "gpu.topology.io"
RACKS = 20


@functools.cache
def tray_topologies() -> tuple[tuple[str, str, Topology], ...]:
    """(node, partition, topology) of 20 racks: racks 0 and 1 share a clique ID, every fifth rack
    is split in two partitions."""
    cliques = [17044, 17044, *range(2, RACKS)]
    nodes = [
        n
        for r in range(RACKS)
        for n in rack_nodes(RACKS, cliques=cliques, partitions=2 if r % 5 == 4 else 1)
        if n.rack == r
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = []
        for node, path in zip(nodes, write_profiles(nodes, Path(tmp)), strict=True):
            topology = build_scanner("auto", Path("/sys"), str(path)).scan().topology
            assert topology is not None
            out.append((node.name, node.partition, topology))
    return tuple(out)


def node_objects(seed: int) -> tuple[list[dict[str, Any]], dict[str, tuple[int, ...] | None]]:
    """The Node objects, and each node's free GPUs (None: no availability annotation)."""
    rng = random.Random(seed)
    objects: list[dict[str, Any]] = []
    free: dict[str, tuple[int, ...] | None] = {}
    for name, _, topology in tray_topologies():
        choice = rng.random()
        gpus = [g.index for g in topology.gpus]
        annotations: dict[str, str] = {}
        if choice < 0.1:
            free[name] = None  # an agent without availability: counts nowhere
        else:
            # Whole free trays often, else a random part of one.
            chosen = gpus if choice < 0.4 else sorted(rng.sample(gpus, rng.randint(0, 3)))
            free[name] = tuple(chosen)
            value = encode_availability(compute_availability(topology, chosen))
            annotations[f"{PREFIX}/availability"] = value
        objects.append(
            {
                "metadata": {
                    "name": name,
                    "labels": labels(topology, PREFIX, name),
                    "annotations": annotations,
                }
            }
        )
    return objects, free


def gauges(metrics: ExtenderMetrics) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name.startswith(
                ("topo_reporter_extender_connected", "topo_reporter_extender_part")
            ):
                (value,) = s.labels.values()
                out.setdefault(s.name, {})[value] = s.value
    return out


def test_capacity_gauges_equal_a_from_scratch_count_over_20_racks() -> None:
    partitions = {p for _, p, _ in tray_topologies()}
    assert len(tray_topologies()) == RACKS * 18
    assert len(partitions) == RACKS + RACKS // 5  # 17044 shared by two racks' distinct UUIDs
    for seed in range(3):
        objects, free = node_objects(seed)
        cache = NodeCache(PREFIX)
        cache.replace(node_annotation(o, f"{PREFIX}/availability") for o in objects)
        got = gauges(ExtenderMetrics(cache))
        # Every pair of a tray's 4 GPUs is NVLink-joined, no link down: k free GPUs host k.
        assert all(
            t.link(a, b).is_nvlink
            for _, _, t in tray_topologies()
            for a in range(4)
            for b in range(4)
            if a != b
        )
        assert got["topo_reporter_extender_connected_capable_nodes"] == {
            str(k): sum(1 for f in free.values() if f is not None and len(f) >= k)
            for k in (2, 4, 8)
        }
        want: dict[str, float] = dict.fromkeys(partitions, 0)
        for name, partition, _ in tray_topologies():
            f = free[name]
            want[partition] += f is not None and len(f) == 4
        assert got["topo_reporter_extender_partition_free_nodes"] == want


def test_the_plugins_partitions_count_what_the_gauges_count_from_the_same_nodes() -> None:
    objects, free = node_objects(1)
    cache = NodeCache(PREFIX)
    cache.replace(node_annotation(o, f"{PREFIX}/availability") for o in objects)
    got = gauges(ExtenderMetrics(cache))
    found = capacity(objects, PREFIX)
    assert found["connected_capable_nodes"] == {
        k: int(v) for k, v in got["topo_reporter_extender_connected_capable_nodes"].items()
    }
    members = Counter(p for _, p, _ in tray_topologies())
    assert found["partitions"] == [
        {"partition": p, "nodes": members[p], "free_nodes": int(n)}
        for p, n in sorted(got["topo_reporter_extender_partition_free_nodes"].items())
    ]
    # From scratch: a partition's whole free nodes are its trays with all 4 GPUs free.
    for row in found["partitions"]:
        assert row["free_nodes"] == sum(
            1
            for name, p, _ in tray_topologies()
            if p == row["partition"] and (f := free[name]) is not None and len(f) == 4
        )
    text = capacity_text(found)
    assert text.splitlines()[0].split() == ["PARTITION", "NODES", "WHOLE-FREE"]
    assert len(text.splitlines()) == len(members) + 2
    assert text.endswith(
        "Nodes that can host an NVLink-connected set now: "
        + ", ".join(f"{k} GPUs: {n}" for k, n in found["connected_capable_nodes"].items())
        + "\n"
    )


def test_a_node_that_changes_partition_or_is_deleted_moves_in_the_counts() -> None:
    objects, _ = node_objects(0)
    first = objects[0]
    cache = NodeCache(PREFIX)
    key = f"{PREFIX}/availability"
    cache.replace([node_annotation(first, key)])
    topology = tray_topologies()[0][2]
    first["metadata"]["annotations"][key] = encode_availability(
        compute_availability(topology, [0, 1, 2, 3])
    )
    cache.apply(WatchEvent("MODIFIED", node_annotation(first, key), "2"))
    old = tray_topologies()[0][1]
    assert cache.capacity() == ({2: 1, 4: 1, 8: 0}, {old: 1})
    first["metadata"]["labels"][f"{PREFIX}/nvlink-partition"] = "other.1"
    cache.apply(WatchEvent("MODIFIED", node_annotation(first, key), "3"))
    assert cache.capacity() == ({2: 1, 4: 1, 8: 0}, {"other.1": 1})
    cache.apply(WatchEvent("DELETED", node_annotation(first, key), "4"))
    assert cache.capacity() == ({2: 0, 4: 0, 8: 0}, {})
