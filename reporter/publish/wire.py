"""The ApiClient over HTTP, once for both backends: paths, verbs, answers and errors.

A backend supplies only a `Transport`: one request out, its urllib3 response back unread, or the
mapped error when no answer came. The lean client's is `reporter.publish.rest.RestTransport`, the
official client's `reporter.publish.kube.KubeTransport`. Everything else (which path a call
takes, what a 404 means, how an answer is read within bounds, how a watch is streamed) is here,
so the two cannot drift apart. This module must never import `kubernetes`, and never log a token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3

from reporter.errors import ApiPermanentError, ApiTransientError, PublishError
from reporter.publish import errors_map
from reporter.publish.api import Resource, WatchExpired

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
_METADATA_LIST = f"{JSON};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,{JSON}"
_METADATA = f"{JSON};as=PartialObjectMetadata;g=meta.k8s.io;v=v1,{JSON}"
MAX_ANSWER_BYTES = 256 * 1024 * 1024
"""A page of 500 whole Nodes from a server that ignores the metadata-only Accept stays far below
this; an answer longer than it is not an object of ours."""
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""A Node's annotations are at most 256 KiB: one watch event longer than this is not a Node."""
_ERROR_BODY_BYTES = 64 * 1024
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One HTTP request to the API server, as WireClient asks a Transport to send it."""

    method: str
    path: str
    what: str
    """`errors_map.describe`'s text, which begins every error the request ends in."""
    query: Sequence[tuple[str, str]] = ()
    body: Mapping[str, Any] | None = None
    """Sent as JSON, with `content_type`; None: no body."""
    content_type: str = JSON
    accept: str = JSON
    read_timeout_s: float | None = None
    """None: the transport's own read timeout."""


class Transport(Protocol):
    """One HTTP request to the API server."""

    host: str

    def send(self, request: ApiRequest) -> urllib3.BaseHTTPResponse:
        """The response, its body unread (the caller reads and releases it). Raises the mapped
        transport error (errors_map.transport_error, or tls_error) when no answer came."""
        ...


class _Missing(Exception):  # noqa: N818 - not an error: a get or delete found nothing
    """A get's or delete's 404 named the object."""


class WireClient:
    """ApiClient over a Transport."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def _call(
        self,
        method: str,
        verb: str,
        resource: Resource,
        name: str | None,
        namespace: str | None,
        body: Mapping[str, Any] | None = None,
        *,
        named: bool = True,
        content_type: str = JSON,
        query: Mapping[str, str] | None = None,
        accept: str = JSON,
    ) -> dict[str, Any]:
        """The answer. Raises _Missing for a get or delete whose 404 names the object."""
        what = errors_map.describe(verb, resource, name, namespace, body)
        response = self._transport.send(
            ApiRequest(
                method,
                resource.path(namespace, name if named else None),
                what,
                query=sorted((query or {}).items()),
                body=body,
                content_type=content_type,
                accept=accept,
            )
        )
        failed = response.status >= 400
        data = self._read(response, _ERROR_BODY_BYTES if failed else MAX_ANSWER_BYTES, what)
        if failed:
            if (
                verb in ("get", "delete")
                and response.status == 404
                and name is not None
                and errors_map.names_object(data, resource, name)
            ):
                raise _Missing
            raise _refusal(response, data, verb, resource, name, namespace, what)
        answer = errors_map.answer_json(data, what)
        if not isinstance(answer, dict):
            raise ApiPermanentError(f"{what}: the API server's answer is not an object")
        return answer

    def _read(self, response: urllib3.BaseHTTPResponse, limit: int, what: str) -> bytes:
        try:
            data = response.read(limit + 1)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise errors_map.transport_error(e, what, self._transport.host) from e
        finally:
            response.release_conn()
        if len(data) > limit and response.status < 400:
            raise ApiTransientError(f"{what}: the answer is larger than {limit} bytes")
        return bytes(data[:limit])

    def get(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self._call("GET", "get", resource, name, namespace)
        except _Missing:
            return None

    def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        name = str((body.get("metadata") or {}).get("name") or "")
        return self._call(
            "POST",
            "create",
            resource,
            name,
            namespace,
            body,
            named=False,
            query={"dryRun": "All"} if dry_run else None,
        )

    def replace(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return self._call("PUT", "replace", resource, name, namespace, body)

    def merge_patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return self._call(
            "PATCH", "merge_patch", resource, name, namespace, patch, content_type=MERGE_PATCH
        )

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        try:
            self._call("DELETE", "delete", resource, name, namespace)
        except _Missing:
            return

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        answer = self._call(
            "GET",
            "list",
            resource,
            None,
            namespace,
            query=query,
            accept=_METADATA_LIST if metadata_only else JSON,
        )
        # kube-apiserver writes the items of an empty PartialObjectMetadataList as null.
        items = answer.get("items", ())
        if not isinstance(items, list | None):
            what = errors_map.describe("list", resource, None, namespace)
            raise ApiTransientError(f"{what}: the API server's answer is not a list")
        return {**answer, "items": items or []}

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
        what = errors_map.describe("watch", resource, None, namespace)
        query = {
            **(query or {}),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
        }
        # Sent here, not at the first next(): a refused watch raises before any event is awaited.
        # The server ends the watch after timeoutSeconds; reading a little longer than that tells
        # a dead connection from a quiet cluster (bookmarks come about once a minute).
        response = self._transport.send(
            ApiRequest(
                "GET",
                resource.path(namespace),
                what,
                query=sorted(query.items()),
                accept=_METADATA if metadata_only else JSON,
                read_timeout_s=timeout_s + 30,
            )
        )
        if response.status >= 400:
            data = self._read(response, _ERROR_BODY_BYTES, what)
            raise _refusal(response, data, "watch", resource, None, namespace, what)
        return self._events(response, stop, what)

    def _events(
        self, response: urllib3.BaseHTTPResponse, stop: threading.Event, what: str
    ) -> Iterator[dict[str, Any]]:
        try:
            for line in _lines(response, stop, what):
                event = _event(line, what)
                if event is not None:
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise errors_map.transport_error(e, what, self._transport.host) from e
        finally:
            response.release_conn()


def _refusal(
    response: urllib3.BaseHTTPResponse,
    data: bytes,
    verb: str,
    resource: Resource,
    name: str | None,
    namespace: str | None,
    what: str,
) -> PublishError:
    """The error for an answer with a failing status (its body read within bounds)."""
    return errors_map.api_error(
        response.status,
        response.reason or "",
        data,
        response.headers,
        verb=verb,
        resource=resource,
        name=name,
        namespace=namespace,
        what=what,
    )


def _lines(response: urllib3.BaseHTTPResponse, stop: threading.Event, what: str) -> Iterator[bytes]:
    buffer = b""
    for chunk in response.stream(64 * 1024, decode_content=True):
        if stop.is_set():
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
        if len(buffer) > MAX_EVENT_BYTES:
            raise ApiTransientError(f"{what}: an event longer than {MAX_EVENT_BYTES} bytes")
    if buffer.strip():
        yield buffer


def _event(line: bytes, what: str) -> dict[str, Any] | None:
    """One watch event; None for a type this client does not know (skipped)."""
    doc = errors_map.answer_json(line, what)
    if not isinstance(doc, dict):
        raise ApiTransientError(f"{what}: an event is not an object")
    kind, obj = doc.get("type"), doc.get("object")
    if kind == "ERROR":
        status = obj if isinstance(obj, dict) else {}
        code = status.get("code")
        if code == 410:
            raise WatchExpired(f"{what}: resourceVersion expired (410)", status=410)
        raise ApiTransientError(
            f"{what}: the API server ended the watch: {str(status.get('message', ''))[:200]}",
            status=code if isinstance(code, int) else None,
        )
    if kind not in _EVENT_TYPES or not isinstance(obj, dict):
        return None
    return doc
