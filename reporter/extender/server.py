"""The extender's HTTP server: POST /filter, /prioritize and /preempt, GET /healthz, /readyz and
/metrics.

The URL prefix is the server root (`urlPrefix: http://HOST:PORT`, verbs `filter`, `prioritize`
and `preempt`). HTTP/1.1 with keep-alive, as kube-scheduler's client reuses its connections. A
request body must state its length and stay under `max_body_bytes`; anything that does not read
as an ExtenderArgs (an ExtenderPreemptionArgs for preempt) is answered 400 with one line of text,
which kube-scheduler counts as an extender error (ignored with `ignorable: true`). It reads the
NodeCache, and calls the API only to read, by name, a node a filter call about to hold its pod
disagrees with the scheduler on (`reporter.extender.fresh`).
"""

from __future__ import annotations

import operator
import ssl
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reporter.availability import CONNECTED_WAIT_S
from reporter.extender import protocol
from reporter.extender.cache import DEFAULT_RESOURCE, NodeCache, RankTable
from reporter.extender.fresh import RESULTS, FreshReads
from reporter.extender.holds import FORGET_S, MAX_HELD, HeldPods
from reporter.schema.keys import CONNECTED_WAIT, key
from reporter.schema.scheduler import MAX_REQUEST_BYTES
from reporter.serve.httpserver import HttpServer, Limits, Request, Response, text

LIMITS = Limits(
    max_body_bytes=MAX_REQUEST_BYTES,
    concurrent_requests=2,
    slot_wait_s=1.0,
    buffered_bodies=4,
    max_connections=128,
)
"""kube-scheduler makes one call at a time; the second slot serves a call it gave up on while
the extender still answers it, or a second scheduler. A call waits up to 1 s for a slot, well
inside kube-scheduler's 5 s default `httpTimeout`. Held by the chart's 320 MiB: `peak_bytes`."""
STARVED_S = 10.0
"""/readyz fails for this long after a call was refused for want of a slot or of room for its
body: two readiness probes (5 s apart), one fewer than the chart's failure threshold, so a single
refusal never takes the replica out of the Service, and a steady stream of them does."""
PARSE_COST = 40
"""Memory per body byte at the peak of answering, at worst: above every body shape measured
(bench/README.md, "Scheduler extender"), the worst being objects of one key nested a few deep;
the tests check it with Python's own count (tracemalloc)."""
IDLE_BYTES = 64 * 1024 * 1024
"""The extender with 5,000 nodes cached (availability, labels, taints, readiness) and nothing to do,
rounded up from what `bench/extender.py` measures (bench/README.md, "Scheduler extender")."""
READ_BYTES = 256 * 1024
"""What one read brings from one connection (asyncio's), held until its request is answered."""


def peak_bytes(limits: Limits) -> int:
    """The most memory the extender needs under `limits`: what its memory limit must hold."""
    answered = limits.concurrent_requests * PARSE_COST * limits.max_body_bytes
    buffered = limits.buffered_bodies * limits.max_body_bytes
    return IDLE_BYTES + answered + buffered + limits.max_connections * READ_BYTES


VERBS = ("filter", "prioritize", "preempt")
MAX_NETWORK_SERIES = 2000
"""The most network groups /metrics lists: a 64-port leaf switch's group holds 16 to 32 nodes, so
15,000 nodes make under 1,000 leaf groups and fewer spine groups. Labels written one value per
node (by a tool other than the agent) would otherwise make a series per node."""


class CapacityCollector(Collector):
    """The cluster's free capacity, from the counts the cache keeps as nodes change (no state of
    its own, no work per node): nodes that can host a connected set of 2, 4 and 8 GPUs now, and
    whole free nodes per multi-node NVLink partition (one series per such partition; a node's
    own `node-<name>` partition is left out, so the series are as many as the fabric's
    partitions, not the nodes); and whole free nodes per network group (a series per value of
    each `network-tier-<N>` label, at most MAX_NETWORK_SERIES)."""

    def __init__(self, cache: NodeCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        capable, free = self._cache.capacity()
        nodes = GaugeMetricFamily(
            "topo_reporter_extender_connected_capable_nodes",
            "Nodes that hand a pod of this many GPUs an NVLink-connected set now.",
            labels=["gpus"],
        )
        for k, n in capable.items():
            nodes.add_metric([str(k)], n)
        yield nodes
        partitions = GaugeMetricFamily(
            "topo_reporter_extender_partition_free_nodes",
            "Nodes of each multi-node NVLink partition (the nvlink-partition label; a node's "
            "own node-<name> partition is left out) whose GPUs are all free.",
            labels=["partition"],
        )
        for partition, n in sorted(free.items()):
            partitions.add_metric([partition], n)
        yield partitions
        networks = sorted(self._cache.network_capacity().items())
        groups = GaugeMetricFamily(
            "topo_reporter_extender_network_group_free_nodes",
            "Nodes of each network group (the value of a network-tier-<N> label; tier 0 the "
            f"leaf group) whose GPUs are all free; the first {MAX_NETWORK_SERIES} groups by tier "
            "and name.",
            labels=["tier", "group"],
        )
        for (tier, group), (_, n) in networks[:MAX_NETWORK_SERIES]:
            groups.add_metric([str(tier), group], n)
        yield groups
        yield GaugeMetricFamily(
            "topo_reporter_extender_network_groups_unlisted",
            f"Network groups beyond the first {MAX_NETWORK_SERIES}, left out of "
            "network_group_free_nodes (0 unless a tier's labels are nearly one value per node).",
            value=max(0, len(networks) - MAX_NETWORK_SERIES),
        )


class ExtenderMetrics:
    """The extender's metrics, in a private registry; names `topo_reporter_extender_*`."""

    def __init__(self, cache: NodeCache, clock: Callable[[], float] = time.time) -> None:
        """`clock`: POSIX seconds now, for the held pods' gauges (the server's own clock)."""
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
        self.in_flight = Gauge(
            "topo_reporter_extender_requests_in_flight",
            "Calls being answered, each from the moment its body was read whole.",
            registry=r,
        )
        self.waiting = Gauge(
            "topo_reporter_extender_requests_waiting",
            "Calls read whole and waiting for a slot (1 s at most, then 503).",
            registry=r,
        )
        self.starved = Gauge(
            "topo_reporter_extender_starved",
            "1 while /readyz fails because a call was refused 503 for want of a slot or of "
            "room for its body in the last 10 s.",
            registry=r,
        )
        self.connections = Gauge(
            "topo_reporter_extender_connections",
            "Open connections, TLS handshakes included; at the cap a new one replaces the "
            "oldest idle one.",
            registry=r,
        )
        self.filtered = Counter(
            "topo_reporter_extender_filtered_nodes",
            "Nodes filter removed because they cannot give the pod its GPUs.",
            registry=r,
        )
        self.holds = Counter(
            "topo_reporter_extender_holds",
            "Filter calls that held a pod back for an NVLink-connected set (--connected-wait).",
            registry=r,
        )
        self.hold_duration = Histogram(
            "topo_reporter_extender_hold_duration_seconds",
            "How long each ended hold for an NVLink-connected set lasted, first hold to the "
            "call that passed the pod (or its last hold, for a pod no longer seen).",
            buckets=(10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 86400),
            registry=r,
        )
        untracked = Counter(
            "topo_reporter_extender_held_pods_untracked",
            f"Holds of a pod not counted in held_pods: {MAX_HELD} pods were tracked already "
            "(a flood of made-up pod UIDs, or as many pods held); each such call counts.",
            registry=r,
        )
        self.held = HeldPods(self.hold_duration.observe, dropped=untracked.inc)
        Gauge(
            "topo_reporter_extender_held_pods",
            "Pods held for an NVLink-connected set now (seen held in the last "
            f"{FORGET_S / 60:g} minutes).",
            registry=r,
        ).set_function(lambda: self.held.count(clock()))
        Gauge(
            "topo_reporter_extender_held_longest_seconds",
            "How long the pod held longest for an NVLink-connected set has been held (0: none).",
            registry=r,
        ).set_function(lambda: self.held.longest_s(clock()))
        self.preemption_vetoed = Counter(
            "topo_reporter_extender_preemption_vetoed_nodes",
            "Nodes preempt took from the scheduler's candidates: no victims, or the pod is held "
            "for an NVLink-connected set that evicting there could not give it.",
            registry=r,
        )
        self.fresh_reads = Counter(
            "topo_reporter_extender_fresh_node_reads",
            "Nodes read from the API server by a filter call about to hold its pod, where the "
            "scheduler passed a node the cache says has too few free GPUs, by result: current "
            "(the cache had its availability), stale (it had an older one: the node was taken "
            "fresh and the call judged again), failed (the call held as before).",
            ["result"],
            registry=r,
        )
        for result in RESULTS:
            self.fresh_reads.labels(result=result)
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
        nodes.labels(availability="readable").set_function(lambda: operator.sub(*cache.counts()))
        nodes.labels(availability="unreadable").set_function(lambda: cache.counts()[1])
        Gauge(
            "topo_reporter_extender_cache_synced",
            "1 once the Node cache holds a full list.",
            registry=r,
        ).set_function(lambda: int(cache.synced))
        r.register(CapacityCollector(cache))

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
        resource: str = DEFAULT_RESOURCE,
        connected_wait_s: float = CONNECTED_WAIT_S,
        limits: Limits = LIMITS,
        starved_s: float = STARVED_S,
        tls: ssl.SSLContext | None = None,
        watching: Callable[[], bool] = lambda: True,
        problem: Callable[[], str | None] = lambda: None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        clock: Callable[[], float] = time.time,
        fresh: FreshReads | None = None,
    ) -> None:
        """`connected_wait_s`: how long from its creation a pod of k >= 2 GPUs may be held for
        an NVLink-connected set (0: never); `clock`: POSIX seconds now; `fresh`: reads the nodes
        a call about to hold its pod disagrees with the scheduler on (None: never). Raises
        OSError when the address cannot be bound."""
        self._clock = clock
        self._fresh = fresh
        self._cache = cache
        self._metrics = metrics
        self._resource = resource
        self._connected_wait_s = connected_wait_s
        self._wait_key = key(cache.prefix, CONNECTED_WAIT)
        self._watching = watching
        self._problem = problem
        self._starved_s = starved_s
        server = self._server = HttpServer(
            address,
            self.handle,
            limits=limits,
            tls=tls,
            name="topo-reporter-extender",
            log=log,
            too_large_hint=(
                ": set nodeCacheCapable: true so the scheduler sends node names only, or raise "
                "--max-request-bytes with the memory limit"
            ),
            on_refused=self._refused,
            # Off the event loop, one at a time (issue 41, item 5: 16 clients looping on it took
            # /filter's median from 1 ms to 1.5 s while it was built on the loop).
            offloaded=frozenset({"/metrics"}),
        )
        metrics.in_flight.set_function(lambda: server.in_flight)
        metrics.connections.set_function(lambda: server.connections)
        metrics.waiting.set_function(lambda: server.waiting)
        metrics.starved.set_function(lambda: int(server.busy_within(starved_s)))

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    def start(self) -> ExtenderServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def answer(self, verb: str, body: bytes) -> bytes:
        """The JSON answer of `verb` to a request body. Raises BadRequestError."""
        if verb == "preempt":
            # Both forms name the victims' nodes only: their wiring comes from the cache.
            victims = protocol.parse_preemption_args(body, self._resource, self._wait_key)
            answer, vetoed = protocol.preempt_answer(
                victims, self._cache.table(), now=self._clock(), limit_s=self._connected_wait_s
            )
            self._metrics.preemption_vetoed.inc(vetoed)
            return answer
        args = protocol.parse_args(body, self._resource, self._wait_key)
        table = (
            self._cache.table()
            if args.node_list is None
            else RankTable.of_nodes(
                args.node_list,
                self._cache.annotation,
                self._resource,
                self._cache.vouched,
                self._cache.prefix,
            )
        )
        verdicts = table.verdicts(args.gpus)
        if verb == "filter":
            now = self._clock()
            held = protocol.hold_reason(
                args, verdicts, now=now, limit_s=self._connected_wait_s, facts=table.facts
            )
            if (
                held is not None
                and self._fresh is not None
                and args.node_list is None
                and self._fresh.revise(args.node_names, verdicts)
            ):
                # The cache was behind the API server on a node the scheduler passed (issue 41,
                # item 9): judged again on what it holds now. Whole Nodes come with the call.
                table = self._cache.table()
                verdicts = table.verdicts(args.gpus)
                held = protocol.hold_reason(
                    args, verdicts, now=now, limit_s=self._connected_wait_s, facts=table.facts
                )
            answer, filtered = protocol.filter_answer(args, verdicts, held)
            self._metrics.filtered.inc(filtered)
            if held is not None:
                self._metrics.holds.inc()
                self._metrics.held.held(args.uid, now)
            else:
                self._metrics.held.passed(args.uid, now)
            return answer
        return protocol.prioritize_answer(args, verdicts)

    def handle(self, request: Request) -> Response:
        """The answer to one request, as the HTTP server hands it over."""
        if request.method == "POST":
            return self._post(request)
        if request.method not in ("GET", "HEAD"):
            return text(405, f"{request.method[:16]} is not served: POST a verb, GET the rest")
        return self._get(request.path)

    def _get(self, path: str) -> Response:
        if path == "/metrics":
            return Response(200, self._metrics.render(), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            ok = self._watching()
            return text(200 if ok else 503, "ok" if ok else "the Node watch stopped")
        if path == "/readyz":
            # Ready while the Node view is current: the watch runs, it listed, and the last list
            # or watch worked.
            reason = (
                (None if self._watching() else "the Node watch stopped")
                or self._problem()
                or (None if self._cache.synced else "no list of Nodes yet")
                or (
                    f"starved: calls answered busy (no request slot, or no room for a body) "
                    f"in the last {self._starved_s:g} s"
                    if self._server.busy_within(self._starved_s)
                    else None
                )
            )
            return text(503 if reason else 200, reason or "ok")
        if path.lstrip("/") in VERBS:
            return text(405, f"{path} takes POST with an ExtenderArgs body")
        return text(
            404, "not found: POST /filter, /prioritize or /preempt; GET /healthz, /readyz, /metrics"
        )

    def _post(self, request: Request) -> Response:
        verb = request.path.strip("/")
        if verb not in VERBS:
            return text(404, f"no verb {verb[:64]!r}: POST /filter, /prioritize or /preempt")
        started = time.perf_counter()
        try:
            answer = self.answer(verb, request.body)
        except protocol.BadRequestError as e:
            self._metrics.requests.labels(verb=verb, result="bad_request").inc()
            return text(400, str(e))
        self._metrics.requests.labels(verb=verb, result="ok").inc()
        self._metrics.duration.labels(verb=verb).observe(time.perf_counter() - started)
        return Response(200, answer, "application/json")

    def _refused(self, request: Request, status: int) -> None:
        verb = request.path.strip("/")
        if verb in VERBS:
            result = "busy" if status == 503 else "bad_request"
            self._metrics.requests.labels(verb=verb, result=result).inc()
