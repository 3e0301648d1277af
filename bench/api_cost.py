"""API cost at cluster scale: 200 agents against the Kubernetes API server double.

Method. One process: the API server double from tests/support/kube_double (HTTPS on 127.0.0.1, the
agent's token and RBAC), 200 Nodes, and 200 agents, each in its own thread, each with its own API
client (`--client lean`, the default, as `topo-reporter run` picks for a token kubeconfig or a
pod; `--client official` for the `kubernetes` one), each agent built as `run` builds it
(reporter.assembly.build_agent). Every agent's scanner returns one simulated DGX H100 scan (scan
cost is bench/scan_cost.py's subject). A simulated hour is compressed 60x: interval 1 s for the
default 60 s, resync 5 s for the default 5 min, so 60 s of wall time is one node-hour. Requests
are counted by the double. Phases:

1. install: 200 agents start on Nodes that carry nothing;
2. steady state: one compressed hour, nothing changes; writes and reads per node-hour;
3. rolling update: every agent stops and a new one starts at once (Nodes keep what was published);
4. throttled: 200 more agents start on fresh Nodes while the double answers 429 (Retry-After: 1)
   to a random half of all requests; time until every Node carries the right data, requests.

    python bench/api_cost.py [--agents 200] [--client lean|official]

Availability (`--availability`): one agent with `run --availability`'s live loop (Agent.run with
its AvailabilityLoop and AvailabilitySink, the real API client over HTTPS to the double), on a
simulated clock: every wait of the loop passes at once (tests.support.agent_support.ClockedStop), so
a simulated day takes seconds and nothing is compressed. Defaults: scan every 60 s, availability
every 10 s, resync 5 min. The free source is a simulated kubelet: pod starts and stops arrive as a
Poisson process at the stated churn (events per node-hour, starts and stops together, seeded), a
starting pod takes k free GPUs (k of 1, 2, 4, 8 in the Philly mix: 70/10/15/5%; a stop when too few
are free), a stop ends a random running pod. Requests are counted by the double; "changes" counts
the ticks whose free set differs from the tick before (what an ideal writer must write).

    python bench/api_cost.py --availability [--hours 24] [--client lean|official]

Heartbeat (`--availability --heartbeat`): the same agent renewing its heartbeat Lease
(`run --heartbeat`, reporter.publish.lease) at the default duration of 40 s and at 120 s, idle and
at 600 pod events an hour: Lease writes and reads per node-hour, the bytes of one renewal (request
body and answer body, as the double serves them), and the Node writes beside it. Then the same
renewal on the real kube-apiserver (tests/controlplane's harness, built by Go as the tests build
it): the body sent, and the Lease as the server answers it (its managedFields included).

Racks (`--racks N`): N simulated GB200 NVL72 racks of 18 nodes (reporter.collect.simulate.racks,
every rack on the same clique ID, as real racks are), one agent per node as `run` builds it for
that node's name, each scanning its own simulated tray for real (the fake pynvml, the fabric and
platform reads, the link walk) every compressed minute, with its NVLink error counters moving at
every scan: what a steady rack costs the API server, errors counted in metrics and never written.

    python bench/api_cost.py --racks 2 [--client lean|official]

DeviceTaintRules (`--device-taints`): one agent with `run --dra-device-taints` (the Agent and its
DeviceTaintRule output as `run` builds them, the real API client over HTTPS to the double, which
serves resource.k8s.io/v1alpha3 DeviceTaintRules), on the simulated clock, scanning every 60 s with
a 5 min resync. Rows: every GPU healthy all day; GPU 3 lost all day (steady: its rule stays); GPU 3
flapping (lost, then healthy again, `--flaps` times a day). Requests to devicetaintrules are counted
by the double: lists (at start and per resync), creates and deletes per node-hour.

    python bench/api_cost.py --device-taints [--hours 24] [--flaps 4] [--client lean|official]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RandomFaultDouble, quiet_logs, table
from reporter.agent import Agent
from reporter.assembly import build_agent
from reporter.collect import CollectorScanner, Scanner, ScanResult, build_scanner
from reporter.collect.podresources import AllocationView
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import Machine
from reporter.collect.simulate.racks import rack_nodes
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs
from reporter.publish.api import NODES, ApiClient, Resource
from reporter.publish.devicetaints import RBAC_VERBS as DEVICE_TAINT_VERBS
from reporter.publish.kube import KubeApiClient, load_configuration
from reporter.publish.lease import LeaseHeartbeat
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.schema import keys
from reporter.schema.codec import encode
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics
from reporter.settings import Settings
from tests.support.agent_support import ClockedStop, FakeClock
from tests.support.controlplane_fixtures import (
    build_harness,
    start_harness,
    stop_process,
    wait_for_file,
)
from tests.support.kube_double import (
    AGENT_PERMISSIONS,
    ApiServerDouble,
    make_certificate,
    write_kubeconfig,
)

PREFIX = keys.DEFAULT_PREFIX
COMPRESSION = 60.0
INTERVAL_S = 60.0 / COMPRESSION
RESYNC_S = 300.0 / COMPRESSION
HOUR_S = 3600.0 / COMPRESSION


class FixedScanner:
    """One scan result, every time: the machine does not change during the benchmark."""

    def __init__(self, result: ScanResult) -> None:
        self._result = result

    def scan(self) -> ScanResult:
        return self._result


@dataclass
class Running:
    agent: Agent
    stop: threading.Event
    thread: threading.Thread
    metrics: Metrics


CLIENTS: dict[str, Callable[[Path], ApiClient]] = {
    "lean": lambda kubeconfig: RestApiClient(load_rest_config(str(kubeconfig))),
    "official": lambda kubeconfig: KubeApiClient(load_configuration(str(kubeconfig))),
}


def start_agent(
    node: str, kubeconfig: Path, scan: ScanResult | Scanner, client: Callable[[Path], ApiClient]
) -> Running:
    """An agent on `node`, as `run` builds it, scanning `scan`: one result every time, or a
    scanner."""
    parts = build_agent(
        Settings(node=node, prefix=PREFIX, interval_s=INTERVAL_S, resync_s=RESYNC_S),
        api=client(kubeconfig),
        scanner=FixedScanner(scan) if isinstance(scan, ScanResult) else scan,
        stall_after_s=300,
    )
    agent, stop, metrics = parts.agent, parts.stop, parts.metrics
    thread = threading.Thread(target=agent.run, name=f"agent-{node}", daemon=True)
    thread.start()
    return Running(agent, stop, thread, metrics)


def stop_all(agents: list[Running]) -> None:
    for a in agents:
        a.stop.set()
    for a in agents:
        a.thread.join(timeout=10)


def count(double: ApiServerDouble, since: int) -> Counter[str]:
    """Requests after the first `since`, by kind: node reads, node writes, events, 429s."""
    out: Counter[str] = Counter()
    for r in double.requests[since:]:
        if r.status == 429:
            out["429"] += 1
        if r.path.startswith("/api/v1/nodes"):
            out["node GET" if r.method == "GET" else f"node {r.method}"] += 1
        elif "/events" in r.path:
            out["event " + r.method] += 1
    out["all"] = len(double.requests) - since
    return out


def converged(double: ApiServerDouble, nodes: list[str], annotation: str) -> bool:
    key = keys.key(PREFIX, keys.TOPOLOGY)
    return all(double.annotations(n).get(key) == annotation for n in nodes)


def wait_converged(
    double: ApiServerDouble, nodes: list[str], annotation: str, limit: float
) -> float:
    start = time.monotonic()
    while not converged(double, nodes, annotation):
        if time.monotonic() - start > limit:
            return float("nan")
        time.sleep(0.1)
    return time.monotonic() - start


CHURNS = (0, 6, 60, 600, 3600)
"""Pod starts plus stops per node-hour: idle, batch, busy, one per 6 s, one a second."""
POD_SIZES = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
SCAN_S, TICK_S, LIVE_RESYNC_S = 60.0, 10.0, 300.0


class ChurningKubelet:
    """A free source: pods start and stop on the simulated clock, at `per_hour` events an hour."""

    def __init__(self, per_hour: float, clock: FakeClock, seed: int) -> None:
        self._clock = clock
        self._rng = random.Random(seed)
        self._rate = per_hour / 3600.0
        self._next = clock() + self._wait()
        self.pods: list[frozenset[int]] = []
        self.events = 0
        self.changes = 0
        self._last: tuple[int, ...] | None = None

    def _wait(self) -> float:
        return self._rng.expovariate(self._rate) if self._rate > 0 else float("inf")

    def _event(self, gpus: int) -> None:
        held = set().union(*self.pods)
        free = [g for g in range(gpus) if g not in held]
        k = self._rng.choices([k for k, _ in POD_SIZES], [w for _, w in POD_SIZES])[0]
        if self.pods and (self._rng.random() < 0.5 or k > len(free)):
            self.pods.pop(self._rng.randrange(len(self.pods)))
        elif k <= len(free):
            self.pods.append(frozenset(self._rng.sample(free, k)))
        self.events += 1

    def allocated(self, topology: Topology) -> AllocationView:
        while self._next <= self._clock():
            self._event(len(topology.gpus))
            self._next += self._wait()
        gpus = frozenset(g.index for g in topology.gpus)
        view = AllocationView(
            allocatable=gpus,
            allocated=frozenset().union(*self.pods),
            unhealthy=(),
            unknown_ids=0,
            unknown_examples=(),
        )
        if self._last is not None and view.free != self._last:
            self.changes += 1
        self._last = view.free
        return view


def availability_cost(
    double: ApiServerDouble,
    kubeconfig: Path,
    scan: ScanResult,
    client: Callable[[Path], ApiClient],
    per_hour: float,
    hours: float,
    heartbeat_s: float | None = None,
) -> list[object]:
    """One agent with availability on, `hours` simulated: its requests per node-hour; with
    `heartbeat_s`, the heartbeat Lease's instead."""
    node = f"gpu-live-{int(per_hour)}" + ("" if heartbeat_s is None else f"-hb{heartbeat_s:g}")
    double.add_node(node)
    clock = FakeClock()
    ticks = int(hours * 3600 / TICK_S)
    stop = ClockedStop(clock, waits=ticks)
    kubelet = ChurningKubelet(per_hour, clock, seed=int(per_hour) + 1)
    parts = build_agent(
        Settings(
            node=node,
            prefix=PREFIX,
            interval_s=SCAN_S,
            resync_s=LIVE_RESYNC_S,
            availability=True,
            availability_interval_s=TICK_S,
            namespace=LEASE_NAMESPACE,
            heartbeat=heartbeat_s is not None,
            heartbeat_duration_s=heartbeat_s or HEARTBEAT_DURATIONS[0],
        ),
        api=client(kubeconfig),
        scanner=FixedScanner(scan),
        source=kubelet,
        stop=stop,
        clock=clock,
        stall_after_s=300,
    )
    agent, loop = parts.agent, parts.live
    assert loop is not None
    agent.step()  # install: the first publish, not counted
    path = f"/api/v1/nodes/{node}"
    mark = len(double.requests)
    worst = 0
    tick = loop.tick

    def counted(topology: Topology | None) -> bool:
        nonlocal worst
        before = len(double.requests)
        done = tick(topology)
        worst = max(worst, sum(r.method == "PATCH" for r in double.requests[before:]))
        return done

    loop.tick = counted  # type: ignore[method-assign]
    wall = time.perf_counter()
    agent.run()
    wall = time.perf_counter() - wall
    ours = [r for r in double.requests[mark:] if r.path == path]
    writes = sum(r.method == "PATCH" for r in ours)
    reads = sum(r.method == "GET" for r in ours)
    if heartbeat_s is not None:
        leases = [r for r in double.requests[mark:] if "/leases" in r.path]
        renewals = [r for r in leases if r.method == "PUT"]
        return [
            f"{heartbeat_s:g} s",
            f"{per_hour:g}",
            f"{len(renewals) / hours:.1f}",
            f"{sum(r.method != 'PUT' for r in leases) / hours:.2f}",
            f"{max(r.request_bytes for r in renewals)} / {max(r.answer_bytes for r in renewals)}",
            f"{sum(r.request_bytes + r.answer_bytes for r in leases) / hours / 1024:.0f} KiB",
            f"{writes / hours:.2f}",
        ]
    return [
        f"{per_hour:g}",
        f"{kubelet.events / hours:.1f}",
        f"{kubelet.changes / hours:.1f}",
        f"{writes / hours:.2f}",
        f"{reads / hours:.2f}",
        worst,
        f"{wall:.1f} s",
    ]


class FlappingScanner:
    """GPU `gpu` of the scan is lost during the first half of every `period_s` (None: always,
    0: never), on the simulated clock."""

    def __init__(
        self, scan: ScanResult, gpu: int, period_s: float | None, clock: FakeClock
    ) -> None:
        assert scan.topology is not None
        gpus = list(scan.topology.gpus)
        gpus[gpu] = replace(gpus[gpu], lost=True)
        self._healthy, self._lost = (
            scan,
            replace(scan, topology=replace(scan.topology, gpus=tuple(gpus))),
        )
        self._period_s, self._clock, self._start = period_s, clock, clock.now

    def scan(self) -> ScanResult:
        if self._period_s == 0:
            return self._healthy
        if self._period_s is None:
            return self._lost
        phase = (self._clock.now - self._start) % self._period_s
        return self._lost if phase < self._period_s / 2 else self._healthy


def device_taint_cost(
    double: ApiServerDouble,
    kubeconfig: Path,
    scan: ScanResult,
    client: Callable[[Path], ApiClient],
    label: str,
    period_s: float | None,
    hours: float,
) -> list[object]:
    """One agent with DeviceTaintRules on, `hours` simulated: its rule requests per node-hour."""
    node = f"gpu-taints-{len(double.nodes)}"
    double.add_node(node)
    clock = FakeClock()
    stop = ClockedStop(clock, waits=int(hours * 3600 / SCAN_S))
    parts = build_agent(
        Settings(
            node=node,
            prefix=PREFIX,
            interval_s=SCAN_S,
            resync_s=LIVE_RESYNC_S,
            dra_device_taints=True,
        ),
        api=client(kubeconfig),
        scanner=FlappingScanner(scan, 3, period_s, clock),
        stop=stop,
        clock=clock,
        stall_after_s=300,
    )
    parts.agent.step()  # install: the first scan and its rules, not counted
    mark = len(double.requests)
    wall = time.perf_counter()
    parts.agent.run()
    wall = time.perf_counter() - wall
    ours = [r for r in double.requests[mark:] if "/devicetaintrules" in r.path]
    by = Counter(r.method for r in ours)
    return [
        label,
        f"{by['GET'] / hours:.2f}",
        f"{by['POST'] / hours:.3f}",
        f"{by['DELETE'] / hours:.3f}",
        f"{(by['POST'] + by['DELETE']) / hours:.3f}",
        f"{wall:.1f} s",
    ]


def main_device_taints(
    client: Callable[[Path], ApiClient], name: str, hours: float, flaps: int
) -> None:
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        with ApiServerDouble(certificate=certificate) as double:
            double.device_taint_rules.installed = True
            double.tokens["taints-token"] = AGENT_PERMISSIONS | {
                f"{verb} devicetaintrules" for verb in DEVICE_TAINT_VERBS
            }
            kubeconfig = write_kubeconfig(
                Path(tmp) / "agent.kubeconfig", double.url, "taints-token", ca_cert=certificate.cert
            )
            for label, period in (
                ("every GPU healthy", 0.0),
                ("GPU 3 lost all day (steady)", None),
                (f"GPU 3 lost and back {flaps} times a day", 24 * 3600 / flaps),
            ):
                rows.append(
                    device_taint_cost(double, kubeconfig, scan, client, label, period, hours)
                )
    print(
        f"one agent, simulated DGX H100, {name} client, {hours:g} simulated hours per row; scan "
        f"{SCAN_S:.0f} s, resync {LIVE_RESYNC_S:.0f} s\n"
    )
    print(
        table(
            [
                "health",
                "lists / node-hour",
                "creates / node-hour",
                "deletes / node-hour",
                "writes / node-hour",
                "wall time",
            ],
            rows,
        )
    )


def main_availability(
    client: Callable[[Path], ApiClient], name: str, hours: float, heartbeat: bool
) -> None:
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        with ApiServerDouble(certificate=certificate) as double:
            kubeconfig = write_kubeconfig(
                Path(tmp) / "agent.kubeconfig", double.url, "agent-token", ca_cert=certificate.cert
            )
            if heartbeat:
                for duration in HEARTBEAT_DURATIONS:
                    for per_hour in (0, 600):
                        rows.append(
                            availability_cost(
                                double, kubeconfig, scan, client, per_hour, hours, duration
                            )
                        )
                print_heartbeat(rows, name, hours)
                sent, answered = real_renewal_bytes(HEARTBEAT_DURATIONS[0])
                print(
                    f"\none renewal on the real kube-apiserver (tests/controlplane): request "
                    f"{sent} bytes, answer {answered} bytes (the Lease with its managedFields)"
                )
                return
            for per_hour in CHURNS:
                rows.append(availability_cost(double, kubeconfig, scan, client, per_hour, hours))
    print(
        f"one agent, simulated DGX H100, {name} client, {hours:g} simulated hours per row; scan "
        f"{SCAN_S:.0f} s, availability interval {TICK_S:.0f} s, resync {LIVE_RESYNC_S:.0f} s\n"
    )
    print(
        table(
            [
                "churn (pod starts + stops / h)",
                "events / h (drawn)",
                "free-set changes at ticks / h",
                "node writes / node-hour",
                "node reads / node-hour",
                "most writes in one interval",
                "wall time",
            ],
            rows,
        )
    )


HEARTBEAT_DURATIONS = (40.0, 120.0)
"""The default `--heartbeat-duration` (the kubelet's node Lease), and a cheaper one."""
LEASE_NAMESPACE = "gpu-system"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)


class Measured:
    """An ApiClient that notes the JSON bytes of each replace: the body sent, the answer."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api
        self.replaced: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._api, name)

    def replace(
        self, resource: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        answer = self._api.replace(resource, name, body, namespace)
        self.replaced.append((len(json.dumps(body)), len(json.dumps(answer))))
        return answer


def real_renewal_bytes(duration_s: float) -> tuple[int, int]:
    """(request, answer) bytes of one Lease renewal on the real kube-apiserver."""
    binary = build_harness()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "admin.kubeconfig"
        log = Path(tmp) / "apiserver.log"
        proc = start_harness(binary, ["apiserver", "--kubeconfig", str(kubeconfig)], log)
        try:
            wait_for_file(kubeconfig, proc, 240, log)
            api = RestApiClient(load_rest_config(str(kubeconfig)))
            node = "gpu-heartbeat-0"
            api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            namespace = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": LEASE_NAMESPACE},
            }
            api.create(NAMESPACES, namespace)
            measured = Measured(api)
            heartbeat = LeaseHeartbeat(
                cast(ApiClient, measured),
                node=node,
                namespace=LEASE_NAMESPACE,
                prefix=PREFIX,
                duration_s=duration_s,
                log=structlog.get_logger("topo_reporter"),
            )
            for _ in range(3):  # create, then two renewals
                heartbeat.renew()
            return measured.replaced[-1]
        finally:
            stop_process(proc)


def print_heartbeat(rows: list[list[object]], name: str, hours: float) -> None:
    print(
        f"one agent with its heartbeat Lease, simulated DGX H100, {name} client, {hours:g} "
        f"simulated hours per row; availability interval {TICK_S:.0f} s\n"
    )
    print(
        table(
            [
                "Lease duration",
                "churn (pod events / h)",
                "Lease writes / node-hour",
                "Lease reads / node-hour",
                "bytes of one renewal (request / answer)",
                "Lease bytes / node-hour",
                "node writes / node-hour",
            ],
            rows,
        )
    )


def erring_scanner(machine: Machine) -> CollectorScanner:
    """The node's real scanner, its NVLink error counters 7 higher at every scan."""
    scans = itertools.count()

    def load() -> FakeNvml:
        counters = {g.index: {"replay": 7 * next(scans)} for g in machine.gpus}
        return FakeNvml(machine, Faults(counters=counters))

    return CollectorScanner("auto", memory_hostfs(machine), load, procfs=memory_procfs(machine))


def main_racks(client: Callable[[Path], ApiClient], name: str, racks: int) -> None:
    nodes = rack_nodes(racks, cliques=[17044] * racks)
    machines = {n.name: n.machine() for n in nodes}
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        double = RandomFaultDouble(certificate=certificate)
        for node in nodes:
            double.add_node(node.name)
        with double:
            kubeconfig = write_kubeconfig(
                Path(tmp) / "agent.kubeconfig", double.url, "agent-token", ca_cert=certificate.cert
            )
            mark = len(double.requests)
            agents = [
                start_agent(n.name, kubeconfig, erring_scanner(machines[n.name]), client)
                for n in nodes
            ]
            partition = keys.key(PREFIX, keys.NVLINK_PARTITION)
            start = time.monotonic()
            while any(double.labels(n.name).get(partition) != n.partition for n in nodes):
                if time.monotonic() - start > 120:
                    raise SystemExit("the racks did not converge in 120 s")
                time.sleep(0.1)
            took = time.monotonic() - start
            time.sleep(INTERVAL_S)
            c = count(double, mark)
            rows.append(
                ["install (all start on empty Nodes)", f"{took:.1f} s", *per_node(c, len(nodes))]
            )
            mark = len(double.requests)
            time.sleep(HOUR_S)
            c = count(double, mark)
            errors = sum(
                a.metrics.registry.get_sample_value(
                    "topo_reporter_nvlink_errors_total", {"counter": "replay"}
                )
                or 0.0
                for a in agents
            )
            scans = sum(
                a.metrics.registry.get_sample_value("topo_reporter_scans_total", {"result": "ok"})
                or 0.0
                for a in agents
            )
            rows.append(
                [
                    f"steady state, per node-hour ({scans:.0f} scans, {errors:.0f} NVLink replay "
                    "errors counted)",
                    f"{HOUR_S:.0f} s",
                    *per_node(c, len(nodes)),
                ]
            )
            stop_all(agents)
    print(
        f"{len(nodes)} agents on {racks} simulated NVL72 racks ({name} client), interval "
        f"{INTERVAL_S:.0f} s, resync {RESYNC_S:.0f} s (60x compressed)\n"
    )
    print(
        table(
            [
                "phase",
                "wall time",
                "node reads/node",
                "node writes/node",
                "events/node",
                "429s/node",
                "requests",
            ],
            rows,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--client", choices=sorted(CLIENTS), default="lean")
    parser.add_argument("--availability", action="store_true", help="the live loop's cost instead")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (availability)")
    parser.add_argument(
        "--heartbeat", action="store_true", help="with --availability: the heartbeat Lease's cost"
    )
    parser.add_argument("--racks", type=int, help="agents on N simulated NVL72 racks instead")
    parser.add_argument(
        "--device-taints", action="store_true", help="the DeviceTaintRule output's cost instead"
    )
    parser.add_argument("--flaps", type=int, default=4, help="health changes a day (device taints)")
    args = parser.parse_args()
    client = CLIENTS[args.client]
    quiet_logs(logging.ERROR)
    if args.racks:
        main_racks(client, args.client, args.racks)
        return
    if args.availability:
        main_availability(client, args.client, args.hours, args.heartbeat)
        return
    if args.device_taints:
        main_device_taints(client, args.client, args.hours, args.flaps)
        return
    n = args.agents
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    annotation = encode(scan.topology)
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        double = RandomFaultDouble(certificate=certificate)
        nodes = [f"gpu-{i:03d}" for i in range(n)]
        for node in nodes:
            double.add_node(node)
        with double:
            kubeconfig = write_kubeconfig(
                Path(tmp) / "agent.kubeconfig", double.url, "agent-token", ca_cert=certificate.cert
            )
            # 1. install
            mark = len(double.requests)
            agents = [start_agent(node, kubeconfig, scan, client) for node in nodes]
            took = wait_converged(double, nodes, annotation, 120)
            time.sleep(INTERVAL_S)
            c = count(double, mark)
            rows.append(["install (all start on empty Nodes)", f"{took:.1f} s", *per_node(c, n)])
            # 2. steady state: one compressed hour
            mark = len(double.requests)
            time.sleep(HOUR_S)
            c = count(double, mark)
            rows.append(["steady state, per node-hour", f"{HOUR_S:.0f} s", *per_node(c, n)])
            # 3. rolling update: all restart at once
            stop_all(agents)
            mark = len(double.requests)
            t0 = time.monotonic()
            agents = [start_agent(node, kubeconfig, scan, client) for node in nodes]
            time.sleep(2 * INTERVAL_S)
            c = count(double, mark)
            rows.append(
                [
                    f"restart of every agent at once (peak {double.peak(t0)} requests/s)",
                    f"{2 * INTERVAL_S:.0f} s",
                    *per_node(c, n),
                ]
            )
            stop_all(agents)
            # 4. throttled install on fresh Nodes
            fresh = [f"gpu-throttled-{i:03d}" for i in range(n)]
            for node in fresh:
                double.add_node(node)
            double.rate = 0.5
            mark = len(double.requests)
            agents = [start_agent(node, kubeconfig, scan, client) for node in fresh]
            took = wait_converged(double, fresh, annotation, 300)
            double.rate = 0.0
            c = count(double, mark)
            throttled = sum(
                a.metrics.registry.get_sample_value(
                    "topo_reporter_api_errors_total", {"kind": "throttled"}
                )
                or 0.0
                for a in agents
            )
            rows.append(
                [
                    f"install, 429 to half the requests ({throttled:.0f} counted by the agents)",
                    f"{took:.1f} s",
                    *per_node(c, n),
                ]
            )
            stop_all(agents)
    print(
        f"{n} agents ({args.client} client), interval {INTERVAL_S:.0f} s, "
        f"resync {RESYNC_S:.0f} s (60x compressed)\n"
    )
    print(
        table(
            [
                "phase",
                "wall time",
                "node reads/node",
                "node writes/node",
                "events/node",
                "429s/node",
                "requests",
            ],
            rows,
        )
    )


def per_node(c: Counter[str], n: int) -> list[str]:
    return [
        f"{c['node GET'] / n:.2f}",
        f"{c['node PATCH'] / n:.2f}",
        f"{c['event POST'] / n:.2f}",
        f"{c['429'] / n:.2f}",
        str(c["all"]),
    ]


if __name__ == "__main__":
    main()
