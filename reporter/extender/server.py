"""The extender's HTTP server: POST /filter and /prioritize, GET /healthz, /readyz and /metrics.

The URL prefix is the server root (`urlPrefix: http://HOST:PORT`, verbs `filter` and
`prioritize`). HTTP/1.1 with keep-alive, as kube-scheduler's client reuses its connections. A
request body must state its length and stay under `max_body_bytes`; anything that does not read
as an ExtenderArgs is answered 400 with one line of text, which kube-scheduler counts as an
extender error (ignored with `ignorable: true`). It reads the NodeCache and never calls the API.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from reporter.extender import protocol
from reporter.extender.cache import NodeCache

MAX_BODY_BYTES = 64 * 1024 * 1024
"""5,000 whole Nodes (without nodeCacheCapable) fit; a request larger than this is refused (413)."""
VERBS = ("filter", "prioritize")


class ExtenderMetrics:
    """The extender's metrics, in a private registry; names `topo_reporter_extender_*`."""

    def __init__(self, cache: NodeCache) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "topo_reporter_extender_requests",
            "Extender calls by verb and result: ok, bad_request.",
            ["verb", "result"],
            registry=r,
        )
        self.duration = Histogram(
            "topo_reporter_extender_request_duration_seconds",
            "Time to answer one extender call, body read to answer written.",
            ["verb"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.filtered = Counter(
            "topo_reporter_extender_filtered_nodes",
            "Nodes filter removed because they cannot give the pod its GPUs.",
            registry=r,
        )
        self.api_errors = Counter(
            "topo_reporter_api_errors",
            "Failed Kubernetes API calls (list and watch of Nodes) by kind.",
            ["kind"],
            registry=r,
        )
        nodes = Gauge(
            "topo_reporter_extender_nodes",
            "Nodes in the watch cache, by whether their availability annotation reads.",
            ["availability"],
            registry=r,
        )
        nodes.labels(availability="readable").set_function(
            lambda: cache.counts()[0] - cache.counts()[1]
        )
        nodes.labels(availability="unreadable").set_function(lambda: cache.counts()[1])
        Gauge(
            "topo_reporter_extender_cache_synced",
            "1 once the Node cache holds a full list.",
            registry=r,
        ).set_function(lambda: int(cache.synced))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ExtenderServer:
    """Serves the extender verbs and health; `start()` returns once it is listening."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        cache: NodeCache,
        metrics: ExtenderMetrics,
        resource: str = protocol.DEFAULT_RESOURCE,
        max_body_bytes: int = MAX_BODY_BYTES,
        watching: Callable[[], bool] = lambda: True,
        problem: Callable[[], str | None] = lambda: None,
    ) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                # One call per scheduling cycle per verb would drown every other line.
                return

            def setup(self) -> None:
                super().setup()
                # Headers and body leave in separate writes; delayed ACKs would add 40 ms each.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                owner._get(self)

            def do_POST(self) -> None:
                owner._post(self)

        self._cache = cache
        self._metrics = metrics
        self._resource = resource
        self._max_body_bytes = max_body_bytes
        self._watching = watching
        self._problem = problem
        self._server = ThreadingHTTPServer(address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="topo-reporter-extender", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> ExtenderServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, verb: str, body: bytes) -> bytes:
        """The JSON answer of `verb` to a request body. Raises BadRequestError."""
        args = protocol.parse_args(body, self._resource)
        table = (
            self._cache.table()
            if args.node_list is None
            else protocol.RankTable.of_nodes(
                args.node_list, self._cache.annotation, self._resource, self._cache.vouched
            )
        )
        verdicts = table.verdicts(args.gpus)
        if verb == "filter":
            answer, filtered = protocol.filter_answer(args, verdicts)
            self._metrics.filtered.inc(filtered)
            return answer
        return protocol.prioritize_answer(args, verdicts)

    def _get(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            _send(request, 200, self._metrics.render(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok = self._watching()
            _text(request, 200 if ok else 503, "ok" if ok else "the Node watch stopped")
        elif path == "/readyz":
            # Ready while the Node view is current: listed, and the last list or watch worked.
            reason = self._problem() or (None if self._cache.synced else "no list of Nodes yet")
            _text(request, 503 if reason else 200, reason or "ok")
        elif path.lstrip("/") in VERBS:
            _text(request, 405, f"{path} takes POST with an ExtenderArgs body")
        else:
            _text(request, 404, "not found: POST /filter or /prioritize; GET /healthz, /metrics")

    def _post(self, request: BaseHTTPRequestHandler) -> None:
        verb = request.path.split("?", 1)[0].strip("/")
        if verb not in VERBS:
            _text(request, 404, f"no verb {verb[:64]!r}: POST /filter or /prioritize")
            return
        started = time.perf_counter()
        length = request.headers.get("Content-Length")
        if length is None or not length.isdigit():
            request.close_connection = True
            self._metrics.requests.labels(verb=verb, result="bad_request").inc()
            _text(request, 411, "the request must state its Content-Length")
            return
        if int(length) > self._max_body_bytes:
            request.close_connection = True
            self._metrics.requests.labels(verb=verb, result="bad_request").inc()
            _text(
                request,
                413,
                f"the body is {length} bytes, more than {self._max_body_bytes}: set "
                "nodeCacheCapable: true so the scheduler sends node names only",
            )
            return
        body = request.rfile.read(int(length))
        try:
            answer = self.answer(verb, body)
        except protocol.BadRequestError as e:
            self._metrics.requests.labels(verb=verb, result="bad_request").inc()
            _text(request, 400, str(e))
            return
        _send(request, 200, answer, "application/json")
        self._metrics.requests.labels(verb=verb, result="ok").inc()
        self._metrics.duration.labels(verb=verb).observe(time.perf_counter() - started)


def _text(request: BaseHTTPRequestHandler, code: int, line: str) -> None:
    _send(request, code, (line + "\n").encode(), "text/plain; charset=utf-8")


def _send(request: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
    request.send_response(code)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(body)))
    if request.close_connection:
        request.send_header("Connection", "close")
    request.end_headers()
    request.wfile.write(body)
