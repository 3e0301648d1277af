"""The extender's /metrics, built off the event loop from counts kept as nodes change and bounded
by the multi-node partitions (issue 41, item 5), and its held-pod tracking, which a flood of
made-up pod UIDs cannot flush (item 6)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from reporter.extender.cache import CAPABLE_SIZES, NodeCache
from reporter.extender.holds import MAX_HELD
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
from reporter.schema.availability import encode_availability
from reporter.serve.httpserver import Request
from tests.extender.test_protocol import CREATED, CREATED_S, availability, pod
from tests.support.node_events import Event, events, replay

WAIT_S = 10.0
FREE = {
    # free GPUs of a DGX H100 (8, NVSwitch): whole, a connected 4, none
    "whole": tuple(range(8)),
    "four": (0, 1, 2, 3),
    "none": (),
}


def text(free: str) -> str:
    return encode_availability(availability("dgx-h100", FREE[free]))


def samples(metrics: ExtenderMetrics) -> dict[str, dict[str, float]]:
    """Each sample of the extender's /metrics by name, then by its labels' values joined."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[",".join(s.labels.values())] = s.value
    return out


def test_a_nodes_own_partition_is_left_out_of_the_partition_gauge_and_counted_elsewhere() -> None:
    # 15,000 nodes outside a multi-node fabric made 15,000 series, one per node: now none.
    nodes = [
        NodeAnnotation(f"single-{i}", text("whole"), {}, f"node-single-{i}", 8) for i in range(5)
    ]
    nodes += [NodeAnnotation(f"rack-{i}", text(f), {}, "c1.1", 8) for i, f in enumerate(FREE)]
    cache = NodeCache("gpu.topology.io")
    cache.replace(nodes)
    got = samples(ExtenderMetrics(cache))
    assert got["topo_reporter_extender_partition_free_nodes"] == {"c1.1": 1}
    assert got["topo_reporter_extender_connected_capable_nodes"] == {"2": 7, "4": 7, "8": 6}
    assert got["topo_reporter_extender_nodes"] == {"readable": 8, "unreadable": 0}


def from_scratch(
    nodes: dict[str, tuple[str | None, str | None]], vouched: set[str]
) -> tuple[dict[int, int], dict[str, int], tuple[int, int]]:
    """What `NodeCache.capacity` and `counts` say, counted over every node at once."""
    ranks = {n: FREE[f] if f is not None and n in vouched else None for n, (f, _) in nodes.items()}
    capable = {k: sum(r is not None and len(r) >= k for r in ranks.values()) for k in CAPABLE_SIZES}
    free: dict[str, int] = {}
    for name, (_, partition) in nodes.items():
        if partition is not None and not partition.startswith("node-"):
            r = ranks[name]
            free[partition] = free.get(partition, 0) + (r is not None and len(r) == 8)
    return capable, free, (len(ranks), sum(r is None for r in ranks.values()))


NAMES = ["a", "b", "c"]
STATES = st.tuples(
    st.sampled_from([*FREE, None]), st.sampled_from([None, "c1.1", "c2.1", "node-x", "node-y"])
)
EVENTS = events(NAMES, STATES)


@given(st.lists(EVENTS, max_size=24))
def test_the_counts_kept_as_nodes_change_equal_a_count_from_scratch(drawn: list[Event]) -> None:
    vouched = set(NAMES)
    cache = NodeCache("gpu.topology.io", vouched=vouched.__contains__)
    cache.replace([])
    nodes: dict[str, tuple[str | None, str | None]] = {}

    def watched(name: str, state: tuple[str | None, str | None]) -> NodeAnnotation:
        free, partition = state
        return NodeAnnotation(name, None if free is None else text(free), {}, partition, 8)

    for event in drawn:
        nodes = replay(cache, nodes, vouched, event, watched)
        capable, free, counts = from_scratch(nodes, vouched)
        assert cache.capacity() == (capable, free)
        assert cache.counts() == counts


class Blocking(Collector):
    """A collector that waits for the test to let it go, and says which thread built it and
    whether it was let go (not timed out)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        self.released: list[bool] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.released.append(self.release.wait(WAIT_S))
        yield from ()


def test_metrics_are_built_in_a_thread_of_their_own_while_the_loop_answers_probes() -> None:
    cache = NodeCache("gpu.topology.io")
    cache.replace([])
    metrics = ExtenderMetrics(cache)
    blocking = Blocking()
    metrics.registry.register(blocking)
    server = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=metrics).start()
    try:
        scraped: list[int] = []

        def scrape() -> None:
            connection = http.client.HTTPConnection(*server.address, timeout=2 * WAIT_S)
            connection.request("GET", "/metrics")
            scraped.append(connection.getresponse().status)
            connection.close()

        scraper = threading.Thread(target=scrape)
        scraper.start()
        assert blocking.entered.wait(WAIT_S)
        # The build is stuck: a loop that built it could answer nothing until it timed out.
        probe = http.client.HTTPConnection(*server.address, timeout=2 * WAIT_S)
        probe.request("GET", "/healthz")
        assert probe.getresponse().status == 200
        probe.close()
        blocking.release.set()
        scraper.join(2 * WAIT_S)
    finally:
        blocking.release.set()
        server.stop()
    assert scraped == [200]
    assert blocking.released == [True]  # let go by the test, after the probe was answered
    (thread,) = blocking.threads
    assert thread.startswith("topo-reporter-extender-get")


def filter_body(uid: str) -> bytes:
    """A filter call for a pod of 4 GPUs created at CREATED, with `uid`, on the PCIe node."""
    held = pod(4)
    held["metadata"] |= {"uid": uid, "creationTimestamp": CREATED}
    return json.dumps({"Pod": held, "NodeNames": ["pcie"]}).encode()


@pytest.fixture
def holding() -> Iterator[tuple[ExtenderServer, ExtenderMetrics, list[float]]]:
    """An extender that holds pods of 4 for up to 2 h (a free PCIe node, a busy DGX), its
    metrics, and its clock (POSIX seconds, set by the test)."""
    clock = [CREATED_S]
    cache = NodeCache("gpu.topology.io")
    cache.replace(
        [
            NodeAnnotation("pcie", encode_availability(availability("pcie-8x", tuple(range(8))))),
            NodeAnnotation("dgx", encode_availability(availability("dgx-a100", (5,)))),
        ]
    )
    metrics = ExtenderMetrics(cache, clock=lambda: clock[0])
    server = ExtenderServer(
        ("127.0.0.1", 0),
        cache=cache,
        metrics=metrics,
        connected_wait_s=7200.0,
        clock=lambda: clock[0],
    )
    yield server, metrics, clock
    server.stop()


def test_a_flood_of_made_up_uids_through_filter_never_restarts_a_held_pods_hold(
    holding: tuple[ExtenderServer, ExtenderMetrics, list[float]],
) -> None:
    # The repro: 10,000 filter calls with made-up UIDs between two calls of a held pod made one
    # held 2,100 s read 540 s, and TopoReporterPodsHeldLong (1,800 s) never fired.
    server, metrics, clock = holding

    def held(raw: bytes) -> bool:
        response = server.handle(Request("POST", "/filter", raw))
        assert response.status == 200, response.body
        return bool(json.loads(response.body)["NodeNames"] == [])

    real = filter_body("real-pod")
    assert held(real)
    clock[0] += 300.0
    assert held(real)
    template = filter_body("made-up-0000000")
    for i in range(10_000):
        clock[0] += 0.003
        assert held(template.replace(b"made-up-0000000", f"made-up-{i:07d}".encode()))
    while clock[0] < CREATED_S + 2100.0:
        # The scheduler retries the held pod at least every 5 minutes.
        clock[0] = min(clock[0] + 300.0, CREATED_S + 2100.0)
        assert held(real)
    got = samples(metrics)
    assert got["topo_reporter_extender_held_longest_seconds"] == {"": 2100.0}
    assert got["topo_reporter_extender_held_pods"] == {"": 1.0}  # the made-up ones forgotten
    assert got["topo_reporter_extender_held_pods_untracked_total"] == {"": 10_000 + 1 - MAX_HELD}
