"""One scan of the machine: ask NVML and sysfs, merge what they saw, say how each fared.

The sources are listed here and nowhere else. NVML gives the GPUs, their paths and NVLinks; sysfs
always gives the NICs and NUMA nodes, and the whole PCIe picture where NVML is absent (`auto`) or
not wanted (`sysfs`). A scan never raises for a failing source: it reports the source as failed
and returns what the others saw, so the agent can keep the last good topology.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from parsers.errors import excerpt
from reporter.collect import BACKENDS, LinkErrors, ScanResult, SourceState, SourceStatus
from reporter.collect.nvml import LinkCounters, NvmlCollector, NvmlModule, load_pynvml
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs
from reporter.collect.sysfs import SysfsCollector, SysfsView
from reporter.errors import CollectError, ConfigError, NvmlUnavailable, SchemaError
from reporter.hostfs import DirHostFS, HostFS
from reporter.schema.codec import check
from reporter.schema.model import Gpu, Topology

log = structlog.get_logger(__name__)

PROC_ROOT = Path("/proc")
"""Where the NVIDIA driver's procfs files are (`driver/nvidia/gpus`): the container's own /proc
shows them, the driver being the host kernel's."""


class CollectorScanner:
    """Scans with the chosen backend; the one `Scanner` the agent and the CLI use."""

    def __init__(
        self,
        backend: str,
        hostfs: HostFS,
        nvml_loader: Callable[[], NvmlModule],
        clock: Callable[[], float] = time.monotonic,
        procfs: HostFS | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(
                f"unknown backend {excerpt(backend)}: use one of {', '.join(BACKENDS)}"
            )
        self.backend = backend
        self._fs = hostfs
        self._load_nvml = nvml_loader
        self._clock = clock
        self._proc = procfs
        self._counters = LinkCounters()
        self._checked: Topology | None = None
        """The last topology that passed the schema check."""

    def scan(self) -> ScanResult:
        start = self._clock()
        view: SysfsView | None = None
        try:
            view = SysfsCollector(self._fs, self._proc).collect()
            sysfs = SourceStatus(
                "sysfs",
                SourceState.OK if view.gpus or view.nics else SourceState.NO_DATA,
                self._clock() - start,
            )
        except CollectError as e:
            sysfs = SourceStatus("sysfs", SourceState.FAILED, self._clock() - start, str(e))
        if self.backend == "sysfs":
            topology = view.topology() if view is not None else None
            problem = self._unpublishable(topology)
            if problem is not None:
                topology, sysfs = None, _failed(sysfs, _SYSFS_GARBAGE, problem)
            return ScanResult(topology, (sysfs,))
        link_errors: list[LinkErrors] = []
        nvml_topology, nvml = _short_of_sysfs(*self._nvml(view, link_errors), view)
        merged = self._merge(nvml_topology, view)
        problem = self._unpublishable(merged)
        if problem is not None:
            # Whose answer: NVML's own topology is checked; if it passes, sysfs added the garbage
            # (NICs, NUMA nodes, procfs minors).
            nvml_problem = self._unpublishable(nvml_topology)
            if nvml_problem is not None:
                nvml_topology, nvml = None, _failed(nvml, _NVML_GARBAGE, nvml_problem)
            else:
                view, sysfs = None, _failed(sysfs, _SYSFS_GARBAGE, problem)
            merged = self._merge(nvml_topology, view)
            problem = self._unpublishable(merged)
            if problem is not None:
                merged, sysfs = None, _failed(sysfs, _SYSFS_GARBAGE, problem)
        return ScanResult(merged, (nvml, sysfs), tuple(link_errors))

    def _unpublishable(self, topology: Topology | None) -> str | None:
        """Why the decoder would refuse `topology` once published, or None.

        A driver or a mount answering garbage (a GPU name with escape sequences, 2^64 bytes of
        memory, one minor for every GPU) must not reach the Node as a topology every reader
        refuses, nor as text an operator's terminal obeys: it fails its source, and the agent
        keeps what it had. The last topology that passed is remembered: a steady machine is
        checked once, not at every scan (bench/publish_check.py).
        """
        if topology is None or topology == self._checked:
            return None
        try:
            check(topology)
        except SchemaError as e:
            return str(e)
        self._checked = topology
        return None

    def _nvml(
        self, view: SysfsView | None, link_errors: list[LinkErrors]
    ) -> tuple[Topology | None, SourceStatus]:
        start = self._clock()
        try:
            collector = NvmlCollector(self._load_nvml(), self._fs, self._counters)
            topology = collector.collect()
            link_errors += collector.link_errors
        except NvmlUnavailable as e:
            # No driver on a node without NVIDIA GPUs is nothing to observe, not a failure.
            nothing_there = self.backend == "auto" and view is not None and not view.gpus
            state = SourceState.NO_DATA if nothing_there else SourceState.FAILED
            return None, SourceStatus(
                "nvml", state, self._clock() - start, None if nothing_there else str(e)
            )
        except CollectError as e:
            return None, SourceStatus("nvml", SourceState.FAILED, self._clock() - start, str(e))
        state = SourceState.NO_DATA if topology is None else SourceState.OK
        return topology, SourceStatus("nvml", state, self._clock() - start)

    def _merge(self, nvml: Topology | None, view: SysfsView | None) -> Topology | None:
        if nvml is None:
            if self.backend == "nvml" or view is None:
                return None
            return view.topology()
        if view is None:
            return nvml
        places = {g.place.address: g.place for g in view.gpus}
        gpu_places = [places.get(g.pci) if g.pci is not None else None for g in nvml.gpus]
        _log_disagreements(nvml, view)
        return dataclasses.replace(
            nvml,
            gpus=_with_minors(nvml, view),
            nics=view.nic_entries(gpu_places),
            numa_nodes=view.numa_nodes,
        )


_NVML_GARBAGE = "NVML answered what the topology schema cannot hold"
_SYSFS_GARBAGE = "sysfs holds what the topology schema cannot"


def _failed(status: SourceStatus, what: str, problem: str) -> SourceStatus:
    # Not logged here: the agent says a source failed once, not at every scan.
    return SourceStatus(
        status.name,
        SourceState.FAILED,
        status.duration_s,
        f"{what} ({problem}): not published; check the driver and the node",
    )


def _with_minors(nvml: Topology, view: SysfsView) -> tuple[Gpu, ...]:
    """NVML's GPUs, each with the driver's procfs minor number where NVML did not give one."""
    minors = {g.place.address: g.minor for g in view.gpus if g.minor is not None}
    gpus = []
    for seen in nvml.gpus:
        known = minors.get(seen.pci) if seen.pci is not None else None
        gpu = seen
        if seen.minor is None and known is not None:
            gpu = dataclasses.replace(seen, minor=known)
        elif known is not None and seen.minor != known:
            log.warning(
                "nvml_sysfs_disagree", field="minor", gpu=gpu.index, nvml=gpu.minor, procfs=known
            )
        gpus.append(gpu)
    return tuple(gpus)


_UNSEEN_SHOWN = 4
"""PCI addresses named in the error line; the rest are counted, not listed."""


def _short_of_sysfs(
    topology: Topology | None, status: SourceStatus, view: SysfsView | None
) -> tuple[Topology | None, SourceStatus]:
    """NVML that answers but sees fewer GPUs than sysfs lists has failed, not observed the machine.

    The pod was not given every GPU (`NVIDIA_VISIBLE_DEVICES=none`, a device list, a CDI spec), or
    the driver dropped some: publishing what it sees would delete the island labels of a healthy
    node, or report 4 GPUs of 8 as the whole machine.
    """
    if status.state is SourceState.FAILED or view is None:
        return topology, status
    seen = 0 if topology is None else len(topology.gpus)
    if seen >= len(view.gpus):
        return topology, status
    known = set() if topology is None else {g.pci for g in topology.gpus}
    unseen = [g.place.address for g in view.gpus if g.place.address not in known]
    more = f" and {len(unseen) - _UNSEEN_SHOWN} more" if len(unseen) > _UNSEEN_SHOWN else ""
    missing = f" (not {', '.join(unseen[:_UNSEEN_SHOWN])}{more})" if unseen else ""
    error = (
        f"NVML sees {seen} of the {len(view.gpus)} NVIDIA GPUs in sysfs{missing}: give the "
        "pod every GPU (NVIDIA_VISIBLE_DEVICES=all, the chart's nvidia.visibleDevices) and check "
        "`nvidia-smi` on the node"
    )
    return None, SourceStatus("nvml", SourceState.FAILED, status.duration_s, error)


def _log_disagreements(nvml: Topology, view: SysfsView) -> None:
    """Where sysfs and the driver classify a GPU pair differently, say so once per scan."""
    index = {g.place.address: k for k, g in enumerate(view.gpus)}
    if nvml.pcie is None:
        return
    sysfs_pcie = view.pcie()
    missing = [g.index for g in nvml.gpus if g.pci not in index and not g.lost]
    if missing:
        log.warning("nvml_sysfs_disagree", field="gpus", missing_in_sysfs=missing)
    for a in nvml.gpus:
        for b in nvml.gpus:
            if a.index >= b.index or a.pci not in index or b.pci not in index:
                continue
            ours = sysfs_pcie[index[a.pci]][index[b.pci]]
            theirs = nvml.pcie[a.index][b.index]
            if ours != theirs:
                log.warning(
                    "nvml_sysfs_disagree",
                    field="pcie",
                    gpus=[a.index, b.index],
                    nvml=theirs.token,
                    sysfs=ours.token,
                )


def build_scanner(
    backend: str, sysfs_root: Path, simulate: str | None, *, faults: Faults | None = None
) -> CollectorScanner:
    """The scanner for a backend and a sysfs root, or for a simulated machine.

    `simulate` is a shipped profile name or a profile file; the simulation holds its sysfs in
    memory and ignores `sysfs_root`. Raises ConfigError for an unknown backend or profile, or a
    sysfs root that is not a readable directory.
    """
    if simulate is not None:
        machine = load_machine(simulate)
        return CollectorScanner(
            backend,
            memory_hostfs(machine),
            lambda: FakeNvml(machine, faults),
            procfs=memory_procfs(machine),
        )
    if not sysfs_root.is_dir():
        raise ConfigError(
            f"sysfs root {sysfs_root} is not a readable directory: pass --sysfs-root (or "
            "TOPO_REPORTER_SYSFS_ROOT) pointing at the host's /sys"
        )
    return CollectorScanner(
        backend, DirHostFS(sysfs_root), load_pynvml, procfs=DirHostFS(PROC_ROOT)
    )
