"""The one module that imports `kubernetes`: NodeClient over the real client, errors mapped once.

Configuration: a kubeconfig when one is named (`--kubeconfig`, `KUBECONFIG`), in-cluster config
when running in a pod, else `~/.kube/config`. The client's own urllib3 retries are switched off:
`reporter.publish.retry` owns retrying, so the backoff is one policy in one place. Every library
exception becomes a `PublishError` here, with a message saying what to fix. It must never log or
put into a message a token or kubeconfig content.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from reporter.errors import ApiPermanentError, ApiTransientError, ConfigError, PublishError
from reporter.publish import nodefeature
from reporter.publish.client import EventType
from reporter.publish.patch import NodeMetadata

MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "topo-reporter"
_TRANSIENT_STATUS = frozenset({409, 429, 500, 502, 503, 504})
AGENT_POD_SELECTOR = "app.kubernetes.io/name=topo-reporter"
"""The label the chart puts on the agent's pods (charts/topo-reporter/templates/_helpers.tpl)."""


def load_configuration(kubeconfig: str | None) -> client.Configuration:
    """Client configuration: the named kubeconfig, else in-cluster, else ~/.kube/config.

    Raises ConfigError naming the kubeconfig path (never its content).
    """
    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # the client ships no annotations for its config loaders
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]  # as above
                config_file=kubeconfig, client_configuration=configuration
            )
    except (ConfigException, OSError) as e:
        where = kubeconfig or "in-cluster service account or ~/.kube/config"
        raise ConfigError(
            f"cannot load Kubernetes credentials from {where} ({type(e).__name__}): pass "
            "--kubeconfig or set KUBECONFIG to a readable kubeconfig, or run in a pod"
        ) from e
    # Retries are reraised to our tenacity policy; urllib3's own would multiply them.
    configuration.retries = False
    return configuration


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("Retry-After")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _status_message(body: str | None) -> str:
    """The apiserver's Status message, or its causes; the raw body is not echoed (size, noise)."""
    try:
        status = json.loads(body or "")
    except ValueError:
        return ""
    if not isinstance(status, dict):
        return ""
    causes = (status.get("details") or {}).get("causes") or []
    parts = [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes if isinstance(c, dict)]
    return "; ".join(parts) or str(status.get("message", ""))


def _map_api_exception(e: ApiException, action: str, node: str) -> PublishError:
    status = int(e.status or 0)
    if status == 0:
        # The client reports a TLS failure as an ApiException without a status.
        first = str(e.reason).splitlines()[0]
        return ApiPermanentError(
            f"{action} node {node}: TLS with the API server failed ({first}): check the "
            "cluster CA in the kubeconfig or service account"
        )
    detail = _status_message(e.body)
    said = f": {detail}" if detail else ""
    if status in _TRANSIENT_STATUS:
        if status == 409:
            text = f"{action} node {node}: conflict (409), the node changed since it was read"
        else:
            text = f"{action} node {node}: the API server answered {status}{said}"
        return ApiTransientError(text, status=status, retry_after=_retry_after(e.headers))
    if status == 401:
        text = (
            f"{action} node {node}: the API server rejected the credentials (401): check the "
            "service account token (automountServiceAccountToken) or the kubeconfig user"
        )
    elif status == 403:
        verb = {"read": "get", "patch": "patch", "post event on": "create"}.get(action, action)
        resource = "events" if action == "post event on" else "nodes"
        text = (
            f"{action} node {node}: forbidden (403): grant the agent's ClusterRole `{verb}` on "
            f"`{resource}`{said}"
        )
    elif status == 404:
        text = (
            f"{action} node {node}: not found (404): check --node / TOPO_REPORTER_NODE / "
            "NODE_NAME (the downward API's spec.nodeName)"
        )
    elif status == 422:
        text = (
            f"{action} node {node}: the API server refused the metadata (422){said}: check the "
            "label values (63 characters, [A-Za-z0-9._-]), the --prefix and the node's total "
            "annotation size (256 KiB)"
        )
    else:
        text = f"{action} node {node}: the API server answered {status}{said}"
    return ApiPermanentError(text, status=status)


def _map_transport(
    e: Exception, action: str, node: str, host: str, *, subject: str | None = None
) -> PublishError:
    reason = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) else e
    what = f"{action} {subject or f'node {node}'}"
    if isinstance(reason, urllib3.exceptions.SSLError | ssl.SSLError):
        return ApiPermanentError(
            f"{what}: TLS with the API server at {host} failed ({reason}): check "
            "the cluster CA in the kubeconfig or service account"
        )
    # NewConnectionError subclasses ConnectTimeoutError in urllib3 2: test it first.
    if isinstance(reason, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
        return ApiTransientError(f"{what}: cannot connect to the API server at {host}")
    if isinstance(reason, urllib3.exceptions.TimeoutError | TimeoutError):
        return ApiTransientError(f"{what}: the API server at {host} timed out")
    return ApiTransientError(
        f"{what}: cannot reach the API server at {host} ({type(reason).__name__})"
    )


def _metadata(raw: Any) -> NodeMetadata:
    data = json.loads(raw)
    meta = data.get("metadata") or {}
    return NodeMetadata(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        resource_version=meta.get("resourceVersion"),
        uid=meta.get("uid"),
    )


class KubeNodeClient:
    """NodeClient over the official client. Every call has a (connect, read) timeout."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
    ) -> None:
        self._api = client.CoreV1Api(client.ApiClient(configuration))
        self._host = str(configuration.host)
        self._timeout = request_timeout_s

    def _call(self, action: str, node: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as e:
            raise _map_api_exception(e, action, node) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _map_transport(e, action, node, self._host) from e

    def get_node(self, name: str) -> NodeMetadata:
        response = self._call("read", name, self._api.read_node, name, _preload_content=False)
        return _metadata(response.data)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> NodeMetadata:
        response = self._call(
            "patch",
            name,
            self._api.patch_node,
            name,
            dict(patch),
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
        return _metadata(response.data)

    def create_event(
        self,
        namespace: str,
        node: NodeMetadata,
        event_type: EventType,
        reason: str,
        message: str,
    ) -> None:
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{node.name}."),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Node", name=node.name, uid=node.uid
            ),
            reason=reason,
            message=message,
            type=event_type.value,
            source=client.V1EventSource(component=COMPONENT, host=node.name),
            reporting_component=COMPONENT,
            reporting_instance=node.name,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._call(
            "post event on",
            node.name,
            self._api.create_namespaced_event,
            namespace,
            event,
            _preload_content=False,
        )


class KubeClusterReader(KubeNodeClient):
    """The doctor's reads (reporter.doctor.ClusterReader) over the official client.

    Returns the API's own JSON as dicts. Pods and Events are optional reads: where the operator's
    credentials may not list them, the answer is None (unknown), not an error.
    """

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        agent_selector: str = AGENT_POD_SELECTOR,
        request_timeout_s: tuple[float, float] = (5.0, 30.0),
    ) -> None:
        super().__init__(configuration, request_timeout_s=request_timeout_s)
        self._agent_selector = agent_selector

    def _read(self, what: str, resource: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = fn(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
        except ApiException as e:
            if e.status == 403:
                raise ApiPermanentError(
                    f"{what}: forbidden (403): `topo-reporter doctor` needs get and list on "
                    f"`{resource}` (the built-in `view` ClusterRole does not cover nodes: bind one "
                    "that does)",
                    status=403,
                ) from e
            if e.status == 404:
                raise ApiPermanentError(f"{what}: not found (404)", status=404) from e
            raise _map_api_exception(e, "read", what) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _map_transport(e, "read", what, self._host) from e
        return json.loads(response.data)

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self._read("list nodes", "nodes", self._api.list_node)["items"])

    def get_node(self, name: str) -> dict[str, Any]:  # type: ignore[override]  # the doctor wants the whole Node, the agent only its metadata
        node: dict[str, Any] = self._read(f"node {name}", "nodes", self._api.read_node, name)
        return node

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None:
        return self._optional(
            f"topo-reporter pods on {node}",
            "pods",
            self._api.list_pod_for_all_namespaces,
            label_selector=self._agent_selector,
            field_selector=f"spec.nodeName={node}",
        )

    def node_events(self, node: str) -> list[dict[str, Any]] | None:
        return self._optional(
            f"events of node {node}",
            "events",
            self._api.list_event_for_all_namespaces,
            field_selector=f"involvedObject.kind=Node,involvedObject.name={node}",
        )

    def _optional(
        self, what: str, resource: str, fn: Any, **kwargs: Any
    ) -> list[dict[str, Any]] | None:
        try:
            return list(self._read(what, resource, fn, **kwargs)["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                return None
            raise


# -- Node Feature Discovery's NodeFeature objects (the nodefeature sink) ---------------------

_NODEFEATURES = f"{nodefeature.PLURAL}.{nodefeature.GROUP}"


def _status_details(body: str | None) -> Mapping[str, Any]:
    try:
        status = json.loads(body or "")
    except ValueError:
        return {}
    details = status.get("details") if isinstance(status, dict) else None
    return details if isinstance(details, dict) else {}


def _map_nodefeature_exception(
    e: ApiException, action: str, namespace: str, name: str
) -> PublishError:
    status = int(e.status or 0)
    what = f"{action} NodeFeature {namespace}/{name}"
    if status == 0:
        first = str(e.reason).splitlines()[0]
        return ApiPermanentError(
            f"{what}: TLS with the API server failed ({first}): check the cluster CA in the "
            "kubeconfig or service account"
        )
    detail = _status_message(e.body)
    said = f": {detail}" if detail else ""
    details = _status_details(e.body)
    if status == 404 and details.get("name") == name:
        # Only a replace gets here (a read of a missing object is not an error): it was
        # deleted since it was read, and reading again leads to creating it.
        return ApiTransientError(f"{what}: deleted since it was read (404)", status=404)
    if status in _TRANSIENT_STATUS:
        if status == 409:
            text = f"{what}: conflict (409), it changed or appeared since it was read"
        else:
            text = f"{what}: the API server answered {status}{said}"
        return ApiTransientError(text, status=status, retry_after=_retry_after(e.headers))
    if status == 401:
        text = (
            f"{what}: the API server rejected the credentials (401): check the service account "
            "token (automountServiceAccountToken) or the kubeconfig user"
        )
    elif status == 403:
        verb = {"read": "get", "create": "create", "replace": "update"}.get(action, action)
        text = (
            f"{what}: forbidden (403): grant the agent a Role in namespace {namespace} with "
            f"`{verb}` on `{_NODEFEATURES}` (the chart does with agent.sink=nodefeature and "
            f"rbac.create=true){said}"
        )
    elif status == 404 and details.get("kind") == "namespaces":
        text = (
            f"{what}: namespace {namespace} does not exist (404): set --namespace, "
            "TOPO_REPORTER_NAMESPACE or POD_NAMESPACE to the agent's namespace"
        )
    elif status == 404:
        text = (
            f"{what}: the API server does not serve {_NODEFEATURES}/{nodefeature.VERSION} (404): "
            "install Node Feature Discovery with its CRDs (v0.14+, or v0.12+ with "
            "-enable-nodefeature-api), or use --sink node"
        )
    elif status == 422:
        text = f"{what}: the API server refused the object (422){said}"
    else:
        text = f"{what}: the API server answered {status}{said}"
    return ApiPermanentError(text, status=status)


class KubeNodeFeatureClient:
    """NodeFeatureClient over the official client: NFD's NodeFeature objects and Node Events."""

    def __init__(
        self,
        configuration: client.Configuration,
        *,
        request_timeout_s: tuple[float, float] = (5.0, 15.0),
    ) -> None:
        self._api = client.CustomObjectsApi(client.ApiClient(configuration))
        self._events = KubeNodeClient(configuration, request_timeout_s=request_timeout_s)
        self._host = str(configuration.host)
        self._timeout = request_timeout_s

    def _call(
        self, action: str, namespace: str, name: str, fn: Any, *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        try:
            response = fn(
                nodefeature.GROUP,
                nodefeature.VERSION,
                namespace,
                nodefeature.PLURAL,
                *args,
                _request_timeout=self._timeout,
                _preload_content=False,
                **kwargs,
            )
        except ApiException as e:
            raise _map_nodefeature_exception(e, action, namespace, name) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            subject = f"NodeFeature {namespace}/{name}"
            raise _map_transport(e, action, name, self._host, subject=subject) from e
        data = json.loads(response.data)
        if not isinstance(data, dict):
            raise ApiPermanentError(f"{action} NodeFeature {namespace}/{name}: not an object")
        return data

    def get_node_feature(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("read", namespace, name, self._api.get_namespaced_custom_object, name)
        except ApiTransientError as e:
            if e.status == 404:
                return None
            raise

    def create_node_feature(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = str(body["metadata"]["name"])
        return self._call(
            "create", namespace, name, self._api.create_namespaced_custom_object, dict(body)
        )

    def replace_node_feature(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self._call(
            "replace",
            namespace,
            name,
            self._api.replace_namespaced_custom_object,
            name,
            dict(body),
        )

    def create_event(
        self,
        namespace: str,
        node: NodeMetadata,
        event_type: EventType,
        reason: str,
        message: str,
    ) -> None:
        try:
            self._events.create_event(namespace, node, event_type, reason, message)
        except ApiPermanentError as e:
            if e.status != 403:
                raise
            # The node sink's text names its ClusterRole; this sink holds a namespaced Role.
            raise ApiPermanentError(
                f"post event on node {node.name}: forbidden (403): grant the agent a Role in "
                f"namespace {namespace} with `create` on `events` (the chart does with "
                "rbac.create=true)",
                status=403,
            ) from e
