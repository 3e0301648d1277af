"""The kubelet's policies as the agent's first node source (reporter.collect.NodeSource).

Read from the kubelet's config file (reporter.collect.kubelet) at every topology step and
published as the `topology-manager-*` and `cpu-manager-policy` labels. A module apart from
reporter.collect.kubelet because reporter.settings imports that one for a constant and must stay
light, and this one loads the schema's label projections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parsers.kubelet import KubeletPolicies
from reporter.collect import NodeReading, SourceState
from reporter.collect.kubelet import KubeletReading
from reporter.schema.labels import kubelet_labels


@dataclass(frozen=True, slots=True)
class KubeletSource:
    """The kubelet's Topology Manager and CPU Manager policies as a node source. A simulated
    machine has no kubelet: under `--simulate` it reads the file `--kubelet-config` names, as
    on a host (a test points it at one of tests/fixtures/kubelet/)."""

    read_config: Callable[[], KubeletReading]
    """The config file's reader: `read_kubelet` at `--kubelet-config`, or a test's double."""

    name = "kubelet_config"
    interval_s = None
    lacking = "Topology Manager policy unknown"

    def read(self) -> NodeReading[KubeletPolicies]:
        reading = self.read_config()
        if reading.policies is not None:
            return NodeReading(reading.policies)
        if reading.problem is None:
            return NodeReading(None, SourceState.NO_DATA)
        state = SourceState.NO_DATA if reading.absent else SourceState.FAILED
        return NodeReading(None, state, reading.problem)

    def labels(self, value: KubeletPolicies, prefix: str) -> dict[str, str]:
        return kubelet_labels(value, prefix)
