"""The one module that imports `kubernetes`: NodeClient over the real client, errors mapped once.

Configuration: a kubeconfig when one is named (`--kubeconfig`, `KUBECONFIG`), in-cluster config
when running in a pod, else `~/.kube/config`. The client's own urllib3 retries are switched off:
`reporter.publish.retry` owns retrying, so the backoff is one policy in one place. Every library
exception becomes a `PublishError` here, with a message saying what to fix. It must never log or
put into a message a token or kubeconfig content.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from reporter.doctor import AGENT_POD_SELECTOR
from reporter.errors import ApiPermanentError, ApiTransientError, ConfigError, PublishError
from reporter.publish import errors_map, nodefeature
from reporter.publish.client import EventType
from reporter.publish.patch import NodeMetadata
from reporter.publish.rest import COMPONENT, MERGE_PATCH, node_metadata, read_kubeconfig


def load_configuration(kubeconfig: str | None, context: str | None = None) -> client.Configuration:
    """Client configuration: the named kubeconfig, else in-cluster, else KUBECONFIG or
    ~/.kube/config; `context` picks a kubeconfig context instead of its current one.

    Raises ConfigError naming the kubeconfig path and context (never the file's content).
    """
    configuration = client.Configuration()
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # the client ships no annotations for its config loaders
        else:
            _check_kubeconfigs(kubeconfig)
            config.load_kube_config(  # type: ignore[no-untyped-call]  # as above
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (ConfigException, OSError) as e:
        where = kubeconfig or "in-cluster service account or KUBECONFIG or ~/.kube/config"
        if context is not None:
            where += f" with context {context!r}"
        raise ConfigError(
            f"cannot load Kubernetes credentials from {where} ({type(e).__name__}): pass "
            "--kubeconfig or set KUBECONFIG to a readable kubeconfig"
            + (" that has that context" if context is not None else ", or run in a pod")
        ) from e
    # Retries are reraised to our tenacity policy; urllib3's own would multiply them.
    configuration.retries = False
    return configuration


def _check_kubeconfigs(kubeconfig: str | None) -> None:
    """Read each kubeconfig the official loader will read through our bounded loader first: its
    own reads with no size limit and expands YAML aliases. A missing file is left to it."""
    paths = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    for path in filter(None, paths.split(os.pathsep)):
        try:
            read_kubeconfig(Path(path))
        except ConfigError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise


def _cut(e: ApiException) -> BaseException | None:
    """The urllib3 error behind a status 0 (the client reports its SSLError so, raised while
    handling it) when the connection was cut: mapped as the lean client maps it, transient."""
    cause = e.__context__
    return cause if e.status == 0 and errors_map.tls_cut(cause) is not None else None


def _map_api_exception(e: ApiException, action: str, node: str, host: str) -> PublishError:
    cut = _cut(e)
    if cut is not None:
        return errors_map.transport_error(cut, f"{action} node {node}", host)
    return errors_map.node_error(int(e.status or 0), str(e.reason), e.body, e.headers, action, node)


def _map_transport(
    e: Exception, action: str, node: str, host: str, *, subject: str | None = None
) -> PublishError:
    return errors_map.transport_error(e, f"{action} {subject or f'node {node}'}", host)


def _metadata(raw: Any, what: str) -> NodeMetadata:
    return node_metadata(errors_map.answer_json(raw, what))


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
            raise _map_api_exception(e, action, node, self._host) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _map_transport(e, action, node, self._host) from e

    def get_node(self, name: str) -> NodeMetadata:
        response = self._call("read", name, self._api.read_node, name, _preload_content=False)
        return _metadata(response.data, f"read node {name}")

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
        return _metadata(response.data, f"patch node {name}")

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
        namespace: str | None = None,
        tool: str = "topo-reporter doctor",
        request_timeout_s: tuple[float, float] = (5.0, 30.0),
    ) -> None:
        """`namespace`: where the agent runs, to look up its pods and Events there only (None:
        every namespace); `tool`: the command that 403 messages say needs the permission."""
        super().__init__(configuration, request_timeout_s=request_timeout_s)
        self._agent_selector = agent_selector
        self._namespace = namespace
        self._tool = tool

    def _read(self, what: str, resource: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = fn(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
        except ApiException as e:
            if e.status == 403:
                raise ApiPermanentError(
                    f"{what}: forbidden (403): `{self._tool}` needs get and list on "
                    f"`{resource}` (the built-in `view` ClusterRole does not cover nodes: bind one "
                    "that does)",
                    status=403,
                ) from e
            if e.status == 404:
                raise ApiPermanentError(f"{what}: not found (404)", status=404) from e
            raise _map_api_exception(e, "read", what, self._host) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _map_transport(e, "read", what, self._host) from e
        return errors_map.answer_json(response.data, what)

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
            self._api.list_namespaced_pod,
            label_selector=self._agent_selector,
            field_selector=f"spec.nodeName={node}",
        )

    def node_events(self, node: str) -> list[dict[str, Any]] | None:
        return self._optional(
            f"events of node {node}",
            "events",
            self._api.list_event_for_all_namespaces,
            self._api.list_namespaced_event,
            field_selector=f"involvedObject.kind=Node,involvedObject.name={node}",
        )

    def _optional(
        self, what: str, resource: str, everywhere: Any, namespaced: Any, **kwargs: Any
    ) -> list[dict[str, Any]] | None:
        try:
            if self._namespace is None:
                return list(self._read(what, resource, everywhere, **kwargs)["items"])
            found = self._read(what, resource, namespaced, self._namespace, **kwargs)
            return list(found["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                return None
            raise


# -- Node Feature Discovery's NodeFeature objects (the nodefeature sink) ---------------------


def _map_nodefeature_exception(
    e: ApiException, action: str, namespace: str, name: str, host: str
) -> PublishError:
    cut = _cut(e)
    if cut is not None:
        return errors_map.transport_error(cut, f"{action} NodeFeature {namespace}/{name}", host)
    return errors_map.nodefeature_error(
        int(e.status or 0), str(e.reason), e.body, e.headers, action, namespace, name
    )


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
            raise _map_nodefeature_exception(e, action, namespace, name, self._host) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            subject = f"NodeFeature {namespace}/{name}"
            raise _map_transport(e, action, name, self._host, subject=subject) from e
        data = errors_map.answer_json(response.data, f"{action} NodeFeature {namespace}/{name}")
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
        self._events.create_event(namespace, node, event_type, reason, message)
