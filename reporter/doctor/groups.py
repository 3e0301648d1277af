"""Findings about pod groups: a Pending Kueue Workload that must land in one NVLink partition, or
in one network group, and needs more room than any partition or group has free.

The pod groups read are Kueue Workloads (`kueue.x-k8s.io`, v1beta2, else v1beta1): a PodSet whose
`topologyRequest.required` is our `nvlink-partition` label key must place all its pods in one
partition, one whose `required` is a `network-tier-<N>` key in one group of that tier (a leaf
group for tier 0): Kueue's Topology Aware Scheduling. KEP-5732's pod groups of kube-scheduler are
not read: no release the tests run serves them.

Pure: it judges the Workload and Node objects `topo-reporter doctor --all` hands it, and reads
nothing itself. A partition's or group's room for pods of G GPUs is the sum, over its nodes, of
each node's free GPUs (its availability annotation) divided by G, rounded down: for pods of a
whole node's GPUs, its whole free nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reporter.doctor.model import (
    GPU_RESOURCE,
    Code,
    Finding,
    Severity,
    node_annotations,
    node_labels,
)
from reporter.doctor.report import WORKLOAD
from reporter.errors import SchemaError
from reporter.schema import keys
from reporter.schema.availability import decode_availability
from reporter.schema.network import network_tiers, tier_of_key
from reporter.schema.scheduler import PodRequestError, gpus_requested

WORKLOAD_GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")
"""Kueue's Workload versions, newest first: v0.17 to v0.19 serve both."""
SHOWN_PARTITIONS = 5
"""Partitions (or network groups) named in the evidence, roomiest first; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Partition:
    """The room of a set of nodes pods may be required to share: an NVLink partition, or a
    network group."""

    nodes: int
    whole_free: int
    """Nodes whose GPUs are all free."""
    free: tuple[int, ...]
    """Free GPUs per node that publishes availability."""

    def room(self, gpus: int) -> int:
        """Pods of `gpus` GPUs it can host now."""
        return sum(f // gpus for f in self.free)


def partitions(nodes: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, Partition]:
    """Each NVLink partition's nodes and free GPUs, from the Nodes' labels and availability; a
    node without a readable availability counts among the nodes, never as free."""
    partition_key = keys.key(prefix, keys.NVLINK_PARTITION)
    return _rooms(nodes, prefix, lambda labels: labels.get(partition_key))


def network_groups(
    nodes: Sequence[Mapping[str, Any]], prefix: str, tier: int
) -> dict[str, Partition]:
    """Each group of network tier `tier` (the values of its `network-tier-<tier>` label): its
    nodes and free GPUs, counted as `partitions` counts them."""
    return _rooms(nodes, prefix, lambda labels: network_tiers(labels, prefix).get(tier))


def _rooms(
    nodes: Sequence[Mapping[str, Any]],
    prefix: str,
    group_of: Callable[[Mapping[str, str]], str | None],
) -> dict[str, Partition]:
    count_key = keys.key(prefix, keys.COUNT)
    found: dict[str, tuple[int, int, list[int]]] = {}
    for node in nodes:
        labels = node_labels(node)
        group = group_of(labels)
        if not group:
            continue
        n, whole, free = found.setdefault(group, (0, 0, []))
        text = node_annotations(node).get(keys.key(prefix, keys.AVAILABILITY))
        gpus = labels.get(count_key, "")
        free_now: int | None = None
        if isinstance(text, str):
            try:
                free_now = len(decode_availability(text).free)
            except SchemaError:
                free_now = None
        if free_now is not None:
            free.append(free_now)
        full = free_now is not None and gpus.isdigit() and free_now == int(gpus) > 0
        found[group] = (n + 1, whole + full, free)
    return {p: Partition(n, w, tuple(f)) for p, (n, w, f) in found.items()}


@dataclass(frozen=True, slots=True)
class _Kind:
    """What a PodSet's `required` key asks its pods to share, and how a finding words it."""

    code: Code
    one: str
    """`one NVLink partition`, `one group of network tier 0`."""
    each: str
    """`partition`, `group`."""
    fix: str


_PARTITION = _Kind(
    Code.POD_GROUP_EXCEEDS_PARTITIONS,
    "one NVLink partition",
    "partition",
    "the group waits until one partition frees that much: shrink the PodSet, let it span "
    "partitions (topologyRequest.preferred instead of required), or free nodes in one partition "
    "(kubectl gpu-topology --partitions counts them)",
)


def _network_kind(tier: int) -> _Kind:
    return _Kind(
        Code.POD_GROUP_EXCEEDS_NETWORK_GROUPS,
        f"one group of network tier {tier}",
        "group",
        "the group waits until one network group frees that much: shrink the PodSet, require a "
        "higher tier or let it span groups (topologyRequest.preferred instead of required), or "
        "free nodes in one group (kubectl gpu-topology --network counts them)",
    )


def pod_group_findings(
    workloads: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    prefix: str,
    resource: str = GPU_RESOURCE,
) -> dict[str, list[Finding]]:
    """Findings by subject (`workload NAMESPACE/NAME`): each Pending Workload with a PodSet that
    must stay in one NVLink partition, of pods asking for GPUs, whose pods no partition can host
    now. Workloads that do not read as such are passed over."""
    if not workloads:
        return {}
    partition_key = keys.key(prefix, keys.NVLINK_PARTITION)
    counted: dict[str, tuple[_Kind, dict[str, Partition]]] = {}

    def rooms(required: object) -> tuple[_Kind, dict[str, Partition]] | None:
        """What `required` asks pods to share and each such set's room; None when it is not
        one of our keys. Counted once per key."""
        if not isinstance(required, str):
            return None
        if required not in counted:
            tier = tier_of_key(required, prefix)
            if required == partition_key:
                counted[required] = (_PARTITION, partitions(nodes, prefix))
            elif tier is not None:
                counted[required] = (_network_kind(tier), network_groups(nodes, prefix, tier))
            else:
                return None
        return counted[required]

    out: dict[str, list[Finding]] = {}
    for workload in workloads:
        if not isinstance(workload, Mapping) or _admitted(workload):
            continue
        meta = workload.get("metadata")
        spec = workload.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue
        subject = f"{WORKLOAD}{meta.get('namespace', '?')}/{meta.get('name', '?')}"
        sets = spec.get("podSets")
        for pod_set in sets if isinstance(sets, list) else []:
            finding = _too_big(pod_set, rooms, resource)
            if finding is not None:
                out.setdefault(subject, []).append(finding)
    return out


def _admitted(workload: Mapping[str, Any]) -> bool:
    status = workload.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, Mapping)
        and c.get("type") in ("Admitted", "Finished")
        and c.get("status") == "True"
        for c in conditions
    )


def _too_big(
    pod_set: Any,
    rooms_of: Callable[[object], tuple[_Kind, dict[str, Partition]] | None],
    resource: str,
) -> Finding | None:
    if not isinstance(pod_set, Mapping):
        return None
    request = pod_set.get("topologyRequest")
    required = request.get("required") if isinstance(request, Mapping) else None
    judged = rooms_of(required)
    if judged is None or not judged[1]:
        return None  # not our key, or no node carries it: nothing to compare with
    kind, rooms = judged
    count, template = pod_set.get("count"), pod_set.get("template")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    if not isinstance(template, Mapping):
        return None
    try:
        gpus = gpus_requested(template, resource)
    except PodRequestError:
        return None
    if gpus < 1:
        return None
    by_room = sorted(rooms.items(), key=lambda item: (-item[1].room(gpus), item[0]))
    best = by_room[0][1].room(gpus)
    if count <= best:
        return None
    shown = [
        f"{name}: room for {p.room(gpus)} pods, {p.whole_free} of {p.nodes} nodes wholly free"
        for name, p in by_room[:SHOWN_PARTITIONS]
    ]
    if len(by_room) > SHOWN_PARTITIONS:
        shown.append(f"{len(by_room) - SHOWN_PARTITIONS} more {kind.each}s, with less room")
    name = pod_set.get("name", "?")
    return Finding(
        code=kind.code,
        severity=Severity.WARNING,
        summary=f"PodSet {name} needs {count} pods of {gpus} {resource} in {kind.one} "
        f"({required}); the roomiest {kind.each} has room for {best} now",
        evidence=tuple(shown),
        fix=kind.fix,
    )
