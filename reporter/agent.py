"""The agent's loop: scan → choose what to publish → publish when it changed → record state.

Beside the scan, each node source (reporter.collect.NodeSource: the kubelet's policies) is read on
its own cadence, and its labels join the topology's; a source that fails takes only its own labels
away, and never the topology or the loop.

What it must never do: publish an emptier topology over a good one because a source failed (a
failing NVML keeps the last published data and marks the agent degraded), write when nothing
changed, or retry a permanent API refusal in a loop (it waits for a change or the next resync).
A GPU that NVML reports lost is published as lost, deliberately. Steady state costs one Node read
per resync period and nothing else.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from reporter.collect import NodeReading, NodeSource, Scanner, ScanResult, SourceState
from reporter.collect.kubelet_policies import KubeletSource
from reporter.collect.lldp import LldpTierSource
from reporter.doctor.node import local_findings
from reporter.doctor.report import event_text
from reporter.errors import ApiPermanentError, InputError, PublishError
from reporter.live import AvailabilityLoop
from reporter.outputs import ScanOutput
from reporter.publish import patch
from reporter.publish.client import DEGRADED_REASON, FINDING_REASONS, EventType
from reporter.publish.patch import Desired
from reporter.publish.retry import Interrupted
from reporter.publish.sink import Sink
from reporter.schema import keys
from reporter.schema import labels as projections
from reporter.schema.annotations import annotations as annotation_values
from reporter.schema.codec import decode
from reporter.schema.diff import EVENT_MESSAGE_MAX_BYTES, changes, event_message
from reporter.schema.fabric import node_fabric, taint_value
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics
from reporter.serve.state import AgentState
from reporter.signals import stop_on_signals, wait_until_stopped
from reporter.telling import Told

STALL_AFTER_S = 300.0
"""Liveness: the longest the loop may work without a beat or an announced wait before /healthz
says it is stuck. Every wait is announced (the interval, each retry's backoff or Retry-After), so
this bounds only work: one scan, and the one or two API requests between two announcements (each
at most its (5 s, 15 s) timeout). Not a multiple of the interval, nor of the retry budget: a wait
the loop or the server asked for is not a stall, however long."""

REASON_CHANGED = "GPUTopologyChanged"
REASON_FINDING = "GPUTopologyFinding"
REASON_FABRIC = "NVLinkFabricProblem"
"""Warning Event: the node's NVLink partition is withheld, or its GPUs answered fabric or rack
values that cannot be taken (reporter.schema.fabric.NodeFabric.problems)."""


@dataclass(frozen=True, slots=True)
class SchemaProjection:
    """Topology to desired metadata, and published metadata back to a topology: docs/schema.md's
    labels, `topology`, `matrix` and `owned`."""

    prefix: str
    node: str | None = None
    """The Node's name: a node without a multi-node NVLink fabric is its own domain, named after
    it (without one, those two labels are left out)."""
    taint_unhealthy_fabric: bool = False
    """Keep the `<prefix>/fabric-health` NoSchedule taint on the Node while its fabric is
    degraded or unhealthy, and off otherwise; False leaves taints alone."""
    foreign: frozenset[str] = frozenset()
    """Keys outside the prefix the node sources write (Topograph's tier labels, with
    `--network-label-style topograph`), listed in `owned` like ours."""

    def desired(self, topology: Topology, node_labels: Mapping[str, str] | None = None) -> Desired:
        """The metadata for `topology`, with the node sources' `node_labels` beside its own."""
        taint = None
        if self.taint_unhealthy_fabric:
            value = taint_value(node_fabric(topology))
            taint = patch.OwnTaint(keys.key(self.prefix, keys.FABRIC_TAINT), value)
        return patch.desired(
            projections.labels(topology, self.prefix, self.node) | dict(node_labels or {}),
            annotation_values(topology, self.prefix),
            self.prefix,
            taint,
            self.foreign,
        )

    def topology(self, published: Desired) -> Topology | None:
        """The topology the metadata carries; None when absent or unreadable."""
        text = published.annotations.get(keys.key(self.prefix, keys.TOPOLOGY))
        if text is None:
            return None
        try:
            return decode(text)
        except InputError:
            # Hand-edited or from an incompatible version: it will be overwritten, not trusted.
            return None


@dataclass(slots=True)
class _Polled:
    """A node source, when it is next due, and its last reading."""

    source: NodeSource[Any]
    due: float = -math.inf
    reading: NodeReading[Any] = field(
        default_factory=lambda: NodeReading(None, SourceState.NO_DATA)
    )
    problem: Told[str | None] = field(default_factory=lambda: Told(None))
    """The problem last told: said when it starts, changes or clears."""


def _worse(old: Topology, new: Topology) -> bool:
    """Fewer GPUs or NICs, more lost GPUs, a smaller NVLink island, more NVLinks down or a
    fabric less healthy: worth a Warning."""

    def down(t: Topology) -> int:
        return sum(len(g.nvlink.down) for g in t.gpus if g.nvlink is not None)

    def fabric(t: Topology) -> int:
        health = node_fabric(t).health
        return {None: 0, "healthy": 0, "degraded": 1}.get(health, 2)

    return (
        len(new.gpus) < len(old.gpus)
        or len(new.nics) < len(old.nics)
        or sum(g.lost for g in new.gpus) > sum(g.lost for g in old.gpus)
        or new.largest_island < old.largest_island
        or down(new) > down(old)
        or fabric(new) > fabric(old)
    )


class Agent:
    """One node's publisher loop; `step()` is one scan and publish, `run()` loops until stopped."""

    def __init__(
        self,
        *,
        scanner: Scanner,
        sink: Sink,
        projection: SchemaProjection,
        state: AgentState,
        metrics: Metrics,
        log: structlog.typing.FilteringBoundLogger,
        stop: threading.Event,
        interval_s: float,
        resync_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sources: Sequence[NodeSource[Any]] = (),
        outputs: Sequence[ScanOutput] = (),
        live: AvailabilityLoop | None = None,
    ) -> None:
        self._scanner = scanner
        self._sink = sink
        self._projection = projection
        self._state = state
        self._metrics = metrics
        self._log = log
        self._stop = stop
        self._interval_s = interval_s
        self._resync_s = resync_s
        self._clock = clock
        self._wall = wall
        self._topology: Topology | None = None
        """What the target carries: read at start, then what was last published."""
        self._started = False
        self._last_read = -math.inf
        self._refused: Desired | None = None
        """Desired metadata the API refused permanently: not retried until it changes or resync."""
        self._refusal = ""
        self._degraded: Told[bool] = Told(False)
        self._read_refusal: Told[str | None] = Told(None)
        self._outputs = tuple(outputs)
        """Outputs beside the sink (files for other schedulers, DeviceTaintRules)."""
        self._sources = tuple(_Polled(s) for s in sources)
        """The node sources (reporter.assembly.config_node_sources), each with its last reading."""
        self._sources_changed = False
        """A node source's problem changed since the findings were last reported."""
        self._findings_told: set[tuple[str, str]] | None = None
        """Node-local findings already reported as Events; None until the first publish."""
        self._silent_told: tuple[tuple[str, str], ...] = ()
        """The silent RoCE ports the findings were last judged with."""
        self._live = live
        """The availability loop, on its own cadence in `run()`; None when not wired."""
        self._chosen: Topology | None = None
        """The topology chosen by the last scan: the one the live loop reads availability for."""
        self._fabric_told: Told[tuple[str, ...]] = Told(())
        """The fabric problems last reported as a Warning Event."""

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> bool:
        """Scan once and publish if needed, then one availability tick where the live loop is
        wired; True when the target carries what should be there.

        False as well when a source failed, even where the last good topology stands on the
        target: `run --once` exits 1 then, and a check that runs it must see the failure.
        Raises Interrupted when shutdown is requested during an API retry.
        """
        published = self._step()
        if self._live is None:
            return published
        return self._live.tick(self._chosen) and published

    def _step(self) -> bool:
        self._state.beat()
        result = self._scan()
        self._read_sources()
        try:
            if not self._started:
                # The one read at start: after a restart with an unchanged topology nothing is
                # written, and a failing NVML can keep what an earlier run published.
                self._last_read = self._clock()
                published = self._sink.published()
                self._topology = self._projection.topology(published)
                if self._live is not None:
                    self._live.node_read(published)
                self._started = True
                self._read_refusal.changed(None)
            chosen = self._choose(result)
            self._chosen = chosen
            if chosen is None:
                if not result.degraded:
                    self._state.published()
                return not result.degraded
            for output in self._outputs:
                output(chosen)
            return self._publish(chosen) and not result.degraded
        except ApiPermanentError as e:
            if self._read_refusal.changed(str(e)):
                # It is retried every interval, and repeats help nobody.
                self._log.error("node_read_refused", error=str(e))
            self._failed(str(e))
            return False
        except PublishError as e:
            self._log.warning("node_read_failed", error=str(e))
            self._failed(str(e))
            return False

    def _scan(self) -> ScanResult:
        started = self._clock()
        result = self._scanner.scan()
        duration = self._clock() - started
        self._metrics.scanned(result, duration)
        self._log.debug(
            "scanned",
            duration_s=round(duration, 4),
            gpus=None if result.topology is None else len(result.topology.gpus),
            sources={s.name: s.state.value for s in result.sources},
        )
        return result

    def _choose(self, result: ScanResult) -> Topology | None:
        if not result.degraded:
            if self._state.degraded is not None:
                self._log.info("recovered")
            self._state.set_degraded(None)
            self._metrics.degraded.set(0)
            self._degraded.changed(False)
            if result.topology is None:
                self._log.info("no_gpu_observed")
            return result.topology
        reason = "; ".join(f"{s.name}: {s.error or 'failed'}" for s in result.failed)
        self._state.set_degraded(reason)
        self._metrics.degraded.set(1)
        keep = self._topology is not None
        if self._degraded.changed(True):
            if keep:
                self._log.warning("degraded_keeping_last_topology", reason=reason)
                message = f"{reason}; keeping the last published topology"
            else:
                self._log.warning("degraded_nothing_published_before", reason=reason)
                message = f"{reason}; publishing what the other sources saw"
            self._event(EventType.WARNING, DEGRADED_REASON, message)
        return self._topology if keep else result.topology

    def _read_sources(self) -> None:
        """Read each node source that is due; its labels stand until its next read."""
        for polled in self._sources:
            source = polled.source
            if self._clock() < polled.due:
                continue
            started = self._clock()
            try:
                reading = source.read()
            except Exception as e:
                # A source that breaks its promise not to raise still must not stop the loop.
                reading = NodeReading(None, SourceState.FAILED, f"{type(e).__name__}: {e}")
            duration = self._clock() - started
            self._state.beat()
            polled.due = self._clock() + (source.interval_s or 0.0)
            polled.reading = reading
            self._metrics.source_read(source.name, reading.state, duration)
            self._log.debug(
                "source_read",
                source=source.name,
                state=reading.state.value,
                duration_s=round(duration, 4),
            )
            if polled.problem.changed(reading.problem):
                # Read again and again: said when the problem starts, changes or clears.
                if reading.problem is not None:
                    self._log.warning(f"{source.name}_unreadable", error=reading.problem)
                else:
                    self._log.info(f"{source.name}_read")
                self._sources_changed = True
                self._state.note(
                    source.name,
                    None if reading.problem is None else f"{source.lacking}: {reading.problem}",
                )

    def _node_labels(self) -> dict[str, str]:
        """The node sources' labels, from each one's last reading that has a value."""
        labels: dict[str, str] = {}
        for polled in self._sources:
            if polled.reading.value is not None:
                labels |= polled.source.labels(polled.reading.value, self._projection.prefix)
        return labels

    def _kubelet(self) -> NodeReading[Any]:
        """The kubelet source's last reading, which the node-local findings judge."""
        for polled in self._sources:
            if isinstance(polled.source, KubeletSource):
                return polled.reading
        return NodeReading(None, SourceState.NO_DATA)

    def _silent_ports(self) -> tuple[tuple[str, str], ...]:
        """The up RoCE ports the LLDP source heard no neighbour on, at its last reading."""
        for polled in self._sources:
            if isinstance(polled.source, LldpTierSource):
                return polled.source.silent
        return ()

    def _report_findings(self, topology: Topology, changed: bool) -> None:
        """Warning Events for node-local findings: at start, then on changes, once each."""
        silent = self._silent_ports()
        if self._findings_told is not None and not changed and silent == self._silent_told:
            return
        self._silent_told = silent
        kubelet = self._kubelet()
        found = local_findings(topology, kubelet.value, kubelet.problem, silent)
        current = {(f.code, f.summary): f for f in found}
        for key, finding in current.items():
            if key not in (self._findings_told or set()):
                self._log.warning("finding", code=finding.code, summary=finding.summary)
                reason = FINDING_REASONS.get(finding.code, REASON_FINDING)
                self._event(EventType.WARNING, reason, event_text(finding))
        self._findings_told = set(current)

    def _report_fabric(self, topology: Topology) -> None:
        """Readiness and one Warning Event per distinct set of fabric problems (a partition
        withheld, garbage from the driver): said once, again when they change."""
        fabric = node_fabric(topology)
        self._state.set_fabric_problem(fabric.withheld)
        was = self._fabric_told.last
        if not self._fabric_told.changed(fabric.problems):
            return
        if fabric.problems:
            self._log.warning("fabric_problem", problems=list(fabric.problems))
            lead = "no nvlink-partition label" if fabric.withheld is not None else "NVLink fabric"
            message = event_message(fabric.problems, EVENT_MESSAGE_MAX_BYTES - len(lead) - 2)
            self._event(EventType.WARNING, REASON_FABRIC, f"{lead}: {message}")
        else:
            self._log.info("fabric_problem_gone", was=list(was))

    def _publish(self, topology: Topology) -> bool:
        want = self._projection.desired(topology, self._node_labels())
        resync = self._clock() - self._last_read >= self._resync_s
        if resync:
            self._log.debug("resync")
            self._sink.forget()
            self._last_read = self._clock()
            self._refused = None
        if want == self._refused:
            self._failed(self._refusal, result="refused")
            return False
        try:
            wrote = self._sink.publish(want)
            if resync and self._live is not None:
                # The Node was just read again (no request here: the sink knows it now), and the
                # live loop's keys with it: one read per resync serves both loops.
                self._live.node_read(self._sink.published())
        except ApiPermanentError as e:
            # Logged once per refused desired state: a loop of identical errors helps nobody.
            self._log.error("publish_refused", error=str(e))
            self._refused, self._refusal = want, str(e)
            self._failed(str(e), result="refused")
            return False
        except PublishError as e:
            self._log.warning("publish_failed", error=str(e))
            self._failed(str(e))
            return False
        previous, self._topology = self._topology, topology
        self._refused = None
        self._state.published()
        self._metrics.publishes.labels(result="written" if wrote else "unchanged").inc()
        self._metrics.topology(topology)
        self._metrics.last_publish.set(self._wall())
        if wrote:
            self._tell_change(previous, topology)
        self._report_findings(topology, changed=wrote or self._sources_changed)
        self._sources_changed = False
        self._report_fabric(topology)
        return True

    def _tell_change(self, previous: Topology | None, topology: Topology) -> None:
        if previous is None:
            self._log.info("topology_published", summary=projections.summary(topology))
            self._event(
                EventType.NORMAL, REASON_CHANGED, f"published: {projections.summary(topology)}"
            )
            return
        lines = changes(previous, topology)
        if not lines:
            self._log.info("drift_repaired")
            return
        self._log.info("topology_changed", changes=list(lines))
        kind = EventType.WARNING if _worse(previous, topology) else EventType.NORMAL
        self._event(kind, REASON_CHANGED, event_message(lines))

    def _event(self, event_type: EventType, reason: str, message: str) -> None:
        # One request each, and a step may post several: each is progress, not a stall.
        self._state.beat()
        try:
            self._sink.event(event_type, reason, message)
        except PublishError as e:
            # Events are best effort: the labels and annotations are the contract.
            self._log.warning("event_failed", reason=reason, error=str(e))

    def _failed(self, reason: str, *, result: str = "failed") -> None:
        self._state.publish_failed(reason)
        self._metrics.publishes.labels(result=result).inc()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Step every interval, and tick the live loop every one of its intervals, until `stop`.

        One thread, two cadences: each next time is counted from the end of the work before it,
        and the loop sleeps until the earlier of the two, announcing the wait.
        """
        live = self._live
        self._log.info(
            "started",
            interval_s=self._interval_s,
            resync_s=self._resync_s,
            availability_interval_s=None if live is None else live.interval_s,
        )
        try:
            next_scan = next_tick = self._clock()
            while not self._stop.is_set():
                try:
                    if self._clock() >= next_scan:
                        self._step()
                        next_scan = self._clock() + self._interval_s
                    if live is not None and self._clock() >= next_tick:
                        live.tick(self._chosen)
                        next_tick = self._clock() + live.interval_s
                except Interrupted:
                    break
                wake = next_scan if live is None else min(next_scan, next_tick)
                wait = max(wake - self._clock(), 0.0)
                self._state.waiting(wait)
                self._stop.wait(wait)
        finally:
            self._state.stopped()
            self._log.info("stopped")


def run_until_signalled(
    agent: Agent,
    stop: threading.Event,
    log: structlog.typing.FilteringBoundLogger,
    *,
    grace_s: float = 0.8,
) -> None:
    """Run the loop on a thread until SIGTERM/SIGINT; return within about `grace_s` of one.

    The loop runs off the main thread so that a request stuck in a socket read cannot hold the
    process past the kubelet's patience: after the grace period the process exits anyway.
    Must be called from the main thread (signal handlers).
    """
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            agent.run()
        except BaseException as e:
            failure.append(e)
            stop.set()

    worker = threading.Thread(target=loop, name="topo-reporter-loop", daemon=True)
    with stop_on_signals(stop, log):
        worker.start()
        wait_until_stopped(stop, running=worker.is_alive)
        worker.join(grace_s)
        if worker.is_alive():
            log.warning("exiting_with_request_in_flight")
    if failure:
        raise failure[0]
