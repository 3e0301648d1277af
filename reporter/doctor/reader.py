"""The doctor's reads: Nodes, the agent's pods, its Events and the DRA objects, from the API.

This is the part that reads. `ClusterReader` is the seam (a fake in the tests, `ApiClusterReader`
over reporter.publish.api in the commands); `examine` reads what one Node needs, decodes its
topology annotation and hands everything to the pure checks of reporter.doctor.node. A read the
operator may not make is unknown (None), never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from reporter.doctor.groups import WORKLOAD_GROUP, WORKLOAD_VERSIONS
from reporter.doctor.model import (
    GPU_RESOURCE,
    AgentObservation,
    Code,
    DraObservation,
    Finding,
    Severity,
    field,
    node_annotations,
)
from reporter.doctor.node import node_findings
from reporter.doctor.templates import TEMPLATE_GROUP, covered_digests
from reporter.errors import ApiPermanentError, SchemaError
from reporter.publish.api import (
    DRA_VERSIONS,
    EVENTS,
    NODES,
    PODS,
    ApiClient,
    Resource,
    newest_served,
    resource_claims,
    resource_slices,
)
from reporter.publish.client import (
    COMPONENT,
    DEGRADED_REASON,
    FINDING_REASONS,
    NODE_EVENT_NAMESPACE,
)
from reporter.schema import dra, keys
from reporter.schema.codec import decode
from reporter.schema.keys import AGENT_POD_SELECTOR
from reporter.schema.model import Topology


class ClusterReader(Protocol):
    """What the doctor reads from the API: nodes, the agent's pods, and Events on a node.

    Each returns plain dicts as the API serves them; a read the caller may not make returns None
    (RBAC lets many operators read nodes but not pods or events).
    """

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None: ...

    def node_events(self, node: str) -> list[dict[str, Any]] | None: ...

    def dra(self, node: str) -> DraObservation: ...


def dra_observation(
    node: str, slices: list[dict[str, Any]] | None, claims: list[dict[str, Any]] | None
) -> DraObservation:
    """What the cluster's ResourceSlices and ResourceClaims (as the API lists them) say of
    NVIDIA's GPUs on `node`."""
    mine = None
    if slices is not None:
        mine = sum(
            1
            for s in slices
            if (spec := field(s, "spec")).get("driver") == dra.DRIVER
            and node in (spec.get("nodeName"), field(spec, "pool").get("name"))
        )
    held = None
    if claims is not None:
        found: list[tuple[str, str]] = []
        for claim in claims:
            meta = field(claim, "metadata")
            devices = field(field(field(claim, "status"), "allocation"), "devices")
            results = devices.get("results")
            for result in results if isinstance(results, list) else ():
                if (
                    isinstance(result, dict)
                    and result.get("driver") == dra.DRIVER
                    and result.get("pool") == node
                ):
                    found.append(
                        (f"{meta.get('namespace')}/{meta.get('name')}", str(result.get("device")))
                    )
        held = tuple(sorted(found))
    return DraObservation(slices=mine, claims=held)


class ApiClusterReader:
    """ClusterReader over the ApiClient seam (reporter.publish.api). Pods and Events are optional
    reads: where the operator's credentials may not list them, the answer is None (unknown)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        agent_selector: str = AGENT_POD_SELECTOR,
        namespace: str | None = None,
        tool: str = "topo-reporter doctor",
    ) -> None:
        """`namespace`: where the agent runs, to look up its pods there only (None: every
        namespace); its Events are read where it posts them (NODE_EVENT_NAMESPACE) only. `tool`:
        the command that 403 messages say needs the permission."""
        self._api = api
        self._agent_selector = agent_selector
        self._namespace = namespace
        self._tool = tool
        self._dra_lists: dict[str, list[dict[str, Any]] | None] = {}

    def _forbidden(self, what: str, resource: Resource) -> ApiPermanentError:
        return ApiPermanentError(
            f"{what}: forbidden (403): `{self._tool}` needs get and list on `{resource.plural}` "
            "(the built-in `view` ClusterRole does not cover nodes: bind one that does)",
            status=403,
        )

    def list_nodes(self) -> list[dict[str, Any]]:
        try:
            return list(self._api.list(NODES)["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                raise self._forbidden("list nodes", NODES) from e
            raise

    def get_node(self, name: str) -> dict[str, Any]:
        try:
            node = self._api.get(NODES, name)
        except ApiPermanentError as e:
            if e.status == 403:
                raise self._forbidden(f"node {name}", NODES) from e
            raise
        if node is None:
            raise ApiPermanentError(f"node {name}: not found (404)", status=404)
        return node

    def _optional(
        self, resource: Resource, namespace: str | None, query: Mapping[str, str]
    ) -> list[dict[str, Any]] | None:
        try:
            return list(self._api.list(resource, namespace, query=query)["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                return None
            raise

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None:
        query = {"labelSelector": self._agent_selector, "fieldSelector": f"spec.nodeName={node}"}
        return self._optional(PODS, self._namespace, query)

    def node_events(self, node: str) -> list[dict[str, Any]] | None:
        selector = f"involvedObject.kind=Node,involvedObject.name={node}"
        return self._optional(EVENTS, NODE_EVENT_NAMESPACE, {"fieldSelector": selector})

    def _dra_list(self, kind: str) -> list[dict[str, Any]] | None:
        """Every ResourceSlice or ResourceClaim, listed once per reader in the newest version
        served; None where none is served (404) or the operator may not list them (403)."""
        if kind not in self._dra_lists:
            self._dra_lists[kind] = None
            make = resource_slices if kind == "slices" else resource_claims
            self._dra_lists[kind] = newest_served(
                DRA_VERSIONS, lambda version: list(self._api.list(make(version))["items"])
            )
        return self._dra_lists[kind]

    def resource_slices(self) -> list[dict[str, Any]] | None:
        """Every ResourceSlice (the list `dra` reads), for the template findings; None where
        none is served or the operator may not list them."""
        return self._dra_list("slices")

    def dra(self, node: str) -> DraObservation:
        return dra_observation(node, self._dra_list("slices"), self._dra_list("claims"))

    def workloads(self) -> list[dict[str, Any]] | None:
        """Kueue's Workloads in every namespace, in the newest version served; None where Kueue
        is not installed (404) or the operator may not list them (403)."""
        page = self._newest(WORKLOAD_GROUP, WORKLOAD_VERSIONS, "workloads", "Workload")
        return None if page is None else list(page["items"])

    def dra_templates(self, prefix: str) -> list[dict[str, Any]] | None:
        """The ResourceClaimTemplates in every namespace that carry our
        `<prefix>/dra-template-machines` annotation, in the newest version served; None where
        none is served (404) or the operator may not list them (403)."""
        page = self._newest(
            TEMPLATE_GROUP, DRA_VERSIONS, "resourceclaimtemplates", "ResourceClaimTemplate"
        )
        if page is None:
            return None
        items = page.get("items") if isinstance(page, Mapping) else None
        return [
            t
            for t in (items if isinstance(items, list) else ())
            if covered_digests(t, prefix) is not None
        ]

    def _newest(
        self, group: str, versions: Sequence[str], plural: str, kind: str
    ) -> dict[str, Any] | None:
        """The list of a namespaced resource in every namespace, in the newest of `versions`
        served; None where none is served (404) or the operator may not list it (403)."""
        return newest_served(
            versions,
            lambda version: self._api.list(Resource(group, version, plural, kind, True)),
        )


def is_agent_event(event: Mapping[str, Any], node: str) -> bool:
    """An Event the agent on `node` could have posted about it: in NODE_EVENT_NAMESPACE, from
    COMPONENT, about the cluster-scoped Node (no involvedObject namespace), reported by `node`
    itself (reportingInstance and source.host), as reporter.publish.client writes it.

    The API server takes an Event about a Node in any namespace whose name the involvedObject
    repeats, so whoever may create Events there can write any reason, source and message about
    any Node. The chart's `<fullname>-own-events` policy lets an agent post only Events about
    its own Node that name no other reporter; so another node's agent cannot have written one
    that passes here (an operator with `create events` still could)."""
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return (
        (event.get("metadata") or {}).get("namespace") == NODE_EVENT_NAMESPACE
        and source.get("component") == COMPONENT
        and source.get("host") == node
        and event.get("reportingComponent") == COMPONENT
        and event.get("reportingInstance") == node
        and involved.get("kind") == "Node"
        and involved.get("name") == node
        and not involved.get("namespace")
    )


def observe_agent(reader: ClusterReader, node: str) -> AgentObservation:
    """What the cluster says about the agent on `node` (unknown parts stay None)."""
    pods = reader.agent_pods(node)
    ready: bool | None = None
    if pods:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for pod in pods
            for c in (pod.get("status") or {}).get("conditions") or []
        )
    events = reader.node_events(node)
    degraded = _latest(events, node, DEGRADED_REASON)
    silent = _latest(events, node, FINDING_REASONS[Code.ROCE_PORT_SILENT])
    return AgentObservation(
        pod_found=None if pods is None else bool(pods),
        pod_ready=ready,
        degraded_reason=None if degraded is None else str(degraded.get("message")),
        silent_ports=None if silent is None else (_when(silent), str(silent.get("message"))),
    )


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def _latest(
    events: list[dict[str, Any]] | None, node: str, reason: str
) -> Mapping[str, Any] | None:
    """The agent's latest Event about `node` with `reason`; None where it posted none."""
    mine = [e for e in events or [] if e.get("reason") == reason and is_agent_event(e, node)]
    return sorted(mine, key=_when)[-1] if mine else None


def examine(reader: ClusterReader, node: dict[str, Any], prefix: str) -> list[Finding]:
    """Every finding for one Node: its annotation decoded, its agent observed."""
    annotation = node_annotations(node).get(keys.key(prefix, keys.TOPOLOGY))
    topology: Topology | None = None
    findings: list[Finding] = []
    if annotation is not None:
        try:
            topology = decode(annotation)
        except SchemaError as e:
            findings.append(
                Finding(
                    code=Code.TOPOLOGY_UNREADABLE,
                    severity=Severity.ERROR,
                    summary="the topology annotation does not validate: schedulers ignore it",
                    evidence=(str(e),),
                    fix="someone edited it by hand or another tool wrote it: delete the annotation "
                    "and the agent republishes within one resync",
                )
            )
    name = str((node.get("metadata") or {}).get("name", "?"))
    agent = observe_agent(reader, name)
    return findings + node_findings(node, topology, prefix, agent, reader.dra(name))


def is_gpu_node(node: Mapping[str, Any], prefix: str) -> bool:
    """A Node the kubelet gives GPUs to, or one our agent published on."""
    status = node.get("status") or {}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return (
        GPU_RESOURCE in (status.get("capacity") or {})
        or keys.key(prefix, keys.TOPOLOGY) in annotations
    )
