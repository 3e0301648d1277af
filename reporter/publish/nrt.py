"""The NodeResourceTopology sink: the agent as the sole producer of its node's object.

It writes the object `reporter.schema.nrt` builds, only when its content (zones, attributes, our
labels, the owner reference) differs from what the API holds: one read when unknown, then a create
or a replace carrying the resourceVersion it read; a 409 forgets and reads again. It never
touches an object another producer manages (NFD's topology-updater, resource-topology-exporter:
anything without our `app.kubernetes.io/managed-by` label): NodeResourceTopology lists are atomic,
so writing over one would silently take it from its owner. That refusal is permanent and says
which producer to turn off. An object of ours that lacks this install's `<prefix>/node` label (an
earlier version wrote it, or an agent under another prefix) is written again with it, so prune
under an old prefix never takes it (`reporter.publish.prune`).

It writes through `reporter.publish.api.ApiClient`, as every sink does. `NrtOutput` is the
agent's live output: it builds the object from each allocation view, and withdraws it when the
live loop says nobody can vouch for the availability any more (`reporter.schema.nrt.withdrawn`:
our object replaced by one the plugin does not filter on, never deleted, for the reason given
there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from parsers.kubelet import KubeletPolicies
from reporter.errors import ApiPermanentError, ApiTransientError, InputError, PublishError
from reporter.publish import retry
from reporter.publish.api import NODE_RESOURCE_TOPOLOGIES, ApiClient
from reporter.schema import nrt
from reporter.schema.model import Topology
from reporter.telling import Told

if TYPE_CHECKING:
    # Types only: importing the reader loads grpc, which an agent without availability never needs.
    from reporter.collect.podresources import AllocationView

RBAC_VERBS = ("get", "create", "update")
"""Exactly the verbs the sink uses on noderesourcetopologies."""


class ForeignProducerError(ApiPermanentError):
    """The object exists and another producer manages it."""


def _content(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What we own of the object: compared to decide whether to write."""
    return (
        obj.get("zones"),
        obj.get("attributes"),
        nrt.ownership(obj),
        (obj.get("metadata") or {}).get("ownerReferences"),
    )


def _producer(obj: Mapping[str, Any]) -> str:
    """Who manages a foreign object, as far as it says."""
    meta = obj.get("metadata") or {}
    managed_by = (meta.get("labels") or {}).get(nrt.MANAGED_BY)
    managers = sorted(
        {str(m.get("manager")) for m in meta.get("managedFields") or () if isinstance(m, dict)}
    )
    if managed_by:
        return f"{nrt.MANAGED_BY}={managed_by}"
    if managers:
        return f"field manager {', '.join(managers)}"
    return f"a producer without the {nrt.MANAGED_BY}={nrt.MANAGER} label"


class NrtSink:
    """Keeps the node's NodeResourceTopology equal to the desired one, if it is ours."""

    def __init__(
        self,
        api: ApiClient,
        *,
        stop: threading.Event,
        backoff: retry.Backoff,
        log: structlog.typing.FilteringBoundLogger,
        on_error: retry.OnError = lambda e: None,
    ) -> None:
        self._api = api
        self._log = log
        self._retry = retry.Retrying(stop, backoff, log, on_error)
        self._known: dict[str, Any] | None = None

    def forget(self) -> None:
        """Read the object again before the next write (resync, or after a conflict)."""
        self._known = None

    def publish(self, want: Mapping[str, Any]) -> bool:
        """Make the object equal `want`; True when written. Raises ForeignProducerError when
        another producer manages it, PublishError when the API refuses or cannot be reached."""
        if self._known is not None and _content(self._known) == _content(want):
            return False
        name = str(want["metadata"]["name"])

        def attempt() -> bool:
            try:
                return self._write(name, want)
            except ApiTransientError:
                self._known = None  # a 409 or a vanished object: read again
                raise

        return self._retry(attempt, what=f"write NodeResourceTopology {name}")

    def withdraw(self, name: str, prefix: str) -> bool:
        """Make our object `name` one the scheduler does not filter on (nrt.withdrawn), as the
        agent under `prefix`; True when written. No object: nothing to withdraw. Raises
        ForeignProducerError when another producer manages it, PublishError when the API refuses
        or cannot be reached."""
        if self._known is not None and _content(self._known) == _content(
            nrt.withdrawn(self._known, prefix)
        ):
            return False

        def attempt() -> bool:
            try:
                current = self._read(name)
                if current is None:
                    return False
                return self._replace(name, current, nrt.withdrawn(current, prefix), "nrt_withdrawn")
            except ApiTransientError:
                self._known = None
                raise

        return self._retry(attempt, what=f"withdraw NodeResourceTopology {name}")

    def _read(self, name: str) -> dict[str, Any] | None:
        """Our object as last known or read; None when there is none. Raises
        ForeignProducerError when another producer manages it."""
        current = self._known
        if current is None:
            current = self._api.get(NODE_RESOURCE_TOPOLOGIES, name)
        if current is None:
            return None
        labels = (current.get("metadata") or {}).get("labels") or {}
        if labels.get(nrt.MANAGED_BY) != nrt.MANAGER:
            raise ForeignProducerError(
                f"NodeResourceTopology {name} is managed by {_producer(current)} (NFD's "
                "topology-updater or resource-topology-exporter): topo-reporter will not write "
                "over it; turn that producer off on this node, or turn --nrt off"
            )
        return current

    def _write(self, name: str, want: Mapping[str, Any]) -> bool:
        current = self._read(name)
        if current is None:
            self._known = self._api.create(NODE_RESOURCE_TOPOLOGIES, want)
            self._log.info("nrt_created", name=name)
            return True
        return self._replace(name, current, want, "nrt_replaced")

    def _replace(
        self, name: str, current: dict[str, Any], want: Mapping[str, Any], event: str
    ) -> bool:
        """Replace `current` (ours) by `want` if their content differs; True when written."""
        if _content(current) == _content(want):
            self._known = current
            return False
        body = dict(want)
        body["metadata"] = {
            **dict(want["metadata"]),
            "resourceVersion": (current.get("metadata") or {}).get("resourceVersion"),
        }
        self._known = self._api.replace(NODE_RESOURCE_TOPOLOGIES, name, body)
        self._log.info(event, name=name)
        return True


class NrtOutput:
    """The agent's NodeResourceTopology, a live output: called with the topology and the kubelet's
    allocation view after each availability read, it publishes the node's object through the
    sink, which writes only on change.

    `withdraw()`, called by the loop at each tick while the reads it needs keep failing, turns
    the object into one the scheduler does not filter on, once; the next good read publishes it
    again.

    Each call ends in one `on_result`: `written`, `withdrawn`, `unchanged`, `failed` (the API,
    after the sink's retries) or `refused` (a permanent refusal, another producer's object, or an
    object that cannot be built: no NUMA node, a NUMA node without memory, a Topology Manager
    policy neither the kubelet config nor the user says: `policies` raises InputError then).
    A failure is logged once per distinct error, never raised; only `retry.Interrupted` passes
    through, the loop's own shutdown request. A permanent refusal is not asked again until the
    object it was refused changes or `resync_s` passes, when the sink also reads the object
    again to repair drift (ours edited or deleted by hand).
    """

    def __init__(
        self,
        sink: NrtSink,
        *,
        node: str,
        prefix: str,
        memory: Callable[[], Mapping[int, int]],
        policies: Callable[[], KubeletPolicies],
        log: structlog.typing.FilteringBoundLogger,
        resource: str = nrt.GPU_RESOURCE,
        resync_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        on_result: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._sink = sink
        self._node = node
        self._prefix = prefix
        self._memory = memory
        self._policies = policies
        self._log = log
        self._resource = resource
        self._resync_s = resync_s
        self._clock = clock
        self._on_result = on_result
        self._last_read = clock()
        self._refused: Mapping[str, Any] | None = None
        self._error: Told[str | None] = Told(None)
        self._withdrawn = False
        """Withdrawn (or nothing to withdraw, or refused): nothing to do until a good read."""

    def __call__(self, topology: Topology, view: AllocationView) -> None:
        self._withdrawn = False
        state = nrt.NodeState(
            pods=view.pods, free_gpus=frozenset(view.free), exclusive_cpus=view.exclusive_cpus
        )
        try:
            want = nrt.node_resource_topology(
                self._node,
                topology,
                state,
                self._memory(),
                policies=self._policies(),
                prefix=self._prefix,
                resource=self._resource,
            )
        except InputError as e:
            self._failed("refused", str(e))
            return
        self._resync()
        if want == self._refused:
            self._on_result("refused")
            return
        try:
            wrote = self._sink.publish(want)
        except ApiPermanentError as e:
            self._refused = want
            self._failed("refused", str(e))
            return
        except PublishError as e:
            self._failed("failed", str(e))
            return
        self._refused = None
        self._recovered()
        self._on_result("written" if wrote else "unchanged")

    def withdraw(self) -> None:
        """Nobody can vouch for the last allocation view: withdraw the object (see the class)."""
        self._resync()
        if self._withdrawn:
            self._on_result("unchanged")
            return
        try:
            wrote = self._sink.withdraw(self._node, self._prefix)
        except ApiPermanentError as e:
            # Not ours, or refused for good: asked again at the next resync.
            self._withdrawn = True
            self._failed("refused", str(e))
            return
        except PublishError as e:
            self._failed("failed", str(e))
            return
        self._withdrawn = True
        self._recovered()
        self._on_result("withdrawn" if wrote else "unchanged")

    def _resync(self) -> None:
        """Every `resync_s`: read the object again (repairs drift), ask again what was refused."""
        if self._clock() - self._last_read >= self._resync_s:
            self._sink.forget()
            self._last_read = self._clock()
            self._refused = None
            self._withdrawn = False

    def _failed(self, result: str, error: str) -> None:
        if self._error.changed(error):
            # The output is called every availability interval: said once per distinct error.
            self._log.error("nrt_publish_failed", result=result, error=error)
        self._on_result(result)

    def _recovered(self) -> None:
        previous = self._error.last
        if self._error.changed(None):
            self._log.info("nrt_recovered", previous=previous)
