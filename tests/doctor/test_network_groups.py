"""The doctor's network-group finding (issue 43, item 6): a Pending Kueue Workload required to stay
in one group of a network tier, over marin#6950's 64 H100 nodes in 15 leaf groups, against a count
from scratch; and its numbers agree with the extender's gauges and the plugin's."""

from __future__ import annotations

from collections import Counter

import pytest

from reporter.commands.gpu_topology import network_capacity
from reporter.doctor import pod_group_findings
from reporter.doctor.groups import network_groups
from reporter.doctor.model import Code
from reporter.doctor.report import report_text
from tests.doctor.test_groups import PARTITION_KEY, workload
from tests.support.leaf_groups import GPUS, PREFIX, SPINE, leaf_cluster

TIER_0 = f"{PREFIX}/network-tier-0"
TIER_1 = f"{PREFIX}/network-tier-1"
SEEDS = range(4)


def room_from_scratch(seed: int, gpus: int) -> dict[str, int]:
    """Per leaf group, the pods of `gpus` GPUs its nodes' free GPUs can hold."""
    cluster = leaf_cluster(seed)
    out: dict[str, int] = {}
    for name, group in cluster.group.items():
        free = cluster.free[name]
        out[group] = out.get(group, 0) + (0 if free is None else free // gpus)
    return out


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed {s}" for s in SEEDS])
def test_each_leaf_groups_room_and_whole_free_nodes_agree_with_the_gauges_and_the_plugin(
    seed: int,
) -> None:
    cluster = leaf_cluster(seed)
    rooms = network_groups(cluster.nodes, PREFIX, 0)
    for gpus in (1, 2, 4, 8):
        assert {g: r.room(gpus) for g, r in rooms.items()} == room_from_scratch(seed, gpus)
    members = Counter(cluster.group.values())
    assert {g: (r.nodes, r.whole_free) for g, r in rooms.items()} == {
        g: (members[g], room_from_scratch(seed, GPUS)[g]) for g in members
    }
    # The plugin's (and so the gauges': the same NodeCache) counts, tier 0.
    assert {
        r["group"]: (r["nodes"], r["free_nodes"])
        for r in network_capacity(cluster.nodes, PREFIX)
        if r["tier"] == 0
    } == {g: (r.nodes, r.whole_free) for g, r in rooms.items()}


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed {s}" for s in SEEDS])
def test_a_gang_of_whole_nodes_bigger_than_every_leaf_groups_room_is_named(seed: int) -> None:
    cluster = leaf_cluster(seed)
    room = room_from_scratch(seed, GPUS)
    best = max(room.values())
    too_big = workload(best + 1, GPUS, required=TIER_0)
    fits = workload(best, GPUS, required=TIER_0)
    fits["metadata"]["name"] = "fits"
    found = pod_group_findings([too_big, fits], cluster.nodes, PREFIX)
    subject = f"workload ml/job-{best + 1}x{GPUS}"
    assert list(found) == [subject]
    (finding,) = found[subject]
    assert finding.code == Code.POD_GROUP_EXCEEDS_NETWORK_GROUPS
    assert finding.summary == (
        f"PodSet main needs {best + 1} pods of {GPUS} nvidia.com/gpu in one group of network "
        f"tier 0 ({TIER_0}); the roomiest group has room for {best} now"
    )
    roomiest = sorted(room.items(), key=lambda item: (-item[1], item[0]))[:5]
    assert finding.evidence[:5] == tuple(
        f"{g}: room for {n} pods, {n} of {Counter(cluster.group.values())[g]} nodes wholly free"
        for g, n in roomiest
    )
    assert finding.evidence[5] == "10 more groups, with less room"
    assert "kubectl gpu-topology --network" in finding.fix
    # marin#6950's gang of 8 whole nodes waits where no leaf group has 8 wholly free.
    eight = pod_group_findings([workload(8, GPUS, required=TIER_0)], cluster.nodes, PREFIX)
    assert bool(eight) == (best < 8)
    assert f"WARNING pod-group-exceeds-network-groups: PodSet main needs {best + 1}" in (
        report_text(found, summary=False)
    )


@pytest.mark.parametrize(
    ("nodes", "want"),
    [(8, False), (9, False), (11, False), (12, True), (64, True)],
    ids=[f"a gang of {n} whole nodes" for n in (8, 9, 11, 12, 64)],
)
def test_with_every_gpu_free_only_the_two_largest_leaf_groups_take_a_gang_of_8(
    nodes: int, want: bool
) -> None:
    cluster = leaf_cluster(None)
    found = pod_group_findings([workload(nodes, GPUS, required=TIER_0)], cluster.nodes, PREFIX)
    assert bool(found) == want
    rooms = network_groups(cluster.nodes, PREFIX, 0)
    assert sorted(g for g, r in rooms.items() if r.whole_free >= nodes) == sorted(
        g for g, n in Counter(cluster.group.values()).items() if n >= nodes
    )
    assert sum(r.whole_free >= 8 for r in rooms.values()) == 2


@pytest.mark.parametrize(
    ("required", "pods", "gpus", "want"),
    [
        # The one spine group holds every leaf: its room is the whole cluster's.
        (TIER_1, "spine+1", GPUS, True),
        (TIER_1, "spine", GPUS, False),
        (TIER_0, "leaf", 4, False),
        (TIER_0, "leaf+1", 4, True),
        # A tier no node carries, a key not ours, a key that only looks like one: no judgement.
        (f"{PREFIX}/network-tier-7", "leaf+1", GPUS, False),
        ("example.com/network-tier-0", "leaf+1", GPUS, False),
        (f"{PREFIX}/network-tier-00", "leaf+1", GPUS, False),
        # The cluster's H100s are each their own partition (node-NAME): one node's room at most.
        (PARTITION_KEY, "leaf+1", GPUS, True),
    ],
    ids=[
        "a gang above the spine's room",
        "a gang the spine holds",
        "pods of 4 the roomiest leaf holds",
        "pods of 4 above every leaf's room",
        "a tier no node carries",
        "another prefix's tier",
        "a tier key with a leading zero",
        "the partition rule still judged beside",
    ],
)
def test_which_required_key_is_judged_against_which_groups(
    required: str, pods: str, gpus: int, want: bool
) -> None:
    cluster = leaf_cluster(1)
    spine = sum(f // GPUS for f in cluster.free.values() if f is not None)
    leaf = max(room_from_scratch(1, gpus).values())
    count = {"spine": spine, "spine+1": spine + 1, "leaf": leaf, "leaf+1": leaf + 1}[pods]
    found = pod_group_findings([workload(count, gpus, required=required)], cluster.nodes, PREFIX)
    assert bool(found) == want
    if want and required == TIER_1:
        (finding,) = next(iter(found.values()))
        assert finding.evidence == (
            f"{SPINE}: room for {spine} pods, {spine} of 64 nodes wholly free",
        )
