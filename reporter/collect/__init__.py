"""Sources of topology: NVML, sysfs, and simulated machines.

A scan asks each source in turn and says, per source, whether it observed the machine (`ok`),
found nothing to observe (`no_data`: no GPU is not a failure) or failed (`failed`, with the reason).
The agent decides what to publish from that; a collector never decides to publish nothing.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

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
    """`nvml` or `sysfs`."""
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
    "ProfileInfo",
    "ScanResult",
    "Scanner",
    "SourceState",
    "SourceStatus",
    "build_scanner",
    "list_profiles",
]
