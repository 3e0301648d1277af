"""Prometheus metrics of the agent, in a private registry (no process-global state in tests).

Names follow `topo_reporter_<thing>_<unit>`. Label values are closed sets (results, API error
kinds, link types, source names), never node or GPU identifiers, so cardinality stays fixed.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reporter.collect import LINK_ERROR_COUNTERS, ScanResult, SourceState
from reporter.errors import ApiPermanentError, PublishError
from reporter.placement_quality import judge, largest_free_connected
from reporter.schema.fabric import HEALTHY, node_fabric
from reporter.schema.model import LinkKind, Topology

if TYPE_CHECKING:
    # Types only: importing the reader loads grpc, which an agent without availability never needs.
    from reporter.collect.podresources import AllocationView, PodResourcesError


def api_error_kind(error: PublishError) -> str:
    """A closed vocabulary for `topo_reporter_api_errors_total{kind}`."""
    status = error.status
    if status is None:
        return "tls" if isinstance(error, ApiPermanentError) else "unreachable"
    named = {401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict"}
    named |= {422: "invalid", 429: "throttled"}
    if status in named:
        return named[status]
    return "server" if status >= 500 else "other"


class PlacementQuality(Collector):
    """The quality of the sets running containers hold, and the largest free connected set, from
    the last good PodResources read (kept while reads fail, as the other PodResources gauges).

    Built once per read that changed something and swapped in whole, so a scrape never sees half
    of one read; labels are sizes and closed vocabularies, never pods.
    """

    def __init__(self) -> None:
        self._key: object = None
        self._families: tuple[Metric, ...] = ()

    def observe(self, topology: Topology, view: AllocationView) -> None:
        """A good read: judge every held set again where the sets or the free GPUs changed."""
        key = (topology, view.held_sets, view.free)
        if key == self._key:
            return
        qualities = [judge(topology, s.gpus) for s in view.held_sets]
        sets = GaugeMetricFamily(
            "topo_reporter_pod_gpu_sets",
            "Containers holding 2 or more of the node's GPUs, by set size and whether every pair "
            "of their set is NVLink-joined (true/false); both values for every size the node has.",
            labels=["gpus", "connected"],
        )
        connected = Tally((len(q.gpus), q.connected) for q in qualities)
        for k in range(2, len(topology.gpus) + 1):
            for flag in (True, False):
                sets.add_metric([str(k), str(flag).lower()], connected[k, flag])
        worst = GaugeMetricFamily(
            "topo_reporter_pod_gpu_sets_worst_link",
            "Containers holding 2 or more GPUs, by set size and the farthest path between two GPUs "
            "of the set (NV, PIX, PXB, PHB, NODE, SYS); sizes and paths that occur.",
            labels=["gpus", "link"],
        )
        for (k, link), n in sorted(Tally((len(q.gpus), q.worst.value) for q in qualities).items()):
            worst.add_metric([str(k), link], n)
        numa = GaugeMetricFamily(
            "topo_reporter_pod_gpu_sets_numa",
            "Containers holding 2 or more GPUs, by set size and whether its GPUs sit on one NUMA "
            "node (one, several, unknown); sizes and values that occur.",
            labels=["gpus", "numa"],
        )
        for (k, where), n in sorted(Tally((len(q.gpus), q.numa) for q in qualities).items()):
            numa.add_metric([str(k), where], n)
        free_max = GaugeMetricFamily(
            "topo_reporter_free_connected_max",
            "The largest set of free GPUs all pairwise NVLink-joined (1: free GPUs share no "
            "NVLink; 0: none free).",
            value=largest_free_connected(topology, view.free),
        )
        self._families = (sets, worst, numa, free_max)
        self._key = key

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class Metrics:
    """The agent's metrics; `render()` is what /metrics serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scan_duration = Histogram(
            "topo_reporter_scan_duration_seconds",
            "Time one topology scan took.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.scans = Counter(
            "topo_reporter_scans", "Scans by result: ok, degraded, failed.", ["result"], registry=r
        )
        self.publishes = Counter(
            "topo_reporter_publishes",
            "Publish attempts by result: written, unchanged, kept (degraded), failed.",
            ["result"],
            registry=r,
        )
        self.api_errors = Counter(
            "topo_reporter_api_errors",
            "Failed Kubernetes API calls by kind, retried ones included.",
            ["kind"],
            registry=r,
        )
        self.gpus = Gauge("topo_reporter_gpus", "GPUs in the published topology.", registry=r)
        self.links = Gauge(
            "topo_reporter_links",
            "GPU pairs in the published topology by link type (NV, PIX, PXB, PHB, NODE, SYS).",
            ["type"],
            registry=r,
        )
        self.island = Gauge(
            "topo_reporter_nvlink_island_size",
            "GPUs in the largest NVLink island (1 when there is no NVLink).",
            registry=r,
        )
        self.last_publish = Gauge(
            "topo_reporter_last_publish_timestamp_seconds",
            "Unix time of the last successful publish.",
            registry=r,
        )
        self.degraded = Gauge(
            "topo_reporter_degraded",
            "1 while a source fails and the last good topology is kept.",
            registry=r,
        )
        self.nvlink_errors = Counter(
            "topo_reporter_nvlink_errors",
            "NVLink errors the GPUs' counters added between scans, by counter: replay, recovery, "
            "crc_flit, crc_data, recovery_failed (a counter that went back, a driver reload, "
            "counts from zero). Which GPU: the nvlink_errors log line.",
            ["counter"],
            registry=r,
        )
        for counter in LINK_ERROR_COUNTERS:
            self.nvlink_errors.labels(counter=counter)
        self.nvlinks_down = Gauge(
            "topo_reporter_nvlinks_down",
            "NVLinks not active, over the GPUs of the published topology.",
            registry=r,
        )
        self.source_success = Gauge(
            "topo_reporter_source_success",
            "1 when the source answered in the last scan (ok or no data), 0 when it failed.",
            ["source"],
            registry=r,
        )
        self.source_duration = Gauge(
            "topo_reporter_source_duration_seconds",
            "Time the source's last read took.",
            ["source"],
            registry=r,
        )

        self.podresources_reads = Counter(
            "topo_reporter_podresources_reads",
            "Reads of the kubelet's PodResources API by result: ok, or why it failed (missing, "
            "unavailable, timeout, throttled, too_large, refused, no_devices, unmatched).",
            ["result"],
            registry=r,
        )
        self.podresources_gpus = Gauge(
            "topo_reporter_podresources_gpus",
            "GPUs by state in the last good PodResources read: free, allocated, unhealthy "
            "(not offered by the kubelet).",
            ["state"],
            registry=r,
        )
        self.availability_writes = Counter(
            "topo_reporter_availability_writes",
            "Availability publishes by result: written (a Node patch), unchanged (no request), "
            "failed.",
            ["result"],
            registry=r,
        )
        self.podresources_failures = Gauge(
            "topo_reporter_podresources_consecutive_failures",
            "PodResources reads that failed in a row, since the last good one (0: the last read "
            "was good).",
            registry=r,
        )
        self.availability_withdrawn = Gauge(
            "topo_reporter_availability_withdrawn",
            "1 while the availability keys are withdrawn from the Node because PodResources reads "
            "keep failing (--availability-withdraw-after).",
            registry=r,
        )
        self.heartbeat_renewals = Counter(
            "topo_reporter_heartbeat_renewals",
            "Renewals of the node's heartbeat Lease by result: renewed, failed.",
            ["result"],
            registry=r,
        )
        self.podresources_unknown = Gauge(
            "topo_reporter_podresources_unknown_devices",
            "Device IDs of a managed resource matching no GPU, in the last good read.",
            registry=r,
        )
        self.nrt_publishes = Counter(
            "topo_reporter_nrt_publishes",
            "NodeResourceTopology publishes by result: written, unchanged, failed (the API, "
            "retried at the next read), refused (another producer's object, the API's refusal, "
            "or an object that cannot be built).",
            ["result"],
            registry=r,
        )
        self.gpus_lost = Gauge(
            "topo_reporter_gpus_lost",
            "GPUs of the published topology that NVML reports lost (fell off the bus).",
            registry=r,
        )
        self.fabric_unhealthy = Gauge(
            "topo_reporter_fabric_unhealthy",
            "1 while the node's GPUs report a multi-node NVLink fabric that is not healthy (not "
            "completed, degraded or unhealthy: the fabric-health label); 0 otherwise, also "
            "without a fabric.",
            registry=r,
        )
        self.partition_withheld = Gauge(
            "topo_reporter_partition_withheld",
            "1 while the GPUs have a fabric but no nvlink-partition label is published (not "
            "completed, or GPUs that disagree: the doctor says why).",
            registry=r,
        )
        self.placement = PlacementQuality()
        r.register(self.placement)

    def podresources_read(self, view: AllocationView, topology: Topology) -> None:
        """A good PodResources read of `topology`: count it and show what it saw."""
        self.placement.observe(topology, view)
        self.podresources_reads.labels(result="ok").inc()
        self.podresources_failures.set(0)
        self.podresources_gpus.labels(state="free").set(len(view.free))
        self.podresources_gpus.labels(state="allocated").set(len(view.allocated))
        self.podresources_gpus.labels(state="unhealthy").set(len(view.unhealthy))
        self.podresources_unknown.set(view.unknown_ids)

    def podresources_failed(self, error: PodResourcesError) -> None:
        """A failed read: the gauges keep the last good read, as the published value does."""
        self.podresources_reads.labels(result=error.reason).inc()
        self.podresources_failures.inc()

    def scanned(self, result: ScanResult, duration_s: float) -> None:
        self.scan_duration.observe(duration_s)
        outcome = "failed" if result.topology is None and result.degraded else "ok"
        if result.topology is not None and result.degraded:
            outcome = "degraded"
        self.scans.labels(result=outcome).inc()
        for source in result.sources:
            self.source_read(source.name, source.state, source.duration_s)
        for errors in result.link_errors:
            self.nvlink_errors.labels(counter=errors.counter).inc(errors.delta)

    def source_read(self, name: str, state: SourceState, duration_s: float) -> None:
        """One read of source `name` (a topology source in a scan, or a node source)."""
        self.source_success.labels(source=name).set(0 if state is SourceState.FAILED else 1)
        self.source_duration.labels(source=name).set(duration_s)

    def topology(self, t: Topology) -> None:
        self.gpus.set(len(t.gpus))
        counts: dict[LinkKind, int] = {k: 0 for k in LinkKind if k is not LinkKind.X}
        n = len(t.gpus)
        for i in range(n):
            for j in range(i + 1, n):
                counts[t.link(i, j).kind] += 1
        for kind, count in counts.items():
            self.links.labels(type=kind.value).set(count)
        self.island.set(t.largest_island)
        self.nvlinks_down.set(sum(len(g.nvlink.down) for g in t.gpus if g.nvlink is not None))
        self.gpus_lost.set(sum(g.lost for g in t.gpus))
        fabric = node_fabric(t)
        self.fabric_unhealthy.set(int(fabric.health not in (None, HEALTHY)))
        self.partition_withheld.set(int(fabric.withheld is not None))

    def render(self) -> bytes:
        return generate_latest(self.registry)
