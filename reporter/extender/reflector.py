"""List, then watch from the list's resourceVersion, relist when the watch expires (410 Gone):
client-go's reflector loop, run by the extender for Nodes (`cache.NodeWatcher`) and for heartbeat
Leases (`heartbeat.HeartbeatWatcher`).

Errors are logged, counted and waited out with full-jitter backoff; the loop ends only when
`stop` is set. `problem` says why the view may be stale; it clears once listed and watching (a
list alone would flap with a refused watch). It never writes anything.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Generic, NotRequired, Protocol, TypedDict, TypeVar, Unpack

import structlog

from reporter.errors import ApiTransientError, PublishError
from reporter.publish.api import WatchExpired

QUICK_END_S = 1.0
"""A watch that ends this soon with nothing in it counts as a failure (backoff), not progress."""


class Versioned(Protocol):
    @property
    def resource_version(self) -> str: ...


E = TypeVar("E", bound=Versioned)


def _unheard(error: PublishError) -> None:
    """No one else hears of an error; the log and `problem` still say it."""


class Loop(TypedDict):
    """How a reflector runs: the stop that ends it, its log, who hears of each error, and the
    backoff between failures (0.5 s doubling up to 30 s unless told)."""

    stop: threading.Event
    log: structlog.typing.FilteringBoundLogger
    on_error: NotRequired[Callable[[PublishError], None]]
    backoff_initial_s: NotRequired[float]
    backoff_max_s: NotRequired[float]


class Reflector(ABC, Generic[E]):
    """One list-watch loop on a thread of its own; subclasses say what is listed and watched."""

    what: str
    """The objects, as errors and the first problem name them ("nodes", "leases")."""
    log_prefix: str = ""
    """Put before `watch_expired` and `watch_failed` in the log."""
    thread_name: str
    """The loop's thread, as a thread dump names it."""

    def __init__(self, **loop: Unpack[Loop]) -> None:
        self._stop = loop["stop"]
        self._log = loop["log"]
        self._on_error = loop.get("on_error", _unheard)
        self._initial_s = loop.get("backoff_initial_s", 0.5)
        self._max_s = loop.get("backoff_max_s", 30.0)
        self._threads = [threading.Thread(target=self.run, name=self.thread_name, daemon=True)]
        self._problem: str | None = f"no list of {self.what} yet"

    @abstractmethod
    def _list(self) -> str:
        """List every object into the store; the resourceVersion to watch from."""

    @abstractmethod
    def _watch_from(self, resource_version: str) -> Iterable[E]:
        """The watch's events from `resource_version` until the server ends it or stop is set."""

    @abstractmethod
    def _apply(self, event: E) -> None:
        """Take one watch event into the store."""

    def _describe(self, error: PublishError) -> str:
        return str(error)

    def start(self) -> Reflector[E]:
        for thread in self._threads:
            thread.start()
        return self

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    @property
    def problem(self) -> str | None:
        """Why the view may be stale (the last list or watch failed), or None."""
        return self._problem

    def run(self) -> None:
        """List and watch until `stop` is set; errors are logged, counted and waited out."""
        failures = 0
        while not self._stop.is_set():
            try:
                resource_version = self._list()
                failures = 0
                self._watch(resource_version)
            except WatchExpired:
                self._log.info(f"{self.log_prefix}watch_expired")
            except PublishError as e:
                self._problem = self._describe(e)
                self._on_error(e)
                failures += 1
                # Full jitter, so that replicas restarted together do not relist together.
                wait = random.uniform(0, min(self._max_s, self._initial_s * 2 ** min(failures, 16)))
                self._log.warning(
                    f"{self.log_prefix}watch_failed", error=str(e), wait_s=round(wait, 3)
                )
                self._stop.wait(wait)

    def _watch(self, resource_version: str) -> None:
        while not self._stop.is_set():
            started, events = time.monotonic(), 0
            watch = self._watch_from(resource_version)
            self._problem = None
            for event in watch:
                self._apply(event)
                resource_version = event.resource_version or resource_version
                events += 1
            if self._stop.is_set():
                return
            if not events and time.monotonic() - started < QUICK_END_S:
                # A server that ends every watch at once would otherwise be asked in a loop.
                raise ApiTransientError(
                    f"watch {self.what}: the API server ended the watch at once"
                )
