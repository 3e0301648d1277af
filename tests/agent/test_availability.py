"""The live loop (`run --availability`) against the API server double, through each API client.

A fake free source hands it prepared allocation views and a fake clock runs hours in no time;
what is asserted is what reached the Node (the availability annotation and its two labels), the
requests made (writes counted), and the metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reporter.agent import Agent
from reporter.assembly import build_agent
from reporter.collect.kubelet import KubeletReading
from reporter.collect.podresources import AllocationView, PodResourcesError
from reporter.free_sets import compute_availability
from reporter.live import AvailabilityLoop, SimulatedFreeSource
from reporter.outputs import LiveOutput
from reporter.placement_quality import HeldSet, decode_held_sets
from reporter.schema.availability import encode_availability
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState, Verdict
from reporter.settings import WITHDRAW_AFTER, Settings
from tests.support.agent_support import (
    FAST,
    NODE,
    PREFIX,
    ApiClientFactory,
    ClockedStop,
    FakeClock,
    FakeScanner,
    ok,
    topology,
)
from tests.support.kube_double import ApiServerDouble, Fault

AVAILABILITY = f"{PREFIX}/availability"
FREE = f"{PREFIX}/gpu-free"
NVLINK_MAX = f"{PREFIX}/gpu-free-nvlink-max"
OWNED = f"{PREFIX}/owned"
INTERVAL_S = 10.0
SCAN_S = 60.0
RESYNC_S = 300.0
LEASE_NAMESPACE = "gpu-topology"
HEARTBEAT_DEFAULT_S = 40.0


@dataclass
class FakeSource:
    """Allocation views on demand: `used` GPUs are allocated; `error` makes the next reads fail."""

    used: set[int] = field(default_factory=set)
    error: PodResourcesError | None = None
    unknown: int = 0
    reads: int = 0
    held: tuple[HeldSet, ...] = ()

    def allocated(self, t: Topology) -> AllocationView:
        self.reads += 1
        if self.error is not None:
            raise self.error
        gpus = frozenset(g.index for g in t.gpus)
        return AllocationView(
            allocatable=gpus,
            allocated=frozenset(self.used) & gpus,
            unhealthy=(),
            unknown_ids=self.unknown,
            unknown_examples=tuple(f"GPU-unknown-{i}" for i in range(self.unknown)),
            held_sets=self.held,
        )


@dataclass
class Live:
    agent: Agent
    loop: AvailabilityLoop
    scanner: FakeScanner
    source: FakeSource | None
    metrics: Metrics
    state: AgentState
    clock: FakeClock
    stop: ClockedStop


def wire_live(
    kubeconfig: Path,
    client: ApiClientFactory,
    *,
    source: FakeSource | None,
    scanner: FakeScanner | None = None,
    outputs: tuple[LiveOutput, ...] = (),
    waits: int = 1_000,
    withdraw_after: int = WITHDRAW_AFTER,
    heartbeat_s: float | None = None,
    node: str = NODE,
    lease_namespace: str = LEASE_NAMESPACE,
) -> Live:
    """An agent with its live loop, built as `run --availability` builds it (one client for both
    sinks); `source=None` is availability off, whose loop only takes our keys off the Node.
    `heartbeat_s`: `run --heartbeat` with that Lease duration, the Lease in `lease_namespace`."""
    clock = FakeClock()
    stop = ClockedStop(clock, waits=waits)
    scanner = scanner or FakeScanner([ok(topology())])
    parts = build_agent(
        Settings(
            node=node,
            namespace=lease_namespace,
            prefix=PREFIX,
            interval_s=SCAN_S,
            resync_s=RESYNC_S,
            availability=source is not None,
            availability_interval_s=INTERVAL_S,
            availability_withdraw_after=withdraw_after,
            heartbeat=heartbeat_s is not None,
            heartbeat_duration_s=HEARTBEAT_DEFAULT_S if heartbeat_s is None else heartbeat_s,
        ),
        api=client(kubeconfig, (2.0, 2.0)),
        scanner=scanner,
        source=source,
        live_outputs=outputs,
        kubelet=lambda: KubeletReading(None),
        stop=stop,
        clock=clock,
        backoff=FAST,
        stall_after_s=180,
    )
    assert parts.live is not None
    stop.probe = parts.state.liveness
    return Live(parts.agent, parts.live, scanner, source, parts.metrics, parts.state, clock, stop)


@pytest.fixture
def live(kubeconfig: Path, node_client: ApiClientFactory) -> Callable[..., Live]:
    def make(**kwargs: object) -> Live:
        return wire_live(kubeconfig, node_client, **kwargs)  # type: ignore[arg-type]

    return make


def expected(used: set[int], n: int = 8) -> str:
    return encode_availability(compute_availability(topology(n), set(range(n)) - used))


def availability_writes(apiserver: ApiServerDouble) -> list[dict[str, object]]:
    """The bodies of the patches that touched our availability keys."""
    out = []
    for write in apiserver.writes(f"/api/v1/nodes/{NODE}"):
        meta = write.body["metadata"]
        if AVAILABILITY in meta.get("annotations", {}) or FREE in meta.get("labels", {}):
            out.append(write.body)
    return out


def sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_the_first_step_publishes_topology_then_availability_outside_the_owned_list(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={0, 1, 2}))
    assert w.agent.step()
    annotations, labels = apiserver.annotations(NODE), apiserver.labels(NODE)
    assert annotations[AVAILABILITY] == expected({0, 1, 2})
    assert labels[FREE] == "5"
    assert labels[NVLINK_MAX] == "5"
    owned = annotations[OWNED].split(",")
    assert "availability" not in owned
    assert "gpu-free" not in owned
    (body,) = availability_writes(apiserver)
    # Our three keys only, and no resourceVersion: a kubelet status update must not make it 409.
    assert body == {
        "metadata": {
            "annotations": {AVAILABILITY: expected({0, 1, 2})},
            "labels": {FREE: "5", NVLINK_MAX: "5"},
        }
    }
    # The agent's one read at start served both sinks.
    assert len(apiserver.reads(f"/api/v1/nodes/{NODE}")) == 1


def test_the_sets_containers_hold_ride_in_the_availability_patch_and_idle_writes_none(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    train = HeldSet("ml", "train-0", "main", (0, 1, 2))
    source = FakeSource(used={0, 1, 2, 5, 6}, held=(train, HeldSet("ml", "b", "c", (5, 6))))
    w = live(source=source)
    assert w.agent.step()
    (body,) = availability_writes(apiserver)
    sets = body["metadata"]["annotations"][f"{PREFIX}/gpu-sets"]  # type: ignore[index]
    assert decode_held_sets(sets) == ((HeldSet("ml", "b", "c", (5, 6)), train), 0)
    apiserver.clear_requests()
    w.stop.waits = int(3600 / INTERVAL_S)
    w.agent.run()
    assert apiserver.writes() == []
    # The pods end: the sets leave the Node in the same patch as the free GPUs.
    source.used, source.held = set(), ()
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    (body,) = availability_writes(apiserver)
    assert body["metadata"]["annotations"][f"{PREFIX}/gpu-sets"] is None  # type: ignore[index]
    assert f"{PREFIX}/gpu-sets" not in apiserver.annotations(NODE)


def test_an_idle_hour_writes_nothing_and_reads_only_at_resync(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={3}))
    w.agent.step()
    apiserver.clear_requests()
    hour = int(3600 / INTERVAL_S)
    w.stop.waits = hour
    w.agent.run()
    assert apiserver.writes() == []
    # One read per resync, which serves both loops, and nothing else.
    assert {r.method for r in apiserver.requests} == {"GET"}
    assert 3600 / RESYNC_S - 1 <= len(apiserver.requests) <= 3600 / RESYNC_S
    assert w.source is not None
    assert w.source.reads >= hour
    assert all(v == Verdict(True, "ok") for v in w.stop.seen)
    assert sample(w.metrics, "topo_reporter_availability_writes_total", {"result": "written"}) == 1


def test_each_change_is_one_write_at_the_next_tick_and_never_more_than_one_per_interval(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource()
    w = live(source=source)
    w.agent.step()
    apiserver.clear_requests()
    # Several changes between two ticks: only the state at the tick is written.
    source.used = {0}
    source.used = {0, 1}
    source.used = {1}
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert [b["metadata"]["labels"] for b in availability_writes(apiserver)] == [  # type: ignore[index]
        {FREE: "7", NVLINK_MAX: "7"}
    ]
    assert apiserver.annotations(NODE)[AVAILABILITY] == expected({1})
    # A source that changes at every read: exactly one write per tick, whatever the loop does.
    flips = iter(range(10_000))

    class Flipping(FakeSource):
        def allocated(self, t: Topology) -> AllocationView:
            self.used = {next(flips) % 2}
            return super().allocated(t)

    apiserver.clear_requests()
    flipping = live(source=Flipping(), waits=60)
    flipping.agent.run()
    assert flipping.source is not None
    assert len(availability_writes(apiserver)) == flipping.source.reads


def test_a_failed_read_keeps_the_last_good_availability_and_is_counted(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource(used={0})
    w = live(source=source)
    assert w.agent.step()
    before = apiserver.annotations(NODE)[AVAILABILITY]
    apiserver.clear_requests()
    source.error = PodResourcesError("kubelet restarting", reason="unavailable", method="List")
    # Up to the withdrawal (tests/agent/test_availability_freshness.py), the last good value stays.
    for _ in range(WITHDRAW_AFTER - 1):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())
    assert apiserver.writes() == []
    assert apiserver.annotations(NODE)[AVAILABILITY] == before
    assert apiserver.labels(NODE)[FREE] == "7"
    reads = "topo_reporter_podresources_reads_total"
    assert sample(w.metrics, reads, {"result": "unavailable"}) == WITHDRAW_AFTER - 1
    assert sample(w.metrics, "topo_reporter_podresources_gpus", {"state": "free"}) == 7
    # Back: the next good read that differs is written.
    source.error, source.used = None, {0, 1}
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert apiserver.labels(NODE)[FREE] == "6"


def test_a_failed_read_before_any_good_one_publishes_nothing(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource(error=PodResourcesError("no socket", reason="missing"))
    w = live(source=source)
    assert not w.agent.step()
    assert AVAILABILITY not in apiserver.annotations(NODE)
    assert FREE not in apiserver.labels(NODE)
    # The topology is published whatever the kubelet says.
    assert f"{PREFIX}/topology" in apiserver.annotations(NODE)


def test_unknown_devices_are_counted_and_free_no_gpu_away(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={2}, unknown=3))
    assert w.agent.step()
    assert sample(w.metrics, "topo_reporter_podresources_unknown_devices") == 3
    assert apiserver.labels(NODE)[FREE] == "7"


@dataclass
class RecordingOutput:
    """A live output that notes each call: (GPUs, free GPUs) per good read, "withdraw" else."""

    seen: list[tuple[int, tuple[int, ...]] | str] = field(default_factory=list)

    def __call__(self, t: Topology, view: AllocationView) -> None:
        self.seen.append((len(t.gpus), view.free))

    def withdraw(self) -> None:
        self.seen.append("withdraw")


def test_live_outputs_get_each_good_read_and_withdraw_with_the_keys(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    output = RecordingOutput()
    source = FakeSource(used={5})
    w = live(source=source, outputs=(output,))
    w.agent.step()
    source.error = PodResourcesError("down", reason="unavailable")
    for _ in range(WITHDRAW_AFTER - 1):
        w.clock.advance(INTERVAL_S)
        w.loop.tick(topology())
    assert output.seen == [(8, (0, 1, 2, 3, 4, 6, 7))]
    # The read that withdraws the Node's keys withdraws the outputs' too, and so does each one
    # after it (an output asks the API only once).
    w.clock.advance(INTERVAL_S)
    w.loop.tick(topology())
    assert FREE not in apiserver.labels(NODE)
    w.clock.advance(INTERVAL_S)
    w.loop.tick(topology())
    source.error = None
    w.clock.advance(INTERVAL_S)
    w.loop.tick(topology())
    assert output.seen == [
        (8, (0, 1, 2, 3, 4, 6, 7)),
        "withdraw",
        "withdraw",
        (8, (0, 1, 2, 3, 4, 6, 7)),
    ]


def test_a_topology_change_leaves_the_availability_keys_alone(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={0}))
    w.agent.step()
    apiserver.clear_requests()
    w.scanner.then(ok(topology(lost=[7])))
    w.clock.advance(SCAN_S)
    w.agent.step()
    # One patch each, the topology's with the version the availability patch left: no 409.
    (topology_write, availability_write) = apiserver.writes(f"/api/v1/nodes/{NODE}")
    assert sample(w.metrics, "topo_reporter_api_errors_total", {"kind": "conflict"}) == 0
    named = {*topology_write.body["metadata"].get("labels", {})}
    named |= set(topology_write.body["metadata"].get("annotations", {}))
    assert not named & {AVAILABILITY, FREE, NVLINK_MAX}
    # GPU 7 is lost: no longer free.
    assert availability_write.body["metadata"]["labels"][FREE] == "6"
    assert apiserver.annotations(NODE)[AVAILABILITY] == encode_availability(
        compute_availability(topology(lost=[7]), set(range(1, 7)))
    )


def test_keys_edited_by_hand_are_repaired_at_resync_and_not_before(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={0}))
    w.agent.step()
    apiserver.edit_node(NODE, {"metadata": {"labels": {FREE: None, NVLINK_MAX: "8"}}})
    apiserver.clear_requests()
    w.clock.advance(INTERVAL_S)
    w.loop.tick(topology())
    assert apiserver.requests == []
    w.clock.advance(RESYNC_S)
    # The topology loop's resync reads the Node; the live loop compares with what it read.
    assert w.agent.step()
    assert [(r.method, r.body) for r in apiserver.requests] == [
        ("GET", None),
        ("PATCH", {"metadata": {"labels": {FREE: "7", NVLINK_MAX: "7"}}}),
    ]
    assert apiserver.labels(NODE)[FREE] == "7"


def test_without_the_topology_loops_reads_the_live_loop_reads_the_node_itself(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={0}))
    w.agent.step()
    apiserver.edit_node(NODE, {"metadata": {"annotations": {AVAILABILITY: "1;;"}}})
    apiserver.clear_requests()
    w.clock.advance(RESYNC_S)
    assert w.loop.tick(topology())
    assert apiserver.requests == []
    w.clock.advance(RESYNC_S)
    assert w.loop.tick(topology())
    assert [r.method for r in apiserver.requests] == ["GET", "PATCH"]
    assert apiserver.annotations(NODE)[AVAILABILITY] == expected({0})


def test_a_failed_write_is_counted_and_made_at_the_next_tick(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource()
    w = live(source=source)
    w.agent.step()
    source.used = {4}
    apiserver.plan(Fault(status=500, method="PATCH"))
    w.clock.advance(INTERVAL_S)
    assert not w.loop.tick(topology())
    writes = "topo_reporter_availability_writes_total"
    assert sample(w.metrics, writes, {"result": "failed"}) == 1
    assert sample(w.metrics, "topo_reporter_api_errors_total", {"kind": "server"}) == 1
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert apiserver.labels(NODE)[FREE] == "7"


def test_a_throttled_write_waits_for_retry_after(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource()
    w = live(source=source)
    w.agent.step()
    source.used = {4}
    apiserver.plan(Fault(status=429, method="PATCH", retry_after="25"))
    w.clock.advance(INTERVAL_S)
    assert not w.loop.tick(topology())
    apiserver.clear_requests()
    w.clock.advance(INTERVAL_S)
    assert not w.loop.tick(topology())
    assert apiserver.requests == []
    w.clock.advance(INTERVAL_S + 6)
    assert w.loop.tick(topology())
    assert apiserver.labels(NODE)[FREE] == "7"


def test_availability_off_takes_our_keys_off_the_node_once_and_nothing_else(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    live(source=FakeSource(used={0})).agent.step()
    apiserver.edit_node(NODE, {"metadata": {"labels": {"team": "ml"}}})
    apiserver.clear_requests()
    off = live(source=None)
    assert off.agent.step()
    writes = apiserver.writes(f"/api/v1/nodes/{NODE}")
    assert [w.body for w in writes] == [
        {
            "metadata": {
                "annotations": {AVAILABILITY: None},
                "labels": {FREE: None, NVLINK_MAX: None},
            }
        }
    ]
    assert FREE not in apiserver.labels(NODE)
    assert AVAILABILITY not in apiserver.annotations(NODE)
    assert apiserver.labels(NODE)["team"] == "ml"
    assert f"{PREFIX}/topology" in apiserver.annotations(NODE)
    apiserver.clear_requests()
    off.stop.waits = 100
    off.agent.run()
    assert apiserver.writes() == []


def test_availability_off_on_a_node_without_our_keys_costs_no_request(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    off = live(source=None)
    assert off.agent.step()
    apiserver.clear_requests()
    restarted = live(source=None)
    assert restarted.agent.step()
    assert [(r.method, r.path) for r in apiserver.requests] == [("GET", f"/api/v1/nodes/{NODE}")]


def test_the_loop_runs_both_cadences_on_one_thread_and_announces_every_wait(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(), waits=12)
    w.agent.run()
    # Ticks every 10 s, scans every 60 s: the waits are the gaps between the two.
    assert w.stop.waited == [INTERVAL_S] * 12
    assert w.scanner.calls == 2
    assert w.source is not None
    assert w.source.reads == 12
    assert all(v == Verdict(True, "ok") for v in w.stop.seen)


def test_the_simulated_source_offers_every_gpu_but_the_used_and_lost() -> None:
    view = SimulatedFreeSource({0, 2}).allocated(topology(4, lost=[3]))
    assert view.free == (1,)
    assert view.allocated == frozenset({0, 2})
    assert view.unknown_ids == 0


def test_a_thread_stops_the_loop_between_ticks(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    w = wire_live(kubeconfig, node_client, source=FakeSource())
    w.stop.set()
    thread = threading.Thread(target=w.agent.run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert w.state.liveness() == Verdict(False, "stopped")
