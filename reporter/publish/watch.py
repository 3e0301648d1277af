"""List and watch Nodes through the ApiClient seam: the extender's `NodeWatchClient`.

It reads whole Nodes: beside the availability annotation and the labels, the extender needs what
decides where a pod may go (taints, `spec.unschedulable`, the Ready condition), which
`PartialObjectMetadata` leaves out. Of each object only those parts are kept, so a page is
freed once read. The watch is the seam's (one streamed GET, bookmarks on, bounded lines, ended by
the server's `timeoutSeconds` or by `stop`). A 410 Gone, as an HTTP status or as a watch ERROR
event, raises `WatchExpired` so the caller relists. Every other failure is a PublishError from the
shared mapping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from reporter.errors import ApiPermanentError, ApiTransientError
from reporter.publish.api import NODES, ApiClient, WatchExpired
from reporter.schema import keys

__all__ = [
    "MAX_PAGES",
    "PAGE_SIZE",
    "NodeAnnotation",
    "NodeSnapshot",
    "NodeWatch",
    "NodeWatchClient",
    "WatchEvent",
    "WatchExpired",
]
PAGE_SIZE = 500
MAX_PAGES = 1000
"""500,000 nodes: a loop that never ends is a server bug, not a cluster."""


@dataclass(frozen=True, slots=True)
class NodeAnnotation:
    """One Node as the cache needs it: its name, its availability annotation (None: absent),
    the parts of the object that say where pods may go (its labels, taints, `unschedulable` and
    Ready condition, in the Node's own shape; empty when not sent), and for the capacity gauges
    its NVLink partition and GPU count labels (None: absent)."""

    name: str
    value: str | None
    node: Mapping[str, Any] = field(default_factory=dict)
    partition: str | None = None
    gpus: int | None = None
    version: str = ""
    """Its `metadata.resourceVersion` ("" when not sent)."""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Every Node, and the resourceVersion to watch from."""

    nodes: tuple[NodeAnnotation, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED, or BOOKMARK (node None, progress only)."""

    type: str
    node: NodeAnnotation | None
    resource_version: str


class NodeWatchClient(Protocol):
    """List and watch Nodes' metadata. Implementations raise only PublishError subclasses."""

    def list_nodes(self, annotation: str) -> NodeSnapshot:
        """Every Node (all pages, whole) with the value of annotation key `annotation`."""
        ...

    def watch_nodes(
        self, annotation: str, resource_version: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        """Start a watch from `resource_version` (raising when it is refused) and return its
        events, until the server ends it or `stop` is set.

        Raises (at once, or while iterating) WatchExpired when the server no longer holds that
        resourceVersion.
        """
        ...


def _forbidden(e: ApiPermanentError) -> ApiPermanentError:
    """A 403 that says which grant the extender needs."""
    what = str(e).partition(":")[0]
    return ApiPermanentError(
        f"{what}: forbidden (403): grant the extender's ClusterRole `list` and `watch` on "
        "`nodes` (the chart does with extender.enabled=true)",
        status=403,
    )


def node_annotation(obj: Any, key: str) -> NodeAnnotation:
    """A listed or watched Node object as the cache needs it; raises ApiTransientError without a
    name."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ApiTransientError("list or watch nodes: the API server sent an object without a name")
    annotations = meta.get("annotations")
    value = annotations.get(key) if isinstance(annotations, dict) else None
    # The agent's labels share its annotation's prefix.
    prefix = key.rpartition("/")[0]
    found = meta.get("labels")
    labels: dict[str, Any] = found if isinstance(found, dict) else {}
    partition = labels.get(keys.key(prefix, keys.NVLINK_PARTITION))
    count = labels.get(keys.key(prefix, keys.COUNT))
    return NodeAnnotation(
        meta["name"],
        value if isinstance(value, str) else None,
        _placement(obj),
        partition if isinstance(partition, str) and partition else None,
        int(count)
        if isinstance(count, str) and count.isascii() and count.isdigit() and len(count) <= 4
        else None,
        str(meta.get("resourceVersion") or ""),
    )


def _placement(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Node that say where pods may go (labels, taints, cordon, the Ready
    condition), so that a list of whole Nodes is not kept page after page (images, addresses and
    the other conditions are most of a Node's bytes)."""
    meta, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    spec = spec if isinstance(spec, dict) else {}
    return {
        "metadata": {"labels": meta.get("labels") if isinstance(meta, dict) else None},
        "spec": {"taints": spec.get("taints"), "unschedulable": spec.get("unschedulable")},
        "status": {
            "conditions": [
                c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"
            ]
            if isinstance(conditions, list)
            else None
        },
    }


class NodeWatch:
    """NodeWatchClient over any ApiClient: pages of whole Nodes, then a watch of them."""

    def __init__(self, api: ApiClient, *, watch_timeout_s: int = 300) -> None:
        self._api = api
        self._watch_timeout_s = watch_timeout_s

    def list_nodes(self, annotation: str) -> NodeSnapshot:
        nodes: list[NodeAnnotation] = []
        query = {"limit": str(PAGE_SIZE)}
        for _ in range(MAX_PAGES):
            try:
                page = self._api.list(NODES, query=query)
            except ApiPermanentError as e:
                if e.status == 403:
                    raise _forbidden(e) from e
                raise
            nodes.extend(node_annotation(item, annotation) for item in page["items"])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return NodeSnapshot(tuple(nodes), str(meta.get("resourceVersion") or ""))
            query = {"limit": str(PAGE_SIZE), "continue": str(meta["continue"])}
        raise ApiTransientError(f"list nodes: more than {MAX_PAGES} pages")

    def read_node(self, annotation: str, name: str) -> NodeAnnotation | None:
        """The Node `name` as the API server holds it now; None when there is none.

        A list by name, not a get: the extender's ClusterRole grants `list` and `watch` on Nodes
        and nothing more. Without a resourceVersion the list is a consistent read (quorum, or the
        watch cache once it has caught up), never older than any watch."""
        try:
            page = self._api.list(NODES, query={"fieldSelector": f"metadata.name={name}"})
        except ApiPermanentError as e:
            if e.status == 403:
                raise _forbidden(e) from e
            raise
        found = [node_annotation(item, annotation) for item in page.get("items") or []]
        return next((node for node in found if node.name == name), None)

    def watch_nodes(
        self, annotation: str, resource_version: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        try:
            events = self._api.watch(
                NODES,
                resource_version,
                stop,
                timeout_s=self._watch_timeout_s,
            )
        except ApiPermanentError as e:
            if e.status == 403:
                raise _forbidden(e) from e
            raise
        return (_event(event, annotation) for event in events)


def _event(event: Mapping[str, Any], annotation: str) -> WatchEvent:
    obj = event["object"]
    meta = obj.get("metadata")
    version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
    if event["type"] == "BOOKMARK":
        return WatchEvent("BOOKMARK", None, version)
    return WatchEvent(str(event["type"]), node_annotation(obj, annotation), version)
