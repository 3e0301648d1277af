"""List and watch Nodes' metadata over the lean client: the extender's `NodeWatchClient`.

It asks the API server for `PartialObjectMetadata` (what client-go's metadata informers ask for),
so a list of 5,000 Nodes carries names and annotations, not images and conditions; a server that
ignores the request sends whole Nodes and only their metadata is read. The watch is one streamed
GET (`watch=1`, bookmarks on) read line by line with a bounded line length, ended by the server's
`timeoutSeconds` or by `stop`. A 410 Gone, as an HTTP status or as a watch ERROR event, raises
`WatchExpired` so the caller relists. Every other failure is a PublishError from the shared
mapping. This module must never import `kubernetes`, and never log a token.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3

from reporter.errors import ApiPermanentError, ApiTransientError, PublishError
from reporter.publish import errors_map
from reporter.publish.rest import RestConfig, RestTransport

_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
_WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
PAGE_SIZE = 500
MAX_PAGES = 1000
"""500,000 nodes: a loop that never ends is a server bug, not a cluster."""
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""A Node's annotations are at most 256 KiB: one event line longer than this is not a Node."""
MAX_PAGE_BYTES = 256 * 1024 * 1024
"""500 whole Nodes from a server that ignores the metadata-only Accept stay far below this."""
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


@dataclass(frozen=True, slots=True)
class NodeAnnotation:
    """One Node as the cache needs it: its name and its availability annotation (None: absent)."""

    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Every Node, and the resourceVersion to watch from."""

    nodes: tuple[NodeAnnotation, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED, or BOOKMARK (node None, progress only)."""

    type: str
    node: NodeAnnotation | None
    resource_version: str


class WatchExpired(PublishError):  # noqa: N818 - the API's word (410 Gone), not a failure of ours
    """The resourceVersion to watch from is too old: list again."""


class NodeWatchClient(Protocol):
    """List and watch Nodes' metadata. Implementations raise only PublishError subclasses."""

    def list_nodes(self, annotation: str) -> NodeSnapshot:
        """Every Node (all pages) with the value of annotation key `annotation`."""
        ...

    def watch_nodes(
        self, annotation: str, resource_version: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        """Start a watch from `resource_version` (raising when it is refused) and return its
        events, until the server ends it or `stop` is set.

        Raises (at once, or while iterating) WatchExpired when the server no longer holds that
        resourceVersion.
        """
        ...


def _error(
    status: int, body: bytes | None, headers: Mapping[str, str] | None, what: str
) -> PublishError:
    detail = errors_map.status_message(body)
    said = f": {detail}" if detail else ""
    if status == 410:
        return WatchExpired(f"{what}: resourceVersion expired (410)", status=410)
    if status in errors_map.TRANSIENT_STATUS:
        return ApiTransientError(
            f"{what}: the API server answered {status}{said}",
            status=status,
            retry_after=errors_map.retry_after(headers),
        )
    if status == 401:
        text = (
            f"{what}: the API server rejected the credentials (401): check the service account "
            "token (automountServiceAccountToken) or the kubeconfig user"
        )
    elif status == 403:
        text = (
            f"{what}: forbidden (403): grant the extender's ClusterRole `list` and `watch` on "
            f"`nodes` (the chart does with extender.enabled=true){said}"
        )
    else:
        text = f"{what}: the API server answered {status}{said}"
    return ApiPermanentError(text, status=status)


def _annotation(obj: Any, key: str) -> NodeAnnotation:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ApiTransientError("list or watch nodes: the API server sent an object without a name")
    annotations = meta.get("annotations")
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return NodeAnnotation(meta["name"], value if isinstance(value, str) else None)


class RestNodeWatchClient:
    """NodeWatchClient over the lean client's transport."""

    def __init__(
        self,
        config: RestConfig,
        *,
        watch_timeout_s: int = 300,
        request_timeout_s: tuple[float, float] = (5.0, 30.0),
    ) -> None:
        """Raises ConfigError when the TLS files cannot be loaded."""
        self._http = RestTransport(config, request_timeout_s=request_timeout_s)
        self._watch_timeout_s = watch_timeout_s

    def _get(
        self, query: Mapping[str, str], accept: str, *, watch: bool
    ) -> urllib3.BaseHTTPResponse:
        what = "watch nodes" if watch else "list nodes"
        response = self._http.stream(
            f"/api/v1/nodes?{urlencode(query)}",
            accept=accept,
            # The server closes the watch after timeoutSeconds; reading a little longer than that
            # tells a dead connection from a quiet cluster (bookmarks come about once a minute).
            read_timeout_s=self._watch_timeout_s + 30 if watch else None,
            what=what,
        )
        if response.status >= 400:
            try:
                data = response.read(64 * 1024)
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            response.release_conn()
            raise _error(response.status, data, response.headers, what)
        return response

    def list_nodes(self, annotation: str) -> NodeSnapshot:
        nodes: list[NodeAnnotation] = []
        query = {"limit": str(PAGE_SIZE)}
        for _ in range(MAX_PAGES):
            response = self._get(query, _LIST_ACCEPT, watch=False)
            try:
                body = response.read(MAX_PAGE_BYTES + 1)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise errors_map.transport_error(e, "list nodes", self._http.host) from e
            finally:
                response.release_conn()
            if len(body) > MAX_PAGE_BYTES:
                raise ApiTransientError(f"list nodes: a page is larger than {MAX_PAGE_BYTES} bytes")
            try:
                page = json.loads(body)
            except ValueError as e:
                raise ApiTransientError("list nodes: the API server's answer is not JSON") from e
            # kube-apiserver writes the items of an empty PartialObjectMetadataList as null.
            if not isinstance(page, dict) or not isinstance(page.get("items", ()), list | None):
                raise ApiTransientError("list nodes: the API server's answer is not a list")
            nodes.extend(_annotation(item, annotation) for item in page["items"] or ())
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return NodeSnapshot(tuple(nodes), str(meta.get("resourceVersion") or ""))
            query = {"limit": str(PAGE_SIZE), "continue": str(meta["continue"])}
        raise ApiTransientError(f"list nodes: more than {MAX_PAGES} pages")

    def watch_nodes(
        self, annotation: str, resource_version: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(self._watch_timeout_s),
        }
        # Sent here, not at the first next(): a refused watch raises before any event is awaited.
        response = self._get(query, _WATCH_ACCEPT, watch=True)
        return self._events(response, annotation, stop)

    def _events(
        self, response: urllib3.BaseHTTPResponse, annotation: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        try:
            for line in _lines(response, stop):
                event = _event(line, annotation)
                if event is not None:
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise errors_map.transport_error(e, "watch nodes", self._http.host) from e
        finally:
            response.release_conn()


def _lines(response: urllib3.BaseHTTPResponse, stop: threading.Event) -> Iterator[bytes]:
    buffer = b""
    for chunk in response.stream(64 * 1024, decode_content=True):
        if stop.is_set():
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
        if len(buffer) > MAX_EVENT_BYTES:
            raise ApiTransientError(f"watch nodes: an event longer than {MAX_EVENT_BYTES} bytes")
    if buffer.strip():
        yield buffer


def _event(line: bytes, annotation: str) -> WatchEvent | None:
    try:
        doc = json.loads(line)
    except ValueError as e:
        raise ApiTransientError("watch nodes: an event is not JSON") from e
    if not isinstance(doc, dict):
        raise ApiTransientError("watch nodes: an event is not an object")
    kind, obj = doc.get("type"), doc.get("object")
    if kind == "ERROR":
        status = obj if isinstance(obj, dict) else {}
        code = status.get("code")
        if code == 410:
            raise WatchExpired("watch nodes: resourceVersion expired (410)", status=410)
        raise ApiTransientError(
            f"watch nodes: the API server ended the watch: {str(status.get('message', ''))[:200]}",
            status=code if isinstance(code, int) else None,
        )
    if kind not in _EVENT_TYPES:
        return None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
    if kind == "BOOKMARK":
        return WatchEvent("BOOKMARK", None, version)
    return WatchEvent(str(kind), _annotation(obj, annotation), version)
