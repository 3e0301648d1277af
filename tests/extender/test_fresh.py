"""Issue 41, item 9: a filter call about to hold its pod reads fresh the candidates the scheduler
passed but the cache says have too few free GPUs, takes each one its watch has not brought yet,
and judges the call again; within its bounds (reads per call, per second, time per call), and
holding as before when the API server does not answer. The API server is a fake reader here; the
real kube-scheduler and apiserver, with the extender's watch lagged by the fault proxy, are in
tests/controlplane/test_scheduler.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from reporter.errors import ApiTransientError, PublishError
from reporter.extender.cache import NodeCache
from reporter.extender.fresh import READ_BURST, READS_PER_CALL, FreshReads
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.watch import NodeAnnotation, NodeWatch, WatchEvent
from reporter.schema.availability import encode_availability
from tests.extender.test_protocol import CREATED, CREATED_S, KEY, availability, waiting_pod
from tests.support.kube_double import ApiServerDouble, Certificate, write_kubeconfig

PCIE_FREE = encode_availability(availability("pcie-8x", tuple(range(8))))
H100_TWO = encode_availability(availability("dgx-h100", (6, 7)))
H100_FREE = encode_availability(availability("dgx-h100", tuple(range(8))))


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Api:
    """The API server's Nodes as a fresh read sees them; each read costs `cost_s` of the clock,
    or raises `error`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.nodes: dict[str, NodeAnnotation] = {}
        self.reads: list[str] = []
        self.error: PublishError | None = None
        self.cost_s = 0.001

    def __call__(self, name: str) -> NodeAnnotation | None:
        self.reads.append(name)
        self.clock.now += self.cost_s
        if self.error is not None:
            raise self.error
        return self.nodes.get(name)


def h100(name: str, text: str, version: int) -> NodeAnnotation:
    return NodeAnnotation(name, text, version=str(version))


class Extender:
    def __init__(self, suspects: int = 1) -> None:
        self.clock = Clock()
        self.api = Api(self.clock)
        self.cache = NodeCache("gpu.topology.io")
        self.busy = [f"h100-{i}" for i in range(suspects)]
        # Every H100 has 2 free for the cache: capable of a connected 4 once its pods end, so a
        # pod of 4 is held; the PCIe node's 4 are never connected.
        listed = [NodeAnnotation("pcie", PCIE_FREE, version="5")]
        listed += [h100(name, H100_TWO, 10) for name in self.busy]
        self.cache.replace(listed)
        self.api.nodes = {n.name: n for n in listed}
        self.metrics = ExtenderMetrics(self.cache)
        self.fresh = FreshReads(
            self.api,
            self.cache,
            counted=lambda result: self.metrics.fresh_reads.labels(result=result).inc(),
            log=structlog.get_logger(),
            clock=self.clock,
        )
        self.server = ExtenderServer(
            ("127.0.0.1", 0),
            cache=self.cache,
            metrics=self.metrics,
            connected_wait_s=600.0,
            clock=lambda: CREATED_S + 60,
            fresh=self.fresh,
        )

    def free(self, name: str, version: int = 11) -> None:
        """The node's pods ended and its agent published: the API server has it, the watch not."""
        self.api.nodes[name] = h100(name, H100_FREE, version)

    def filter(self, names: list[str], gpus: int = 4) -> Any:
        args = {"Pod": waiting_pod(gpus, CREATED), "NodeNames": names}
        return json.loads(self.server.answer("filter", json.dumps(args).encode()))

    def prioritize(self, names: list[str]) -> dict[str, int]:
        args = {"Pod": waiting_pod(4, CREATED), "NodeNames": names}
        answer = json.loads(self.server.answer("prioritize", json.dumps(args).encode()))
        return {entry["Host"]: entry["Score"] for entry in answer}

    def counted(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "topo_reporter_extender_fresh_node_reads_total", {"result": result}
        )
        assert value is not None
        return value


@pytest.fixture
def extender() -> Iterator[Extender]:
    made = Extender()
    yield made
    made.server.stop()


@pytest.fixture
def crowded() -> Iterator[Extender]:
    made = Extender(suspects=6)
    yield made
    made.server.stop()


def test_a_node_the_watch_has_not_brought_is_read_fresh_and_the_pod_passes(
    extender: Extender,
) -> None:
    extender.free("h100-0")
    answer = extender.filter(["pcie", "h100-0"])
    # Judged on the fresh node: a connected 4 is free there, so the pod is not held.
    assert answer["NodeNames"] == ["pcie", "h100-0"]
    assert answer["FailedNodes"] == answer["FailedAndUnresolvableNodes"] == {}
    assert extender.api.reads == ["h100-0"]  # the suspect only: the PCIe node agrees
    assert extender.counted("stale") == 1
    # The cache took it: prioritize, called next, ranks the node as it is now.
    scores = extender.prioritize(["pcie", "h100-0"])
    assert scores["h100-0"] > scores["pcie"]


def test_the_watchs_older_events_do_not_undo_the_fresh_read_and_its_newer_ones_count(
    extender: Extender,
) -> None:
    extender.free("h100-0", version=12)
    extender.filter(["pcie", "h100-0"])
    # The watch catches up: first the version the read was ahead of, then the one it read.
    for version in (11, 12):
        extender.cache.apply(WatchEvent("MODIFIED", h100("h100-0", H100_TWO, 0), str(version)))
        assert extender.cache.text("h100-0") == H100_FREE
    # Past the read, the watch rules again.
    extender.cache.apply(WatchEvent("MODIFIED", h100("h100-0", H100_TWO, 13), "13"))
    assert extender.cache.text("h100-0") == H100_TWO


def test_a_node_that_agrees_is_read_and_the_pod_held_as_before(extender: Extender) -> None:
    answer = extender.filter(["pcie", "h100-0"])
    assert answer["NodeNames"] == []
    assert "holding the pod" in answer["FailedAndUnresolvableNodes"]["pcie"]
    assert extender.api.reads == ["h100-0"]
    assert (extender.counted("current"), extender.counted("stale")) == (1, 0)


@pytest.mark.parametrize(
    ("names", "gpus"),
    [
        (["pcie", "h100-0", "h100-free"], 4),  # a connected set on a candidate: not held
        (["pcie", "h100-0"], 2),  # the H100's 2 free are connected: not held
        (["pcie"], 4),  # held, but no candidate the scheduler passed is in doubt
    ],
    ids=["a connected candidate", "a smaller pod", "no suspect"],
)
def test_a_call_with_no_suspect_to_hold_on_reads_nothing(
    extender: Extender, names: list[str], gpus: int
) -> None:
    extender.cache.apply(WatchEvent("ADDED", h100("h100-free", H100_FREE, 20), "20"))
    extender.free("h100-0")
    extender.filter(names, gpus)
    assert extender.api.reads == []


def test_the_whole_nodes_form_reads_nothing(extender: Extender) -> None:
    extender.free("h100-0")
    items = [
        {"metadata": {"name": n, "annotations": {"gpu.topology.io/availability": t}}}
        for n, t in [("pcie", PCIE_FREE), ("h100-0", H100_TWO)]
    ]
    args = {"Pod": waiting_pod(4, CREATED), "Nodes": {"items": items}}
    answer = json.loads(extender.server.answer("filter", json.dumps(args).encode()))
    assert answer["Nodes"]["items"] == []  # held: the call brought its own nodes
    assert extender.api.reads == []


def test_each_call_reads_at_most_its_share_least_recently_read_first(crowded: Extender) -> None:
    names = ["pcie", *crowded.busy]
    crowded.filter(names)
    assert crowded.api.reads == crowded.busy[:READS_PER_CALL]
    crowded.clock.now += 10  # the bucket refills
    crowded.filter(names)
    # The two never read, then the two read longest ago.
    assert crowded.api.reads[READS_PER_CALL:] == crowded.busy[4:] + crowded.busy[:2]


def test_reads_across_calls_are_bounded_by_the_bucket(crowded: Extender) -> None:
    names = ["pcie", *crowded.busy]
    for _ in range(5):  # a held pod retried on every event
        crowded.filter(names)
    assert len(crowded.api.reads) == READ_BURST
    crowded.clock.now += 0.5  # 4 a second
    crowded.filter(names)
    assert len(crowded.api.reads) == READ_BURST + 2


def test_no_read_starts_that_could_end_past_the_calls_budget(crowded: Extender) -> None:
    # Each read takes 0.6 s of its 1 s timeout: after the first, a second could end at 1.6 s,
    # past the 1.5 s a call may spend.
    crowded.api.cost_s = 0.6
    answer = crowded.filter(["pcie", *crowded.busy])
    assert crowded.api.reads == ["h100-0"]
    assert answer["NodeNames"] == []


def test_an_api_error_holds_the_pod_as_before_logged_once_and_counted(extender: Extender) -> None:
    extender.free("h100-0")
    extender.api.error = ApiTransientError("list nodes: 503 from the API server")
    with capture_logs() as logs:
        for _ in range(2):
            answer = extender.filter(["pcie", "h100-0"])
            assert answer["NodeNames"] == []
            assert answer["Error"] == ""
    assert [e["event"] for e in logs] == ["fresh_node_read_failed"]
    assert extender.counted("failed") == 2

    extender.api.error = None  # it answers again: the next call takes the node
    assert extender.filter(["pcie", "h100-0"])["NodeNames"] == ["pcie", "h100-0"]


def test_a_node_gone_from_the_api_server_is_left_to_the_watch(extender: Extender) -> None:
    del extender.api.nodes["h100-0"]
    assert extender.filter(["pcie", "h100-0"])["NodeNames"] == []
    assert extender.counted("current") == 1
    assert extender.cache.text("h100-0") == H100_TWO


def test_a_relist_ends_the_fresh_reads_precedence(extender: Extender) -> None:
    extender.free("h100-0", version=12)
    extender.filter(["pcie", "h100-0"])
    # The list the watch restarts from, older than the read: the watch brings the rest.
    extender.cache.replace([h100("h100-0", H100_TWO, 11)])
    extender.cache.apply(WatchEvent("MODIFIED", h100("h100-0", H100_FREE, 12), "12"))
    assert extender.cache.text("h100-0") == H100_FREE


def test_a_fresh_read_is_one_list_by_name_which_the_extenders_grant_allows(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    apiserver.add_node("h100-0", annotations={KEY: H100_FREE})
    apiserver.add_node("pcie", annotations={KEY: PCIE_FREE})
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", apiserver.url, "extender-token", ca_cert=apiserver_certificate.cert
    )
    reads = NodeWatch(RestApiClient(load_rest_config(str(kubeconfig)), request_timeout_s=(1, 1)))
    apiserver.clear_requests()

    found = reads.read_node(KEY, "h100-0")
    assert found is not None
    assert (found.name, found.value) == ("h100-0", H100_FREE)
    assert found.version == apiserver.get_node("h100-0")["metadata"]["resourceVersion"]
    assert reads.read_node(KEY, "gone") is None
    asked = [(r.path, r.query.get("fieldSelector"), r.status) for r in apiserver.requests]
    assert asked == [
        ("/api/v1/nodes", ["metadata.name=h100-0"], 200),
        ("/api/v1/nodes", ["metadata.name=gone"], 200),
    ]
