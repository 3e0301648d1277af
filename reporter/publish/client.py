"""The seam between the publisher and the Kubernetes API: a small Protocol we own.

`reporter.publish.kube.KubeNodeClient` implements it over the real client; tests use the real
implementation against an API server double, or a fake. Implementations raise only
`reporter.errors.PublishError` subclasses, never a library exception.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol

from reporter.publish.patch import NodeMetadata

NODE_EVENT_NAMESPACE = "default"
"""Where every Event about the Node goes, whatever the agent's own namespace. The API server takes
a core/v1 Event about a cluster-scoped object (an involvedObject without a namespace) only in
`default` (or no namespace): it refuses one in the agent's namespace as invalid (422). The kubelet
and the node controller post theirs there too, and `kubectl describe node` finds them. The chart
grants `create` on events in this namespace only, with a Role."""


class EventType(enum.Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class NodeClient(Protocol):
    """Read and patch one Node's metadata, and post Events about it."""

    def get_node(self, name: str) -> NodeMetadata:
        """Read the Node. Raises ApiTransientError or ApiPermanentError."""
        ...

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeMetadata:
        """Send a JSON merge patch; returns the Node as patched. Raises like get_node."""
        ...

    def create_event(
        self,
        namespace: str,
        node: NodeMetadata,
        event_type: EventType,
        reason: str,
        message: str,
    ) -> None:
        """Post a core/v1 Event whose involvedObject is the Node, in `namespace` (the sinks pass
        NODE_EVENT_NAMESPACE). Raises like get_node."""
        ...
