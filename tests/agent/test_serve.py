"""The health and metrics server: /healthz, /readyz and /metrics over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from reporter.collect import ScanResult, SourceState, SourceStatus
from reporter.errors import ApiTransientError
from reporter.serve.http import HealthServer
from reporter.serve.metrics import Metrics, api_error_kind
from reporter.serve.state import AgentState
from tests.support.agent_support import FakeClock, topology


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, AgentState, Metrics, FakeClock]]:
    clock = FakeClock()
    state = AgentState(stall_after_s=180, stale_after_s=600, clock=clock)
    metrics = Metrics()
    server = HealthServer(("127.0.0.1", 0), state, metrics).start()
    yield server, state, metrics, clock
    server.stop()


def get(server: HealthServer, path: str) -> tuple[int, str]:
    host, port = server.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ready_only_after_the_first_publish_and_not_when_degraded_or_stale(
    served: tuple[HealthServer, AgentState, Metrics, FakeClock],
) -> None:
    server, state, _, clock = served
    assert get(server, "/readyz") == (503, "no publish yet\n")
    state.published()
    assert get(server, "/readyz") == (200, "ok\n")
    state.set_degraded("nvml: NVML did not load")
    assert get(server, "/readyz") == (503, "degraded: nvml: NVML did not load\n")
    state.set_degraded(None)
    clock.advance(601)
    assert get(server, "/readyz") == (503, "data is 601s old\n")


def test_live_while_the_loop_beats(
    served: tuple[HealthServer, AgentState, Metrics, FakeClock],
) -> None:
    server, state, _, clock = served
    assert get(server, "/healthz") == (200, "ok\n")
    clock.advance(181)
    assert get(server, "/healthz") == (503, "loop stalled for 181s\n")
    state.beat()
    assert get(server, "/healthz")[0] == 200


def test_metrics_have_the_conventional_names_and_values(
    served: tuple[HealthServer, AgentState, Metrics, FakeClock],
) -> None:
    server, _, metrics, _ = served
    result = ScanResult(
        topology(),
        (
            SourceStatus("nvml", SourceState.OK, 0.2),
            SourceStatus("sysfs", SourceState.FAILED, 0.1, "unreadable"),
        ),
    )
    metrics.scanned(result, 0.3)
    metrics.topology(topology(8, nics=()))
    metrics.publishes.labels(result="written").inc()
    metrics.api_errors.labels(kind=api_error_kind(ApiTransientError("x", status=429))).inc()
    metrics.last_publish.set(1_700_000_000)
    status, text = get(server, "/metrics")
    assert status == 200
    lines = set(text.splitlines())
    for expected in [
        "topo_reporter_scan_duration_seconds_count 1.0",
        'topo_reporter_scans_total{result="degraded"} 1.0',
        'topo_reporter_publishes_total{result="written"} 1.0',
        'topo_reporter_api_errors_total{kind="throttled"} 1.0',
        "topo_reporter_gpus 8.0",
        'topo_reporter_links{type="NV"} 28.0',
        'topo_reporter_links{type="SYS"} 0.0',
        "topo_reporter_nvlink_island_size 8.0",
        "topo_reporter_last_publish_timestamp_seconds 1.7e+09",
        "topo_reporter_degraded 0.0",
        'topo_reporter_source_success{source="nvml"} 1.0',
        'topo_reporter_source_success{source="sysfs"} 0.0',
    ]:
        assert expected in lines, expected


def test_unknown_paths_say_what_exists(
    served: tuple[HealthServer, AgentState, Metrics, FakeClock],
) -> None:
    assert get(served[0], "/") == (404, "not found: try /healthz, /readyz or /metrics\n")


def test_an_announced_wait_is_live_until_it_ends_and_a_stall_limit_after(
    served: tuple[HealthServer, AgentState, Metrics, FakeClock],
) -> None:
    server, state, _, clock = served
    state.waiting(1000)
    clock.advance(1000 + 180)
    assert get(server, "/healthz") == (200, "ok\n")
    clock.advance(1)
    assert get(server, "/healthz") == (503, "loop stalled for 181s\n")
    state.beat()
    assert get(server, "/healthz")[0] == 200
