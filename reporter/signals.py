"""SIGTERM and SIGINT, for the processes that serve until told to stop: the agent and the extender.

A signal sets the process's stop event (and is logged); the main thread waits on that event in
short steps, so that Python runs the handler promptly. This module never exits the process: the
caller stops its parts and returns its exit status.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import structlog

WAIT_STEP_S = 0.5
"""How often the waiting main thread looks again: what a signal may wait before it is seen."""


@contextmanager
def stop_on_signals(
    stop: threading.Event, log: structlog.typing.FilteringBoundLogger
) -> Iterator[None]:
    """Inside, SIGTERM and SIGINT set `stop` instead of ending the process; the previous handlers
    come back on leaving. Must be entered on the main thread (signal handlers)."""

    def handle(signum: int, _: FrameType | None) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_until_stopped(stop: threading.Event, running: Callable[[], bool] = lambda: True) -> None:
    """Return once `stop` is set, or `running()` says the work ended by itself."""
    while running() and not stop.wait(WAIT_STEP_S):
        pass
