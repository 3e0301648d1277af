"""The agent's health, shared between the loop thread and the HTTP server thread.

Live: the loop made progress recently, or is in a wait it announced (the interval, a retry's
backoff, a server's Retry-After): a wait asked for is not a stall. Ready: the last publish
succeeded, no source is failing (the topology's, and, with availability on, the kubelet's
PodResources and the heartbeat Lease), the data is fresh, and the node's NVLink partition is not
withheld (a fabric not completed, GPUs that disagree on it). It only records; it never decides what
to publish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str


class AgentState:
    """Thread-safe record of the loop's progress."""

    def __init__(
        self,
        *,
        stall_after_s: float,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._stall_after_s = stall_after_s
        self._stale_after_s = stale_after_s
        self._beat: float = clock()
        self._published_at: float | None = None
        self._publish_error: str | None = "no publish yet"
        self._degraded: str | None = None
        self._live_problems: dict[str, str] = {}
        self._fabric: str | None = None
        self._notes: dict[str, str] = {}
        self._stopped = False

    def beat(self) -> None:
        """The loop is alive and making progress."""
        with self._lock:
            self._beat = max(self._beat, self._clock())

    def waiting(self, seconds: float) -> None:
        """The loop is about to wait `seconds` on purpose: live until then, stalled only after
        `stall_after_s` more. Only shutdown cuts such a wait short."""
        with self._lock:
            self._beat = max(self._beat, self._clock() + max(seconds, 0.0))

    def published(self) -> None:
        """The desired metadata is on the target (written, or already there)."""
        with self._lock:
            self._published_at = self._clock()
            self._publish_error = None

    def publish_failed(self, reason: str) -> None:
        with self._lock:
            self._publish_error = reason

    def set_degraded(self, reason: str | None) -> None:
        with self._lock:
            self._degraded = reason

    def note(self, key: str, text: str | None) -> None:
        """Something operators should know that does not make the agent unready (the kubelet
        config cannot be read): shown in /readyz's detail; None takes note `key` away."""
        with self._lock:
            if text is None:
                self._notes.pop(key, None)
            else:
                self._notes[key] = text

    def set_live_problem(self, part: str, reason: str | None) -> None:
        """What fails in the live loop's `part` (`podresources`, `heartbeat`); None: nothing."""
        with self._lock:
            if reason is None:
                self._live_problems.pop(part, None)
            else:
                self._live_problems[part] = reason

    def set_fabric_problem(self, reason: str | None) -> None:
        """Why the node's `nvlink-partition` label is withheld; None when it is not."""
        with self._lock:
            self._fabric = reason

    def stopped(self) -> None:
        with self._lock:
            self._stopped = True

    @property
    def degraded(self) -> str | None:
        with self._lock:
            return self._degraded

    def liveness(self) -> Verdict:
        with self._lock:
            if self._stopped:
                return Verdict(False, "stopped")
            # Negative while an announced wait lasts.
            age = self._clock() - self._beat
            if age > self._stall_after_s:
                return Verdict(False, f"loop stalled for {age:.0f}s")
            return Verdict(True, "ok")

    def readiness(self) -> Verdict:
        with self._lock:
            if self._publish_error is not None:
                return Verdict(False, self._publish_error)
            if self._degraded is not None:
                return Verdict(False, f"degraded: {self._degraded}")
            if self._live_problems:
                return Verdict(
                    False, "; ".join(f"{k}: {v}" for k, v in sorted(self._live_problems.items()))
                )
            if self._fabric is not None:
                return Verdict(False, f"no nvlink-partition label: {self._fabric}")
            assert self._published_at is not None  # set together with clearing the error
            age = self._clock() - self._published_at
            if age > self._stale_after_s:
                return Verdict(False, f"data is {age:.0f}s old")
            return Verdict(True, "; ".join(["ok", *(self._notes[k] for k in sorted(self._notes))]))
