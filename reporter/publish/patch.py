"""The minimal patch from what a Node carries to what the agent wants it to carry.

Pure: current labels and annotations, desired ones and the prefix in; a JSON merge patch (or None
when nothing differs) out. It sets only desired keys (all under the prefix, or one of the foreign
keys the caller names: Topograph's tier labels, `keys.TOPOGRAPH_TIER_KEYS`, which only
`--network-label-style topograph` passes), deletes only keys that the previous `<prefix>/owned`
annotation lists and that are so, never a key in the
Kubernetes-reserved namespaces (`kubernetes.io`, `k8s.io`, their subdomains), and never names any
other key, so a foreign label or annotation cannot be changed or removed by construction.
Opted in, it also keeps one taint of ours (`<prefix>/fabric-health`) on or off the Node: a merge
patch replaces the whole `spec.taints` list, so the patch carries every other taint as it was read,
in its order, and changes only ours.
The patch carries `metadata.resourceVersion`: the apiserver answers 409 if the Node changed since
it was read (another writer's taints included), and the caller re-reads and recomputes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parsers.errors import excerpt
from reporter.errors import ApiPermanentError
from reporter.schema import keys

ANNOTATION_BUDGET_BYTES = 256 * 1024
"""The apiserver's limit on all annotations of one object together (sum of key and value bytes)."""


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    """The part of a Node the publisher reads: its labels, annotations, taints and version."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str | None = None
    uid: str | None = None
    taints: tuple[Mapping[str, Any], ...] = ()
    """`spec.taints` as the API returned them, in order: others' are sent back unchanged."""


def node_metadata(node: Mapping[str, Any]) -> NodeMetadata:
    """The part of a Node object the publisher reads."""
    meta = node.get("metadata") or {}
    taints = (node.get("spec") or {}).get("taints") or ()
    return NodeMetadata(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        resource_version=meta.get("resourceVersion"),
        uid=meta.get("uid"),
        taints=tuple(dict(t) for t in taints if isinstance(t, Mapping)),
    )


@dataclass(frozen=True, slots=True)
class OwnTaint:
    """The one taint the agent manages on its Node: present with `value`, or absent (None)."""

    key: str
    value: str | None
    effect: str = keys.FABRIC_TAINT_EFFECT

    def wanted(self) -> list[dict[str, str]]:
        """The taint as `spec.taints` holds it; empty when it should be absent."""
        if self.value is None:
            return []
        return [{"key": self.key, "value": self.value, "effect": self.effect}]


@dataclass(frozen=True, slots=True)
class Desired:
    """The labels and annotations the agent wants on its Node, `owned` included, and its taint."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taint: OwnTaint | None = None
    """Opted in: the agent's taint, on or off; None leaves the Node's taints alone."""


def under_prefix(key: str, prefix: str) -> bool:
    """True for a key the agent may write or delete: under the prefix, never Kubernetes-reserved.

    Settings refuse a reserved prefix; this holds even where one slips through, so that no
    `owned` list, however edited, can make the agent touch `kubernetes.io/hostname`.
    """
    return key.startswith(prefix + "/") and keys.reserved_domain(key.partition("/")[0]) is None


def ownable(key: str, prefix: str, foreign: frozenset[str] = frozenset()) -> bool:
    """True for a key the agent may write, list in `owned` and delete: under the prefix, or one
    of the `foreign` keys it was told it writes (by exact key: `fabric.topograph.run/tier-0`, with
    `--network-label-style topograph` only). Without that style no foreign key is ever deleted,
    whatever the `owned` annotation (which anyone who can edit the Node can write) lists."""
    return under_prefix(key, prefix) or key in foreign


def desired(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    prefix: str,
    taint: OwnTaint | None = None,
    foreign: frozenset[str] = frozenset(),
) -> Desired:
    """Desired metadata with the `owned` annotation listing every other key it carries.

    Raises ValueError for a key outside the prefix (a label, an annotation or the taint's) but
    the `foreign` ones: the agent never writes one.
    """
    owned_key = keys.key(prefix, keys.OWNED)
    outside = sorted(k for k in (*labels, *annotations) if not ownable(k, prefix, foreign))
    if outside or owned_key in annotations:
        raise ValueError(f"refusing to own keys outside {prefix}/ or the owned key: {outside}")
    # Names without the prefix: every owned key is under it, and the prefix written once per key
    # cost a DGX H100 Node 208 bytes sent to every Node watcher on every update. Topograph's
    # keys are listed whole.
    owned = ",".join(
        sorted(
            k[len(prefix) + 1 :] if under_prefix(k, prefix) else k for k in {*labels, *annotations}
        )
    )
    if taint is not None and not under_prefix(taint.key, prefix):
        raise ValueError(f"refusing a taint outside {prefix}/: {excerpt(taint.key)}")
    return Desired(dict(labels), {**annotations, owned_key: owned}, taint)


def owned(
    annotations: Mapping[str, str], prefix: str, foreign: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The keys the `owned` annotation lists, keeping only those under the prefix and the
    `foreign` ones the agent writes.

    An entry is a name under the prefix (`count`), or a full key as earlier builds wrote it
    (`gpu.topology.io/count`) and as Topograph's are (`fabric.topograph.run/tier-0`). The filter
    matters: the annotation is writable by anyone who can edit the Node, and a key outside the
    prefix listed there must still never be deleted.
    """
    text = annotations.get(keys.key(prefix, keys.OWNED), "")
    listed = (k.strip() for k in text.split(","))
    full = (k if "/" in k else keys.key(prefix, k) for k in listed if k)
    return frozenset(k for k in full if ownable(k, prefix, foreign))


def ours(current: NodeMetadata, prefix: str, foreign: frozenset[str] = frozenset()) -> Desired:
    """What of the Node's metadata is under the prefix (its labels also the `foreign` keys the
    agent writes): what the agent may have published."""
    return Desired(
        {k: v for k, v in current.labels.items() if ownable(k, prefix, foreign)},
        {k: v for k, v in current.annotations.items() if under_prefix(k, prefix)},
    )


def section_changes(
    current: Mapping[str, str], wanted: Mapping[str, str], deletable: Iterable[str]
) -> dict[str, str | None]:
    """The merge patch of one map (labels or annotations): what `wanted` sets or changes, and
    None for each key of `deletable` that `current` has and `wanted` has not."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    changes.update({k: None for k in sorted(deletable) if k in current and k not in wanted})
    return changes


def metadata_patch(
    labels: Mapping[str, str | None],
    annotations: Mapping[str, str | None],
    resource_version: str | None = None,
) -> dict[str, Any] | None:
    """The JSON merge patch of a Node's metadata with these changes; None when there are none."""
    if not labels and not annotations:
        return None
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def _taint_fields(taint: Mapping[str, Any]) -> tuple[object, object, object]:
    # timeAdded is the server's (set for NoExecute only): not ours to compare.
    return (taint.get("key"), taint.get("value"), taint.get("effect"))


def taints_change(current: NodeMetadata, want: OwnTaint | None) -> list[dict[str, Any]] | None:
    """The Node's whole new `spec.taints` when the agent's own taint must change: every other
    taint as read, in order, then ours if it should be there. None when ours is already as
    wanted, or when the agent manages no taint (`want` None)."""
    if want is None:
        return None
    mine = [_taint_fields(t) for t in current.taints if t.get("key") == want.key]
    if mine == [_taint_fields(t) for t in want.wanted()]:
        return None
    others = [dict(t) for t in current.taints if t.get("key") != want.key]
    return [*others, *want.wanted()]


def minimal_patch(
    current: NodeMetadata, want: Desired, prefix: str, foreign: frozenset[str] = frozenset()
) -> dict[str, Any] | None:
    """The JSON merge patch bringing `current` to `want`; None when nothing differs. `foreign`:
    the keys outside the prefix the agent writes (and so may delete)."""
    for k in (*want.labels, *want.annotations):
        if not ownable(k, prefix, foreign):
            raise ValueError(f"desired key {excerpt(k)} is outside the prefix {excerpt(prefix)}")
    if want.taint is not None and not under_prefix(want.taint.key, prefix):
        raise ValueError(f"desired taint {excerpt(want.taint.key)} is outside {excerpt(prefix)}")
    deletable = owned(current.annotations, prefix, foreign)
    body = metadata_patch(
        section_changes(current.labels, want.labels, deletable),
        section_changes(current.annotations, want.annotations, deletable),
        current.resource_version,
    )
    taints = taints_change(current, want.taint)
    if taints is None:
        return body
    if body is None:
        # The whole list is sent: only a Node unchanged since it was read may take it.
        body = {"metadata": {}}
        if current.resource_version is not None:
            body["metadata"]["resourceVersion"] = current.resource_version
    # An empty list is sent as null: merge patch removes the field, as `kubectl taint ... -` does.
    body["spec"] = {"taints": taints or None}
    return body


def apply(current: NodeMetadata, patch: Mapping[str, Any]) -> NodeMetadata:
    """The metadata the Node will carry once `patch` is applied (merge patch semantics)."""
    metadata = patch.get("metadata", {})

    def merged(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
        out = dict(base)
        for k, v in changes.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    spec = patch.get("spec") or {}
    return NodeMetadata(
        current.name,
        merged(current.labels, metadata.get("labels", {})),
        merged(current.annotations, metadata.get("annotations", {})),
        current.resource_version,
        current.uid,
        tuple(spec.get("taints") or ()) if "taints" in spec else current.taints,
    )


def annotation_bytes(annotations: Mapping[str, str]) -> int:
    """Size as the apiserver counts it: the bytes of every key and value."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


def check_annotation_budget(current: NodeMetadata, patch: Mapping[str, Any], prefix: str) -> None:
    """Refuse a patch that would take the Node's annotations over the apiserver's 256 KiB.

    Raises ApiPermanentError naming the sizes, ours and everyone else's.
    """
    after = apply(current, patch).annotations
    total = annotation_bytes(after)
    if total <= ANNOTATION_BUDGET_BYTES:
        return
    mine = annotation_bytes({k: v for k, v in after.items() if under_prefix(k, prefix)})
    raise ApiPermanentError(
        f"node {current.name}: annotations would total {total} bytes, over the apiserver's "
        f"{ANNOTATION_BUDGET_BYTES}-byte limit ({mine} bytes under {prefix}/, {total - mine} "
        "from others): remove large foreign annotations from the node or shorten the prefix",
        status=422,
    )
