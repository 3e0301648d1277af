"""What the doctor works with: a finding, what was observed of the agent and of DRA, and how a
Node object (a dict, as the API serves it) is read.

Pure: values and constants only. It reads nothing, and knows no check: the checks live in
reporter.doctor.node (one node), reporter.doctor.racks (across nodes),
reporter.doctor.groups (pod groups) and reporter.doctor.templates (dra-template's templates).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reporter.schema import keys

GPU_RESOURCE = keys.GPU_RESOURCE
GFD_CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""GPU Feature Discovery's partition label, `<clusterUUID>.<cliqueId>`: ours must say the same."""
FABRIC_CHECK = (
    "`nvidia-smi -q | grep -A12 Fabric` on the node (State, Status, ClusterUUID, CliqueId, Health)"
)
"""Where an operator sees the fabric as the driver does: the fabric findings' fixes quote it."""


class Code(enum.StrEnum):
    """Every finding's code, the word an operator greps for and docs/doctor.md lists; a
    finding carries one of these and nothing else."""

    # One node (reporter.doctor.node, reporter.doctor.reader)
    KUBELET_POLICY_UNKNOWN = "kubelet-policy-unknown"
    GPU_LOST = "gpu-lost"
    NVLINK_DEGRADED = "nvlink-degraded"
    NUMA_UNKNOWN = "numa-unknown"
    NUMA_ALIGNMENT_LIMIT = "numa-alignment-limit"
    DEVICE_PLUGIN_MISSING = "device-plugin-missing"
    GPUS_UNALLOCATABLE = "gpus-unallocatable"
    AGENT_DEGRADED = "agent-degraded"
    DRA_NOT_COUNTED = "dra-not-counted"
    DRA_SLICES_MISSING = "dra-slices-missing"
    DRA_CLAIMS_ON_LOST_GPUS = "dra-claims-on-lost-gpus"
    NO_TOPOLOGY_DATA = "no-topology-data"
    AGENT_NOT_READY = "agent-not-ready"
    FABRIC_NOT_READY = "fabric-not-ready"
    FABRIC_GPUS_DISAGREE = "fabric-gpus-disagree"
    FABRIC_DEGRADED = "fabric-degraded"
    FABRIC_VALUES_INVALID = "fabric-values-invalid"
    ROCE_PORT_SILENT = "roce-port-silent"
    TOPOLOGY_UNREADABLE = "topology-unreadable"
    # Across nodes and racks (reporter.doctor.racks)
    PARTITION_LABEL_MISMATCH = "partition-label-mismatch"
    PARTITION_SHORT = "partition-short"
    CLIQUE_ID_SHARED = "clique-id-shared"
    # Network tiers across nodes (reporter.doctor.network)
    TOPOGRAPH_TIERS_DISAGREE = "topograph-tiers-disagree"
    NVLINK_DOMAIN_SPANS_NETWORK_GROUPS = "nvlink-domain-spans-network-groups"
    # Pod groups (reporter.doctor.groups)
    POD_GROUP_EXCEEDS_PARTITIONS = "pod-group-exceeds-partitions"
    POD_GROUP_EXCEEDS_NETWORK_GROUPS = "pod-group-exceeds-network-groups"
    # dra-template's templates (reporter.doctor.templates)
    DRA_TEMPLATE_GATE_OFF = "dra-template-gate-off"
    DRA_TEMPLATE_MISROUTED_NODES = "dra-template-misrouted-nodes"
    DRA_TEMPLATE_UNCOVERED_NODES = "dra-template-uncovered-nodes"


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong on a node: what, the evidence that shows it, and what to do."""

    code: Code
    severity: Severity
    summary: str
    evidence: tuple[str, ...]
    fix: str


@dataclass(frozen=True, slots=True)
class AgentObservation:
    """What the operator's view of the cluster says about the agent on one node; None is unknown."""

    pod_found: bool | None = None
    pod_ready: bool | None = None
    degraded_reason: str | None = None
    """The message of the agent's latest `TopologyDegraded` Warning Event, if any."""
    silent_ports: tuple[str, str] | None = None
    """When and what the agent's latest `RoCEPortSilent` Warning Event said (its
    lastTimestamp, its message), if any: only the agent hears LLDP, so the doctor takes its
    word."""


@dataclass(frozen=True, slots=True)
class DraObservation:
    """What the cluster's DRA objects say of one node's GPUs; None where they cannot be read
    (a cluster before 1.32 serves none; an operator may not be allowed to list them)."""

    slices: int | None = None
    """ResourceSlices of NVIDIA's GPU driver (`gpu.nvidia.com`) for the node."""
    claims: tuple[tuple[str, str], ...] | None = None
    """(`namespace/name`, device) of each device of that driver in the node's pool that an
    allocated ResourceClaim holds."""


def field(obj: Any, name: str) -> Mapping[str, Any]:
    """`obj[name]` where both are objects, else empty: an object of any shape reads safely."""
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    """The Node object's labels; empty where it has none."""
    return dict((node.get("metadata") or {}).get("labels") or {})


def node_annotations(node: Mapping[str, Any]) -> dict[str, str]:
    """The Node object's annotations; empty where it has none."""
    return dict((node.get("metadata") or {}).get("annotations") or {})
