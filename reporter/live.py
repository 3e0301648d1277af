"""The agent's live loop: the free GPUs, read every --availability-interval, published on change.

Each tick reads the allocation view of the current topology from a free source (the kubelet's
PodResources, or `--simulate-used`), hands it to the live outputs, computes the availability
(reporter.availability) and gives it to the AvailabilitySink, which writes only what differs from
what the Node carries. So: at most one write per tick (one tick per interval), none while nothing
changes, and no read of the Node of its own: the topology loop's read at start and at each resync
tells it what the Node carries, which repairs our keys where someone edited or deleted them.

A failed read never blanks or crashes what is published: the last good availability stays, and
the failure is counted (the reader logs it, once per reason) and makes the agent not ready. But a
value nobody can vouch for must not go on excluding the node from schedulers that read it: after
`withdraw_after` failed reads in a row the loop withdraws the availability keys from the Node
(the gpu-free labels and the annotation; a reader then knows nothing, which filters nothing) and
has each live output withdraw what it published (the NodeResourceTopology), and publishes again
at the first good read. The topology stays whatever the kubelet says. A failed
write is logged once per distinct error, counted, and tried again at the next tick, or after the
server's Retry-After, or, when the API refused it for good, once the availability changes or at
the next resync.

With a heartbeat (`reporter.publish.lease.LeaseHeartbeat`), each tick that leaves the Node
carrying what the loop decided (the availability, or nothing once withdrawn) renews the node's
Lease when a renewal is due: the Lease then says "the agent still vouches for these keys", and
stops saying so when the agent is gone, stuck or cannot write. A failed renewal is logged once per
distinct error, counted, makes the agent not ready, and is tried again at the next tick.

With availability off the loop has no source: it makes sure none of our keys stays on the Node
(a stale `gpu-free` label would mislead schedulers), then has nothing more to do.

grpc is imported only when a source is given: an agent without availability never loads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import structlog

from reporter.errors import ApiPermanentError, ApiTransientError, ConfigError, PublishError
from reporter.free_sets import compute_availability
from reporter.outputs import LiveOutput
from reporter.placement import Policy
from reporter.placement_quality import HeldSet
from reporter.publish.availability import AvailabilitySink
from reporter.publish.lease import LeaseHeartbeat
from reporter.publish.patch import Desired
from reporter.schema.availability import Allocation, Availability
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics, api_error_kind
from reporter.serve.state import AgentState
from reporter.telling import Told

if TYPE_CHECKING:
    from reporter.collect.podresources import AllocationView, PodResourcesError

_Published = tuple[Availability, Allocation | None, tuple[HeldSet, ...]]
"""What the Node carries of ours: availability, how it was counted, the sets containers hold."""


class FreeSource(Protocol):
    """Which GPUs of a topology are allocated right now."""

    def allocated(self, topology: Topology) -> AllocationView:
        """Raises reporter.collect.podresources.PodResourcesError, logged by the source."""
        ...


class SimulatedFreeSource:
    """`--simulate-used`: the given GPU indexes are allocated, every other GPU is offered."""

    def __init__(self, used: Iterable[int]) -> None:
        self.used = frozenset(used)

    def allocated(self, topology: Topology) -> AllocationView:
        from reporter.collect.podresources import AllocationView  # noqa: PLC0415  # loads grpc

        gpus = frozenset(g.index for g in topology.gpus)
        lost = frozenset(g.index for g in topology.gpus if g.lost)
        return AllocationView(
            allocatable=gpus - lost,
            allocated=self.used & gpus,
            unhealthy=(),
            unknown_ids=0,
            unknown_examples=(),
            lost=lost,
        )


def check_simulated_used(used: Iterable[int], gpus: Iterable[int], profile: str) -> None:
    """Raises ConfigError for an index that is not a GPU of the simulated profile."""
    known = set(gpus)
    unknown = sorted(set(used) - known)
    if unknown:
        raise ConfigError(
            f"--simulate-used: GPU {unknown[0]} is not in profile {profile}, which has GPUs "
            f"{min(known, default=0)} to {max(known, default=-1)}"
        )


class AvailabilityLoop:
    """Reads, computes and publishes availability; Agent.run calls `tick()` once per interval."""

    def __init__(
        self,
        *,
        source: FreeSource | None,
        sink: AvailabilitySink,
        state: AgentState,
        metrics: Metrics,
        log: structlog.typing.FilteringBoundLogger,
        interval_s: float,
        resync_s: float,
        clock: Callable[[], float] = time.monotonic,
        outputs: Sequence[LiveOutput] = (),
        policy: Policy = Policy.NVIDIA_BESTEFFORT,
        withdraw_after: int,
        heartbeat: LeaseHeartbeat | None = None,
    ) -> None:
        """`withdraw_after`: failed reads in a row after which the keys leave the Node.
        `heartbeat`: the node's Lease to renew while the Node carries what the loop decided."""
        self.interval_s = interval_s
        self._policy = policy
        self._source = source
        self._sink = sink
        self._state = state
        self._metrics = metrics
        self._log = log
        self._resync_s = resync_s
        self._clock = clock
        self._outputs = tuple(outputs)
        self._read_error: type[PodResourcesError] | None = None
        if source is not None:
            from reporter.collect.podresources import PodResourcesError  # noqa: PLC0415  # grpc

            self._read_error = PodResourcesError
        self._node_read_at = clock()
        self._computed: tuple[Topology, tuple[int, ...], Availability] | None = None
        """The last good read: its topology, free GPUs and availability (kept on failures)."""
        self._allocation: Allocation | None = None
        """How the last good read counted, and the GPUs its claims hold."""
        self._held_sets: tuple[HeldSet, ...] = ()
        """The sets of two or more GPUs containers hold, in the last good read."""
        self._settled = False
        """Off: the Node is known to carry none of our keys; nothing more to do."""
        self._hold_until = -math.inf
        self._refused: tuple[_Published | None, ...] = ()
        """What the API refused for good (one value, or empty): not sent again until resync."""
        self._write_error: Told[str | None] = Told(None)
        self._withdraw_after = withdraw_after
        self._failures = 0
        """Reads failed in a row since the last good one."""
        self._withdrawn = Told(False)
        self._heartbeat = heartbeat
        self._renew_at = -math.inf
        self._heartbeat_error: Told[str | None] = Told(None)

    def node_read(self, published: Desired) -> None:
        """What the Node carries under the prefix, as the topology loop just read it (at start and
        at each resync): the sink compares with it instead of reading the Node itself."""
        self._sink.seed(published)
        self._node_read_at = self._clock()
        self._refused = ()

    def tick(self, topology: Topology | None) -> bool:
        """One read and publish if needed; True when the Node carries what it should.

        `topology` is the one the agent chose (None: no GPU seen, nothing to say yet).
        """
        self._state.beat()
        if self._source is None:
            return self._settled or self._publish(None)
        if topology is None:
            return True
        fresh = self._read(self._source, topology)
        if self._failures >= self._withdraw_after:
            # Nobody can vouch for the last value any more (the kubelet's API keeps failing):
            # say nothing rather than something stale, here and in every output.
            want: _Published | None = None
            for output in self._outputs:
                output.withdraw()
        elif self._computed is None:
            return False
        else:
            want = (self._computed[2], self._allocation, self._held_sets)
        carried = self._publish(want)
        if carried:
            self._withdrawn_now(want is None)
            self._renew()
        return carried and fresh

    def _read(self, source: FreeSource, topology: Topology) -> bool:
        assert self._read_error is not None  # set with the source
        try:
            view = source.allocated(topology)
        except self._read_error as e:
            self._metrics.podresources_failed(e)
            self._failures += 1
            kept = (
                "availability withdrawn from the Node"
                if self._failures >= self._withdraw_after
                else f"availability kept until {self._withdraw_after} in a row"
            )
            self._state.set_live_problem(
                "podresources", f"{e} ({self._failures} failed reads in a row; {kept})"
            )
            return False
        self._failures = 0
        self._state.set_live_problem("podresources", None)
        self._metrics.podresources_read(view, topology)
        for output in self._outputs:
            output(topology, view)
        free = view.free
        self._allocation = Allocation(view.sources, tuple(sorted(view.claimed)))
        self._held_sets = view.held_sets
        if self._computed is None or self._computed[:2] != (topology, free):
            self._computed = (
                topology,
                free,
                compute_availability(topology, free, policy=self._policy),
            )
        return True

    def _withdrawn_now(self, withdrawn: bool) -> None:
        """Note (log, metric) a change between published and withdrawn, once the Node says so."""
        if not self._withdrawn.changed(withdrawn):
            return
        self._metrics.availability_withdrawn.set(int(withdrawn))
        if withdrawn:
            self._log.warning("availability_withdrawn", failed_reads=self._failures)
        else:
            self._log.info("availability_republished")

    def _renew(self) -> None:
        """Renew the heartbeat Lease if a renewal is due; failures are told, never raised."""
        heartbeat = self._heartbeat
        now = self._clock()
        if heartbeat is None or now < self._renew_at:
            return
        try:
            heartbeat.renew()
        except PublishError as e:
            self._metrics.api_errors.labels(kind=api_error_kind(e)).inc()
            self._metrics.heartbeat_renewals.labels(result="failed").inc()
            if self._heartbeat_error.changed(str(e)):
                # It is tried again at every tick: said once per distinct error.
                self._log.warning("heartbeat_failed", error=str(e))
            self._state.set_live_problem("heartbeat", str(e))
            return
        if self._heartbeat_error.changed(None):
            self._log.info("heartbeat_recovered")
        self._state.set_live_problem("heartbeat", None)
        self._metrics.heartbeat_renewals.labels(result="renewed").inc()
        self._renew_at = now + heartbeat.period_s

    def _publish(self, published: _Published | None) -> bool:
        now = self._clock()
        # Its own read only where the topology loop's resync read has not come for two periods
        # (that loop failing, or a dry run, which never reads): drift is still repaired.
        if now - self._node_read_at >= 2 * self._resync_s:
            self._sink.forget()
            self._node_read_at = now
            self._refused = ()
            self._hold_until = -math.inf
        if now < self._hold_until or self._refused == (published,):
            return False
        try:
            availability, allocation, held_sets = published or (None, None, ())
            wrote = self._sink.publish(availability, allocation, held_sets)
        except PublishError as e:
            self._metrics.api_errors.labels(kind=api_error_kind(e)).inc()
            self._metrics.availability_writes.labels(result="failed").inc()
            if self._write_error.changed(str(e)):
                # It is tried again every interval: said once per distinct error.
                off = published is None
                event = "availability_removal_failed" if off else "availability_publish_failed"
                self._log.warning(event, error=str(e))
            if isinstance(e, ApiPermanentError):
                self._refused = (published,)
            elif isinstance(e, ApiTransientError) and e.retry_after is not None:
                self._hold_until = now + e.retry_after
            return False
        if self._write_error.changed(None):
            self._log.info("availability_publish_recovered")
        self._refused = ()
        self._settled = published is None
        self._metrics.availability_writes.labels(result="written" if wrote else "unchanged").inc()
        return True
