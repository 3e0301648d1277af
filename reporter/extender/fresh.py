"""Fresh reads of the Nodes a held pod's filter call disagrees with the scheduler on (issue 41,
item 9).

A retry of a held pod that reaches the extender before its own watch has the Node change that
triggered it reads the old availability and holds the pod again; with that event spent, nothing
retries it in a quiet cluster until kube-scheduler's 5-minute flush. The disagreement shows in
the call itself: a candidate the scheduler passed (by its own count of the pods there, the GPUs
are free) that the cache says has fewer than k free. So, only when a call in the NodeNames form
is about to hold its pod, the extender reads such "suspect" nodes from the API server (a list by
name: a consistent read) and gives the cache each one the watch has not brought yet
(`NodeCache.take_fresh`, ordered by resourceVersion, so the watch's older events cannot put the
old object back); the call is then judged again.

Bounds, so that held pods retried on every event cannot turn into load: at most
`READS_PER_CALL` reads per call, least recently read first (ties by name), none started once
`CALL_BUDGET_S` could be passed, and `READS_PER_S` a second across all calls (a bucket of
`READ_BURST`). A read that fails leaves the call held as before, logged once until a read works
again and counted. Never an error answer: with `ignorable: true` the scheduler would place the
pod anywhere.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Sequence

import structlog

from reporter.errors import PublishError
from reporter.extender.cache import NodeCache, Verdicts
from reporter.publish.watch import NodeAnnotation

READS_PER_CALL = 4
"""Suspects read in one call; more wait for the next calls (least recently read first)."""
READ_TIMEOUT_S = (0.5, 0.5)
"""(connect with its TLS handshake, read) of one fresh read: an API server answers one Node in
milliseconds (bench/README.md), a loaded one well inside this."""
CALL_BUDGET_S = 1.5
"""What the reads may add to one call, at worst: no read starts that could end past it (the
first always may), so a call's answer stays inside the docs' 2 s `httpTimeout`."""
READS_PER_S = 4.0
"""Fresh reads a second, across all calls, once the burst is spent."""
READ_BURST = 8
"""Reads available at once: two calls' worth."""
TRACKED = 4096
"""Nodes whose last read is remembered, for the order (the oldest forgotten first)."""
RESULTS = ("current", "stale", "failed")
"""How a fresh read ends: the cache had the node's availability; it had an older one (the node
is taken fresh); the API server did not answer (the call holds as before)."""


class FreshReads:
    """Reads suspects fresh for `revise`; `read(name)` is `NodeWatch.read_node` with the
    availability annotation bound, `counted(result)` hears each read's result (RESULTS)."""

    def __init__(
        self,
        read: Callable[[str], NodeAnnotation | None],
        cache: NodeCache,
        *,
        counted: Callable[[str], None],
        log: structlog.typing.FilteringBoundLogger,
        clock: Callable[[], float] = time.monotonic,
        per_call: int = READS_PER_CALL,
        per_s: float = READS_PER_S,
        burst: int = READ_BURST,
        budget_s: float = CALL_BUDGET_S,
        read_s: float = sum(READ_TIMEOUT_S),
    ) -> None:
        """`read_s`: the longest one read can take (its timeouts)."""
        self._read = read
        self._cache = cache
        self._counted = counted
        self._log = log
        self._clock = clock
        self._per_call = per_call
        self._per_s = per_s
        self._burst = burst
        self._budget_s = budget_s
        self._read_s = read_s
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._filled = clock()
        self._last: dict[str, float] = {}
        """Node name to when it was last read, least recently read first."""
        self._failing = False

    def revise(self, names: Sequence[str], verdicts: Verdicts) -> bool:
        """Read fresh the suspects among the candidates `names` of a call about to hold its
        pod: those `verdicts` fail for fewer than k free GPUs. True when the cache's view of one
        of them was older than the API server's: the call is to be judged again."""
        suspects = verdicts.failed.keys() & names
        if not suspects:
            return False
        started = self._clock()
        revised = False
        for name in self._choose(suspects):
            if self._clock() - started + self._read_s > self._budget_s:
                break
            revised |= self._reread(name)
        return revised

    def _choose(self, suspects: set[str]) -> list[str]:
        """The suspects to read now, least recently read first, as many as the call and the
        bucket allow; they count as read now (one the call's budget then leaves unread too: the
        next calls try the others first)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._filled) * self._per_s)
            self._filled = now
            count = min(self._per_call, int(self._tokens))
            last = self._last
            chosen = heapq.nsmallest(count, suspects, key=lambda n: (last.get(n, -math.inf), n))
            self._tokens -= len(chosen)
            for name in chosen:
                last.pop(name, None)
                last[name] = now
            while len(last) > TRACKED:
                del last[next(iter(last))]
            return chosen

    def _reread(self, name: str) -> bool:
        try:
            fresh = self._read(name)
        except PublishError as e:
            self._counted("failed")
            if not self._failing:
                self._log.warning("fresh_node_read_failed", node=name, error=str(e))
            self._failing = True
            return False
        self._failing = False
        stale = fresh is not None and fresh.value != self._cache.text(name)
        # Taken whenever newer, the same availability included: its labels or taints may be.
        taken = fresh is not None and self._cache.take_fresh(fresh)
        self._counted("stale" if stale else "current")
        if stale:
            self._log.info("stale_node_read_fresh", node=name, taken=taken)
        # Stale but not taken: the watch brought that version or a newer one meanwhile; the
        # cache changed either way.
        return stale or taken
