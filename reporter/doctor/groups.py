"""Findings about pod groups: a Pending Kueue Workload that must land in one NVLink partition and
needs more room than any partition has free.

The pod groups read are Kueue Workloads (`kueue.x-k8s.io`, v1beta2, else v1beta1): a PodSet whose
`topologyRequest.required` is our `nvlink-partition` label key must place all its pods in one
partition (Kueue's Topology Aware Scheduling). KEP-5732's pod groups of kube-scheduler are not
read: no release the tests run serves them.

Pure: it judges the Workload and Node objects `topo-reporter doctor --all` hands it, and reads
nothing itself. A partition's room for pods of G GPUs is the sum, over its nodes, of each node's
free GPUs (its availability annotation) divided by G, rounded down: for pods of a whole node's
GPUs, its whole free nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from reporter.schema.scheduler import PodRequestError, gpus_requested

WORKLOAD_GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")
"""Kueue's Workload versions, newest first: v0.17 to v0.19 serve both."""
SHOWN_PARTITIONS = 5
"""Partitions named in the evidence, roomiest first; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Partition:
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
    count_key = keys.key(prefix, keys.COUNT)
    found: dict[str, tuple[int, int, list[int]]] = {}
    for node in nodes:
        labels = node_labels(node)
        partition = labels.get(partition_key)
        if not partition:
            continue
        n, whole, free = found.setdefault(partition, (0, 0, []))
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
        found[partition] = (n + 1, whole + full, free)
    return {p: Partition(n, w, tuple(f)) for p, (n, w, f) in found.items()}


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
    rooms = partitions(nodes, prefix)
    if not rooms:
        return {}
    partition_key = keys.key(prefix, keys.NVLINK_PARTITION)
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
            finding = _too_big(pod_set, partition_key, rooms, resource)
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
    pod_set: Any, partition_key: str, rooms: Mapping[str, Partition], resource: str
) -> Finding | None:
    if not isinstance(pod_set, Mapping):
        return None
    request = pod_set.get("topologyRequest")
    if not isinstance(request, Mapping) or request.get("required") != partition_key:
        return None
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
        shown.append(f"{len(by_room) - SHOWN_PARTITIONS} more partitions, with less room")
    name = pod_set.get("name", "?")
    return Finding(
        code=Code.POD_GROUP_EXCEEDS_PARTITIONS,
        severity=Severity.WARNING,
        summary=f"PodSet {name} needs {count} pods of {gpus} {resource} in one NVLink "
        f"partition ({partition_key}); the roomiest partition has room for {best} now",
        evidence=tuple(shown),
        fix="the group waits until one partition frees that much: shrink the PodSet, let it "
        "span partitions (topologyRequest.preferred instead of required), or free "
        "nodes in one partition (kubectl gpu-topology --partitions counts them)",
    )
