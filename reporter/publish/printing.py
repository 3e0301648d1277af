"""The dry run's ApiClient: every write is printed as JSON instead of sent; nothing is contacted.

The sinks run unchanged over it, so a dry run prints exactly what the agent would send: the Node
sink's merge patch (against an empty Node, the first time), the NodeFeature sink's whole object.
It remembers what it printed, so the sinks' zero-write rule holds here too: an unchanged topology
prints nothing. Events are logged, not printed: stdout carries only the objects.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

import structlog

from reporter.publish.api import EVENTS, Resource


def merged(target: Any, patch: Any) -> Any:
    """`target` with the JSON merge patch `patch` applied (RFC 7386)."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


class PrintingClient:
    """ApiClient that prints each write to `out` and answers reads from what it holds."""

    def __init__(
        self,
        out: TextIO,
        log: structlog.typing.FilteringBoundLogger,
        *,
        objects: Mapping[tuple[Resource, str], Mapping[str, Any]] | None = None,
    ) -> None:
        """`objects`: what the cluster is taken to hold already, by resource and name (the dry
        run of the Node sink starts from an empty Node); anything else reads as absent."""
        self._out = out
        self._log = log
        self._objects = {k: dict(v) for k, v in (objects or {}).items()}

    def _print(self, body: Mapping[str, Any]) -> None:
        json.dump(body, self._out, indent=2, sort_keys=True, ensure_ascii=False)
        self._out.write("\n")
        self._out.flush()

    def get(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        found = self._objects.get((resource, name))
        return None if found is None else dict(found)

    def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        if dry_run:
            return dict(body)
        if resource == EVENTS:
            self._log.info(
                "event", type=body.get("type"), reason=body.get("reason"), message=body["message"]
            )
            return dict(body)
        self._print(body)
        name = str((body.get("metadata") or {}).get("name") or "")
        self._objects[resource, name] = dict(body)
        return dict(body)

    def replace(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self._print(body)
        self._objects[resource, name] = dict(body)
        return dict(body)

    def merge_patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self._print(patch)
        written: dict[str, Any] = merged(self._objects.get((resource, name), {}), patch)
        self._objects[resource, name] = written
        return dict(written)

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        """Logged, not printed: stdout carries the objects the agent would write."""
        self._log.info("would_delete", kind=resource.kind, name=name)
        self._objects.pop((resource, name), None)

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        items = [dict(v) for (r, _), v in self._objects.items() if r == resource]
        return {"items": items, "metadata": {}}

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        stop: threading.Event,
        *,
        timeout_s: int,
        metadata_only: bool = False,
        namespace: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Nothing ever changes in a dry run."""
        return iter(())
