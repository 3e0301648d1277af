"""The health and metrics server: /healthz, /readyz, /metrics on a daemon thread.

It answers from `AgentState` and `Metrics` only; it never calls the Kubernetes API or scans.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState


class HealthServer:
    """Serves the agent's state; `start()` returns once it is listening."""

    def __init__(self, address: tuple[str, int], state: AgentState, metrics: Metrics) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                # Probes every few seconds would drown the agent's own log lines.
                return

            def do_GET(self) -> None:
                owner._answer(self)

        self._state = state
        self._metrics = metrics
        self._server = ThreadingHTTPServer(address, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="topo-reporter-http", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            code, body, ctype = 200, self._metrics.render(), CONTENT_TYPE_LATEST
        elif path in ("/healthz", "/readyz"):
            verdict = self._state.liveness() if path == "/healthz" else self._state.readiness()
            code = 200 if verdict.ok else 503
            body, ctype = (verdict.reason + "\n").encode(), "text/plain; charset=utf-8"
        else:
            code, body, ctype = 404, b"not found: try /healthz, /readyz or /metrics\n", "text/plain"
        request.send_response(code)
        request.send_header("Content-Type", ctype)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
