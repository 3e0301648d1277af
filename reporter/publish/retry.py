"""Retrying Kubernetes API calls: exponential backoff with jitter, capped, honouring Retry-After.

Only `ApiTransientError` is retried, over a finite number of attempts; a permanent error goes
straight to the caller. Waiting is `threading.Event.wait`, so a shutdown request ends a wait at
once and no further attempt is made (`Interrupted`). It never retries anything but the API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog
import tenacity

from reporter.errors import ApiTransientError, PublishError

T = TypeVar("T")
OnError = Callable[[PublishError], None]
"""Hears of each failed API call (a metric counts them by kind)."""
OnWait = Callable[[float], None]
"""Hears of each wait before a retry, in seconds (a health check tells a wait from a hang)."""


class Interrupted(Exception):  # noqa: N818 - a request to stop, not an error
    """Shutdown was requested while an API call was waiting to be retried."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """How hard to retry one API operation."""

    attempts: int = 6
    """Total tries, the first included."""
    initial_s: float = 0.5
    """Scale of the first wait; each later wait doubles it, before jitter."""
    max_s: float = 30.0
    """Cap on a computed wait."""
    retry_after_max_s: float = 300.0
    """Cap on a server's Retry-After, so a wrong header cannot park the agent for hours."""


class _Wait(tenacity.wait.wait_base):
    """Full-jitter exponential backoff, never shorter than the server's Retry-After."""

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._jitter = tenacity.wait_random_exponential(
            multiplier=backoff.initial_s, max=backoff.max_s
        )

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = float(self._jitter(retry_state))
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, ApiTransientError) and error.retry_after is not None:
            wait = max(wait, min(error.retry_after, self._backoff.retry_after_max_s))
        return wait


@dataclass(frozen=True, slots=True)
class Retrying:
    """How one writer retries its API calls: the same stop, backoff and listeners for each
    operation it makes."""

    stop: threading.Event
    """Set: no further attempt, and a wait ends at once (Interrupted)."""
    backoff: Backoff
    log: structlog.typing.FilteringBoundLogger
    on_error: OnError = lambda e: None
    on_wait: OnWait = lambda seconds: None
    """Hears of each wait before it starts, so that a health check can tell a wait asked for (a
    server's Retry-After, the backoff) from a loop that is stuck."""

    def __call__(self, operation: Callable[[], T], *, what: str) -> T:
        """Run `operation`, retrying ApiTransientError; re-raises the last error when attempts
        end. Raises Interrupted when `stop` is set before an attempt or during a wait."""

        def sleep(seconds: float) -> None:
            self.on_wait(seconds)
            if self.stop.wait(seconds):
                raise Interrupted(what)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            self.log.warning(
                "api_retry",
                operation=what,
                attempt=state.attempt_number,
                wait_s=round(wait, 3),
                error=str(error),
            )

        def attempt() -> T:
            if self.stop.is_set():
                raise Interrupted(what)
            try:
                return operation()
            except PublishError as e:
                self.on_error(e)
                raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ApiTransientError),
            stop=tenacity.stop_after_attempt(self.backoff.attempts),
            wait=_Wait(self.backoff),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)
