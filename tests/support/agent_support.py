"""Shared pieces of the agent tests: topologies built with the model, a fake scanner, a fake clock,
and an agent wired to the API server double through either API client: the official `kubernetes`
one (`official`) or the agent's own (`lean`). The `wire` fixture runs a test once with each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reporter.agent import Agent
from reporter.assembly import build_agent
from reporter.collect import NodeSource, ScanResult, SourceState, SourceStatus
from reporter.collect.kubelet import KubeletReading
from reporter.publish.api import ApiClient
from reporter.publish.kube import KubeApiClient, load_configuration
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.retry import Backoff
from reporter.publish.sink import NodePatchSink
from reporter.schema.model import SELF, Gpu, Link, LinkKind, Nic, NumaNode, Source, Topology
from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState
from reporter.settings import Settings

NODE = "gpu-node-1"
PREFIX = "gpu.topology.io"
FAST = Backoff(attempts=4, initial_s=0.01, max_s=0.05, retry_after_max_s=2.0)
"""Backoff for tests: real waits, but short."""


def topology(
    n: int = 8,
    *,
    nv: int = 18,
    nics: Sequence[str] = ("mlx5_0", "mlx5_1"),
    lost: Sequence[int] = (),
    overrides: dict[tuple[int, int], Link] | None = None,
) -> Topology:
    """An NVSwitch machine like a DGX H100, GPUs split over two NUMA nodes."""
    half = max(n // 2, 1)
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            pci=f"0000:{0x18 + 0x10 * i:02x}:00.0",
            model="NVIDIA H100 80GB HBM3",
            numa=frozenset({0 if i < half else 1}),
            cpus=frozenset(range(0, 48)) if i < half else frozenset(range(48, 96)),
            mem_mib=81559,
            mig=False,
            lost=i in lost,
        )
        for i in range(n)
    )
    grid = [[SELF if i == j else Link(LinkKind.NV, nv) for j in range(n)] for i in range(n)]
    for (a, b), cell in (overrides or {}).items():
        grid[a][b] = grid[b][a] = cell
    nic_objs = tuple(
        Nic(
            name=name,
            links=tuple(
                Link(LinkKind.PIX if (g < half) == (k % 2 == 0) else LinkKind.SYS) for g in range(n)
            ),
            pci=f"0000:{0x1A + k:02x}:00.0",
            numa=frozenset({k % 2}),
        )
        for k, name in enumerate(nics)
    )
    return Topology(
        source=Source.NVML,
        gpus=gpus,
        links=tuple(tuple(row) for row in grid),
        driver="550.54.15",
        nics=nic_objs,
        numa_nodes=(
            NumaNode(0, frozenset(range(0, 48)), (10, 21)),
            NumaNode(1, frozenset(range(48, 96)), (21, 10)),
        ),
        nvswitch=True,
    )


def ok(t: Topology | None) -> ScanResult:
    return ScanResult(t, (SourceStatus("nvml", SourceState.OK, 0.01),))


def nvml_failed(t: Topology | None = None) -> ScanResult:
    """NVML did not load; `t` is what sysfs alone saw (or nothing)."""
    sources = [SourceStatus("nvml", SourceState.FAILED, 0.01, "NVML did not load: driver gone")]
    if t is not None:
        sources.append(SourceStatus("sysfs", SourceState.OK, 0.01))
        t = replace(t, source=Source.SYSFS, nvlink_observed=False)
    return ScanResult(t, tuple(sources))


@dataclass
class FakeScanner:
    """Returns prepared scan results in order, repeating the last one."""

    results: list[ScanResult]
    calls: int = 0

    def scan(self) -> ScanResult:
        result = self.results[min(self.calls, len(self.results) - 1)]
        self.calls += 1
        return result

    def then(self, *results: ScanResult) -> None:
        """Replace what comes next."""
        self.results = self.results[: self.calls] + list(results)


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ClockedStop(threading.Event):
    """A stop signal whose waits pass at once on a fake clock, so that hours of Retry-After and
    interval cost no real time. Each wait notes `probe()` (the liveness verdict) as it ends; the
    signal sets itself after `waits` waits, ending a running loop."""

    def __init__(self, clock: FakeClock, *, waits: int = 1_000) -> None:
        super().__init__()
        self.clock = clock
        self.waits = waits
        self.waited: list[float] = []
        self.seen: list[object] = []
        self.probe: Callable[[], object] = lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        self.clock.advance(timeout or 0.0)
        self.waited.append(timeout or 0.0)
        self.seen.append(self.probe())
        if len(self.waited) >= self.waits:
            self.set()
        return self.is_set()


@dataclass
class Wired:
    """An agent and everything around it."""

    agent: Agent
    scanner: FakeScanner
    sink: NodePatchSink
    state: AgentState
    metrics: Metrics
    clock: FakeClock
    stop: threading.Event = field(default_factory=threading.Event)


ApiClientFactory = Callable[[Path, tuple[float, float]], ApiClient]

API_CLIENTS: dict[str, ApiClientFactory] = {
    "official": lambda kc, t: KubeApiClient(load_configuration(str(kc)), request_timeout_s=t),
    "lean": lambda kc, t: RestApiClient(load_rest_config(str(kc)), request_timeout_s=t),
}
"""Each ApiClient the agent can run with, made from a kubeconfig and a (connect, read) timeout."""


def wire_agent(
    kubeconfig: Path,
    scanner: FakeScanner,
    *,
    client: ApiClientFactory = API_CLIENTS["official"],
    clock: FakeClock | None = None,
    interval_s: float = 60.0,
    resync_s: float = 300.0,
    request_timeout_s: tuple[float, float] = (2.0, 2.0),
    stop: threading.Event | None = None,
    kubelet: Callable[[], KubeletReading] = lambda: KubeletReading(None),
    node_sources: Sequence[NodeSource[Any]] | None = None,
    backoff: Backoff = FAST,
    stall_after_s: float = 180,
    node: str = NODE,
    taint_unhealthy_fabric: bool = False,
    network_label_style: str = "topo-reporter",
) -> Wired:
    """An agent on `node`, built as `run` builds it, publishing through `client` to whatever
    kubeconfig names; availability off, as `run`'s default."""
    clock = clock or FakeClock()
    parts = build_agent(
        Settings(
            node=node,
            prefix=PREFIX,
            interval_s=interval_s,
            resync_s=resync_s,
            taint_unhealthy_fabric=taint_unhealthy_fabric,
            network_label_style=network_label_style,
        ),
        api=client(kubeconfig, request_timeout_s),
        scanner=scanner,
        kubelet=kubelet,
        node_sources=node_sources,
        stop=stop,
        clock=clock,
        backoff=backoff,
        stall_after_s=stall_after_s,
    )
    assert isinstance(parts.sink, NodePatchSink)
    return Wired(parts.agent, scanner, parts.sink, parts.state, parts.metrics, clock, parts.stop)


WireAgent = Callable[..., Wired]
"""`wire_agent` with its client chosen (the `wire` fixture)."""
