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

import random
import threading
import time
from collections.abc import Callable, Iterable

import structlog

from reporter.availability import AVAILABILITY_KEY
from reporter.errors import ApiTransientError, PublishError
from reporter.extender.protocol import DEFAULT_RESOURCE, NodeRank, RankTable, rank
from reporter.publish.watch import NodeAnnotation, NodeWatchClient, WatchEvent, WatchExpired

QUICK_END_S = 1.0
"""A watch that ends this soon with nothing in it counts as a failure (backoff), not progress."""


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
        self.annotation = f"{prefix}/{AVAILABILITY_KEY}"
        self.vouched = vouched
        self._resource = resource
        self._lock = threading.Lock()
        self._text: dict[str, str | None] = {}
        self._table = RankTable(resource)
        self._synced = threading.Event()

    def replace(self, nodes: Iterable[NodeAnnotation]) -> None:
        """Take a full list: nodes absent from it are gone."""
        fresh = {n.name: n.value for n in nodes}
        with self._lock:
            old = self._table
            table = RankTable(self._resource)
            for name, text in fresh.items():
                unchanged = self._text.get(name, ...) == text and name in old.ranks
                table.set(name, old.ranks[name] if unchanged else self._rank(name, text))
            # The sizes the scheduler was asking for stay encoded: no call pays for the relist.
            for k in old.sizes():
                table.verdicts(k)
            self._text, self._table = fresh, table
        self._synced.set()

    def apply(self, event: WatchEvent) -> None:
        """Take one watch event; a BOOKMARK changes nothing."""
        node = event.node
        if node is None:
            return
        with self._lock:
            if event.type == "DELETED":
                self._text.pop(node.name, None)
                self._table.drop(node.name)
            elif self._text.get(node.name, ...) != node.value or node.name not in self._table.ranks:
                self._text[node.name] = node.value
                self._table.set(node.name, self._rank(node.name, node.value))

    def revise(self, name: str) -> None:
        """Judge the node again: whether it is vouched for changed."""
        with self._lock:
            if name in self._text:
                self._table.set(name, self._rank(name, self._text[name]))

    def _rank(self, name: str, text: str | None) -> NodeRank | None:
        return rank(text) if self.vouched(name) else None

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

    def counts(self) -> tuple[int, int]:
        """(nodes known, nodes whose availability is missing or damaged)."""
        with self._lock:
            ranks = self._table.ranks
            return len(ranks), sum(a is None for a in ranks.values())


class NodeWatcher:
    """Keeps a NodeCache current: list, then watch from its resourceVersion, relist on 410."""

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
        self._client = client
        self._cache = cache
        self._stop = stop
        self._log = log
        self._on_error = on_error
        self._initial_s = backoff_initial_s
        self._max_s = backoff_max_s
        self._thread = threading.Thread(target=self.run, name="topo-reporter-watch", daemon=True)
        self._problem: str | None = "no list of Nodes yet"

    def start(self) -> NodeWatcher:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def problem(self) -> str | None:
        """Why the view of the Nodes may be stale (the last list or watch failed), or None."""
        return self._problem

    def run(self) -> None:
        """List and watch until `stop` is set; errors are logged, counted and waited out."""
        failures = 0
        while not self._stop.is_set():
            try:
                snapshot = self._client.list_nodes(self._cache.annotation)
                self._cache.replace(snapshot.nodes)
                self._log.info("nodes_listed", nodes=len(snapshot.nodes))
                failures = 0
                self._watch(snapshot.resource_version)
            except WatchExpired:
                self._log.info("watch_expired")
            except PublishError as e:
                self._problem = str(e)
                self._on_error(e)
                failures += 1
                # Full jitter, so that replicas restarted together do not relist together.
                wait = random.uniform(0, min(self._max_s, self._initial_s * 2 ** min(failures, 16)))
                self._log.warning("watch_failed", error=str(e), wait_s=round(wait, 3))
                self._stop.wait(wait)

    def _watch(self, resource_version: str) -> None:
        while not self._stop.is_set():
            started, events = time.monotonic(), 0
            watch = self._client.watch_nodes(self._cache.annotation, resource_version, self._stop)
            # Listed and watching: the view is current (a list alone would flap with a refused
            # watch).
            self._problem = None
            for event in watch:
                self._cache.apply(event)
                resource_version = event.resource_version or resource_version
                events += 1
            if not events and time.monotonic() - started < QUICK_END_S:
                # A server that ends every watch at once would otherwise be asked in a loop.
                raise ApiTransientError("watch nodes: the API server ended the watch at once")
