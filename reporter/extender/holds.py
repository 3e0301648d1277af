"""The pods filter holds for an NVLink-connected set: how many are held now, how long the longest
has waited, and how long each hold lasted once it ended.

A hold ends when filter sees the pod again and no longer holds it (a connected set came free, the
pod's wait ran out, or its nodes changed), or when filter has not seen it for `FORGET_S` (the pod
was deleted, bound by another scheduler, or the extender is no longer asked). Pods are known by
their UID, which the scheduler sends in every call; a pod without one is not counted. Pure
bookkeeping under one lock: no I/O, no clock of its own.

What it must never do: end the hold of a pod that is still being held. Anyone who reaches the
port can send calls with made-up UIDs (issue 41, item 6: 10,000 of them made a pod held 2,100 s
read 540 s, and `TopoReporterPodsHeldLong` never fired), so at the bound a new UID is dropped and
counted (`dropped`), never a tracked one evicted: a tracked pod leaves only by passing or by not
being seen for `FORGET_S`, and its hold is never restarted while it is being held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

FORGET_S = 360.0
"""kube-scheduler retries an unschedulable pod at least every 5 minutes
(`podMaxInUnschedulablePodsDuration`), so a held pod not seen for 6 has left the queue."""
MAX_HELD = 10_000
"""Pods tracked at once; at the bound a pod not tracked yet is not tracked (and counted,
`dropped`), so a flood of pod UIDs costs at most this many entries (about 150 bytes each) and
moves no tracked pod out."""


@dataclass
class _Hold:
    first_s: float
    last_s: float


class HeldPods:
    """Held pods by UID. `ended` is called with each finished hold's length in seconds,
    `dropped` with each hold of a pod not tracked for want of room."""

    def __init__(
        self,
        ended: Callable[[float], None],
        *,
        dropped: Callable[[], None] = lambda: None,
        forget_s: float = FORGET_S,
        bound: int = MAX_HELD,
    ) -> None:
        self._ended = ended
        self._dropped = dropped
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
            hold = self._holds.pop(uid, None)
            if hold is None:
                # Room first from the pods no longer seen, then none: a new UID never takes the
                # place of a pod still being held.
                self._expire(now)
                if len(self._holds) >= self._bound:
                    self._dropped()
                    return
                hold = _Hold(now, now)
            hold.last_s = max(hold.last_s, now)
            self._holds[uid] = hold

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
