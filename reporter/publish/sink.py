"""Where a topology goes: the Sink seam and the Node patch sink.

A sink is told the desired metadata and makes its target carry it with as few API calls as it
can: it remembers what the target carried after its last read or write and sends nothing when
that already matches. `forget()` drops that memory so the next publish reads again (resync repairs
drift).
A second sink (a NodeFeature object for node-feature-discovery) implements the same Protocol.
Both write through `reporter.publish.api.ApiClient`; a dry run is the same sink over the printing
client.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Protocol

import structlog

from reporter.errors import ApiTransientError, PublishError
from reporter.publish import errors_map, retry
from reporter.publish import patch as node_patch
from reporter.publish.api import EVENTS, NODES, ApiClient
from reporter.publish.client import NODE_EVENT_NAMESPACE, EventType, event_body
from reporter.publish.patch import Desired, NodeMetadata, node_metadata


class Sink(Protocol):
    """A target for the desired labels and annotations."""

    def published(self) -> Desired:
        """What the target carries under the prefix (read if not known). Raises PublishError."""
        ...

    def publish(self, want: Desired) -> bool:
        """Make the target carry `want`; True when something was written. Raises PublishError."""
        ...

    def forget(self) -> None:
        """Drop what is known of the target: the next call reads it again."""
        ...

    def event(self, event_type: EventType, reason: str, message: str) -> None:
        """Tell operators about a change (a Kubernetes Event, a log line). Raises PublishError."""
        ...


def read_node(api: ApiClient, node: str) -> NodeMetadata:
    """The Node's metadata. Raises PublishError; a missing Node is a permanent one."""
    found = api.get(NODES, node)
    if found is None:
        raise errors_map.node_not_found(node)
    return node_metadata(found)


class NodePatchSink:
    """Patches the agent's own Node: one GET when unknown, one PATCH per change, 409 re-reads."""

    def __init__(
        self,
        api: ApiClient,
        *,
        node: str,
        prefix: str,
        stop: threading.Event,
        backoff: retry.Backoff,
        log: structlog.typing.FilteringBoundLogger,
        on_error: retry.OnError = lambda e: None,
        on_wait: retry.OnWait = lambda seconds: None,
        foreign: frozenset[str] = frozenset(),
    ) -> None:
        """`foreign`: the keys outside the prefix the agent writes, and so may delete (Topograph's
        tier labels, with `--network-label-style topograph` only)."""
        self._api = api
        self._node = node
        self._prefix = prefix
        self._foreign = foreign
        self._log = log
        self._on_error = on_error
        self._retry = retry.Retrying(stop, backoff, log, on_error, on_wait)
        self._known: NodeMetadata | None = None

    def _read(self) -> NodeMetadata:
        return read_node(self._api, self._node)

    def _current(self) -> NodeMetadata:
        if self._known is None:
            self._known = self._read()
            self._log.debug("node_read", resource_version=self._known.resource_version)
        return self._known

    def published(self) -> Desired:
        return node_patch.ours(
            self._retry(self._current, what="read node"), self._prefix, self._foreign
        )

    def publish(self, want: Desired) -> bool:
        sent = False

        def attempt() -> bool:
            nonlocal sent
            current = self._current()
            body = node_patch.minimal_patch(current, want, self._prefix, self._foreign)
            if body is None:
                # After a patch whose answer was lost, the Node carrying `want` is that patch
                # landed: a write, which the caller tells operators about.
                return sent
            node_patch.check_annotation_budget(current, body, self._prefix)
            try:
                self._known = node_metadata(self._api.merge_patch(NODES, self._node, body))
            except ApiTransientError:
                # A conflict, or a write that may or may not have landed: read before retrying.
                self._known = None
                sent = True
                raise
            self._log.info(
                "node_patched",
                labels=sorted(body["metadata"].get("labels", {})),
                annotations=sorted(body["metadata"].get("annotations", {})),
                resource_version=self._known.resource_version,
            )
            taint = want.taint
            if "spec" in body and taint is not None:
                # The taint, unlike a label, keeps pods off the Node: said on its own line.
                if taint.value is not None:
                    self._log.warning("node_tainted", taint=f"{taint.key}={taint.value}")
                else:
                    self._log.info("node_untainted", taint=taint.key)
            return True

        try:
            return self._retry(attempt, what="patch node")
        except PublishError:
            self._known = None
            raise

    def forget(self) -> None:
        self._known = None

    def observe(self, node: NodeMetadata) -> None:
        """The Node as another writer of this agent (the availability sink) just left it.

        Kept where the Node is known, so that the next patch carries the current resourceVersion
        instead of meeting a 409 and a read; a forgotten Node stays forgotten (resync reads it).
        """
        if self._known is not None:
            self._known = node

    def event(self, event_type: EventType, reason: str, message: str) -> None:
        # One attempt: an Event is worth less than the API calls a retry loop would spend on it.
        # Its failure is still a failed API call, counted like every other.
        try:
            node = self._known or self._read()
            body = event_body(node, event_type, reason, message, datetime.now(UTC))
            self._api.create(EVENTS, body, NODE_EVENT_NAMESPACE)
        except PublishError as e:
            self._on_error(e)
            raise
