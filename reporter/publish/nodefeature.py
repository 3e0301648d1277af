"""Publishing through Node Feature Discovery: one NodeFeature object instead of a Node patch.

Many clusters refuse a DaemonSet that may patch every Node (RBAC cannot narrow `patch nodes` to one
Node). There nfd-master does the labelling: the agent writes one `nfd.k8s-sigs.io/v1alpha1`
NodeFeature in its own namespace, labelled `nfd.node.kubernetes.io/node-name: <node>` (and, as
every object an agent writes besides its Node, `<prefix>/node: <node>`, which says which install
wrote it: `reporter.schema.keys.OWNER_NODE`), with our labels in `spec.labels` and the topology
as NFD features in `spec.features`, and needs only a namespaced Role: `get`, `create` and `update`
on `nodefeatures` (`RBAC_VERBS`), and `create` on events in `default`, where Events about a Node go
(NODE_EVENT_NAMESPACE).

The object is ours alone, so it is replaced whole (`update`, with its resourceVersion) when it
must change: a label the agent no longer produces goes with the old `spec.labels`, and nfd-master
removes it from the Node. Nothing is sent when the object already carries what is wanted. This
module never touches a Node and never writes another NodeFeature (nfd-worker's, GPU Feature
Discovery's). nfd-master applies labels, not our annotations: the `topology` and `matrix`
documents stay in the object, under the attribute feature `gputopology.annotations`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from parsers.errors import excerpt
from reporter.errors import ApiTransientError, ConfigError, PublishError
from reporter.publish import retry
from reporter.publish.api import EVENTS, NODE_FEATURES, ApiClient
from reporter.publish.client import NODE_EVENT_NAMESPACE, EventType, event_body
from reporter.publish.patch import Desired, NodeMetadata, desired, under_prefix
from reporter.schema import keys
from reporter.schema.codec import expand

GROUP = NODE_FEATURES.group
VERSION = NODE_FEATURES.version
PLURAL = NODE_FEATURES.plural
KIND = NODE_FEATURES.kind
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
"""How nfd-master finds the NodeFeature objects of a Node."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "topo-reporter"
NAME_SUFFIX = "-topo-reporter"
RBAC_VERBS = frozenset({"get", "create", "update"})
"""Every verb the sink uses on nodefeatures; the chart's Role grants exactly these."""

# Feature set names: NFD's `<domain>.<feature>`, one dot, so NodeFeatureRule templates can use them.
NODE_FEATURE = "gputopology.node"
ANNOTATIONS_FEATURE = "gputopology.annotations"
GPU_FEATURE = "gputopology.gpu"
NIC_FEATURE = "gputopology.nic"
NUMA_FEATURE = "gputopology.numa"

_DOCUMENTS = (keys.TOPOLOGY, keys.MATRIX)
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE_MAX = 63


def object_name(node: str) -> str:
    """The NodeFeature's name for `node` (`<node>-topo-reporter`, as NFD's docs name vendors').

    Raises ConfigError when the node name cannot be a label value: nfd-master finds the object by
    the label `nfd.node.kubernetes.io/node-name`, so longer names cannot use this sink at all.
    """
    if not _DNS1123_SUBDOMAIN.fullmatch(node):
        raise ConfigError(
            f"node name {excerpt(node)} is not a lower-case DNS subdomain: pass the Node's name as "
            "`kubectl get nodes` shows it (--node, TOPO_REPORTER_NODE or NODE_NAME)"
        )
    if len(node) > _LABEL_VALUE_MAX:
        raise ConfigError(
            f"node name {excerpt(node)} has {len(node)} characters: nfd-master finds NodeFeature "
            f"objects by the label {NODE_NAME_LABEL}, whose value is at most {_LABEL_VALUE_MAX} "
            "characters; use --sink node on this node"
        )
    return node + NAME_SUFFIX


# -- the object: a pure projection of the desired labels and annotations ----------------------


def _text(value: Any) -> str | None:
    """NFD feature values are strings; unknown (None) becomes an absent attribute."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _attributes(values: Mapping[str, Any]) -> dict[str, str]:
    return {k: t for k, v in values.items() if (t := _text(v)) is not None}


def _instances(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"elements": [{"attributes": _attributes(item)} for item in items]}


def features(label_values: Mapping[str, str], document: Mapping[str, Any]) -> dict[str, Any]:
    """NFD's Features from the labels (short names) and the v1 topology document.

    `gputopology.node`: the label values plus source, driver and nvswitch; `gputopology.gpu`: one
    instance per GPU (index, uuid, pci, model, numa, cpus, mem_mib, mig, ..., its matrix row as
    `links`, `nvlink_peers` and its `island`); `gputopology.nic` and `gputopology.numa` likewise.
    Every value is a string; a value the source does not know is absent.
    """
    gpus = document.get("gpus", [])
    rows = [str(r).split() for r in document.get("links", [])]
    islands = document.get("islands", [])
    nvlink_observed = document.get("nvlink_observed", True)
    gpu_items = []
    for gpu in gpus:
        i = gpu["index"]
        item = dict(gpu)
        item["links"] = document["links"][i]
        if nvlink_observed:
            item["nvlink_peers"] = [j for j, t in enumerate(rows[i]) if t.startswith("NV")]
        item["island"] = next((n for n, members in enumerate(islands) if i in members), None)
        gpu_items.append(item)
    node: dict[str, Any] = dict(label_values)
    node.update(
        source=document.get("source"),
        driver=document.get("driver"),
        nvswitch=document.get("nvswitch", False),
    )
    return {
        "flags": {},
        "attributes": {NODE_FEATURE: {"elements": _attributes(node)}},
        "instances": {
            GPU_FEATURE: _instances(gpu_items),
            NIC_FEATURE: _instances(list(document.get("nics", []))),
            NUMA_FEATURE: _instances(list(document.get("numa_nodes", []))),
        },
    }


def spec(want: Desired, prefix: str) -> dict[str, Any]:
    """The NodeFeature spec carrying `want`: its labels, and its documents as features."""
    topology = want.annotations.get(keys.key(prefix, keys.TOPOLOGY))
    # The annotation writes the GPUs' shared fields once: the features list each GPU whole.
    document = expand(json.loads(topology)) if topology is not None else {}
    short = {k.removeprefix(prefix + "/"): v for k, v in want.labels.items()}
    out = features(short, document)
    documents = {
        n: v for n in _DOCUMENTS if (v := want.annotations.get(keys.key(prefix, n))) is not None
    }
    out["attributes"][ANNOTATIONS_FEATURE] = {"elements": documents}
    return {"labels": dict(want.labels), "features": out}


def node_feature(
    want: Desired, *, node: str, namespace: str, prefix: str, current: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The whole object to create (`current` None) or to replace `current` with.

    Replacing keeps what others put in `metadata` and `status` (their labels, annotations,
    owner references) and sends `current`'s resourceVersion, so a concurrent change is a 409. It
    drops another prefix's owner label (`<other prefix>/node`): the object is this install's
    now, and prune under that prefix must leave it alone.
    """
    metadata = dict(current.get("metadata") or {}) if current is not None else {}
    metadata.update(name=object_name(node), namespace=namespace)
    labels = metadata.get("labels") or {}
    stale = keys.owner_keys(labels)
    metadata["labels"] = {
        **{k: v for k, v in labels.items() if k not in stale},
        NODE_NAME_LABEL: node,
        MANAGED_BY_LABEL: MANAGER,
        keys.key(prefix, keys.OWNER_NODE): node,
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": spec(want, prefix),
        # Newer NFD CRDs list `status` as required (their Go client always sends one); older
        # ones prune it: an empty status is accepted by both.
        "status": (current or {}).get("status") or {},
    }


def _ownership(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The labels that say whose the object is: NFD's node label, ours, every owner label."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    owners = keys.owner_keys(labels)
    return {
        k: v for k, v in labels.items() if k in (NODE_NAME_LABEL, MANAGED_BY_LABEL) or k in owners
    }


def carries(current: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether `current` already is `body` where it matters: the spec and the labels that say
    whose it is (an object without this prefix's owner label, or with another's, is written)."""
    return current.get("spec") == body["spec"] and _ownership(current) == _ownership(body)


def read_back(obj: Mapping[str, Any] | None, prefix: str) -> Desired:
    """What a NodeFeature carries, read back as the labels and annotations it stands for."""
    if obj is None:
        return Desired({}, {})
    spec_ = obj.get("spec") or {}
    labels = {
        k: v
        for k, v in (spec_.get("labels") or {}).items()
        if isinstance(v, str) and under_prefix(k, prefix)
    }
    attributes = (spec_.get("features") or {}).get("attributes") or {}
    elements = (attributes.get(ANNOTATIONS_FEATURE) or {}).get("elements") or {}
    annotations = {
        keys.key(prefix, n): v for n in _DOCUMENTS if isinstance(v := elements.get(n), str)
    }
    return desired(labels, annotations, prefix)


# -- the sink ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Read:
    """The object as last read or written; `obj` None: read, and there is none."""

    obj: dict[str, Any] | None


class NodeFeatureSink:
    """Keeps one NodeFeature carrying the topology: one GET when unknown, one write per change."""

    def __init__(
        self,
        api: ApiClient,
        *,
        node: str,
        prefix: str,
        namespace: str,
        stop: threading.Event,
        backoff: retry.Backoff,
        log: structlog.typing.FilteringBoundLogger,
        on_error: retry.OnError = lambda e: None,
        on_wait: retry.OnWait = lambda seconds: None,
    ) -> None:
        """Raises ConfigError when `node` cannot be published through NFD (see object_name)."""
        self._api = api
        self._node = node
        self._name = object_name(node)
        self._prefix = prefix
        self._namespace = namespace
        self._log = log.bind(nodefeature=f"{namespace}/{self._name}")
        self._on_error = on_error
        self._retry = retry.Retrying(stop, backoff, self._log, on_error, on_wait)
        self._known: _Read | None = None

    def _current(self) -> dict[str, Any] | None:
        if self._known is None:
            self._known = _Read(self._api.get(NODE_FEATURES, self._name, self._namespace))
            version = (
                None
                if self._known.obj is None
                else self._known.obj["metadata"].get("resourceVersion")
            )
            self._log.debug(
                "nodefeature_read", exists=self._known.obj is not None, resource_version=version
            )
        return self._known.obj

    def published(self) -> Desired:
        return read_back(self._retry(self._current, what="read nodefeature"), self._prefix)

    def publish(self, want: Desired) -> bool:
        def attempt() -> bool:
            current = self._current()
            body = node_feature(
                want,
                node=self._node,
                namespace=self._namespace,
                prefix=self._prefix,
                current=current,
            )
            if current is not None and carries(current, body):
                return False
            try:
                if current is None:
                    written = self._api.create(NODE_FEATURES, body, self._namespace)
                else:
                    written = self._api.replace(NODE_FEATURES, self._name, body, self._namespace)
            except ApiTransientError:
                # A conflict, a vanished object, or a write that may have landed: read again.
                self._known = None
                raise
            # Remember the spec as sent: an apiserver that prunes or defaults a field must not
            # make every later step look like a change (the next resync compares what is stored).
            self._known = _Read({**written, "spec": body["spec"]})
            self._log.info(
                "nodefeature_created" if current is None else "nodefeature_updated",
                labels=sorted(body["spec"]["labels"]),
                resource_version=written.get("metadata", {}).get("resourceVersion"),
            )
            return True

        try:
            return self._retry(attempt, what="write nodefeature")
        except PublishError:
            self._known = None
            raise

    def forget(self) -> None:
        self._known = None

    def event(self, event_type: EventType, reason: str, message: str) -> None:
        # No right to read the Node, so no uid: like the kubelet, the Node's name stands for it,
        # which is what `kubectl describe node` also looks for. One attempt, as for the node sink.
        node = NodeMetadata(self._node, uid=self._node)
        body = event_body(node, event_type, reason, message, datetime.now(UTC))
        try:
            self._api.create(EVENTS, body, NODE_EVENT_NAMESPACE)
        except PublishError as e:
            # A failed Event is still a failed API call, counted like every other.
            self._on_error(e)
            raise
