"""The node's NodeResourceTopology (`topology.node.k8s.io/v1alpha2`), built from what we observed.

scheduler-plugins' `NodeResourceTopologyMatch` aligns a pod with one NUMA node only from this
object: zones `node-<N>` of type `Node` with, per zone, capacity, allocatable and available of each
resource; NUMA distances as zone costs; the kubelet's Topology Manager policy and scope as
attributes; and the pods fingerprint, without which its cache never resyncs a node that received
a pod. This module is pure: it builds the object and never talks to the API.

Why cpu and memory too, when the point is GPUs: with `single-numa-node`, the plugin rejects a pod
that requests a native resource (cpu, memory) no zone lists, so an object with GPUs alone would
make every pod with requests unschedulable on the node. cpu comes from each NUMA node's CPU list,
minus the CPUs PodResources says are held exclusively; memory is each NUMA node's MemTotal.
Hugepages are not listed: a pod requesting them is refused by the plugin under `single-numa-node`.

When nobody can vouch for the availability (PodResources reads keep failing), `withdrawn` turns
the published object into one the plugin does not filter on: the same zones, no Topology Manager
policy (the plugin then applies its default, `none`, whose filter admits every pod) and an
attribute saying why. Deleting the object would say "no topology" to a plugin that reads the API
on each pod, but its reserve cache (`cacheResyncPeriodSeconds` > 0) keeps the last copy of a
deleted object and goes on filtering on it: it lists the objects once, takes changes only from
its resync (which skips an object it cannot get) and from watched attribute changes
(scheduler-plugins v0.34.7, `pkg/noderesourcetopology/cache/overreserve.go`, `attr_watch.go`).

The pods fingerprint is podfingerprint v1 (`pfp0v001`), checked against the upstream test vectors:
xxh64 of each pod's name seeded with the xxh64 of its namespace, sorted, written little-endian and
hashed again with xxh64, printed as 16 hex digits. It covers every pod PodResources `List` returns
(method `all`).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from parsers.kubelet import KubeletPolicies
from reporter.errors import InputError
from reporter.schema import keys
from reporter.schema.model import Topology

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"
ZONE_TYPE = "Node"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "topo-reporter"
"""The value of MANAGED_BY on objects we own; anything else belongs to another producer. Ours also
carry `<prefix>/node=<node>` (keys.OWNER_NODE), which says which install's agent wrote them."""
POLICY = "topologyManagerPolicy"
SCOPE = "topologyManagerScope"
WITHDRAWN = "topo-reporter.availability"
"""The attribute of a withdrawn object (value WITHDRAWN_VALUE): nobody vouches for its zones."""
WITHDRAWN_VALUE = "withdrawn: PodResources unreadable"
FINGERPRINT = "nodeTopologyPodsFingerprint"
FINGERPRINT_METHOD = "nodeTopologyPodsFingerprintMethod"
FINGERPRINT_PREFIX = "pfp0v001"
GPU_RESOURCE = keys.GPU_RESOURCE
MAX_PODS = 10_000
"""More pods than a kubelet runs (its default limit is 110): a bigger list is not a node's."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_VALUE_MAX = 63


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as PodResources names it (it carries no UID)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the kubelet says about the node now (PodResources)."""

    pods: tuple[PodRef, ...]
    """Every pod `List` returned."""
    free_gpus: frozenset[int] | None = None
    """Free GPU indexes; None when unknown (available is then allocatable)."""
    exclusive_cpus: frozenset[int] = frozenset()
    """CPUs held exclusively by pods (the CPU manager's `static` policy)."""


def pods_fingerprint(pods: Iterable[PodRef]) -> str:
    """podfingerprint v1 of a set of pods: `pfp0v001` and 16 hex digits."""
    hashes = sorted(
        xxhash.xxh64_intdigest(p.name.encode(), seed=xxhash.xxh64_intdigest(p.namespace.encode()))
        for p in pods
    )
    packed = struct.pack(f"<{len(hashes)}Q", *hashes)
    return FINGERPRINT_PREFIX + xxhash.xxh64(packed).hexdigest()


def zone_name(numa: int) -> str:
    return f"node-{numa}"


def node_resource_topology(
    node: str,
    topology: Topology,
    state: NodeState,
    memory: Mapping[int, int],
    *,
    policies: KubeletPolicies,
    prefix: str,
    resource: str = GPU_RESOURCE,
    node_uid: str | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology object named after `node`, written by the agent under `prefix`.

    `memory` is each NUMA node's MemTotal in bytes. Raises InputError when the node name cannot be
    a label value, when the topology knows no NUMA node, when a NUMA node's memory is unknown (an
    object without it would block pods, see the module docstring), or for more than MAX_PODS pods.
    """
    if not _NAME.fullmatch(node):
        raise InputError(f"{node!r} is not a node name")
    if len(node) > _LABEL_VALUE_MAX:
        raise InputError(
            f"node name {node[:80]!r} has {len(node)} characters: the NodeResourceTopology names "
            f"its node in the label {keys.key(prefix, keys.OWNER_NODE)}, whose value is at most "
            f"{_LABEL_VALUE_MAX} characters; turn --nrt off on this node"
        )
    if len(state.pods) > MAX_PODS:
        raise InputError(f"{len(state.pods)} pods is more than a node runs (limit {MAX_PODS})")
    numa_ids = sorted({n.id for n in topology.numa_nodes})
    if not numa_ids:
        raise InputError(
            "no NUMA node is known on this machine (a VM?): a NodeResourceTopology without "
            "zones would make NodeResourceTopologyMatch refuse pods; turn --nrt off here"
        )
    missing = [n for n in numa_ids if n not in memory]
    if missing:
        raise InputError(
            f"the memory of NUMA node {missing[0]} is unknown (sysfs "
            f"devices/system/node/node{missing[0]}/meminfo): a NodeResourceTopology without it "
            "would make NodeResourceTopologyMatch refuse pods that request memory"
        )
    zones = [_zone(topology, state, numa, memory[numa], numa_ids, resource) for numa in numa_ids]
    # Never without the policy: NodeResourceTopologyMatch takes a node without it for `none` and
    # admits pods a `single-numa-node` kubelet rejects.
    attributes = [
        {"name": POLICY, "value": policies.topology_manager_policy},
        {"name": SCOPE, "value": policies.topology_manager_scope},
    ]
    attributes += [
        {"name": FINGERPRINT, "value": pods_fingerprint(state.pods)},
        {"name": FINGERPRINT_METHOD, "value": "all"},
    ]
    metadata: dict[str, Any] = {"name": node, "labels": own_labels(node, prefix)}
    if node_uid is not None:
        # Garbage-collected with its Node, as resource-topology-exporter's are.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "zones": zones,
        "attributes": attributes,
    }


def own_labels(node: str, prefix: str) -> dict[str, str]:
    """The labels of the object the agent of `node` writes under `prefix`."""
    return {MANAGED_BY: MANAGER, keys.key(prefix, keys.OWNER_NODE): node}


def ownership(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The labels that say whose an object is: MANAGED_BY and every prefix's owner label. Equal to
    `own_labels` on the object the agent would write; an object an earlier version wrote, or one
    another install's agent wrote, differs, and is written again."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    owners = keys.owner_keys(labels)
    return {k: v for k, v in labels.items() if k == MANAGED_BY or k in owners}


def withdrawn(published: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """`published` (an object of ours, as the API holds it) made one NodeResourceTopologyMatch does
    not filter on, by the agent under `prefix`: its zones as they are, every attribute but the
    Topology Manager policy, and WITHDRAWN. The same again for an object already withdrawn."""
    meta = published.get("metadata") or {}
    name = str(meta.get("name"))
    metadata: dict[str, Any] = {"name": name, "labels": own_labels(name, prefix)}
    if meta.get("ownerReferences"):
        metadata["ownerReferences"] = meta["ownerReferences"]
    zones = published.get("zones")
    attributes = [
        a
        for a in published.get("attributes") or ()
        if isinstance(a, dict) and a.get("name") not in (POLICY, WITHDRAWN)
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "zones": zones if isinstance(zones, list) else [],
        "attributes": [*attributes, {"name": WITHDRAWN, "value": WITHDRAWN_VALUE}],
    }


def _zone(
    topology: Topology,
    state: NodeState,
    numa: int,
    memory_bytes: int,
    numa_ids: list[int],
    resource: str,
) -> dict[str, Any]:
    gpus = [g.index for g in topology.gpus if topology.home_numa(g.index) == numa]
    healthy = [i for i in gpus if not topology.gpus[i].lost]
    free = healthy if state.free_gpus is None else [i for i in healthy if i in state.free_gpus]
    cpus = next(n.cpus for n in topology.numa_nodes if n.id == numa)
    resources = [
        _resource("cpu", len(cpus), len(cpus), len(cpus - state.exclusive_cpus)),
        _resource("memory", memory_bytes, memory_bytes, memory_bytes),
        _resource(resource, len(gpus), len(healthy), len(free)),
    ]
    zone: dict[str, Any] = {"name": zone_name(numa), "type": ZONE_TYPE, "resources": resources}
    distances = next(n.distances for n in topology.numa_nodes if n.id == numa)
    # A distance row lists every online NUMA node in id order; one of another length is not
    # trusted (an offline node in between would shift every cost).
    if len(distances) == len(numa_ids):
        zone["costs"] = [
            {"name": zone_name(other), "value": d}
            for other, d in zip(numa_ids, distances, strict=True)
        ]
    return zone


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": str(capacity),
        "allocatable": str(allocatable),
        "available": str(available),
    }
