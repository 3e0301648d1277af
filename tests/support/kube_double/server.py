"""A Kubernetes API server double over real HTTP on 127.0.0.1, for the real client and kubectl.

It speaks enough of the API for `kubernetes` (Python) and `kubectl get/describe/label node` to work:
discovery (/version, /api, /apis and the resource lists), nodes (get, list, patch with merge,
strategic merge and JSON patch), pods (an empty list, which `describe node` asks for), core/v1 and
events.k8s.io/v1 events, bearer-token authentication and per-token permissions. It keeps the
apiserver's contracts the agent relies on: resourceVersion bumps only on a real change, a stale
`metadata.resourceVersion` in a patch is a 409, label and annotation validation answers 422 with a
`Status` shaped like the real one. Planned faults (status codes with Retry-After, delays, dropped
connections) are served in order to the requests they match.

It never listens on anything but loopback and keeps everything in memory.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import devicetaintrules, leases, nodefeatures, nrt
from .devicetaintrules import DeviceTaintRuleStore
from .leases import LeaseStore
from .nodefeatures import ApiStatusError, NodeFeatureStore
from .nrt import NrtStore
from .patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from .tls import Certificate
from .validation import validate_metadata
from .watch import NodeWatchLog

ALL = frozenset({"*"})
"""A token allowed every verb on every resource."""

AGENT_PERMISSIONS = frozenset(
    {
        "get nodes",
        "list nodes",
        "patch nodes",
        "create events",
        "get leases",
        "create leases",
        "update leases",
    }
)
"""What the chart's roles grant the agent (leases: its heartbeat, in its namespace)."""

EXTENDER_PERMISSIONS = frozenset({"list nodes", "watch nodes", "list leases", "watch leases"})
"""What the chart's roles grant the scheduler extender (leases: the agents' heartbeats)."""

_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_JSON_PATCH = "application/json-patch+json"

_TOKEN_RE = re.compile(r"Bearer\s+(\S+)")


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned response, served instead of the real one to the first request it matches.

    `method` None matches any verb; `path` is a prefix of the request path. `delay_s` waits before
    answering (or before dropping); `drop` closes the connection without a response; `status` 0
    with a delay serves the real response late.
    """

    status: int = 0
    method: str | None = None
    path: str = "/api/v1/nodes"
    retry_after: str | None = None
    delay_s: float = 0.0
    drop: bool = False
    message: str = "planned fault"

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and path.startswith(self.path)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the double saw it."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    content_type: str | None
    body: Any
    status: int
    accept: str | None
    request_bytes: int = 0
    """The request body's length, as sent."""
    answer_bytes: int = 0
    """The answer body's length (0 for a watch, which streams)."""


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, message: str, *, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A metav1.Status as the apiserver writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        body["details"] = dict(details)
    return body


class _StatusError(Exception):
    """Ends a request with a Status reply."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, details=details)
        self.headers = dict(headers or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _field_value(obj: Mapping[str, Any], dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    return "" if node is None else str(node)


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            name, value = term.split("!=", 1)
            if _field_value(obj, name) == value:
                return False
        else:
            name, value = re.split("==?", term, maxsplit=1)
            if _field_value(obj, name) != value:
                return False
    return True


def _labels_selected(labels: Mapping[str, str], selector: str) -> bool:
    """Equality-based label selectors (`a=b,c!=d`), the kind kubectl and clients send most."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            name, value = term.split("!=", 1)
            if labels.get(name) == value:
                return False
        else:
            name, value = re.split("==?", term, maxsplit=1)
            if labels.get(name) != value:
                return False
    return True


def _event_to_core(event: Mapping[str, Any]) -> dict[str, Any]:
    """events.k8s.io/v1 to core/v1, as the apiserver's conversion does for the fields we read."""
    return {
        "metadata": copy.deepcopy(event.get("metadata", {})),
        "involvedObject": copy.deepcopy(event.get("regarding", {})),
        "reason": event.get("reason", ""),
        "message": event.get("note", ""),
        "type": event.get("type", ""),
        "source": {"component": event.get("reportingController", "")},
        "reportingComponent": event.get("reportingController", ""),
        "reportingInstance": event.get("reportingInstance", ""),
        "action": event.get("action", ""),
        "eventTime": event.get("eventTime"),
        "count": (event.get("series") or {}).get("count", 1),
    }


def _event_from_core(core: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": copy.deepcopy(core.get("metadata", {})),
        "regarding": copy.deepcopy(core.get("involvedObject", {})),
        "reason": core.get("reason", ""),
        "note": core.get("message", ""),
        "type": core.get("type", ""),
        "reportingController": core.get("reportingComponent")
        or (core.get("source") or {}).get("component", ""),
        "reportingInstance": core.get("reportingInstance", ""),
        "action": core.get("action", ""),
        "eventTime": core.get("eventTime"),
        "deprecatedCount": core.get("count", 1),
    }


@dataclass
class ApiServerDouble:
    """The double: start it, add nodes, point a kubeconfig at `url`, read `requests`."""

    tokens: dict[str, frozenset[str]] = field(
        default_factory=lambda: {
            "agent-token": AGENT_PERMISSIONS,
            "admin-token": ALL,
            "extender-token": EXTENDER_PERMISSIONS,
        }
    )
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _revision: Iterator[int] = field(default_factory=lambda: itertools.count(100))
    certificate: Certificate | None = None
    """Serve HTTPS with this certificate (kubectl sends tokens only over TLS); None: plain HTTP."""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    watch_log: NodeWatchLog = field(default_factory=NodeWatchLog)
    """Node changes by resourceVersion, for `watch=1` requests."""
    nodefeatures: NodeFeatureStore = field(init=False)
    """NFD's NodeFeature objects; `nodefeatures.installed = False` serves a cluster without NFD."""
    nrt: NrtStore = field(init=False)
    """NodeResourceTopology objects; `nrt.installed = False` serves a cluster without the CRD."""
    leases: LeaseStore = field(init=False)
    """coordination.k8s.io Leases (the agents' heartbeats), with their own watch log."""
    device_taint_rules: DeviceTaintRuleStore = field(init=False)
    """DRA DeviceTaintRules; off (404) unless `device_taint_rules.installed = True`."""

    def __post_init__(self) -> None:
        self.nodefeatures = NodeFeatureStore(revision=lambda: next(self._revision))
        self.nrt = NrtStore(revision=lambda: next(self._revision))
        self.leases = LeaseStore(revision=lambda: next(self._revision))
        self.device_taint_rules = DeviceTaintRuleStore(revision=lambda: next(self._revision))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ApiServerDouble:
        double = self

        class Handler(_Handler):
            owner = double

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        if self.certificate is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.certificate.cert, self.certificate.key)
            # The handshake happens in the request's thread, so a stalled client stalls only itself.
            server.socket = context.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.watch_log.close()
        self.leases.log.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ApiServerDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the double first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.certificate is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # -- test-side state ---------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Register a Node shaped like one a kubelet registered."""
        base_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
        }
        base_labels.update(labels or {})
        node = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(next(self._revision)),
                "creationTimestamp": _now(),
                "labels": base_labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
            },
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {
                "capacity": {"cpu": "224", "memory": "2113645460Ki", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "224", "memory": "2113543060Ki", "nvidia.com/gpu": "8"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "10.0.0.11"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "machineID": "0" * 32,
                    "systemUUID": str(uuid.uuid4()),
                    "bootID": str(uuid.uuid4()),
                    "kernelVersion": "6.8.0-45-generic",
                    "osImage": "Ubuntu 22.04.4 LTS",
                    "containerRuntimeVersion": "containerd://1.7.22",
                    "kubeletVersion": "v1.32.0",
                    "kubeProxyVersion": "v1.32.0",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        with self._lock:
            self.nodes[name] = node
            self.watch_log.record("ADDED", node)
        return copy.deepcopy(node)

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        labels: Mapping[str, str] | None = None,
        ready: bool = True,
    ) -> dict[str, Any]:
        """Register a running Pod on `node`, Ready or not."""
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(next(self._revision)),
                "labels": dict(labels or {}),
            },
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        with self._lock:
            self.pods.append(pod)
        return copy.deepcopy(pod)

    def list_pods(
        self, namespace: str | None, field_selector: str, label_selector: str
    ) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(p)
                for p in self.pods
                if (namespace is None or p["metadata"]["namespace"] == namespace)
                and _selected(p, field_selector)
                and _labels_selected(p["metadata"]["labels"], label_selector)
            ]

    def node(self, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.nodes[name])

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("labels") or {})

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("annotations") or {})

    def edit_node(self, name: str, patch: Mapping[str, Any]) -> None:
        """Change a Node as someone else would (a human, another controller): bumps the version."""
        with self._lock:
            node = merge_patch(self.nodes[name], patch)
            node["metadata"]["resourceVersion"] = str(next(self._revision))
            self.nodes[name] = node
            self.watch_log.record("MODIFIED", node)

    def delete_node(self, name: str) -> None:
        """Remove a Node as a cluster admin would."""
        with self._lock:
            node = self.nodes.pop(name)
            node["metadata"]["resourceVersion"] = str(next(self._revision))
            self.watch_log.record("DELETED", node)

    def plan(self, *faults: Fault) -> None:
        """Queue planned responses; each is served once, in order, to the first match."""
        with self._lock:
            self.faults.extend(faults)

    def pending_faults(self) -> list[Fault]:
        with self._lock:
            return list(self.faults)

    def writes(self, path_prefix: str = "/api/v1/nodes") -> list[Recorded]:
        """The PATCH/PUT/POST requests under `path_prefix`, including refused ones."""
        return [
            r
            for r in self.requests
            if r.method in ("PATCH", "PUT", "POST") and r.path.startswith(path_prefix)
        ]

    def reads(self, path_prefix: str = "/api/v1/nodes") -> list[Recorded]:
        return [r for r in self.requests if r.method == "GET" and r.path.startswith(path_prefix)]

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- request side ------------------------------------------------------------------------

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for i, fault in enumerate(self.faults):
                if fault.matches(method, path):
                    return self.faults.pop(i)
        return None

    def record(self, entry: Recorded) -> None:
        with self._lock:
            self.requests.append(entry)

    def authorize(self, authorization: str | None, verb: str, resource: str, name: str) -> None:
        match = _TOKEN_RE.fullmatch(authorization or "")
        if match is None or match.group(1) not in self.tokens:
            raise _StatusError(401, "Unauthorized")
        granted = self.tokens[match.group(1)]
        if "*" in granted or f"{verb} {resource}" in granted:
            return
        user = "system:serviceaccount:gpu-topology:topo-reporter"
        what = f'{resource} "{name}"' if name else resource
        raise _StatusError(
            403,
            f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API '
            'group "" at the cluster scope',
            details={"name": name, "kind": resource},
        )

    def get_node(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name not in self.nodes:
                raise _StatusError(
                    404, f'nodes "{name}" not found', details={"name": name, "kind": "nodes"}
                )
            return copy.deepcopy(self.nodes[name])

    def list_nodes(self, limit: int = 0, after: str = "", selector: str = "") -> dict[str, Any]:
        """All Nodes, or a page of `limit` after the name `after` (the continue token); those a
        field selector picks (`metadata.name=NAME`, as the extender reads one node fresh: that
        one alone, looked up, as kube-apiserver does)."""
        with self._lock:
            named = selector.removeprefix("metadata.name=")
            if selector.startswith("metadata.name=") and "," not in named:
                found = [(named, self.nodes[named])] if named in self.nodes else []
            else:
                found = sorted(self.nodes.items())
            items = [
                copy.deepcopy(n) for name, n in found if name > after and _selected(n, selector)
            ]
            revision = max(
                [int(n["metadata"]["resourceVersion"]) for n in self.nodes.values()]
                + [e[0] for e in self.watch_log.events],
                default=1,
            )
        meta: dict[str, Any] = {"resourceVersion": str(revision)}
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = items[-1]["metadata"]["name"]
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items}

    def patch_node(self, name: str, content_type: str, patch: Any) -> dict[str, Any]:
        with self._lock:
            if name not in self.nodes:
                raise _StatusError(
                    404, f'nodes "{name}" not found', details={"name": name, "kind": "nodes"}
                )
            current = self.nodes[name]
            try:
                if content_type == _MERGE:
                    updated = _checked_object(merge_patch(current, _object_patch(patch)))
                elif content_type == _STRATEGIC:
                    updated = _checked_object(strategic_merge_patch(current, _object_patch(patch)))
                elif content_type == _JSON_PATCH:
                    updated = _checked_object(json_patch(current, patch))
                else:
                    raise _StatusError(
                        415,
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: {_JSON_PATCH}, {_MERGE}, {_STRATEGIC}, "
                        "application/apply-patch+yaml",
                    )
            except PatchError as e:
                raise _StatusError(400, str(e)) from e
            wanted = updated["metadata"].get("resourceVersion")
            have = current["metadata"]["resourceVersion"]
            if wanted is not None and wanted != have:
                raise _StatusError(
                    409,
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    details={"name": name, "kind": "nodes"},
                )
            updated["metadata"]["resourceVersion"] = have
            for immutable in ("name", "uid", "creationTimestamp"):
                if updated["metadata"].get(immutable) != current["metadata"].get(immutable):
                    raise _StatusError(422, f"metadata.{immutable}: field is immutable")
            causes = validate_metadata(
                updated["metadata"].get("labels") or {},
                updated["metadata"].get("annotations") or {},
            )
            if causes:
                texts = [c.text for c in causes]
                summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
                raise _StatusError(
                    422,
                    f'Node "{name}" is invalid: {summary}',
                    details={
                        "name": name,
                        "kind": "Node",
                        "causes": [c.as_json() for c in causes],
                    },
                )
            if updated != current:
                updated["metadata"]["resourceVersion"] = str(next(self._revision))
                self.nodes[name] = updated
                self.watch_log.record("MODIFIED", updated)
            return copy.deepcopy(self.nodes[name])

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(event))
        metadata = stored.setdefault("metadata", {})
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise _StatusError(422, "Event is invalid: metadata.name: Required value")
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        if metadata.get("namespace", namespace) != namespace:
            raise _StatusError(
                400, "the namespace of the provided object does not match the namespace sent"
            )
        if not stored.get("involvedObject", {}).get("name") or not stored.get("reason"):
            raise _StatusError(
                422,
                "Event is invalid: involvedObject and reason are required",
            )
        # The apiserver's legacyValidateEvent: an Event about a cluster-scoped object (a Node)
        # lives in `default` (or no namespace; `kube-system` too for one with an eventTime).
        involved_namespace = stored["involvedObject"].get("namespace") or ""
        if involved_namespace:
            allowed: tuple[str, ...] = (involved_namespace,)
        elif stored.get("eventTime"):
            allowed = ("default", "kube-system")
        else:
            allowed = ("", "default")
        if namespace not in allowed:
            raise _StatusError(
                422,
                f'Event "{metadata["name"]}" is invalid: involvedObject.namespace: Invalid '
                f'value: "{involved_namespace}": does not match event.namespace',
            )
        metadata["namespace"] = namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = _now()
        with self._lock:
            metadata["resourceVersion"] = str(next(self._revision))
            stored.setdefault("firstTimestamp", _now())
            stored.setdefault("lastTimestamp", stored["firstTimestamp"])
            stored.setdefault("count", 1)
            stored["kind"] = "Event"
            stored["apiVersion"] = "v1"
            self.events.append(stored)
        return copy.deepcopy(stored)

    def list_events(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(e)
                for e in self.events
                if (namespace is None or e["metadata"]["namespace"] == namespace)
                and _selected(e, selector)
            ]


def _object_patch(patch: Any) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise _StatusError(400, "a merge patch must be a JSON object")
    return patch


def _checked_object(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise _StatusError(422, "the patched object has no metadata")
    for name in ("labels", "annotations"):
        values = obj["metadata"].get(name)
        if values is not None and (
            not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values())
        ):
            raise _StatusError(400, f"metadata.{name}: every value must be a string")
    return obj


# -- discovery documents -------------------------------------------------------------------

_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _resource(
    name: str, kind: str, namespaced: bool, verbs: list[str], short: list[str] | None = None
) -> dict[str, Any]:
    res: dict[str, Any] = {
        "name": name,
        "singularName": kind.lower(),
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs,
    }
    if short:
        res["shortNames"] = short
    return res


_CORE_RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        _resource("nodes", "Node", False, ["get", "list", "patch"], ["no"]),
        _resource("pods", "Pod", True, ["get", "list"], ["po"]),
        _resource("events", "Event", True, ["create", "get", "list"], ["ev"]),
        _resource("namespaces", "Namespace", False, ["get", "list"], ["ns"]),
    ],
}

_GROUPS: dict[str, dict[str, Any]] = {
    "events.k8s.io": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "events.k8s.io/v1",
        "resources": [_resource("events", "Event", True, ["create", "get", "list"], ["ev"])],
    },
    "coordination.k8s.io": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "coordination.k8s.io/v1",
        "resources": [
            _resource("leases", "Lease", True, ["create", "get", "list", "update", "watch"])
        ],
    },
}


def _group_list() -> dict[str, Any]:
    groups = []
    for name in _GROUPS:
        version = {"groupVersion": f"{name}/v1", "version": "v1"}
        groups.append({"name": name, "versions": [version], "preferredVersion": version})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


# -- HTTP ----------------------------------------------------------------------------------

_NAMESPACED = re.compile(r"/namespaces/([^/]+)/(\w+)(?:/([^/]+))?")


class _Handler(BaseHTTPRequestHandler):
    owner: ApiServerDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: pytest shows the double's request list on failure instead.
        return

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without this, delayed ACKs add 40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path).rstrip("/") or "/"
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        body: Any = None
        headers: Mapping[str, str] = {}
        try:
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise _StatusError(400, f"the request body is not JSON: {e}") from e
            fault = self.owner.take_fault(method, path)
            if fault is not None:
                if fault.delay_s:
                    threading.Event().wait(fault.delay_s)
                if fault.drop:
                    self._record(
                        method,
                        path=path,
                        query=query,
                        content_type=content_type,
                        body=body,
                        status=-1,
                    )
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault.status:
                    retry_after = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    raise _StatusError(fault.status, fault.message, headers=retry_after)
            lease_path = leases.PATH.fullmatch(path)
            watch = (query.get("watch") or [""])[0] in ("1", "true") and (
                path == "/api/v1/nodes" or (lease_path is not None and lease_path[2] is None)
            )
            verb, resource, name = self._verb_resource(method, path)
            self.owner.authorize(
                self.headers.get("Authorization"), "watch" if watch else verb, resource, name
            )
            if watch:
                self._record(
                    method, path=path, query=query, content_type=content_type, body=body, status=200
                )
                if lease_path is None:
                    self._watch(query, self.owner.watch_log.stream)
                else:
                    namespace, selected = lease_path[1], self._label_selector(query)
                    self._watch(
                        query,
                        lambda since, timeout: self.owner.leases.stream(
                            namespace, selected, since, timeout
                        ),
                    )
                return
            status, payload = self._route(method, path, query, content_type, body)
        except _StatusError as reply:
            status, payload, headers = reply.code, reply.body, reply.headers
        data = json.dumps(payload).encode()
        # Recorded before answering, so that a test reading `requests` after the client returned
        # sees every request the client made.
        self._record(
            method,
            path=path,
            query=query,
            content_type=content_type,
            body=body,
            status=status,
            sizes=(len(raw), len(data)),
        )
        self._send(status, data, headers)

    def _record(
        self,
        method: str,
        *,
        path: str,
        query: Mapping[str, list[str]],
        content_type: str | None,
        body: Any,
        status: int,
        sizes: tuple[int, int] = (0, 0),
    ) -> None:
        """`sizes`: (request, answer) body bytes."""
        accept = self.headers.get("Accept")
        self.owner.record(Recorded(method, path, query, content_type, body, status, accept, *sizes))

    @staticmethod
    def _verb_resource(method: str, path: str) -> tuple[str, str, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] not in (["api"], ["apis"]) or (parts[0] == "api" and len(parts) <= 2):
            return ("get", "discovery", "")
        if parts[0] == "apis" and len(parts) <= 3:
            return ("get", "discovery", "")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if len(rest) >= 2 and rest[0] == "namespaces":
            rest = rest[2:]
        resource = rest[0] if rest else ""
        name = rest[1] if len(rest) > 1 else ""
        verb = {
            "GET": "get" if name else "list",
            "PATCH": "patch",
            "POST": "create",
            "PUT": "update",
        }.get(method, method.lower())
        return (verb, resource, name)

    def _route(
        self,
        method: str,
        path: str,
        query: Mapping[str, list[str]],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, Any]:
        owner = self.owner
        lease_path = leases.PATH.fullmatch(path)
        if lease_path is not None:
            try:
                return owner.leases.serve(
                    method, lease_path[1], lease_path[2], body, self._label_selector(query)
                )
            except ApiStatusError as e:
                raise _StatusError(e.code, e.message, details=e.details) from e
        if path.startswith(devicetaintrules.PREFIX):
            try:
                return owner.device_taint_rules.serve(method, path, dict(query), body)
            except ApiStatusError as e:
                raise _StatusError(e.code, e.message, details=e.details) from e
        if path.startswith(nrt.PREFIX):
            try:
                return owner.nrt.serve(method, path, body)
            except ApiStatusError as e:
                raise _StatusError(e.code, e.message, details=e.details) from e
        if path.startswith(f"/apis/{nodefeatures.GROUP}/") or path == f"/apis/{nodefeatures.GROUP}":
            try:
                return owner.nodefeatures.serve(method, path, query, content_type, body)
            except ApiStatusError as e:
                raise _StatusError(e.code, e.message, details=e.details) from e
        selector = (query.get("fieldSelector") or [""])[0]
        if method == "GET":
            if path == "/version":
                return 200, _VERSION
            if path == "/api":
                return 200, {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{owner.port}"}
                    ],
                }
            if path == "/apis":
                groups = _group_list()
                if owner.nodefeatures.installed:
                    groups["groups"].append(nodefeatures.GROUP_ENTRY)
                return 200, groups
            if path == "/api/v1":
                return 200, _CORE_RESOURCES
            for group, resources in _GROUPS.items():
                if path == f"/apis/{group}/v1":
                    return 200, resources
                if path == f"/apis/{group}":
                    return 200, next(g for g in _group_list()["groups"] if g["name"] == group)
            if path == "/api/v1/nodes":
                limit = (query.get("limit") or ["0"])[0]
                listed = owner.list_nodes(
                    int(limit) if limit.isdigit() else 0,
                    (query.get("continue") or [""])[0],
                    selector,
                )
                if "as=PartialObjectMetadataList" in (self.headers.get("Accept") or ""):
                    # As kube-apiserver answers it (seen through tests/support/fault_proxy.py): a
                    # page with no Nodes has `"items": null`. Whole Nodes are served still, as a
                    # server that ignores the metadata-only Accept would.
                    listed["items"] = listed["items"] or None
                return 200, listed
            if path.startswith("/api/v1/nodes/"):
                return 200, owner.get_node(path.removeprefix("/api/v1/nodes/"))
            if path in ("/api/v1/pods", "/api/v1/events", "/apis/events.k8s.io/v1/events"):
                return 200, self._list(path, None, selector, query)
        namespaced = _NAMESPACED.fullmatch(path.split("/v1", 1)[-1]) if "/v1/" in path else None
        if namespaced is not None:
            namespace, resource, name = namespaced.groups()
            group_path = path.split("/namespaces/", maxsplit=1)[0]
            if method == "GET" and name is None and resource in ("pods", "events"):
                return 200, self._list(f"{group_path}/{resource}", namespace, selector, query)
            if method == "POST" and resource == "events" and name is None:
                if not isinstance(body, dict):
                    raise _StatusError(400, "an Event must be a JSON object")
                if group_path == "/apis/events.k8s.io/v1":
                    return 201, _event_from_core(
                        owner.create_event(namespace, _event_to_core(body))
                    )
                if group_path == "/api/v1":
                    return 201, owner.create_event(namespace, body)
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            return 200, owner.patch_node(
                path.removeprefix("/api/v1/nodes/"), content_type or "", body
            )
        raise _StatusError(404, "the server could not find the requested resource")

    def _list(
        self,
        path: str,
        namespace: str | None,
        selector: str,
        query: Mapping[str, list[str]],
    ) -> dict[str, Any]:
        if path.endswith("/pods"):
            labels = (query.get("labelSelector") or [""])[0]
            items = self.owner.list_pods(namespace, selector, labels)
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        events = self.owner.list_events(namespace, selector)
        if path.startswith("/apis/events.k8s.io"):
            return {
                "kind": "EventList",
                "apiVersion": "events.k8s.io/v1",
                "metadata": {},
                "items": [_event_from_core(e) for e in events],
            }
        return {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": events}

    @staticmethod
    def _label_selector(query: Mapping[str, list[str]]) -> Callable[[Mapping[str, str]], bool]:
        selector = (query.get("labelSelector") or [""])[0]
        return lambda labels: _labels_selected(labels, selector)

    def _watch(
        self,
        query: Mapping[str, list[str]],
        events: Callable[[int, float], Iterator[dict[str, Any]]],
    ) -> None:
        """Stream the `events` of a log (Nodes, or one namespace's Leases) as chunked JSON
        lines, as the apiserver does."""
        since = int((query.get("resourceVersion") or ["0"])[0] or 0)
        timeout = float((query.get("timeoutSeconds") or ["60"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        bookmarks = (query.get("allowWatchBookmarks") or [""])[0] == "true"
        try:
            for event in events(since, timeout):
                if event["type"] == "BOOKMARK" and not bookmarks:
                    continue
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client left
        self.close_connection = True

    def _send(self, code: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
