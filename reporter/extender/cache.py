"""The extender's own view of the Nodes: availability by node name, kept current by list + watch.

With `nodeCacheCapable` the scheduler sends node names only; at 5,000 nodes whole Node objects
would be megabytes per call. The cache decodes each node's availability annotation once, when the
watch says the node changed (and only when the annotation's text changed), and keeps each node's
answer pre-encoded for the request sizes asked recently (`RankTable`), so that a scheduling call
costs dictionary lookups and joins, no Python code per node. A node it has not seen, or whose
annotation is missing or damaged, reads as None: never filtered, neutral score. So does a node
whose agent no longer vouches for its annotation, with heartbeats on (`vouched`, kept by
`reporter.extender.heartbeat`, which calls `revise` when a node's verdict changes).

The watch goes through `NodeWatchClient`, a seam we own (`reporter.publish.watch`, where the
lean client implements it); the loop relists when the watch expires (410 Gone) and backs off on
errors. It never writes anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import structlog

from reporter.errors import PublishError
from reporter.extender.eligibility import OPEN_NODE, NodeFacts, node_facts
from reporter.extender.protocol import (
    DEFAULT_RESOURCE,
    NodeRank,
    RankTable,
    connected_whole,
    rank,
)
from reporter.extender.reflector import Reflector
from reporter.publish.watch import NodeAnnotation, NodeWatchClient, WatchEvent
from reporter.schema import keys


class NodeCache:
    """Each node's rank by name, shared between the watch thread and the request threads."""

    def __init__(
        self,
        prefix: str,
        resource: str = DEFAULT_RESOURCE,
        *,
        vouched: Callable[[str], bool] = lambda node: True,
    ) -> None:
        """`vouched(node)`: whether the node's availability is to be trusted now (heartbeats)."""
        self.prefix = prefix
        self.annotation = keys.key(prefix, keys.AVAILABILITY)
        self.vouched = vouched
        self._resource = resource
        self._lock = threading.Lock()
        self._text: dict[str, str | None] = {}
        self._whole: dict[str, int] = {}
        """Node name to `connected_whole` of its labels, as last judged."""
        self._facts: dict[str, NodeFacts] = {}
        """Node name to where pods may go on it (labels, taints), as last seen."""
        self._place: dict[str, tuple[str | None, int | None]] = {}
        """Each node's NVLink partition and GPU count labels, for `capacity`."""
        self._table = RankTable(resource)
        self._synced = threading.Event()

    def replace(self, nodes: Iterable[NodeAnnotation]) -> None:
        """Take a full list: nodes absent from it are gone."""
        listed = list(nodes)
        fresh = {n.name: n.value for n in listed}
        wholes = {n.name: connected_whole(_labels(n), self.prefix) for n in listed}
        facts = {n.name: node_facts(n.node) for n in listed}
        with self._lock:
            old = self._table
            table = RankTable(self._resource)
            for name, text in fresh.items():
                unchanged = self._text.get(name, ...) == text and name in old.ranks
                r = old.ranks[name] if unchanged else self._rank(name, text)
                table.set(name, r, self._whole_of(name, wholes[name]), facts[name])
            # The sizes the scheduler was asking for stay encoded: no call pays for the relist.
            for k in old.sizes():
                table.verdicts(k)
            self._text, self._whole, self._facts, self._table = fresh, wholes, facts, table
            self._place = {n.name: (n.partition, n.gpus) for n in listed}
        self._synced.set()

    def apply(self, event: WatchEvent) -> None:
        """Take one watch event; a BOOKMARK changes nothing."""
        node = event.node
        if node is None:
            return
        with self._lock:
            if event.type == "DELETED":
                self._text.pop(node.name, None)
                self._whole.pop(node.name, None)
                self._facts.pop(node.name, None)
                self._place.pop(node.name, None)
                self._table.drop(node.name)
                return
            self._place[node.name] = (node.partition, node.gpus)
            whole = connected_whole(_labels(node), self.prefix)
            facts = node_facts(node.node)
            if (
                self._text.get(node.name, ...) != node.value
                or self._whole.get(node.name) != whole
                or self._facts.get(node.name) != facts
                or node.name not in self._table.ranks
            ):
                self._text[node.name] = node.value
                self._whole[node.name] = whole
                self._facts[node.name] = facts
                r = self._rank(node.name, node.value)
                self._table.set(node.name, r, self._whole_of(node.name, whole), facts)

    def revise(self, name: str) -> None:
        """Judge the node again: whether it is vouched for changed."""
        with self._lock:
            if name in self._text:
                r = self._rank(name, self._text[name])
                whole = self._whole_of(name, self._whole.get(name, 0))
                self._table.set(name, r, whole, self._facts.get(name, OPEN_NODE))

    def _rank(self, name: str, text: str | None) -> NodeRank | None:
        return rank(text) if self.vouched(name) else None

    def _whole_of(self, name: str, whole: int) -> int:
        # What a node's labels say of its wiring counts only while its agent vouches for it.
        return whole if self.vouched(name) else 0

    def get(self, name: str) -> NodeRank | None:
        """The node's rank; None when unknown, or its availability is absent or damaged."""
        return self._table.ranks.get(name)

    def table(self) -> RankTable:
        """The current ranks, for one request.

        A full relist replaces the table; a request that started before reads the old one,
        which is what it would have read a moment earlier.
        """
        return self._table

    @property
    def synced(self) -> bool:
        """True once a full list has been taken."""
        return self._synced.is_set()

    def capacity(self, sizes: Iterable[int]) -> tuple[dict[int, int], dict[str, int]]:
        """What the cluster can host now: per size k in `sizes`, the nodes that hand a pod of k
        GPUs an NVLink-connected set now (`connected_now`); per NVLink partition, its nodes whose
        GPUs are all free (free GPUs equal the `count` label). Every partition a node carries is
        listed, with 0 where none is free. Nodes whose availability reads as None count nowhere."""
        with self._lock:
            ranks, place = self._table.ranks, dict(self._place)
        capable = {
            k: sum(
                1
                for r in ranks.values()
                if r is not None and k <= len(r.connected) and r.connected[k - 1]
            )
            for k in sizes
        }
        free: dict[str, int] = {}
        for name, (partition, gpus) in place.items():
            if partition is None:
                continue
            r = ranks.get(name)
            whole = r is not None and gpus is not None and gpus > 0 and r.free == gpus
            free[partition] = free.get(partition, 0) + int(whole)
        return capable, free

    def counts(self) -> tuple[int, int]:
        """(nodes known, nodes whose availability is missing or damaged)."""
        with self._lock:
            ranks = self._table.ranks
            return len(ranks), sum(a is None for a in ranks.values())


def _labels(node: NodeAnnotation) -> object:
    meta = node.node.get("metadata")
    return meta.get("labels") if isinstance(meta, dict) else None


class NodeWatcher(Reflector[WatchEvent]):
    """Keeps a NodeCache current: list, then watch from its resourceVersion, relist on 410."""

    what = "nodes"

    def __init__(
        self,
        client: NodeWatchClient,
        cache: NodeCache,
        *,
        stop: threading.Event,
        log: structlog.typing.FilteringBoundLogger,
        on_error: Callable[[PublishError], None] = lambda e: None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        super().__init__(
            stop=stop,
            log=log,
            on_error=on_error,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            thread_name="topo-reporter-watch",
        )
        self._client = client
        self._cache = cache

    def _list(self) -> str:
        snapshot = self._client.list_nodes(self._cache.annotation)
        self._cache.replace(snapshot.nodes)
        self._log.info("nodes_listed", nodes=len(snapshot.nodes))
        return snapshot.resource_version

    def _watch_from(self, resource_version: str) -> Iterable[WatchEvent]:
        return self._client.watch_nodes(self._cache.annotation, resource_version, self._stop)

    def _apply(self, event: WatchEvent) -> None:
        self._cache.apply(event)
