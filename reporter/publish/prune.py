"""Prune: take away everything the agents under one prefix wrote to the cluster, and nothing else.

`helm uninstall` deletes what the chart created, not what its agents wrote: labels, annotations
and the fabric taint on every Node, DeviceTaintRules, NodeResourceTopology objects, heartbeat
Leases and NodeFeature objects. A stale NoSchedule taint keeps a node out of scheduling for good,
stale labels keep matching nodeAffinity rules. The chart's pre-delete hook runs `topo-reporter
prune`, as Node Feature Discovery's prune job does for NFD.

What is ours, kind by kind, is decided as the agent itself decides it, never by "under the
prefix" alone, since anyone who can edit an object can put a key under our prefix on it:
  - a Node's labels and annotations that its `<prefix>/owned` annotation lists (under the prefix,
    never Kubernetes-reserved: `reporter.publish.patch.owned`), that annotation itself, and the
    availability sink's four keys, which it owns by name and `owned` never lists
    (`reporter.publish.availability.availability_keys`);
  - the Node's taints with our key `<prefix>/fabric-health`; every other taint is sent back as read;
  - DeviceTaintRules labelled ours whose name and pool are the ones the agent of the node in
    their `<prefix>/node` label writes (`reporter.schema.dra.own_rule`);
  - NodeResourceTopology objects labelled `app.kubernetes.io/managed-by=topo-reporter` (another
    producer's never are: `reporter.publish.nrt`) and `<prefix>/node=<their name>`;
  - heartbeat Leases in the agents' namespace with our label, held by the node they are named for;
  - NodeFeature objects in the agents' namespace labelled ours and named `<node>-topo-reporter`
    after the node their NFD label and their `<prefix>/node` label both name.
Koordinator's device-info file lies on each node's disk, out of reach of one Job: not here.

The `<prefix>/node` label (`reporter.schema.keys.OWNER_NODE`) is what keeps prune under an old
prefix off the objects the current install's agents write: a NodeResourceTopology and a
NodeFeature are named after the node alone, so after a prefix change the same object is the new
install's. A NodeResourceTopology or NodeFeature of ours with no prefix's label at all was written
by a version before the label and cannot say its prefix: it is listed as left (`Plan.unlabelled`)
and removed only when asked (`unlabelled=True`, `prune --unlabelled`). The agent of any prefix
labels its own such object at its next write, so these exist only where no agent has run since.

Reads go through `reporter.publish.api.ApiClient` like every sink; `find` is read-only (the dry
run prints its plan), `remove` writes it: one merge patch per Node, carrying the resourceVersion
read (a 409 reads the Node again and recomputes), one delete per object.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import structlog

from reporter.errors import ApiPermanentError, ApiTransientError
from reporter.publish import retry
from reporter.publish.api import (
    LEASES,
    NODE_FEATURES,
    NODE_RESOURCE_TOPOLOGIES,
    NODES,
    ApiClient,
    Resource,
    device_taint_rules,
)
from reporter.publish.availability import availability_keys
from reporter.publish.lease import is_heartbeat
from reporter.publish.nodefeature import MANAGED_BY_LABEL, MANAGER, NAME_SUFFIX, NODE_NAME_LABEL
from reporter.publish.patch import (
    NodeMetadata,
    OwnTaint,
    metadata_patch,
    node_metadata,
    owned,
    taints_change,
)
from reporter.schema import dra, keys

PAGE_SIZE = 500
MAX_PAGES = 1000
NODE_RBAC_VERBS = ("list", "get", "patch")
"""What prune does to Nodes (the chart's hook ClusterRole grants exactly these)."""
OBJECT_RBAC_VERBS = ("list", "delete")
"""What prune does to every other kind."""
FORBIDDEN_HINT = (
    "prune needs list, get and patch on nodes, and list and delete on devicetaintrules, "
    "noderesourcetopologies and, in the agents' namespace, leases and nodefeatures: the chart's "
    "pre-delete hook holds exactly these; by hand, run it with a cluster admin's kubeconfig"
)


@dataclass(frozen=True, slots=True)
class NodeCleanup:
    """What comes off one Node: its owned keys, the `owned` annotation, our taint."""

    node: str
    labels: tuple[str, ...]
    annotations: tuple[str, ...]
    taints: tuple[str, ...]
    """Our taints as `key=value:effect`, for the listing."""
    patch: Mapping[str, Any]
    """The merge patch removing them, with the resourceVersion read."""

    def describe(self) -> str:
        """One line saying what comes off the Node."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("labels", self.labels),
                ("annotations", self.annotations),
                ("taint", self.taints),
            )
            if names
        ]
        return f"node {self.node}: {'; '.join(parts)}"


@dataclass(frozen=True, slots=True)
class ObjectRemoval:
    """One object of ours to delete."""

    resource: Resource
    name: str
    namespace: str | None = None

    def describe(self) -> str:
        """`Lease gpu-system/n1`, `NodeResourceTopology n1`."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.resource.kind} {where}"


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything of ours found on the cluster, and the kinds it does not serve."""

    nodes: tuple[NodeCleanup, ...]
    objects: tuple[ObjectRemoval, ...]
    not_served: tuple[str, ...]
    unlabelled: tuple[ObjectRemoval, ...] = ()
    """Objects of ours that name no prefix, left where `find` was not asked to remove them."""

    def lines(self) -> Iterator[str]:
        """One line per Node and per object, in the order `remove` takes them."""
        yield from (n.describe() for n in self.nodes)
        yield from (o.describe() for o in self.objects)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _meta(obj: Any) -> dict[str, Any]:
    return _object(_object(obj).get("metadata"))


def _labels(obj: Any) -> dict[str, Any]:
    return _object(_meta(obj).get("labels"))


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'' if value is None else f'={value}'}:{taint.get('effect')}"


def node_cleanup(node: NodeMetadata, prefix: str) -> NodeCleanup | None:
    """What of ours `node` carries under `prefix`, as a patch; None when it carries nothing."""
    owned_key = keys.key(prefix, keys.OWNED)
    listed = owned(node.annotations, prefix)
    free_labels, free_annotations = availability_keys(prefix)
    labels = tuple(sorted(k for k in listed | free_labels if k in node.labels))
    annotations = tuple(
        sorted(k for k in (listed | free_annotations) - {owned_key} if k in node.annotations)
    )
    if owned_key in node.annotations:
        annotations = (*annotations, owned_key)
    ours = OwnTaint(keys.key(prefix, keys.FABRIC_TAINT), None)
    taints = taints_change(node, ours)
    removed = tuple(_taint_text(t) for t in node.taints if t.get("key") == ours.key)
    body = metadata_patch(dict.fromkeys(labels), dict.fromkeys(annotations), node.resource_version)
    if taints is not None:
        body = body or {"metadata": {"resourceVersion": node.resource_version}}
        # A merge patch replaces the whole list: every other taint goes back as it was read.
        body["spec"] = {"taints": taints}
    if body is None:
        return None
    return NodeCleanup(node.name, labels, annotations, removed, body)


def own_device_taint_rule(rule: Any, prefix: str) -> bool:
    """Whether a listed DeviceTaintRule is one the agent of the node in its label writes."""
    node = _labels(rule).get(keys.key(prefix, keys.OWNER_NODE))
    if _labels(rule).get(MANAGED_BY_LABEL) != MANAGER or not isinstance(node, str):
        return False
    return dra.own_rule(rule, node, prefix) is not None


class Owner(Enum):
    """Whose a listed NodeResourceTopology or NodeFeature of ours is, as prune judges it."""

    PREFIX = "prefix"
    """Labelled as written under the prefix being pruned."""
    UNLABELLED = "unlabelled"
    """Carrying no prefix's owner label: a version before that label wrote it."""


def _owner(obj: Any, node: str, prefix: str) -> Owner | None:
    """Whose an object of ours standing for `node` is; None: another prefix's (or one whose
    owner label names another node: edited by hand, never guessed at)."""
    labels = _labels(obj)
    if labels.get(keys.key(prefix, keys.OWNER_NODE)) == node:
        return Owner.PREFIX
    return None if keys.owner_keys(labels) else Owner.UNLABELLED


def node_resource_topology_owner(obj: Any, prefix: str) -> Owner | None:
    """Whose a NodeResourceTopology is: None when it is not ours (another producer's lacks our
    label) or is another prefix's."""
    name = _meta(obj).get("name")
    if _labels(obj).get(MANAGED_BY_LABEL) != MANAGER or not isinstance(name, str):
        return None
    return _owner(obj, name, prefix)


def own_lease(lease: Any, prefix: str) -> bool:
    """Whether a Lease is the heartbeat of the node it is named for, under `prefix`."""
    name = _meta(lease).get("name")
    holder = _object(_object(lease).get("spec")).get("holderIdentity")
    return is_heartbeat(_object(lease), prefix) and isinstance(name, str) and holder == name


def node_feature_owner(obj: Any, prefix: str) -> Owner | None:
    """Whose a NodeFeature is: None when it is not ours (our label, named after the node its NFD
    label names) or is another prefix's."""
    labels = _labels(obj)
    node = labels.get(NODE_NAME_LABEL)
    if (
        labels.get(MANAGED_BY_LABEL) != MANAGER
        or not isinstance(node, str)
        or _meta(obj).get("name") != node + NAME_SUFFIX
    ):
        return None
    return _owner(obj, node, prefix)


class Pruner:
    """Finds and removes what the agents under one prefix wrote; see the module docstring."""

    def __init__(
        self,
        api: ApiClient,
        *,
        prefix: str,
        namespace: str,
        log: structlog.typing.FilteringBoundLogger,
        backoff: retry.Backoff,
        unlabelled: bool = False,
    ) -> None:
        """`unlabelled`: also remove the objects of ours that name no prefix (module docstring)."""
        self._api = api
        self._prefix = prefix
        self._namespace = namespace
        self._unlabelled = unlabelled
        # The stop event is never set: prune is one pass, ended by its process.
        self._retry = retry.Retrying(threading.Event(), backoff, log)

    def _call(self, operation: Callable[[], Any], what: str) -> Any:
        try:
            return self._retry(operation, what=what)
        except ApiPermanentError as e:
            if e.status == 403:
                raise ApiPermanentError(f"{e} ({FORBIDDEN_HINT})", status=403) from None
            raise

    def _items(
        self, resource: Resource, namespace: str | None, selector: str | None
    ) -> list[Any] | None:
        """Every object of the collection (all pages); None when the cluster does not serve it."""
        items: list[Any] = []
        base = {"limit": str(PAGE_SIZE)} | ({"labelSelector": selector} if selector else {})
        query = base
        for _ in range(MAX_PAGES):
            try:
                page = self._call(
                    functools.partial(self._api.list, resource, namespace, query=query),
                    f"list {resource.plural}",
                )
            except ApiPermanentError as e:
                if e.status == 404:
                    return None
                raise
            items.extend(page.get("items") or ())
            more = _object(page.get("metadata")).get("continue")
            if not more:
                return items
            query = base | {"continue": str(more)}
        raise ApiTransientError(f"list {resource.plural}: more than {MAX_PAGES} pages")

    def find(self) -> Plan:
        """Everything of ours on the cluster, read only. Raises PublishError."""
        nodes = self._items(NODES, None, None) or []
        cleanups = (node_cleanup(node_metadata(n), self._prefix) for n in nodes)
        objects: list[ObjectRemoval] = []
        not_served: list[str] = []
        node_label = keys.key(self._prefix, keys.OWNER_NODE)
        rules = None
        for version in dra.VERSIONS:
            resource = device_taint_rules(version)
            rules = self._items(resource, None, f"{MANAGED_BY_LABEL}={MANAGER},{node_label}")
            if rules is not None:
                objects += (
                    ObjectRemoval(resource, str(_meta(r)["name"]))
                    for r in rules
                    if own_device_taint_rule(r, self._prefix)
                )
                break
        if rules is None:
            not_served.append("DeviceTaintRule")
        unlabelled: list[ObjectRemoval] = []
        # Every object of ours is listed, the unlabelled ones too: they are said when left.
        mine = f"{MANAGED_BY_LABEL}={MANAGER}"
        kinds: tuple[tuple[Resource, str | None, str, Callable[[Any], Owner | None]], ...] = (
            (
                NODE_RESOURCE_TOPOLOGIES,
                None,
                mine,
                lambda obj: node_resource_topology_owner(obj, self._prefix),
            ),
            (
                LEASES,
                self._namespace,
                "=".join((keys.key(self._prefix, keys.HEARTBEAT), keys.HEARTBEAT_AVAILABILITY)),
                lambda lease: Owner.PREFIX if own_lease(lease, self._prefix) else None,
            ),
            (
                NODE_FEATURES,
                self._namespace,
                mine,
                lambda obj: node_feature_owner(obj, self._prefix),
            ),
        )
        for resource, namespace, selector, owner in kinds:
            found = self._items(resource, namespace, selector)
            if found is None:
                not_served.append(resource.kind)
                continue
            for obj in found:
                whose = owner(obj)
                if whose is None:
                    continue
                removal = ObjectRemoval(resource, str(_meta(obj)["name"]), namespace)
                if whose is Owner.PREFIX or self._unlabelled:
                    objects.append(removal)
                else:
                    unlabelled.append(removal)
        return Plan(
            tuple(c for c in cleanups if c is not None),
            tuple(objects),
            tuple(not_served),
            tuple(unlabelled),
        )

    def remove(self, plan: Plan, on_removed: Callable[[str], None]) -> None:
        """Remove what `plan` found; `on_removed` hears each line as it is done. Raises
        PublishError (what was removed before stays removed; running again goes on)."""
        for cleanup in plan.nodes:
            done = self._call(
                functools.partial(self._clean_node, cleanup.node), f"patch node {cleanup.node}"
            )
            if done is not None:
                on_removed(done.describe())
        for obj in plan.objects:
            self._call(
                functools.partial(self._api.delete, obj.resource, obj.name, obj.namespace),
                f"delete {obj.describe()}",
            )
            on_removed(obj.describe())

    def _clean_node(self, name: str) -> NodeCleanup | None:
        """Read the Node again and patch what of ours it carries now (a 409 comes back here)."""
        found = self._api.get(NODES, name)
        if found is None:
            return None
        cleanup = node_cleanup(node_metadata(found), self._prefix)
        if cleanup is not None:
            self._api.merge_patch(NODES, name, cleanup.patch)
        return cleanup
