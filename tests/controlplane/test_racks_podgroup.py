"""Issue 30 item 5: Kubernetes' own pod groups (KEP-5732, `scheduling.k8s.io/v1beta1` PodGroup)
with a topology constraint on the partition label the agent publishes, placed by the real
kube-scheduler 1.37.2 (the `rack_scheduler` fixture, its GenericWorkload and
TopologyAwareWorkloadScheduling gates on) on the simulated NVL72 racks of
tests/support/consumer_fixtures.py: racks 0 and 1 of 4 trays both on clique 17044, rack 2 split into
two partitions of 2 trays.

A gang of 3 pods x 4 GPUs with `schedulingConstraints.topology[0].key:
gpu.topology.io/nvlink-partition` lands in one partition, never across the two racks that share
the clique ID. The scheduler's TopologyPlacementGenerator offers one placement per value of the
key, the gang is tried in each, and of those it fits (only the two 4-tray partitions) the
PlacementScore plugins pick one, ties at random (schedule_one_podgroup.go findBestPlacement).
Without the constraint there is one placement, every node, and each pod goes to the best-scored
free tray. Empty trays score alike, and 1.37.2 draws a tie-break only when an extender scores
(schedule_one.go prioritizeNodes; kubernetes/kubernetes#141024 moves it): the tie goes to the
order of the scheduler's node list, so one scheduler process puts gang after gang on the same 3
trays, and which 3 changes from one process to the next.

Measured on this harness (2 cores, Dec 2026), trials on the bare racks:
- with the constraint: 110 of 110 groups in one partition (11 scheduler processes), each process
  choosing now one rack on 17044, now the other; with trays 2 and 3 of racks 0 and 1 loaded,
  110 of 110.
- gang only: 77 of 130 groups split across partitions (59 %), but by scheduler process: 10 of 12
  processes split every group (6 of 6 in nine, 20 of 20 in one), the other two split 1 of 6 and
  2 of 50 (their trays mostly in one partition). A uniform draw of 3 of the 12 trays would keep
  one partition 8 in 220 times (3.6 %). With trays 2 and 3 of racks 0 and 1 loaded, split across
  the two racks on clique 17044 in 11 of 11 processes.
Only the outcomes that cannot come by chance are asserted: the constrained groups, and the
gang-only group on trays whose scores send it across the two racks; the bare gang-only split count
is printed (`-s`), not asserted.

The file is named to run after tests/controlplane/test_prune.py, which prunes the default prefix
from every Node of the shared apiserver: the session's `rack_cluster` is published when it is first
used, and must be first used after that.

No kubelet runs: a bound pod never starts, and the scheduler still counts its GPUs. Everything
waits by polling.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.controlplane.test_racks import Pods, two_racks
from tests.support.consumer_fixtures import (
    HOSTNAME,
    PARTITION,
    TRAYS,
    RackCluster,
    RackScheduler,
    poll,
)
from tests.support.controlplane_fixtures import RealApiServer, unique

pytestmark = pytest.mark.controlplane

GROUP, VERSION, PLURAL = "scheduling.k8s.io", "v1beta1", "podgroups"
GANG = 3
TRIALS = 6
"""Groups placed one after another, each finding the racks' GPUs free: every group's pods are
deleted, and gone, before the next is made."""


def pod_group(name: str, size: int, topology_key: str | None) -> dict[str, Any]:
    """A gang of `size` pods, with a topology constraint on `topology_key` when one is given."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": size}}}
    if topology_key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


class PodGroups:
    """PodGroups of one test's namespace and their pods of 4 GPUs each."""

    def __init__(
        self, server: RealApiServer, namespace: str, pods: Pods, scheduler: RackScheduler
    ) -> None:
        self.api = k8s.CustomObjectsApi(server.api())
        self.core = server.core()
        self.namespace = namespace
        self.pods = pods
        self.scheduler = scheduler
        self.made: list[str] = []

    def create(self, size: int, topology_key: str | None, **spec: Any) -> tuple[str, list[str]]:
        """A group and its `size` pods (`spec` added to each pod's): its name and theirs."""
        name = unique("gang")
        self.api.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, pod_group(name, size, topology_key)
        )
        self.made.append(name)
        members = [f"{name}-{i}" for i in range(size)]
        for member in members:
            self.pods.create(
                member, self.scheduler.name, schedulingGroup={"podGroupName": name}, **spec
            )
            # The pod the apiserver stored names its group (the client models the field).
            stored = self.core.read_namespaced_pod(member, self.namespace).spec
            assert stored is not None
            assert stored.scheduling_group is not None
            assert stored.scheduling_group.pod_group_name == name
        return name, members

    def place(self, topology_key: str | None, **spec: Any) -> list[str]:
        """A group of GANG pods made, all bound, then deleted with its pods: their nodes."""
        name, members = self.create(GANG, topology_key, **spec)
        try:
            return [self.pods.node_of(member, self.scheduler.log) for member in members]
        finally:
            self.delete(name, members)

    def condition(self, name: str) -> dict[str, Any] | None:
        """The scheduler's PodGroupInitiallyScheduled condition on the group, once written."""
        group = self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        assert isinstance(group, dict)
        for c in (group.get("status") or {}).get("conditions") or []:
            if c["type"] == "PodGroupInitiallyScheduled":
                return dict(c)
        return None

    def delete(self, name: str, members: list[str]) -> None:
        """The pods deleted and gone (their GPUs free for the next group), then the group."""
        for member in members:
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_namespaced_pod(member, self.namespace, grace_period_seconds=0)
        poll(f"the pods of group {name} gone", lambda: not self.listed() & set(members))
        with contextlib.suppress(k8s.ApiException):
            self.api.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def listed(self) -> set[str]:
        items = self.core.list_namespaced_pod(self.namespace).items
        return {p.metadata.name for p in items if p.metadata and p.metadata.name}

    def close(self) -> None:
        for name in self.made:
            with contextlib.suppress(k8s.ApiException):
                self.api.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name
                )


@pytest.fixture
def pods(
    real_apiserver: RealApiServer, real_namespace: str, rack_cluster: RackCluster
) -> Iterator[Pods]:
    made = Pods(real_apiserver, real_namespace, rack_cluster)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def groups(
    real_apiserver: RealApiServer,
    real_namespace: str,
    pods: Pods,
    rack_scheduler: RackScheduler,
) -> Iterator[PodGroups]:
    made = PodGroups(real_apiserver, real_namespace, pods, rack_scheduler)
    try:
        yield made
    finally:
        made.close()


def partitions_of(cluster: RackCluster, nodes: list[str]) -> set[str]:
    return {cluster.partition_of(n) for n in nodes}


def test_a_pod_group_with_the_partition_constraint_lands_in_one_partition(
    rack_cluster: RackCluster, groups: PodGroups
) -> None:
    trays = Counter(labels[PARTITION] for labels in rack_cluster.labels.values())
    placed = []
    for _ in range(TRIALS):
        nodes = groups.place(PARTITION)
        assert len(set(nodes)) == GANG, nodes
        (partition,) = partitions_of(rack_cluster, nodes)
        # Every tray is free when a trial starts: only a 4-tray partition (racks 0 and 1) fits.
        assert trays[partition] >= GANG, (partition, trays)
        assert len({rack_cluster.domain_of(n) for n in nodes}) == 1, nodes
        placed.append(partition)
    print(f"with the constraint: {TRIALS} of {TRIALS} groups in one partition: {placed}")


def test_a_gang_without_the_constraint_is_placed_tray_by_tray(
    rack_cluster: RackCluster, groups: PodGroups
) -> None:
    splits = 0
    trays: list[list[str]] = []
    for _ in range(TRIALS):
        nodes = groups.place(None)
        # One pod per tray: each takes a tray's 4 GPUs. Which trays is the order of the
        # scheduler's node list (the module docstring), so the split count is printed, not
        # asserted.
        assert len(set(nodes)) == GANG, nodes
        splits += len(partitions_of(rack_cluster, nodes)) > 1
        trays.append(sorted(n.removeprefix(f"{rack_cluster.id}-") for n in nodes))
    print(f"gang only: {splits} of {TRIALS} groups split across partitions: {trays}")


def test_the_constraint_keeps_a_gang_in_one_rack_where_the_scores_would_split_it(
    rack_cluster: RackCluster, pods: Pods, groups: PodGroups, rack_scheduler: RackScheduler
) -> None:
    # CPU-only pods take 6 of 8 CPUs on trays 2 and 3 of racks 0 and 1. NodeResourcesFit
    # (LeastAllocated) and NodeResourcesBalancedAllocation then score those trays below trays 0
    # and 1, so pod by pod a gang kept to the two racks takes 3 of the 4 unloaded trays, 2 per
    # rack at most: across the two racks on clique 17044, every time. The loaded trays still have
    # all their GPUs, so each rack's partition fits the whole gang.
    for rack in (0, 1):
        for tray in range(2, TRAYS):
            name = unique("cpu")
            node = rack_cluster.node(rack, tray)
            pods.create(
                name,
                rack_scheduler.name,
                nodeSelector={HOSTNAME: node},
                containers=[
                    {
                        "name": "cpu",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "6"}},
                    }
                ],
            )
            assert pods.node_of(name, rack_scheduler.log) == node
    unloaded = {rack_cluster.node(rack, tray) for rack in (0, 1) for tray in (0, 1)}
    affinity = two_racks(rack_cluster)

    nodes = groups.place(None, affinity=affinity)
    assert set(nodes) <= unloaded, nodes
    assert len({rack_cluster.domain_of(n) for n in nodes}) == 2, nodes
    assert len(partitions_of(rack_cluster, nodes)) == 2, nodes

    for _ in range(TRIALS):
        nodes = groups.place(PARTITION, affinity=affinity)
        assert len(set(nodes)) == GANG, nodes
        assert len(partitions_of(rack_cluster, nodes)) == 1, nodes
        assert len({rack_cluster.domain_of(n) for n in nodes}) == 1, nodes


def test_a_pod_group_that_fits_no_partition_waits_instead_of_spanning_the_shared_clique(
    rack_cluster: RackCluster, groups: PodGroups, pods: Pods, rack_scheduler: RackScheduler
) -> None:
    # Five pods: racks 0 and 1 together have 8 free trays on "clique 17044", one partition 4.
    size = TRAYS + 1
    assert (
        max(Counter(labels[PARTITION] for labels in rack_cluster.labels.values()).values()) < size
    )
    name, members = groups.create(size, PARTITION)
    condition: dict[str, Any] = poll(
        f"group {name} found unschedulable",
        lambda: groups.condition(name),
        log=rack_scheduler.log,
    )
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    # Each pod is left unbound (`unschedulable` fails on a bound one), none split off alone.
    for member in members:
        assert pods.unschedulable(member, rack_scheduler.log)
