"""The NodeResourceTopology sink: the agent as the sole producer of its node's object.

It writes the object `reporter.schema.nrt` builds, only when its content (zones, attributes, our
label, the owner reference) differs from what the API holds: one read when unknown, then a create
or a replace carrying the resourceVersion it read; a 409 forgets and reads again. It never
touches an object another producer manages (NFD's topology-updater, resource-topology-exporter:
anything without our `app.kubernetes.io/managed-by` label): NodeResourceTopology lists are atomic,
so writing over one would silently take it from its owner. That refusal is permanent and says
which producer to turn off.

The client seam (`NrtClient`) is small and ours; `RestNrtClient` is the lean client's.
`NrtOutput` is the agent's live output: it builds the object from each allocation view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import structlog
import urllib3

from parsers.kubelet import KubeletPolicies
from reporter.errors import ApiPermanentError, ApiTransientError, InputError, PublishError
from reporter.publish import errors_map, retry
from reporter.publish.rest import RestConfig, RestTransport
from reporter.schema import nrt
from reporter.schema.model import Topology

if TYPE_CHECKING:
    # Types only: importing the reader loads grpc, which an agent without availability never needs.
    from reporter.collect.podresources import AllocationView

RBAC_VERBS = ("get", "create", "update")
"""Exactly the verbs the sink uses on noderesourcetopologies."""
_RESOURCE = f"{nrt.PLURAL}.{nrt.GROUP}"
_PATH = f"/apis/{nrt.GROUP}/{nrt.VERSION}/{nrt.PLURAL}"


class ForeignProducerError(ApiPermanentError):
    """The object exists and another producer manages it."""


class NrtClient(Protocol):
    """Read and write cluster-scoped NodeResourceTopology objects. Raises PublishError only."""

    def get(self, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        ...

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object; returns it as stored."""
        ...

    def replace(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace it (body carries the resourceVersion read); returns it as stored."""
        ...


def nrt_error(
    status: int,
    reason: str,
    body: str | bytes | None,
    headers: Mapping[str, str] | None,
    action: str,
    name: str,
) -> PublishError:
    """The error for an answer `status` to `action` ("read", "create", "replace") on the object."""
    what = f"{action} NodeResourceTopology {name}"
    if status == 0:
        return ApiPermanentError(
            f"{what}: TLS with the API server failed ({str(reason).splitlines()[0]}): check the "
            "cluster CA in the kubeconfig or service account"
        )
    detail = errors_map.status_message(body)
    said = f": {detail}" if detail else ""
    details = errors_map.status_details(body)
    if status == 404 and details.get("name") == name:
        # Only a replace gets here: deleted since it was read; reading again leads to a create.
        return ApiTransientError(f"{what}: deleted since it was read (404)", status=404)
    if status in errors_map.TRANSIENT_STATUS:
        text = (
            f"{what}: conflict (409), it changed or appeared since it was read"
            if status == 409
            else f"{what}: the API server answered {status}{said}"
        )
        return ApiTransientError(text, status=status, retry_after=errors_map.retry_after(headers))
    if status == 401:
        text = (
            f"{what}: the API server rejected the credentials (401): check the service account "
            "token (automountServiceAccountToken) or the kubeconfig user"
        )
    elif status == 403:
        verb = {"read": "get", "create": "create", "replace": "update"}.get(action, action)
        text = f"{what}: forbidden (403): grant the agent `{verb}` on `{_RESOURCE}`{said}"
    elif status == 404:
        text = (
            f"{what}: the API server does not serve {_RESOURCE}/{nrt.VERSION} (404): install "
            "the NodeResourceTopology CRD (scheduler-plugins' "
            "manifests/noderesourcetopology/crd.yaml) or turn --nrt off"
        )
    elif status == 422:
        text = f"{what}: the API server refused the object (422){said}"
    else:
        text = f"{what}: the API server answered {status}{said}"
    return ApiPermanentError(text, status=status)


def _status_error(action: str, name: str) -> Callable[[urllib3.BaseHTTPResponse], PublishError]:
    def mapped(response: urllib3.BaseHTTPResponse) -> PublishError:
        return nrt_error(
            response.status, response.reason or "", response.data, response.headers, action, name
        )

    return mapped


class RestNrtClient:
    """NrtClient over the lean client's transport."""

    def __init__(self, config: RestConfig) -> None:
        """Raises ConfigError when the TLS files cannot be loaded."""
        self._http = RestTransport(config)

    def _call(
        self, method: str, action: str, name: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        path = _PATH if method == "POST" else f"{_PATH}/{quote(name, safe='')}"
        data = self._http.request(
            method,
            path,
            body,
            what=f"{action} NodeResourceTopology {name}",
            on_status=_status_error(action, name),
        )
        if not isinstance(data, dict):
            raise ApiPermanentError(f"{action} NodeResourceTopology {name}: not an object")
        return data

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", "read", name)
        except ApiTransientError as e:
            if e.status == 404:
                return None
            raise

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "create", str(body["metadata"]["name"]), body)

    def replace(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("PUT", "replace", name, body)


def _content(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What we own of the object: compared to decide whether to write."""
    meta = obj.get("metadata") or {}
    return (
        obj.get("zones"),
        obj.get("attributes"),
        (meta.get("labels") or {}).get(nrt.MANAGED_BY),
        meta.get("ownerReferences"),
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
        client: NrtClient,
        *,
        stop: threading.Event,
        backoff: retry.Backoff,
        log: structlog.typing.FilteringBoundLogger,
        on_error: Callable[[PublishError], None] = lambda e: None,
    ) -> None:
        self._client = client
        self._stop = stop
        self._backoff = backoff
        self._log = log
        self._on_error = on_error
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

        return retry.call(
            attempt,
            what=f"write NodeResourceTopology {name}",
            stop=self._stop,
            backoff=self._backoff,
            log=self._log,
            on_error=self._on_error,
        )

    def _write(self, name: str, want: Mapping[str, Any]) -> bool:
        current = self._known if self._known is not None else self._client.get(name)
        if current is None:
            self._known = self._client.create(want)
            self._log.info("nrt_created", name=name)
            return True
        labels = (current.get("metadata") or {}).get("labels") or {}
        if labels.get(nrt.MANAGED_BY) != nrt.MANAGER:
            raise ForeignProducerError(
                f"NodeResourceTopology {name} is managed by {_producer(current)} (NFD's "
                "topology-updater or resource-topology-exporter): topo-reporter will not write "
                "over it; turn that producer off on this node, or turn --nrt off"
            )
        if _content(current) == _content(want):
            self._known = current
            return False
        body = dict(want)
        body["metadata"] = {
            **dict(want["metadata"]),
            "resourceVersion": (current.get("metadata") or {}).get("resourceVersion"),
        }
        self._known = self._client.replace(name, body)
        self._log.info("nrt_replaced", name=name)
        return True


class NrtOutput:
    """The agent's NodeResourceTopology, a live output: called with the topology and the kubelet's
    allocation view after each availability read, it publishes the node's object through the
    sink, which writes only on change.

    Each call ends in one `on_result`: `written`, `unchanged`, `failed` (the API, after the sink's
    retries) or `refused` (a permanent refusal, another producer's object, or an object that
    cannot be built: no NUMA node, a NUMA node without memory, an unreadable kubelet config).
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
        memory: Callable[[], Mapping[int, int]],
        policies: Callable[[], KubeletPolicies | None],
        log: structlog.typing.FilteringBoundLogger,
        resource: str = nrt.GPU_RESOURCE,
        resync_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        on_result: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._sink = sink
        self._node = node
        self._memory = memory
        self._policies = policies
        self._log = log
        self._resource = resource
        self._resync_s = resync_s
        self._clock = clock
        self._on_result = on_result
        self._last_read = clock()
        self._refused: Mapping[str, Any] | None = None
        self._error: str | None = None

    def __call__(self, topology: Topology, view: AllocationView) -> None:
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
                resource=self._resource,
            )
        except InputError as e:
            self._failed("refused", str(e))
            return
        if self._clock() - self._last_read >= self._resync_s:
            self._sink.forget()
            self._last_read = self._clock()
            self._refused = None
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
        if self._error is not None:
            self._log.info("nrt_recovered", previous=self._error)
            self._error = None
        self._on_result("written" if wrote else "unchanged")

    def _failed(self, result: str, error: str) -> None:
        if error != self._error:
            # Once per distinct error: the output is called every availability interval.
            self._log.error("nrt_publish_failed", result=result, error=error)
        self._error = error
        self._on_result(result)
