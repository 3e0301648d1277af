"""The pods filter holds for an NVLink-connected set: how many are held now, how long the longest
has waited, and how long each hold lasted once it ended.

A hold ends when filter sees the pod again and no longer holds it (a connected set came free, the
pod's wait ran out, or its nodes changed), or when filter has not seen it for `FORGET_S` (the pod
was deleted, bound by another scheduler, or the extender is no longer asked). Pods are known by
their UID, which the scheduler sends in every call; a pod without one is not counted. Pure
bookkeeping under one lock: no I/O, no clock of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

FORGET_S = 360.0
"""kube-scheduler retries an unschedulable pod at least every 5 minutes
(`podMaxInUnschedulablePodsDuration`), so a held pod not seen for 6 has left the queue."""
MAX_HELD = 10_000
"""Pods tracked at once; at the bound the one seen least recently is counted as ended, so a
flood of pod UIDs costs at most this many entries (about 150 bytes each)."""


@dataclass
class _Hold:
    first_s: float
    last_s: float


class HeldPods:
    """Held pods by UID. `ended` is called with each finished hold's length in seconds."""

    def __init__(
        self,
        ended: Callable[[float], None],
        *,
        forget_s: float = FORGET_S,
        bound: int = MAX_HELD,
    ) -> None:
        self._ended = ended
        self._forget_s = forget_s
        self._bound = bound
        self._lock = threading.Lock()
        # Insertion order is last-seen order: `held` moves a pod to the end.
        self._holds: dict[str, _Hold] = {}

    def held(self, uid: str | None, now: float) -> None:
        """Filter held the pod `uid` at `now` (POSIX seconds)."""
        if uid is None:
            return
        with self._lock:
            hold = self._holds.pop(uid, None) or _Hold(now, now)
            hold.last_s = max(hold.last_s, now)
            self._holds[uid] = hold
            while len(self._holds) > self._bound:
                # The pod seen least recently was last known to wait when it was last seen.
                evicted = self._holds.pop(next(iter(self._holds)))
                self._end(evicted, evicted.last_s)

    def passed(self, uid: str | None, now: float) -> None:
        """Filter judged the pod `uid` at `now` and did not hold it: a hold it was in ends."""
        if uid is None:
            return
        with self._lock:
            hold = self._holds.pop(uid, None)
            if hold is not None:
                self._end(hold, max(now, hold.last_s))

    def count(self, now: float) -> int:
        """Pods held now, after forgetting those not seen for `forget_s`."""
        with self._lock:
            self._expire(now)
            return len(self._holds)

    def longest_s(self, now: float) -> float:
        """How long the pod held longest has been held (0 when none is)."""
        with self._lock:
            self._expire(now)
            return max((now - h.first_s for h in self._holds.values()), default=0.0)

    def _expire(self, now: float) -> None:
        while self._holds:
            uid = next(iter(self._holds))
            hold = self._holds[uid]
            if now - hold.last_s <= self._forget_s:
                return
            del self._holds[uid]
            # Unseen since its last hold: that is when it was last known to wait.
            self._end(hold, hold.last_s)

    def _end(self, hold: _Hold, at: float) -> None:
        self._ended(max(0.0, at - hold.first_s))
