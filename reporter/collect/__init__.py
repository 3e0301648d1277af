"""Sources: of the GPU topology (NVML, sysfs, simulated machines), and of the node beside it.

A scan asks each topology source in turn and says, per source, whether it observed the machine
(`ok`), found nothing to observe (`no_data`: no GPU is not a failure) or failed (`failed`, with
the reason). The agent decides what to publish from that; a collector never decides to publish
nothing. The topology sources observe the same GPUs and are merged (reporter.collect.scanner).

A node source (`NodeSource`: the kubelet's policies today) observes something else about the node,
on its own cadence, and is projected into labels of its own; its failure takes away only those
labels. The agent's sources are listed in one tuple, in reporter.assembly.node_sources.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from reporter.schema.model import Topology

BACKENDS = ("auto", "nvml", "sysfs")
"""What `--backend` names: `auto` (NVML, sysfs where NVML does not load), `nvml` or `sysfs`."""


class SourceState(enum.Enum):
    OK = "ok"
    NO_DATA = "no_data"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What one source did during one scan."""

    name: str
    """`nvml` or `sysfs`, or a node source's name: the `source` label of the metrics."""
    state: SourceState
    duration_s: float
    error: str | None = None
    """For FAILED: one line saying what happened and what to check."""


LINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "recovery_failed")
"""Every `LinkErrors.counter`: the metric starts each at 0, so a rate over it has a series before
the first error."""


@dataclass(frozen=True, slots=True)
class LinkErrors:
    """What one NVLink error counter of one GPU added since the previous scan."""

    gpu: int
    counter: str
    """One of LINK_ERROR_COUNTERS: `replay`, `recovery`, `crc_flit`, `crc_data` (totals over the
    GPU's links) or `recovery_failed` (link recoveries that failed and left the link down)."""
    delta: int


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The merged topology of one scan and how each source fared."""

    topology: Topology | None
    """None when no source observed anything usable."""
    sources: tuple[SourceStatus, ...]
    link_errors: tuple[LinkErrors, ...] = ()
    """NVLink error counters that moved since the previous scan: for metrics and logs, never
    for the annotation, which would be rewritten at every scan while a link keeps erring."""

    @property
    def failed(self) -> tuple[SourceStatus, ...]:
        return tuple(s for s in self.sources if s.state is SourceState.FAILED)

    @property
    def degraded(self) -> bool:
        """A source that should have answered failed (NVML did not load, sysfs unreadable)."""
        return bool(self.failed)


class Scanner(Protocol):
    """Anything that can scan the machine; the agent's only view of the collectors."""

    def scan(self) -> ScanResult: ...


Observed = TypeVar("Observed")


@dataclass(frozen=True, slots=True)
class NodeReading(Generic[Observed]):
    """What one read of a node source observed, or why it observed nothing."""

    value: Observed | None
    """What it observed; None with NO_DATA or FAILED."""
    state: SourceState = SourceState.OK
    problem: str | None = None
    """Why there is no value (NO_DATA: nothing to read; FAILED: it could not be read), in one
    line saying what to check; None with OK."""


class NodeSource(Protocol[Observed]):
    """A fact of the node beside the GPU topology, read on its own cadence and published as
    labels of its own: node-feature-discovery's `FeatureSource` with GPU Feature Discovery's
    one-method labeler. Its builder picks its simulated twin under `--simulate`.

    What it must never do: raise from `read` (a failure is a FAILED reading: the agent logs it,
    counts it in `topo_reporter_source_success{source=name}`, notes it in /readyz and publishes
    the topology without this source's labels), or write anything itself."""

    @property
    def name(self) -> str:
        """Lower-case, constant: the metrics' `source` label, the /readyz note's key, and the
        log events `<name>_unreadable` and `<name>_read`."""
        ...

    @property
    def interval_s(self) -> float | None:
        """Read again once this long has passed since the last read, at the topology loop's next
        step; None: at every step (the topology's --interval)."""
        ...

    @property
    def lacking(self) -> str:
        """What the node's labels lack while the source has no value, for /readyz."""
        ...

    def read(self) -> NodeReading[Observed]:
        """One read of the source; never raises."""
        ...

    def labels(self, value: Observed, prefix: str) -> dict[str, str]:
        """The labels `value` is published as, under `prefix`: a pure projection."""
        ...


# The builders sit below the contract they return, so the agent and the CLI import one package;
# they load when first named: the settings, the metrics and the agent's loop read only the
# contract above, and the scanner brings the NVML binding, the simulated machines and the schema.
if TYPE_CHECKING:
    from reporter.collect.scanner import CollectorScanner, build_scanner
    from reporter.collect.simulate.machine import ProfileInfo, list_profiles
else:
    _BUILDERS = {
        "CollectorScanner": "scanner",
        "build_scanner": "scanner",
        "ProfileInfo": "simulate.machine",
        "list_profiles": "simulate.machine",
    }

    def __getattr__(name: str) -> object:
        if name not in _BUILDERS:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{__name__}.{_BUILDERS[name]}"), name)


__all__ = [
    "BACKENDS",
    "CollectorScanner",
    "LinkErrors",
    "NodeReading",
    "NodeSource",
    "ProfileInfo",
    "ScanResult",
    "Scanner",
    "SourceState",
    "SourceStatus",
    "build_scanner",
    "list_profiles",
]
