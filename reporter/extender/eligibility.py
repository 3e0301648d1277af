"""Whether a pod may run on a node, as kube-scheduler's own filters judge it, from what the
extender can see: what the hold for a connected set waits for must be a node the pod could use.

kube-scheduler sends the extender only the nodes that passed its own filters, so the candidates of
a call need no judging here. The nodes worth waiting for are another matter: a busy NVSwitch node
fails the scheduler's resource fit and never reaches the extender, so the extender judges it
itself, with the Kubernetes semantics of the filters that do not depend on the pods running
there:

- NodeUnschedulable: a cordoned node (`spec.unschedulable`) takes a pod only if it tolerates the
  `node.kubernetes.io/unschedulable:NoSchedule` taint;
- TaintToleration: every `NoSchedule` and `NoExecute` taint of the node must be tolerated
  (`PreferNoSchedule` never excludes); a node whose Ready condition is `False` counts as
  tainted `node.kubernetes.io/not-ready:NoSchedule` (`unreachable` when `Unknown`), as the node
  lifecycle controller taints it (a node without the condition is not judged by it);
- NodeAffinity: the pod's `nodeSelector` (every pair equal) and its
  `requiredDuringSchedulingIgnoredDuringExecution` node affinity: terms ORed, a term's expressions
  and fields ANDed, an empty term matching nothing; operators `In`, `NotIn` (true when the label is
  absent), `Exists`, `DoesNotExist`, `Gt` and `Lt` (the label and the one value as integers);
  `matchFields` on `metadata.name` with `In` and `NotIn`.

What it cannot see (so a node passing here may still refuse the pod): the pods on the node (pod
affinity and anti-affinity, topology spread, host ports), volumes and their zones, DRA claims,
resources other than the GPUs, and any filter plugin or extender of the scheduler's own.
A pod whose placement does not read, or holds more than the check reads (`MAX_PLACEMENT_CHECKS`
terms, expressions, fields, selector pairs and tolerations, `MAX_PLACEMENT_VALUES` values), is
judged as free to run anywhere (`ANYWHERE`): as before, the hold is then decided over every node;
it never makes a request fail. So judging one node costs at most MAX_PLACEMENT_CHECKS lookups
(tolerations: for each of its taints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from sys import intern
from typing import Any

__all__ = [
    "ANYWHERE",
    "MAX_PLACEMENT_CHECKS",
    "MAX_PLACEMENT_VALUES",
    "NOT_READY_TAINT",
    "OPEN_NODE",
    "UNREACHABLE_TAINT",
    "UNSCHEDULABLE_TAINT",
    "NodeFacts",
    "Placement",
    "Taint",
    "node_facts",
    "placement",
]

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
_EXCLUDING = frozenset({"NoSchedule", "NoExecute"})
_MAX_ITEMS = 1024
"""More taints or conditions than any Node the API server admits holds (its whole size is
bounded): a longer list is not read."""
MAX_PLACEMENT_CHECKS = 128
"""The most a pod's placement may hold for the hold check to read it: its nodeSelector pairs, its
required node affinity's terms and their expressions and fields, and its tolerations, together.
The check judges the placement against every node worth waiting for, and its cost per node grows
with these (issue 41, item 3: 34,000 expressions, 3.4 ms a node, 6 s a call at 2,000 nodes; at
this bound 33 to 45 ms, bench/README.md). Real pods hold a few dozen; a larger placement reads
as ANYWHERE."""
MAX_PLACEMENT_VALUES = 1024
"""The most values the affinity's expressions and fields may hold together (an `In` of a few
hundred host names fits). Each is looked up in a set, so they cost the per-node check nothing
more; this bounds reading them. More read as ANYWHERE."""


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint that can exclude pods: key, value and effect (`NoSchedule`, `NoExecute`)."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the extender knows of a node beyond its availability: where pods may go."""

    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    """The taints that exclude a pod not tolerating them, with the node lifecycle controller's
    for a cordoned node and for a node that is not Ready."""


OPEN_NODE = NodeFacts({})
"""A node of which nothing is known: no labels, no taints."""


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """The facts of a Node object (whole, as a list or watch sends it); what does not read is
    left out (a node without labels, taints, or conditions)."""
    meta = node.get("metadata")
    spec = node.get("spec")
    status = node.get("status")
    raw_labels = meta.get("labels") if isinstance(meta, dict) else None
    # Interned: nodes share most label keys and many values (`kubernetes.io/os`, `linux`), and
    # the cache keeps every node's labels for as long as the node lives.
    labels = (
        {
            intern(k): intern(v)
            for k, v in raw_labels.items()
            if isinstance(k, str) and isinstance(v, str)
        }
        if isinstance(raw_labels, dict)
        else {}
    )
    taints: list[Taint] = []
    raw_taints = spec.get("taints") if isinstance(spec, dict) else None
    if isinstance(raw_taints, list):
        for t in raw_taints[:_MAX_ITEMS]:
            if not isinstance(t, dict) or t.get("effect") not in _EXCLUDING:
                continue
            key, value = t.get("key"), t.get("value") or ""
            if isinstance(key, str) and isinstance(value, str):
                taints.append(Taint(key, value, t["effect"]))
    if isinstance(spec, dict) and spec.get("unschedulable") is True:
        taints.append(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule"))
    ready = _ready(status)
    if ready is not None and ready != "True":
        # The node lifecycle controller's taints: Unknown (no heartbeat) reads as unreachable.
        # Without a Ready condition nothing is known (the kubelet taints a node it registers).
        key = UNREACHABLE_TAINT if ready == "Unknown" else NOT_READY_TAINT
        taints.append(Taint(key, "", "NoSchedule"))
    return NodeFacts(labels, tuple(dict.fromkeys(taints)))


def _ready(status: Any) -> Any:
    """The status of the Ready condition; None without one."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for c in conditions[:_MAX_ITEMS] if isinstance(conditions, list) else ():
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status")
    return None


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    operator: str
    values: tuple[str, ...]
    members: frozenset[str]
    """The values as a set: `In` and `NotIn` look a label up in it, whatever their number."""

    def matches(self, found: str | None) -> bool:
        op = self.operator
        if op == "In":
            return found is not None and found in self.members
        if op == "NotIn":
            return found is None or found not in self.members
        if op == "Exists":
            return found is not None
        if op == "DoesNotExist":
            return found is None
        # Gt and Lt: one value, both sides integers (the API server checks the value).
        if found is None or len(self.values) != 1:
            return False
        have, want = _int64(found), _int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want


_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")


def _int64(text: str) -> int | None:
    """`text` as Go's strconv.ParseInt(text, 10, 64) reads it; None where it refuses it."""
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


@dataclass(frozen=True, slots=True)
class _Term:
    expressions: tuple[_Requirement, ...]
    fields: tuple[_Requirement, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False  # an empty term matches no node (k8s.io/component-helpers)
        return all(r.matches(labels.get(r.key)) for r in self.expressions) and all(
            r.matches(name if r.key == "metadata.name" else None) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class _Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        # k8s.io/api core/v1 Toleration.ToleratesTaint: an empty key with Exists tolerates all.
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod may run, as far as the extender judges it (see the module docstring)."""

    selector: Mapping[str, str]
    terms: tuple[_Term, ...] | None
    """The required node affinity's terms; None without one (every node matches)."""
    tolerations: tuple[_Toleration, ...]

    def allows(self, name: str, facts: NodeFacts) -> bool:
        """Whether the pod may run on node `name` with `facts`, by the filters above."""
        labels = facts.labels
        if any(labels.get(k) != v for k, v in self.selector.items()):
            return False
        if self.terms is not None and not any(t.matches(name, labels) for t in self.terms):
            return False
        return all(any(t.tolerates(taint) for t in self.tolerations) for taint in facts.taints)


ANYWHERE = Placement({}, None, (_Toleration("", "Exists", "", ""),))
"""A pod that may run on any node: what a pod whose placement does not read is judged as."""


class _UnreadableError(Exception):
    """Part of the pod's placement is not what the API server admits, or more than the hold
    check reads (`MAX_PLACEMENT_CHECKS`, `MAX_PLACEMENT_VALUES`)."""


class _Budget:
    """What is left of MAX_PLACEMENT_CHECKS and MAX_PLACEMENT_VALUES while a placement is read:
    each list is counted whole before any of it is read, so a larger one costs one look."""

    __slots__ = ("checks", "values")

    def __init__(self) -> None:
        self.checks = MAX_PLACEMENT_CHECKS
        self.values = MAX_PLACEMENT_VALUES

    def spend(self, checks: int, values: int = 0) -> None:
        self.checks -= checks
        self.values -= values
        if self.checks < 0 or self.values < 0:
            raise _UnreadableError


def placement(spec: Any) -> Placement:
    """The placement a Pod's `spec` asks for; ANYWHERE when any part of it does not read, or it
    holds more than the hold check reads."""
    if not isinstance(spec, dict):
        return ANYWHERE
    budget = _Budget()
    try:
        return Placement(_selector(spec, budget), _terms(spec, budget), _tolerations(spec, budget))
    except _UnreadableError:
        return ANYWHERE


def _items(value: Any, budget: _Budget, *, values: bool = False) -> list[Any]:
    """`value` as a list, its length spent from `budget` (as checks, or as `values`)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _UnreadableError
    if values:
        budget.spend(0, len(value))
    else:
        budget.spend(len(value))
    return value


def _text(value: Any, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise _UnreadableError
    return value


def _selector(spec: Mapping[str, Any], budget: _Budget) -> dict[str, str]:
    raw = spec.get("nodeSelector")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _UnreadableError
    budget.spend(len(raw))
    return {_text(k): _text(v) for k, v in raw.items()}


def _terms(spec: Mapping[str, Any], budget: _Budget) -> tuple[_Term, ...] | None:
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node, dict)
        else None
    )
    if required is None:
        return None
    if not isinstance(required, dict):
        raise _UnreadableError
    terms = []
    for term in _items(required.get("nodeSelectorTerms"), budget):
        if not isinstance(term, dict):
            raise _UnreadableError
        expressions = _items(term.get("matchExpressions"), budget)
        fields = _items(term.get("matchFields"), budget)
        terms.append(
            _Term(
                tuple(_requirement(r, budget) for r in expressions),
                tuple(_requirement(r, budget) for r in fields),
            )
        )
    return tuple(terms)


_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _requirement(raw: Any, budget: _Budget) -> _Requirement:
    if not isinstance(raw, dict) or raw.get("operator") not in _OPERATORS:
        raise _UnreadableError
    values = tuple(_text(v) for v in _items(raw.get("values"), budget, values=True))
    return _Requirement(_text(raw.get("key")), raw["operator"], values, frozenset(values))


def _tolerations(spec: Mapping[str, Any], budget: _Budget) -> tuple[_Toleration, ...]:
    found = []
    for raw in _items(spec.get("tolerations"), budget):
        if not isinstance(raw, dict):
            raise _UnreadableError
        operator = _text(raw.get("operator"), "Equal")
        if operator not in ("Equal", "Exists"):
            raise _UnreadableError
        found.append(
            _Toleration(
                _text(raw.get("key"), ""),
                operator,
                _text(raw.get("value"), ""),
                _text(raw.get("effect"), ""),
            )
        )
    return tuple(found)
