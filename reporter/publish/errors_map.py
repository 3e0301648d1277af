"""One mapping from what the Kubernetes API answered to our PublishError tree, for every resource.

`reporter.publish.wire` hands every answer here, whichever transport (lean or official) carried
it, and each transport hands here what it raises when no answer came: the messages an operator
reads, which errors are retried and the Retry-After they carry are therefore the same whichever
client the agent runs with, and a new resource needs at most a hint here. This module must never
import `kubernetes` (the lean client exists so that the agent need not load it), and never put a
token, a kubeconfig's content or a raw response body into a message.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3

from parsers.documents import DocumentBoundError, load_json
from parsers.errors import ParseError
from reporter.errors import ApiPermanentError, ApiTransientError, PublishError
from reporter.publish.api import (
    EVENTS,
    LEASES,
    NODE_FEATURES,
    NODE_RESOURCE_TOPOLOGIES,
    NODES,
    Resource,
    WatchExpired,
)
from reporter.publish.client import NODE_EVENT_NAMESPACE

TRANSIENT_STATUS = frozenset({409, 429, 500, 502, 503, 504})
# A Node or NodeFeature nests about a dozen levels, managedFields included. Anyone who can write
# one of these objects chooses its depth; the bound keeps a hostile one from a RecursionError.
MAX_ANSWER_DEPTH = 100


MAX_RETRY_AFTER_CHARS = 64
"""Longer than any HTTP date (29 characters) or sensible number of seconds: not a Retry-After."""
MAX_RETRY_AFTER_S = 86400.0
"""A day: the retry policy caps what it honours lower still; this only keeps the float finite."""


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (a number or an HTTP date), or None."""
    value = (headers or {}).get("Retry-After")
    if value is None:
        return None
    value = value.strip()
    if len(value) > MAX_RETRY_AFTER_CHARS:
        return None
    # str.isdigit() also takes '²' and other non-ASCII digits, which float() refuses.
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(max(0.0, (when - datetime.now(UTC)).total_seconds()), MAX_RETRY_AFTER_S)


def answer_json(data: str | bytes, what: str) -> Any:
    """The JSON of an API answer. Raises ApiTransientError for one that is not JSON (a proxy's
    error page), ApiPermanentError for JSON nested deeper than MAX_ANSWER_DEPTH."""
    try:
        return load_json(data, max_depth=MAX_ANSWER_DEPTH, max_chars=None)
    except DocumentBoundError as e:
        raise ApiPermanentError(f"{what}: the API server's answer is refused: {e}") from None
    except ParseError as e:
        raise ApiTransientError(f"{what}: the API server's answer is not JSON") from e


def _status(body: str | bytes | None) -> dict[str, Any]:
    try:
        status = load_json(body or "", max_depth=MAX_ANSWER_DEPTH, max_chars=None)
    except ParseError:
        return {}
    return status if isinstance(status, dict) else {}


def status_message(body: str | bytes | None) -> str:
    """The apiserver's Status message, or its causes; the raw body is not echoed (size, noise)."""
    status = _status(body)
    causes = (status.get("details") or {}).get("causes") or []
    parts = [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes if isinstance(c, dict)]
    return "; ".join(parts) or str(status.get("message", ""))


def status_details(body: str | bytes | None) -> Mapping[str, Any]:
    """The Status's `details` (name, kind of the object it is about), or empty."""
    details = _status(body).get("details")
    return details if isinstance(details, dict) else {}


_ACTIONS = {"get": "read", "merge_patch": "patch"}
"""The word messages use for an ApiClient call, where it is not the call's name."""
_RBAC_VERBS = {"replace": "update", "merge_patch": "patch"}


def _label(resource: Resource) -> str:
    """How messages name an object of `resource`: core kinds in lower case (`node n1`), others by
    their Kind (`NodeFeature ns/n1`)."""
    return resource.kind if resource.group else resource.kind.lower()


def describe(
    verb: str,
    resource: Resource,
    name: str | None,
    namespace: str | None,
    body: Mapping[str, Any] | None = None,
) -> str:
    """What a call does, as messages start: "read node n1", "create NodeFeature ns/n1", "post
    event on node n1" (an Event is told by the object it is about), "list nodes"."""
    if resource == EVENTS and verb == "create" and body is not None:
        involved = body.get("involvedObject") or {}
        return f"post event on {str(involved.get('kind', '')).lower()} {involved.get('name')}"
    if name is None:
        return f"{_ACTIONS.get(verb, verb)} {resource.plural}"
    where = f"{namespace}/{name}" if resource.namespaced and namespace else name
    return f"{_ACTIONS.get(verb, verb)} {_label(resource)} {where}"


def names_object(body: str | bytes | None, resource: Resource, name: str) -> bool:
    """Whether a 404 says the object itself is missing (not its namespace, not the resource)."""
    details = status_details(body)
    return details.get("name") == name and details.get("kind") in (None, resource.plural)


def _forbidden(resource: Resource, verb: str, namespace: str | None) -> str:
    rbac = _RBAC_VERBS.get(verb, verb)
    served = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    if resource == NODES:
        return f"grant the agent's ClusterRole `{rbac}` on `nodes`"
    if resource == NODE_FEATURES:
        return (
            f"grant the agent a Role in namespace {namespace} with `{rbac}` on `{served}` (the "
            "chart does with agent.sink=nodefeature and rbac.create=true)"
        )
    if resource == LEASES:
        who = "the extender" if verb in ("list", "watch") else "the agent"
        return (
            f"grant {who} a Role in namespace {namespace} with `{rbac}` on `{served}` (the chart "
            "does with availability.heartbeat.enabled and rbac.create=true)"
        )
    return f"grant the agent `{rbac}` on `{served}`"


def _not_found(resource: Resource, namespace: str | None, body: str | bytes | None) -> str:
    served = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    if resource == NODES:
        return (
            "not found (404): check --node / TOPO_REPORTER_NODE / NODE_NAME (the downward API's "
            "spec.nodeName)"
        )
    if status_details(body).get("kind") == "namespaces":
        return (
            f"namespace {namespace} does not exist (404): set --namespace, "
            "TOPO_REPORTER_NAMESPACE or POD_NAMESPACE to the agent's namespace"
        )
    if resource == NODE_FEATURES:
        return (
            f"the API server does not serve {served}/{resource.version} (404): install Node "
            "Feature Discovery with its CRDs (v0.14+, or v0.12+ with -enable-nodefeature-api), "
            "or use --sink node"
        )
    if resource == NODE_RESOURCE_TOPOLOGIES:
        return (
            f"the API server does not serve {served}/{resource.version} (404): install the "
            "NodeResourceTopology CRD (scheduler-plugins' "
            "manifests/noderesourcetopology/crd.yaml) or turn --nrt off"
        )
    return "not found (404)"


def node_not_found(node: str) -> ApiPermanentError:
    """Reading the agent's own Node found none: the node name is wrong."""
    return ApiPermanentError(f"read node {node}: {_not_found(NODES, None, None)}", status=404)


def api_error(
    status: int,
    reason: str,
    body: str | bytes | None,
    headers: Mapping[str, str] | None,
    *,
    verb: str,
    resource: Resource,
    name: str | None,
    namespace: str | None,
    what: str,
) -> PublishError:
    """The error for an answer `status` to `verb` (an ApiClient method) on `resource`; `what` is
    `describe`'s text. Status 0 is how the official client reports a TLS failure."""
    if status == 0:
        return tls_error(what, reason)
    detail = status_message(body)
    said = f": {detail}" if detail else ""
    if status == 410:
        return WatchExpired(f"{what}: resourceVersion expired (410)", status=410)
    if (
        status == 404
        and resource != NODES
        and name is not None
        and names_object(body, resource, name)
    ):
        # A get of a missing object is not an error: only a write gets here, on an object
        # deleted since it was read; reading again leads to creating it.
        return ApiTransientError(f"{what}: deleted since it was read (404)", status=404)
    if status in TRANSIENT_STATUS:
        if status == 409:
            it = "the node changed" if resource == NODES else "it changed or appeared"
            text = f"{what}: conflict (409), {it} since it was read"
        else:
            text = f"{what}: the API server answered {status}{said}"
        return ApiTransientError(text, status=status, retry_after=retry_after(headers))
    if status == 401:
        text = (
            f"{what}: the API server rejected the credentials (401): check the service account "
            "token (automountServiceAccountToken) or the kubeconfig user"
        )
    elif status == 403 and resource == EVENTS:
        return forbidden_event(what.rpartition(" ")[2])
    elif status == 403:
        text = f"{what}: forbidden (403): {_forbidden(resource, verb, namespace)}{said}"
    elif status == 404:
        text = f"{what}: {_not_found(resource, namespace, body)}"
    elif status == 422 and resource == NODES:
        text = (
            f"{what}: the API server refused the metadata (422){said}: check the label values "
            "(63 characters, [A-Za-z0-9._-]), the --prefix and the node's total annotation size "
            "(256 KiB)"
        )
    elif status == 422:
        text = f"{what}: the API server refused the object (422){said}"
    else:
        text = f"{what}: the API server answered {status}{said}"
    return ApiPermanentError(text, status=status)


def tls_error(what: str, reason: object) -> ApiPermanentError:
    """The official client's TLS failure (no status, the reason in its text)."""
    first = str(reason).splitlines()[0] if str(reason) else "TLS"
    return ApiPermanentError(
        f"{what}: TLS with the API server failed ({first}): check the cluster CA in the "
        "kubeconfig or service account"
    )


_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ConnectionError)
MAX_CAUSES = 8


def tls_cut(e: BaseException | None) -> BaseException | None:
    """The reset or EOF that broke off a TLS connection behind the error `e`, or None.

    A server restarting or a load balancer dropping a connection mid-request does that, and a
    retry cures it; a certificate the CA does not sign is not cured so. urllib3 wraps the ssl
    error in its own SSLError (its first argument); the official client turns that into a status
    0 raised while handling it (its context).
    """
    for _ in range(MAX_CAUSES):
        if e is None or isinstance(e, _CUT):
            return e
        nested = e.args[0] if e.args and isinstance(e.args[0], BaseException) else None
        e = nested or e.__cause__ or e.__context__
    return None


def transport_error(e: BaseException, what: str, host: str) -> PublishError:
    """The error for a request to `host` that got no HTTP answer; `what` is "read node n" etc."""
    reason = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) else e
    if isinstance(reason, urllib3.exceptions.SSLError | ssl.SSLError):
        cut = tls_cut(reason)
        if cut is not None:
            return ApiTransientError(
                f"{what}: cannot reach the API server at {host} (the connection was cut: "
                f"{type(cut).__name__})"
            )
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


def forbidden_event(node: str) -> ApiPermanentError:
    """A 403 on posting an Event about the Node: either sink needs a Role in `default`."""
    return ApiPermanentError(
        f"post event on node {node}: forbidden (403): grant the agent a Role in namespace "
        f"{NODE_EVENT_NAMESPACE}, where Events about Nodes go, with `create` on `events` (the "
        "chart does with rbac.create=true)",
        status=403,
    )
