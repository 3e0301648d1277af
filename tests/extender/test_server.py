"""The extender end to end in one process: the lean watch client against the API server double,
the Node cache, and the HTTP server answering as kube-scheduler calls it."""

from __future__ import annotations

import dataclasses
import functools
import http.client
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from reporter.availability import node_score
from reporter.errors import PublishError
from reporter.extender.cache import NodeCache, NodeWatcher
from reporter.extender.server import LIMITS, ExtenderMetrics, ExtenderServer
from reporter.free_sets import compute_availability
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.watch import NodeAnnotation, NodeSnapshot, NodeWatch, WatchEvent
from reporter.schema.availability import encode_availability
from reporter.schema.labels import labels
from tests.extender.test_protocol import KEY, pod, profile
from tests.support.kube_double import ApiServerDouble, Certificate, Fault, write_kubeconfig

WAIT_S = 10.0


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition the watch makes true, within a bounded time."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@functools.cache
def annotation(profile_name: str, free: tuple[int, ...]) -> str:
    return encode_availability(compute_availability(profile(profile_name), free))


class Extender:
    """A running extender and a way to call it as kube-scheduler does."""

    def __init__(
        self,
        server: ExtenderServer,
        cache: NodeCache,
        metrics: ExtenderMetrics,
        watcher: NodeWatcher,
        stop: threading.Event,
    ) -> None:
        self.server, self.cache, self.metrics = server, cache, metrics
        self.watcher, self.stop = watcher, stop

    def call(
        self,
        method: str,
        path: str,
        payload: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        host, port = self.server.address
        connection = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        try:
            connection.request(method, path, body=payload, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def post(self, verb: str, args: dict[str, Any]) -> Any:
        status, data = self.call("POST", f"/{verb}", json.dumps(args).encode())
        assert status == 200, data
        return json.loads(data)


@pytest.fixture
def extender_factory(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> Iterator[Callable[..., Extender]]:
    stops: list[Callable[[], None]] = []

    def start(token: str = "extender-token", watch_timeout_s: int = 60, **kw: Any) -> Extender:
        kubeconfig = write_kubeconfig(
            tmp_path / f"{token}.kubeconfig",
            apiserver.url,
            token,
            ca_cert=apiserver_certificate.cert,
        )
        stop = threading.Event()
        cache = NodeCache("gpu.topology.io")
        metrics = ExtenderMetrics(cache)
        client = NodeWatch(
            RestApiClient(load_rest_config(str(kubeconfig))), watch_timeout_s=watch_timeout_s
        )
        watcher = NodeWatcher(
            client,
            cache,
            stop=stop,
            log=structlog.get_logger(),
            backoff_initial_s=0.01,
            backoff_max_s=0.05,
            on_error=lambda e: metrics.api_errors.labels(kind="x").inc(),
        ).start()
        server = ExtenderServer(
            ("127.0.0.1", 0),
            cache=cache,
            metrics=metrics,
            watching=lambda: watcher.alive,
            problem=lambda: watcher.problem,
            **kw,
        ).start()

        def finish() -> None:
            stop.set()
            server.stop()

        stops.append(finish)
        return Extender(server, cache, metrics, watcher, stop)

    yield start
    for finish in stops:
        finish()


def test_node_names_are_answered_from_the_watched_nodes(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.add_node("dgx-free", annotations={KEY: annotation("dgx-a100", tuple(range(8)))})
    apiserver.add_node("pcie-free", annotations={KEY: annotation("pcie-8x", tuple(range(8)))})
    apiserver.add_node("dgx-busy", annotations={KEY: annotation("dgx-a100", (5,))})
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    names = ["dgx-free", "pcie-free", "dgx-busy", "gpu-node-1"]

    filtered = extender.post("filter", {"Pod": pod(4), "NodeNames": names})
    ranked = extender.post("prioritize", {"Pod": pod(4), "NodeNames": filtered["NodeNames"]})

    assert filtered["NodeNames"] == ["dgx-free", "pcie-free", "gpu-node-1"]
    assert set(filtered["FailedNodes"]) == {"dgx-busy"}
    scores = {h["Host"]: h["Score"] for h in ranked}
    assert scores["dgx-free"] > scores["pcie-free"]
    assert scores["gpu-node-1"] == 5  # no annotation: neutral


def test_a_change_on_a_node_reaches_the_next_call_through_the_watch(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.add_node("dgx", annotations={KEY: annotation("dgx-a100", tuple(range(8)))})
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    args = {"Pod": pod(4), "NodeNames": ["dgx"]}
    assert extender.post("filter", args)["NodeNames"] == ["dgx"]

    apiserver.edit_node("dgx", {"metadata": {"annotations": {KEY: annotation("dgx-a100", (0, 1))}}})
    eventually(lambda: extender.post("filter", args)["NodeNames"] == [], "the edit to arrive")
    apiserver.edit_node("dgx", {"metadata": {"annotations": {KEY: "damaged"}}})
    eventually(lambda: extender.post("filter", args)["NodeNames"] == ["dgx"], "the damage")
    assert extender.post("prioritize", args) == [{"Host": "dgx", "Score": 5}]
    apiserver.delete_node("dgx")
    eventually(lambda: extender.cache.counts()[0] == 1, "the delete")  # gpu-node-1 is left
    assert [r.path for r in apiserver.requests if r.query.get("watch")] == ["/api/v1/nodes"]


def test_an_expired_watch_lists_again(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    args = {"Pod": pod(1), "NodeNames": ["late"]}
    assert extender.post("prioritize", args) == [{"Host": "late", "Score": 5}]  # not seen yet
    # The open watch falls behind compaction before it can send the new node: it ends with 410.
    with apiserver.watch_log.paused():
        apiserver.add_node("late", annotations={KEY: annotation("dgx-a100", (0,))})
        apiserver.watch_log.compact()
    eventually(lambda: extender.cache.get("late") is not None, "a relist after 410")
    # The answers kept for the size asked before the relist are the relisted nodes'.
    assert extender.cache.table().sizes() == [1]
    a = compute_availability(profile("dgx-a100"), (0,))
    assert extender.post("prioritize", args) == [{"Host": "late", "Score": node_score(a, 1)}]
    lists = [
        r for r in apiserver.requests if r.path == "/api/v1/nodes" and not r.query.get("watch")
    ]
    assert len(lists) >= 2


def test_a_cluster_without_nodes_is_listed_as_empty_not_refused(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.delete_node("gpu-node-1")  # an empty page is `"items": null`, as the real one sends
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    assert extender.cache.counts() == (0, 0)
    apiserver.add_node("late", annotations={KEY: annotation("dgx-a100", (0,))})
    eventually(lambda: extender.cache.get("late") is not None, "the new node through the watch")


def test_lists_are_paged_and_ask_for_whole_nodes(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    for i in range(1203):
        apiserver.add_node(f"n{i:05d}", annotations={KEY: annotation("dgx-a100", (i % 8,))})
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    assert extender.cache.counts() == (1204, 1)
    lists = [
        r for r in apiserver.requests if r.path == "/api/v1/nodes" and not r.query.get("watch")
    ]
    # gpu-node-1 sorts first, so pages end at n00498 and n00998.
    assert [r.query.get("continue", [""])[0] for r in lists] == ["", "n00498", "n00998"]
    # Whole Nodes: taints and the Ready condition decide where a held pod could go (issue 28).
    assert not any("PartialObjectMetadata" in (r.accept or "") for r in lists)


def test_a_failing_api_server_is_retried_and_counted(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.plan(Fault(status=503, method="GET"), Fault(status=500, method="GET"))
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the list after two failures")
    assert b'topo_reporter_api_errors_total{kind="x"} 2.0' in extender.metrics.render()


@pytest.mark.parametrize(
    ("permissions", "reason"),
    [
        (frozenset({"get nodes"}), b"list nodes: forbidden (403)"),
        (frozenset({"list nodes"}), b"watch nodes: forbidden (403)"),
    ],
    ids=["no list", "a list but no watch"],
)
def test_without_permission_it_is_live_but_not_ready_and_says_why(
    apiserver: ApiServerDouble,
    extender_factory: Callable[..., Extender],
    permissions: frozenset[str],
    reason: bytes,
) -> None:
    apiserver.tokens["limited"] = permissions
    extender = extender_factory(token="limited")
    eventually(lambda: b'api_errors_total{kind="x"}' in extender.metrics.render(), "a refusal")
    status, text = extender.call("GET", "/readyz")
    assert status == 503
    assert reason in text
    assert b"grant the extender's ClusterRole `list` and `watch` on `nodes`" in text
    assert extender.call("GET", "/healthz") == (200, b"ok\n")


@pytest.mark.parametrize(
    ("method", "path", "payload", "headers", "status", "reason"),
    [
        ("POST", "/filter", b"{", {}, 400, b"the body is not JSON"),
        ("POST", "/prioritize", b'{"Pod": {}}', {}, 400, b"exactly one of Nodes"),
        ("POST", "/filter", b"x" * 2048, {}, 413, b"nodeCacheCapable: true"),
        ("POST", "/bind", b"{}", {}, 404, b"no verb 'bind'"),
        ("GET", "/filter", None, {}, 405, b"takes POST"),
        ("GET", "/nowhere", None, {}, 404, b"not found"),
    ],
    ids=[
        "a body that is not JSON",
        "a request without nodes",
        "a body over the size limit",
        "a verb it does not serve",
        "a GET on a verb",
        "an unknown path",
    ],
)
def test_bad_requests_get_a_status_and_one_line(
    extender_factory: Callable[..., Extender],
    method: str,
    path: str,
    payload: bytes | None,
    headers: dict[str, str],
    status: int,
    reason: bytes,
) -> None:
    extender = extender_factory(limits=dataclasses.replace(LIMITS, max_body_bytes=1024))
    got, data = extender.call(method, path, payload, headers)
    assert got == status
    assert reason in data
    assert data.count(b"\n") == 1


def test_a_request_without_a_length_is_refused(extender_factory: Callable[..., Extender]) -> None:
    extender = extender_factory()
    host, port = extender.server.address
    connection = http.client.HTTPConnection(host, port, timeout=WAIT_S)
    connection.putrequest("POST", "/filter")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    response = connection.getresponse()
    assert (response.status, response.read()) == (
        411,
        b"the request must state its Content-Length\n",
    )
    connection.close()


def test_whole_nodes_are_read_from_the_request_not_the_cache(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    extender = extender_factory()
    sent = {
        "kind": "NodeList",
        "items": [
            {"metadata": {"name": "a", "annotations": {KEY: annotation("dgx-a100", (0, 1))}}},
            {"metadata": {"name": "gpu-node-1", "annotations": {}}},
        ],
    }
    filtered = extender.post("filter", {"Pod": pod(2), "Nodes": sent})
    ranked = extender.post("prioritize", {"Pod": pod(2), "Nodes": sent})
    assert filtered["Nodes"] == sent
    assert filtered["NodeNames"] is None
    a = compute_availability(profile("dgx-a100"), (0, 1))
    assert ranked == [{"Host": "a", "Score": node_score(a, 2)}, {"Host": "gpu-node-1", "Score": 5}]


def test_metrics_count_calls_and_cached_nodes(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.add_node("dgx", annotations={KEY: annotation("dgx-a100", (0,))})
    extender = extender_factory()
    # Ready once listed and watching: `synced` alone comes a moment before the watch is open.
    eventually(lambda: extender.call("GET", "/readyz") == (200, b"ok\n"), "list and watch")
    extender.post("filter", {"Pod": pod(2), "NodeNames": ["dgx"]})
    extender.call("POST", "/prioritize", b"{")
    status, text = extender.call("GET", "/metrics")
    assert status == 200
    for line in (
        b'topo_reporter_extender_requests_total{result="ok",verb="filter"} 1.0',
        b'topo_reporter_extender_requests_total{result="bad_request",verb="prioritize"} 1.0',
        b"topo_reporter_extender_filtered_nodes_total 1.0",
        b'topo_reporter_extender_nodes{availability="readable"} 1.0',
        b'topo_reporter_extender_nodes{availability="unreadable"} 1.0',
        b"topo_reporter_extender_cache_synced 1.0",
    ):
        assert line in text
    assert extender.call("GET", "/readyz") == (200, b"ok\n")


class _ImpatientServer:
    """A NodeWatchClient whose every watch ends at once with nothing in it."""

    def __init__(self) -> None:
        self.watches = 0

    def list_nodes(self, annotation: str) -> NodeSnapshot:
        return NodeSnapshot((NodeAnnotation("a", None),), "7")

    def watch_nodes(
        self, annotation: str, resource_version: str, stop: threading.Event
    ) -> Iterator[WatchEvent]:
        self.watches += 1
        return iter(())


def test_a_watch_that_ends_at_once_is_a_failure_with_backoff_not_a_loop() -> None:
    errors: list[PublishError] = []
    stop = threading.Event()
    client = _ImpatientServer()
    watcher = NodeWatcher(
        client,
        NodeCache("gpu.topology.io"),
        stop=stop,
        log=structlog.get_logger(),
        on_error=errors.append,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
    ).start()
    try:
        eventually(lambda: len(errors) >= 2, "two failed watches")
    finally:
        stop.set()
        # Its thread may list once more before it sees the stop: it ends here, not in a later
        # test, where its log line would reach the terminal past pytest's capture.
        eventually(lambda: not watcher.alive, "the watch thread ended")
    assert "ended the watch at once" in str(errors[0])
    assert client.watches <= len(errors) + 1


# -- issue 19, item 1: a value that int() refuses -------------------------------------------------

POISON = "1;" + "0" * 4301 + ";0.1.1.0.1"
"""The review's annotation: 4,301 zeros, one past int()'s digit limit."""


def test_a_poisoned_node_at_start_is_unreadable_and_the_extender_serves(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.add_node("poisoned", annotations={KEY: POISON})
    apiserver.add_node("dgx-busy", annotations={KEY: annotation("dgx-a100", (0,))})
    extender = extender_factory()
    eventually(lambda: extender.call("GET", "/readyz") == (200, b"ok\n"), "readiness")
    assert extender.call("GET", "/healthz") == (200, b"ok\n")
    args = {"Pod": pod(2), "NodeNames": ["poisoned", "dgx-busy"]}
    assert extender.post("filter", args)["NodeNames"] == ["poisoned"]
    ranked = extender.post("prioritize", {"Pod": pod(2), "NodeNames": ["poisoned"]})
    assert ranked == [{"Host": "poisoned", "Score": 5}]
    assert b'topo_reporter_extender_nodes{availability="unreadable"} 2.0' in (
        extender.metrics.render()
    )


def test_a_poisoned_value_arriving_while_it_runs_leaves_the_watch_running(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    apiserver.add_node("dgx", annotations={KEY: annotation("dgx-a100", (0,))})
    extender = extender_factory()
    eventually(lambda: extender.cache.get("dgx") is not None, "the first list")
    apiserver.edit_node("dgx", {"metadata": {"annotations": {KEY: POISON}}})
    apiserver.add_node("late", annotations={KEY: annotation("dgx-a100", (0,))})
    # The watch took the poisoned value and went on to the next event.
    eventually(lambda: extender.cache.get("late") is not None, "the event after the poison")
    assert extender.cache.get("dgx") is None
    args = {"Pod": pod(2), "NodeNames": ["dgx"]}
    assert extender.post("prioritize", args) == [{"Host": "dgx", "Score": 5}]
    assert extender.call("GET", "/healthz") == (200, b"ok\n")
    assert extender.call("GET", "/readyz") == (200, b"ok\n")


def test_whole_nodes_with_a_poisoned_value_are_answered(
    extender_factory: Callable[..., Extender],
) -> None:
    extender = extender_factory()
    sent = {"items": [{"metadata": {"name": "a", "annotations": {KEY: POISON}}}]}
    assert extender.post("filter", {"Pod": pod(2), "Nodes": sent})["Nodes"] == sent
    assert extender.post("prioritize", {"Pod": pod(2), "Nodes": sent}) == [
        {"Host": "a", "Score": 5}
    ]


def test_readyz_is_503_whenever_the_watch_is_not_running(
    extender_factory: Callable[..., Extender],
) -> None:
    extender = extender_factory(watch_timeout_s=1)  # so that a stop is seen within a second
    eventually(lambda: extender.call("GET", "/readyz")[0] == 200, "readiness")
    extender.stop.set()  # the watch thread ends, as when anything ends it
    eventually(lambda: not extender.watcher.alive, "the watch thread to end")
    assert extender.call("GET", "/healthz") == (503, b"the Node watch stopped\n")
    assert extender.call("GET", "/readyz") == (503, b"the Node watch stopped\n")


def holding(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender], **meta: str
) -> tuple[Extender, dict[str, Any]]:
    """An extender that holds a pod of 4 GPUs for up to 10m (a free PCIe node, a busy DGX), and
    such a pod created now, with `meta` in its metadata."""
    apiserver.add_node("pcie", annotations={KEY: annotation("pcie-8x", tuple(range(8)))})
    apiserver.add_node("dgx-busy", annotations={KEY: annotation("dgx-a100", (5,))})
    extender = extender_factory(connected_wait_s=600.0)
    eventually(lambda: extender.cache.synced, "the first list")
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return extender, pod(4) | {"metadata": {"name": "p", "creationTimestamp": created, **meta}}


def test_a_pod_created_now_is_held_by_the_servers_clock_and_its_own_annotation_frees_it(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    extender, held = holding(apiserver, extender_factory)
    answer = extender.post("filter", {"Pod": held, "NodeNames": ["pcie"]})
    assert answer["NodeNames"] == []
    # Whole seconds since a creation time truncated to seconds: 0s, or more on a loaded machine.
    # Unresolvable: evicting pods on a PCIe node can never give it a connected set.
    reason = answer["FailedAndUnresolvableNodes"]["pcie"]
    assert re.search(r"holding the pod for one up to 10m \(waited [0-9]+s\)$", reason), reason

    # The key is the extender's prefix's: the pod says never, and it passes.
    held["metadata"]["annotations"] = {"gpu.topology.io/connected-wait": "0"}
    assert extender.post("filter", {"Pod": held, "NodeNames": ["pcie"]})["NodeNames"] == ["pcie"]
    assert b"topo_reporter_extender_holds_total 1.0" in extender.call("GET", "/metrics")[1]


def test_a_held_pod_is_counted_while_held_and_its_hold_timed_when_it_passes(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    extender, held = holding(apiserver, extender_factory, uid="0f9e6d3c-held")

    def metric(name: str) -> float:
        found = re.search(rf"^{name} (\S+)$", extender.call("GET", "/metrics")[1].decode(), re.M)
        assert found, name
        return float(found.group(1))

    assert metric("topo_reporter_extender_held_pods") == 0
    for _ in range(2):  # held twice: one pod
        assert extender.post("filter", {"Pod": held, "NodeNames": ["pcie"]})["NodeNames"] == []
    assert metric("topo_reporter_extender_held_pods") == 1
    assert metric("topo_reporter_extender_hold_duration_seconds_count") == 0

    # A connected set comes free: the next call passes the pod, and its hold ends.
    apiserver.add_node("dgx-free", annotations={KEY: annotation("dgx-a100", tuple(range(8)))})
    eventually(lambda: "dgx-free" in extender.cache.table().ranks, "the new node")
    answer = extender.post("filter", {"Pod": held, "NodeNames": ["pcie", "dgx-free"]})
    assert answer["NodeNames"] == ["pcie", "dgx-free"]  # not held: prioritize ranks them
    assert metric("topo_reporter_extender_held_pods") == 0
    assert metric("topo_reporter_extender_held_longest_seconds") == 0
    assert metric("topo_reporter_extender_hold_duration_seconds_count") == 1
    assert metric('topo_reporter_extender_hold_duration_seconds_bucket{le="60.0"}') == 1


def test_preempt_spares_the_pcie_node_while_a_pod_is_held_through_the_watched_labels(
    apiserver: ApiServerDouble, extender_factory: Callable[..., Extender]
) -> None:
    # Issue 28, item 1: the wiring each node's agent labels, read through the metadata watch.
    for name, machine, free in [("pcie", "pcie-8x", (0, 1)), ("dgx", "dgx-h100", (6, 7))]:
        apiserver.add_node(
            name,
            labels=labels(profile(machine), node=name),
            annotations={KEY: annotation(machine, free)},
        )
    extender = extender_factory()
    eventually(lambda: extender.cache.synced, "the first list")
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = pod(4) | {"metadata": {"name": "p", "creationTimestamp": created}}
    victims = {n: {"Pods": [{"UID": f"low-{n}"}], "NumPDBViolations": 0} for n in ("pcie", "dgx")}
    answer = extender.post("preempt", {"Pod": held, "NodeNameToMetaVictims": victims})
    assert answer == {"NodeNameToMetaVictims": {"dgx": victims["dgx"]}}
    metrics = extender.call("GET", "/metrics")[1]
    assert b"topo_reporter_extender_preemption_vetoed_nodes_total 1.0" in metrics

    # A pod that is not held keeps every candidate the scheduler chose.
    held["metadata"]["annotations"] = {"gpu.topology.io/connected-wait": "0"}
    answer = extender.post("preempt", {"Pod": held, "NodeNameToMetaVictims": victims})
    assert answer == {"NodeNameToMetaVictims": victims}
