"""The agent's retries against the real kube-apiserver, through a fault-injecting proxy.

`topo-reporter run --once` runs as a user runs it, once through each API client at the same time
(each on its own fresh Node): the lean client with the admin's client certificate, the official
client with the same certificate from an exec credential plugin (the lean client refuses plugins,
so the agent picks the official one). Between them and the real server, tests/support/fault_proxy.py
answers 429 and 503, resets connections, or holds a request past the client's read timeout, for
the requests a test names; everything else is the real server's own answer. A 409 is not
injected: the real server produces it (test_controlplane_agent, and the slow write below).
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes import client as k8s

from reporter.extender.cache import NodeCache, NodeWatcher
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.retry import Backoff
from reporter.publish.watch import NodeWatch
from tests.cli.test_run import CLI, env
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer, unique
from tests.support.fault_proxy import Delay, Fault, FaultProxy, Reply, Reset

# The first test to run also runs the batch of fourteen agents (`runs`): 32 s on the 2-core machine
# when quiet, about 50 s at load 5 (CPU-bound: their start-up); the suite's 120 s is too tight.
pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(300)]

PREFIX = "gpu.topology.io"
CLIENTS = ("lean", "official")
READ_TIMEOUT_S = 15.0
"""Both clients' read timeout for a Node read or patch (reporter/publish/rest.py and kube.py)."""
RUN_TIMEOUT_S = 90.0
CACHE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Run:
    client: str
    node: str
    returncode: int
    logs: list[dict[str, Any]]
    stderr: str
    resource_version: str
    """The Node's, before the run."""

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("event") == name]


SLOW = Delay(READ_TIMEOUT_S + 3)
SCENARIOS: dict[str, tuple[tuple[str, Fault, int], ...]] = {
    "slow patch": (("PATCH", SLOW, 1),),
    "503 for ever": (("PATCH", Reply(503), 100),),
    "429": (("PATCH", Reply(429, retry_after="1"), 1),),
    "503 twice": (("GET", Reply(503), 2),),
    "read reset": (("GET", Reset.AFTER_REQUEST, 1),),
    "patch reset": (("PATCH", Reset.BEFORE_BODY, 1),),
    "patch answer lost": (("PATCH", Reset.AFTER_FORWARD, 1),),
}
"""Faults planned on each scenario's Node: (method, fault, how many times). The runs that wait
longest start first."""

Runs = dict[str, dict[str, Run]]


def node_path(node: str) -> str:
    return f"/api/v1/nodes/{node}"


@pytest.fixture(scope="module")
def proxy(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FaultProxy]:
    with FaultProxy(real_apiserver.kubeconfig, tmp_path_factory.mktemp("proxy")) as started:
        yield started


@pytest.fixture(scope="module")
def runs(
    real_apiserver: RealApiServer, proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runs]:
    """`run --once` through the proxy for every scenario with each client, each on a fresh Node,
    all at once: the batch takes about as long as its slowest run (the slow patch), not the sum."""
    work = tmp_path_factory.mktemp("agents")
    kubeconfigs = {
        client: proxy.kubeconfig(work / f"{client}.kubeconfig", exec_plugin=client == "official")
        for client in CLIENTS
    }
    core = real_apiserver.core()
    # The kubelet config a node has: the agent reads its policies and has nothing to warn about.
    kubelet = work / "kubelet.yaml"
    kubelet.write_text("kind: KubeletConfiguration\n")
    started = {}
    try:
        for scenario, faults in SCENARIOS.items():
            for client in CLIENTS:
                node = unique("node")
                created = core.create_node(
                    {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}
                )
                for method, fault, times in faults:
                    proxy.inject(method, node_path(node), fault, times=times)
                argv = ["run", "--simulate", "dgx-h100", "--once", "--listen", ""]
                argv += ["--kubelet-config", str(kubelet)]
                process = subprocess.Popen(
                    [*CLI, *argv, "--node", node, "--kubeconfig", str(kubeconfigs[client])],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env(TOPO_REPORTER_LOG_FORMAT="json"),
                )
                started[scenario, client] = (node, created.metadata.resource_version, process)
        batch: Runs = {scenario: {} for scenario in SCENARIOS}
        for (scenario, client), (node, version, process) in started.items():
            _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
            logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
            run = Run(client, node, process.returncode, logs, stderr, version)
            (chosen,) = run.events("api_client")
            assert chosen["api_client"] == client, stderr
            batch[scenario][client] = run
        # A request held past its client's timeout still reaches the server: let it land first.
        proxy.settle()
        yield batch
    finally:
        for node, _, process in started.values():
            process.kill()
            process.wait()
            with contextlib.suppress(k8s.ApiException):
                core.delete_node(node)


def published(server: RealApiServer, node: str) -> dict[str, str]:
    """Our labels on the Node, as the server holds them."""
    labels = server.core().read_node(node).metadata.labels or {}
    return {k: v for k, v in labels.items() if k.startswith(f"{PREFIX}/")}


def assert_published(server: RealApiServer, run: Run) -> None:
    assert run.returncode == 0, run.stderr
    ours = published(server, run.node)
    assert ours[f"{PREFIX}/count"] == "8", run.client
    assert ours[f"{PREFIX}/interconnect"] == "nvswitch", run.client


def node_events(server: RealApiServer, node: str) -> list[str]:
    listed = server.core().list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}"
    )
    return [e.reason for e in listed.items]


def statuses(proxy: FaultProxy, method: str, node: str) -> list[int | None]:
    return [e.status for e in proxy.requests(method, node_path(node))]


def test_a_429_with_retry_after_is_waited_out_then_the_patch_lands(
    real_apiserver: RealApiServer, proxy: FaultProxy, runs: Runs
) -> None:
    for client, run in runs["429"].items():
        assert_published(real_apiserver, run)
        assert statuses(proxy, "PATCH", run.node) == [429, 200], client
        (retried,) = run.events("api_retry")
        assert retried["wait_s"] >= 1.0  # the agent planned at least the server's Retry-After
        assert "429" in retried["error"]
        # A failed write may or may not have landed: the agent read the Node again before retrying.
        assert statuses(proxy, "GET", run.node) == [200, 200], client
        assert node_events(real_apiserver, run.node) == ["GPUTopologyChanged"], client


def test_two_503s_on_the_read_are_retried_then_the_node_is_published(
    real_apiserver: RealApiServer, proxy: FaultProxy, runs: Runs
) -> None:
    for client, run in runs["503 twice"].items():
        assert_published(real_apiserver, run)
        assert statuses(proxy, "GET", run.node) == [503, 503, 200], client
        assert statuses(proxy, "PATCH", run.node) == [200], client
        assert [r["attempt"] for r in run.events("api_retry")] == [1, 2], client
        assert node_events(real_apiserver, run.node) == ["GPUTopologyChanged"], client


@pytest.mark.parametrize(
    ("scenario", "method", "server_saw_it"),
    [
        ("read reset", "GET", False),
        ("patch reset", "PATCH", False),
        ("patch answer lost", "PATCH", True),
    ],
    ids=[
        "a read reset before it reaches the server",
        "a patch reset before its body is read",
        "a patch that landed but whose answer was lost to a reset",
    ],
)
def test_a_connection_reset_is_retried_and_the_node_is_published(
    real_apiserver: RealApiServer,
    proxy: FaultProxy,
    runs: Runs,
    scenario: str,
    method: str,
    server_saw_it: bool,
) -> None:
    ((_, reset, _),) = SCENARIOS[scenario]
    for client, run in runs[scenario].items():
        assert_published(real_apiserver, run)
        first, *rest = proxy.requests(method, node_path(run.node))
        assert (first.injected, first.status) == (reset, None), client
        assert (first.upstream is not None) == server_saw_it, client
        (retried,) = run.events("api_retry")
        assert "cannot reach the API server" in retried["error"], client
        if server_saw_it:
            # The re-read finds the write in place: nothing is sent twice.
            assert rest == [], client
        else:
            assert [e.status for e in rest] == [200], client
        # Either way the Node was written once, and operators are told so once.
        assert node_events(real_apiserver, run.node) == ["GPUTopologyChanged"], client


def test_a_write_slower_than_the_read_timeout_is_abandoned_and_retried(
    real_apiserver: RealApiServer, proxy: FaultProxy, runs: Runs
) -> None:
    for client, run in runs["slow patch"].items():
        assert_published(real_apiserver, run)
        assert "timed out" in run.events("api_retry")[0]["error"], client
        patches = proxy.requests("PATCH", node_path(run.node))
        (slow,) = [e for e in patches if e.injected == SLOW]
        # The held patch reached the server after its client had gone, with the resourceVersion
        # the client read: exactly one of it and the retry's patch was applied, and the server
        # refused the other as a conflict (or the retry's re-read found the write and sent none).
        assert not slow.delivered, client
        applied = [e for e in patches if e.upstream == 200]
        assert len(applied) == 1, (client, patches)
        assert all(e.upstream == 409 for e in patches if e not in applied), (client, patches)


def test_503s_past_the_retry_budget_fail_the_run_in_one_line_and_write_nothing(
    real_apiserver: RealApiServer, proxy: FaultProxy, runs: Runs
) -> None:
    budget = Backoff().attempts
    for client, run in runs["503 for ever"].items():
        assert run.returncode == 1, run.stderr
        assert statuses(proxy, "PATCH", run.node) == [503] * budget, client
        assert len(run.events("api_retry")) == budget - 1, client
        problems = [
            line
            for line in run.logs
            if line["level"] in ("warning", "error") and line["event"] != "api_retry"
        ]
        assert [p["event"] for p in problems] == ["publish_failed"], run.stderr
        assert problems[0]["error"].startswith(f"patch node {run.node}: "), client
        assert "503" in problems[0]["error"], client
        # Not half-written: the Node is as it was (no write reached it), and no Event was posted.
        after = real_apiserver.core().read_node(run.node).metadata.resource_version
        assert after == run.resource_version, client
        assert published(real_apiserver, run.node) == {}, client
        assert node_events(real_apiserver, run.node) == [], client


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CACHE_TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"not {what} after {CACHE_TIMEOUT_S:.0f} s"
        time.sleep(0.05)


def test_the_extenders_node_watch_cut_mid_stream_relists_and_watches_again(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, tmp_path: Path
) -> None:
    # A proxy of its own: this one is stopped before the end, to end the watch.
    proxy = FaultProxy(real_apiserver.kubeconfig, tmp_path).start()
    proxy.inject("GET", "/api/v1/nodes", Reset.MID_RESPONSE, query="watch=1")
    client = NodeWatch(
        RestApiClient(load_rest_config(str(proxy.kubeconfig(tmp_path / "kubeconfig"))))
    )
    cache, stop = NodeCache(PREFIX), threading.Event()
    watcher = NodeWatcher(client, cache, stop=stop, log=structlog.get_logger()).start()
    gets = functools.partial(proxy.requests, "GET", "/api/v1/nodes")
    try:
        wait_until(lambda: cache.synced, "listed")
        listed = cache.counts()[0]
        # Its ADDED event is the first piece of the watch: the proxy relays it and cuts the stream.
        real_node_factory()
        # The cut, a relist, and a new watch answered (`problem` clears only then).
        wait_until(lambda: len(gets()) == 3 and watcher.problem is None, "watching again")
        assert cache.counts()[0] == listed + 1
        real_node_factory()
        wait_until(lambda: cache.counts()[0] == listed + 2, "told of the second node")
    finally:
        stop.set()
        proxy.stop()
        # The stopped proxy ends its watch: the thread logs that and ends here, not during a
        # later test, where its log line would reach the terminal past pytest's capture.
        wait_until(lambda: not watcher.alive, "the watch thread ended")
    seen = [("watch=1" in e.query, e.injected, e.upstream) for e in gets()]
    assert seen == [
        (False, None, 200),
        (True, Reset.MID_RESPONSE, 200),
        (False, None, 200),
        (True, None, 200),
    ]
