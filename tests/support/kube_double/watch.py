"""Watch for the double's Nodes: a log of changes by resourceVersion, served as the apiserver does.

A watch from resourceVersion R streams, as chunked JSON lines, every change after R, then waits
for more until `timeoutSeconds` or the double stops. A watch from a version older than the
compacted horizon gets the apiserver's 410 Gone as an ERROR event, so clients learn to relist.
Bookmarks (`allowWatchBookmarks`) are sent when a test asks for one.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class NodeWatchLog:
    """Every Node change, in order, and the condition watchers wait on."""

    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0
    """Versions below this are gone: a watch from one gets 410, as does an open watch that has
    not sent up to it (the apiserver ends a watch that fell behind compaction)."""
    closed: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def record(self, kind: str, node: Mapping[str, Any]) -> None:
        with self._cond:
            revision = int(node["metadata"]["resourceVersion"])
            self.events.append((revision, kind, copy.deepcopy(dict(node))))
            self._cond.notify_all()

    def bookmark(self, revision: int) -> None:
        """Send a BOOKMARK at `revision` to every open watch (and later ones from below it)."""
        self.record("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": str(revision)}})

    def compact(self) -> None:
        """Forget every event so far: watches that have not sent them all end with 410."""
        with self._cond:
            self.compacted = max((e[0] for e in self.events), default=0)
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No watch sends anything meanwhile (changes made inside arrive together, after)."""
        with self._cond:
            yield

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def stream(self, since: int, timeout_s: float) -> Iterator[dict[str, Any]]:
        """Watch events after `since` until `timeout_s` passes or the log closes."""
        deadline = time.monotonic() + timeout_s
        sent = since
        while True:
            with self._cond:
                if sent < self.compacted:
                    yield _expired(sent, self.compacted)
                    return
                pending = [e for e in self.events if e[0] > sent]
                if not pending:
                    left = deadline - time.monotonic()
                    if self.closed or left <= 0:
                        return
                    self._cond.wait(min(left, 0.5))
                    continue
            for revision, kind, obj in pending:
                sent = max(sent, revision)
                yield {"type": kind, "object": obj}


def _expired(since: int, compacted: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since} ({compacted})",
            "reason": "Expired",
            "code": 410,
        },
    }
