"""The availability annotations and their two labels on the agent's Node, written only on change.

The keys (`<prefix>/availability`, `<prefix>/allocation`, `<prefix>/gpu-sets`, `<prefix>/gpu-free`,
`<prefix>/gpu-free-nvlink-max`) are this sink's alone. They are not listed in the Node sink's
`owned` annotation, so the Node sink neither writes nor deletes them; this sink removes them when
availability is off. Because no other writer sets them, a patch carries no resourceVersion: a
precondition would turn every kubelet status update between our read and our write into a 409 for
nothing.

One request per attempt and no retry here: the live loop calls again at its next interval, which
is sooner than a retry schedule would be useful.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from reporter.errors import PublishError
from reporter.placement_quality import HeldSet, encode_held_sets
from reporter.publish.api import NODES, ApiClient
from reporter.publish.patch import (
    Desired,
    NodeMetadata,
    metadata_patch,
    node_metadata,
    section_changes,
)
from reporter.publish.sink import read_node
from reporter.schema import keys
from reporter.schema.availability import (
    DEVICE_PLUGIN_ONLY,
    Allocation,
    Availability,
    availability_labels,
    encode_allocation,
    encode_availability,
)


def availability_keys(prefix: str) -> tuple[frozenset[str], frozenset[str]]:
    """(label keys, annotation keys) this sink owns under `prefix`."""
    labels = frozenset(keys.key(prefix, n) for n in (keys.GPU_FREE, keys.GPU_FREE_NVLINK_MAX))
    annotations = frozenset(
        keys.key(prefix, n) for n in (keys.AVAILABILITY, keys.ALLOCATION, keys.GPU_SETS)
    )
    return labels, annotations


def desired(
    availability: Availability | None,
    prefix: str,
    allocation: Allocation | None = None,
    held_sets: tuple[HeldSet, ...] = (),
) -> Desired:
    """What the Node should carry of our keys; nothing when availability is off (None). The
    `gpu-sets` annotation only where some container holds two or more GPUs."""
    if availability is None:
        return Desired({}, {})
    annotations = {keys.key(prefix, keys.AVAILABILITY): encode_availability(availability)}
    if allocation is not None and allocation != DEVICE_PLUGIN_ONLY:
        annotations[keys.key(prefix, keys.ALLOCATION)] = encode_allocation(allocation)
    if held_sets:
        annotations[keys.key(prefix, keys.GPU_SETS)] = encode_held_sets(held_sets)
    return Desired(availability_labels(availability, prefix), annotations)


def carried(labels: Mapping[str, str], annotations: Mapping[str, str], prefix: str) -> Desired:
    """Our keys among a Node's labels and annotations."""
    label_keys, annotation_keys = availability_keys(prefix)
    return Desired(
        {k: v for k, v in labels.items() if k in label_keys},
        {k: v for k, v in annotations.items() if k in annotation_keys},
    )


def patch_body(current: Desired, want: Desired) -> dict[str, Any] | None:
    """The JSON merge patch from `current` to `want` (both of our keys only); None when equal."""
    return metadata_patch(
        section_changes(current.labels, want.labels, current.labels),
        section_changes(current.annotations, want.annotations, current.annotations),
    )


class AvailabilitySink:
    """Keeps our availability keys on the Node equal to what it is told, with as few requests as
    it can: it remembers what the Node carried after its last read or write, sends nothing when
    that already matches, and reads again only after `forget()` (resync) or a failure."""

    def __init__(
        self,
        api: ApiClient,
        *,
        node: str,
        prefix: str,
        log: structlog.typing.FilteringBoundLogger,
        on_written: Callable[[NodeMetadata], None] = lambda node: None,
    ) -> None:
        """`on_written` hears of the Node each patch returns (NodePatchSink.observe)."""
        self._api = api
        self._on_written = on_written
        self._node = node
        self._prefix = prefix
        self._log = log
        self._known: Desired | None = None

    def seed(self, published: Desired) -> None:
        """What the Node carries under the prefix, as another read of it just saw."""
        self._known = carried(published.labels, published.annotations, self._prefix)

    def forget(self) -> None:
        """The next publish reads the Node again (resync: repairs keys edited or deleted)."""
        self._known = None

    def publish(
        self,
        availability: Availability | None,
        allocation: Allocation | None = None,
        held_sets: tuple[HeldSet, ...] = (),
    ) -> bool:
        """Make the Node carry `availability`, how it was counted and the sets containers hold
        (None: none of our keys); True when it wrote.

        Raises PublishError; what the Node carries is then unknown and read again next time.
        """
        try:
            if self._known is None:
                node = read_node(self._api, self._node)
                self._known = carried(node.labels, node.annotations, self._prefix)
            want = desired(availability, self._prefix, allocation, held_sets)
            body = patch_body(self._known, want)
            if body is None:
                return False
            node = node_metadata(self._api.merge_patch(NODES, self._node, body))
        except PublishError:
            self._known = None
            raise
        self._known = carried(node.labels, node.annotations, self._prefix)
        self._on_written(node)
        self._log.info(
            "availability_patched",
            free=want.labels.get(keys.key(self._prefix, keys.GPU_FREE)),
            removed=availability is None,
        )
        return True
