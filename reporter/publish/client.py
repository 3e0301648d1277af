"""Events about the Node: where they go, their types, and the core/v1 Event both sinks post.

An Event is `api.create(EVENTS, event_body(...), NODE_EVENT_NAMESPACE)` through whichever
`reporter.publish.api.ApiClient` the agent runs with.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from reporter.publish.patch import NodeMetadata

COMPONENT = "topo-reporter"
NODE_EVENT_NAMESPACE = "default"
"""Where every Event about the Node goes, whatever the agent's own namespace. The API server takes
a core/v1 Event about a cluster-scoped object (an involvedObject without a namespace) only in
`default` (or no namespace): it refuses one in the agent's namespace as invalid (422). The kubelet
and the node controller post theirs there too, and `kubectl describe node` finds them. The chart
grants `create` on events in this namespace only, with a Role."""

DEGRADED_REASON = "GPUTopologyDegraded"
"""The Event reason the agent uses when a source fails; the doctor looks for it."""
FINDING_REASONS = {
    "gpu-lost": "GPULost",
    "nvlink-degraded": "NVLinkDegraded",
    "numa-unknown": "GPUNUMAUnknown",
    "numa-alignment-limit": "TopologyManagerLimit",
    "kubelet-policy-unknown": "KubeletPolicyUnknown",
    "roce-port-silent": "RoCEPortSilent",
}
"""Event reasons of the node-local findings the agent reports itself, by finding code
(reporter.doctor.node.local_findings)."""


class EventType(enum.Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


def event_body(
    node: NodeMetadata, event_type: EventType, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Event about `node`, as the official client serializes its CoreV1Event."""
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "name": node.name}
    if node.uid is not None:
        involved["uid"] = node.uid
    return {
        "count": 1,
        "firstTimestamp": now.isoformat(),
        "involvedObject": involved,
        "lastTimestamp": now.isoformat(),
        "message": message,
        "metadata": {"generateName": f"{node.name}."},
        "reason": reason,
        "reportingComponent": COMPONENT,
        "reportingInstance": node.name,
        "source": {"component": COMPONENT, "host": node.name},
        "type": event_type.value,
    }
