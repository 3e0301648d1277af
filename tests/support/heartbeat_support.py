"""The extender as `topo-reporter extender` wires it, in-process, for the freshness tests: the lean
client's Node watch into the NodeCache, and (with a heartbeat namespace) the Lease watch into the
heartbeat judge, whose clock the test holds. Its verdicts are read through the server's own
`answer`, on whatever API server the kubeconfig names (the double or the real one)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from reporter.extender.cache import NodeCache, NodeWatcher
from reporter.extender.heartbeat import Heartbeats, HeartbeatWatcher
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.lease import LeaseWatch
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.watch import NodeWatch
from tests.extender.test_protocol import pod
from tests.support.agent_support import PREFIX, FakeClock

WAIT_S = 10.0


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition a watch makes true, within a bounded time."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@dataclass
class Extender:
    """The running watches and the server answering from them."""

    cache: NodeCache
    heartbeats: Heartbeats | None
    lease_watcher: HeartbeatWatcher | None
    server: ExtenderServer
    clock: FakeClock

    def filter(self, nodes: Sequence[str], gpus: int) -> dict[str, Any]:
        body = json.dumps({"Pod": pod(gpus), "NodeNames": list(nodes)}).encode()
        answer: dict[str, Any] = json.loads(self.server.answer("filter", body))
        return answer

    def scores(self, nodes: Sequence[str], gpus: int) -> dict[str, int]:
        body = json.dumps({"Pod": pod(gpus), "NodeNames": list(nodes)}).encode()
        return {h["Host"]: h["Score"] for h in json.loads(self.server.answer("prioritize", body))}

    def filtered(self, node: str, gpus: int) -> bool:
        """Whether filter drops `node` for a pod of `gpus` GPUs."""
        return node in self.filter([node], gpus)["FailedNodes"]

    def filtered_whole(self, node: dict[str, Any], gpus: int) -> bool:
        """The same, for a scheduler that sends whole Nodes (no nodeCacheCapable)."""
        body = json.dumps({"Pod": pod(gpus), "Nodes": {"items": [node]}}).encode()
        answer = json.loads(self.server.answer("filter", body))
        return node["metadata"]["name"] in answer["FailedNodes"]

    def sees_renewal(self, node: str, renew_time: str) -> None:
        """Wait until the heartbeat judge has seen the node's Lease renewed at `renew_time`."""
        heartbeats = self.heartbeats
        assert heartbeats is not None
        eventually(lambda: heartbeats.renewal(node) == renew_time, f"renewal {renew_time}")


@contextmanager
def running_extender(
    kubeconfig: Path, *, heartbeat_namespace: str | None = None, wait_for_leases: bool = True
) -> Iterator[Extender]:
    """An extender reading through `kubeconfig`; heartbeats judged when a namespace is given.
    It is handed over once it has listed the Nodes (and the Leases, if `wait_for_leases`)."""
    api = RestApiClient(load_rest_config(str(kubeconfig)))
    stop = threading.Event()
    clock = FakeClock()
    log = structlog.get_logger("topo_reporter.extender")
    heartbeats = None if heartbeat_namespace is None else Heartbeats(clock=clock)
    cache = NodeCache(
        PREFIX, vouched=(lambda node: True) if heartbeats is None else heartbeats.vouched
    )
    lease_watcher = None
    if heartbeats is not None:
        assert heartbeat_namespace is not None
        heartbeats.on_change = cache.revise
        lease_watcher = HeartbeatWatcher(
            LeaseWatch(api, namespace=heartbeat_namespace, prefix=PREFIX, watch_timeout_s=60),
            heartbeats,
            stop=stop,
            log=log,
            backoff_initial_s=0.01,
            backoff_max_s=0.05,
        ).start()
    watcher = NodeWatcher(
        NodeWatch(api, watch_timeout_s=60),
        cache,
        stop=stop,
        log=log,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    ).start()
    server = ExtenderServer(
        ("127.0.0.1", 0),
        cache=cache,
        metrics=ExtenderMetrics(cache),
        watching=lambda: watcher.alive,
        problem=lambda: watcher.problem,
    ).start()
    try:
        eventually(lambda: cache.synced, "the extender's first list of Nodes")
        if heartbeats is not None and wait_for_leases:
            eventually(lambda: heartbeats.synced, "the extender's first list of Leases")
        yield Extender(cache, heartbeats, lease_watcher, server, clock)
    finally:
        stop.set()
        server.stop()
