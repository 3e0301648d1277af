"""The health and metrics server: /healthz, /readyz, /metrics, on the shared HTTP server.

It answers from `AgentState` and `Metrics` only; it never calls the Kubernetes API or scans.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST

from reporter.serve.httpserver import HttpServer, Limits, Request, Response, text
from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState

LIMITS = Limits(max_body_bytes=0, concurrent_requests=1, max_connections=16)
"""Probes and a scraper: a handful of connections, no request with a body (each connection may
still hold what one read brings, 256 KiB, until it is refused: 4 MiB at worst)."""


class HealthServer:
    """Serves the agent's state; `start()` returns once it is listening."""

    def __init__(self, address: tuple[str, int], state: AgentState, metrics: Metrics) -> None:
        """Raises OSError when the address cannot be bound."""
        self._state = state
        self._metrics = metrics
        self._server = HttpServer(address, self._answer, limits=LIMITS, name="topo-reporter-http")

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    def start(self) -> HealthServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _answer(self, request: Request) -> Response:
        if request.path == "/metrics":
            return Response(200, self._metrics.render(), CONTENT_TYPE_LATEST)
        if request.path in ("/healthz", "/readyz"):
            verdict = (
                self._state.liveness() if request.path == "/healthz" else self._state.readiness()
            )
            return text(200 if verdict.ok else 503, verdict.reason)
        return text(404, "not found: try /healthz, /readyz or /metrics")
