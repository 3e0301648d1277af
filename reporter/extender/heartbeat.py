"""Whether each node's agent still vouches for its availability: the extender's heartbeat judge.

With heartbeats on, the agents renew one Lease per node (`reporter.publish.lease`) and the
extender trusts a node's availability only while that Lease is fresh. The rule is the node
lifecycle controller's for kubelets, which is immune to clock skew between machines: a Lease is
fresh for `leaseDurationSeconds` after the moment the extender *saw* its `renewTime` change (its
own monotonic clock; the writer's clock is never compared with ours). A node whose Lease is
missing, deleted, not held by the node, without a duration, or not renewed within its duration
is unknown, exactly like a node without the annotation: never filtered, neutral score.

Consequences, documented in docs/scheduling.md: after the extender starts, every Lease it lists
counts as just renewed (a dead agent's node is trusted for one more duration); while the extender
cannot watch Leases, every node falls back to unknown after one duration.

`Heartbeats` holds the verdicts and tells the NodeCache (`on_change`) of every node whose verdict
changed; `HeartbeatWatcher` keeps it current (list, watch, relist on 410, back off on errors) and
expires Leases as their time passes, on a thread of its own. It never writes anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Unpack

from prometheus_client import CollectorRegistry, Gauge

from reporter.errors import PublishError
from reporter.extender.reflector import Loop, Reflector
from reporter.publish.lease import Beat, BeatEvent, LeaseWatch

SWEEP_S = 1.0
"""How often expiries are looked for: a Lease is judged expired at most this late."""


class Heartbeats:
    """Each node's last seen renewal, and the nodes whose Lease is fresh now."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.on_change: Callable[[str], None] = lambda node: None
        """Called (outside any lock here) after a node's verdict changed: the NodeCache's
        `revise`, set once both exist (the cache asks `vouched`, this tells the cache)."""
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, float, int]] = {}
        """Node to (renewTime, when we saw it change, duration) of its valid Lease."""
        self._fresh: set[str] = set()
        self._synced = threading.Event()

    def vouched(self, node: str) -> bool:
        """Whether the node's agent vouches for its availability now. Lock-free: a set lookup."""
        return node in self._fresh

    @property
    def synced(self) -> bool:
        """True once a full list of Leases has been taken."""
        return self._synced.is_set()

    def renewal(self, node: str) -> str | None:
        """The `renewTime` last seen on the node's Lease; None when it has no valid Lease."""
        with self._lock:
            seen = self._seen.get(node)
            return None if seen is None else seen[0]

    def counts(self) -> tuple[int, int]:
        """(nodes with a fresh Lease, nodes with a Lease that expired or vouches for nothing)."""
        with self._lock:
            fresh = len(self._fresh)
            return fresh, len(self._seen) - fresh

    def replace(self, beats: Iterable[Beat]) -> None:
        """Take a full list: a node absent from it has no Lease."""
        listed = {b.node: b for b in beats}
        with self._lock:
            changed = [self._take(b) for b in listed.values()]
            for node in set(self._seen) - set(listed):
                changed.append(self._forget(node))
        self._synced.set()
        self._tell(changed)

    def apply(self, event: BeatEvent) -> None:
        """Take one watch event; a BOOKMARK changes nothing."""
        if event.beat is None:
            return
        with self._lock:
            if event.type == "DELETED":
                changed = self._forget(event.beat.node)
            else:
                changed = self._take(event.beat)
        self._tell([changed])

    def sweep(self) -> None:
        """Expire the Leases whose time has passed."""
        now = self._clock()
        with self._lock:
            expired = [n for n in self._fresh if now >= self._deadline(n)]
            self._fresh.difference_update(expired)
        self._tell(expired)

    def _deadline(self, node: str) -> float:
        _, seen_at, duration = self._seen[node]
        return seen_at + duration

    def _take(self, b: Beat) -> str | None:
        """Record a Lease (lock held); the node's name when its verdict changed."""
        if b.renew_time is None or b.duration_s is None:
            return self._forget(b.node)
        previous = self._seen.get(b.node)
        seen_at = self._clock()
        if previous is not None and previous[0] == b.renew_time:
            # Not renewed since we last saw it (a relist, another field changed): the clock
            # keeps running from when it was.
            seen_at = previous[1]
        self._seen[b.node] = (b.renew_time, seen_at, b.duration_s)
        return self._judge(b.node, self._clock() < seen_at + b.duration_s)

    def _forget(self, node: str) -> str | None:
        self._seen.pop(node, None)
        return self._judge(node, False)

    def _judge(self, node: str, fresh: bool) -> str | None:
        if fresh == (node in self._fresh):
            return None
        if fresh:
            self._fresh.add(node)
        else:
            self._fresh.discard(node)
        return node

    def _tell(self, changed: Iterable[str | None]) -> None:
        for node in changed:
            if node is not None:
                self.on_change(node)


def heartbeat_metrics(registry: CollectorRegistry, heartbeats: Heartbeats) -> None:
    """`topo_reporter_extender_heartbeats{state}` in the extender's registry."""
    gauge = Gauge(
        "topo_reporter_extender_heartbeats",
        "Nodes by the state of their agent's heartbeat Lease: fresh (availability trusted), "
        "expired (not renewed within its duration, or vouching for nothing: read as unknown).",
        ["state"],
        registry=registry,
    )
    gauge.labels(state="fresh").set_function(lambda: heartbeats.counts()[0])
    gauge.labels(state="expired").set_function(lambda: heartbeats.counts()[1])


class HeartbeatWatcher(Reflector[BeatEvent]):
    """Keeps Heartbeats current (list, watch from its resourceVersion, relist on 410) on one
    thread, and expires Leases every SWEEP_S on another."""

    what = "leases"
    log_prefix = "lease_"
    thread_name = "topo-reporter-heartbeats"

    def __init__(self, client: LeaseWatch, heartbeats: Heartbeats, **loop: Unpack[Loop]) -> None:
        super().__init__(**loop)
        self._client = client
        self._heartbeats = heartbeats
        self._threads.append(
            threading.Thread(target=self._expire, name="topo-reporter-expiry", daemon=True)
        )
        self._problem = "no list of heartbeat Leases yet"

    def _list(self) -> str:
        snapshot = self._client.list_beats()
        self._heartbeats.replace(snapshot.beats)
        self._log.info("leases_listed", leases=len(snapshot.beats))
        return snapshot.resource_version

    def _watch_from(self, resource_version: str) -> Iterable[BeatEvent]:
        return self._client.watch_beats(resource_version, self._stop)

    def _apply(self, event: BeatEvent) -> None:
        self._heartbeats.apply(event)

    def _describe(self, error: PublishError) -> str:
        return f"heartbeat Leases in {self._client.namespace}: {error}"

    def _expire(self) -> None:
        while not self._stop.wait(SWEEP_S):
            self._heartbeats.sweep()
