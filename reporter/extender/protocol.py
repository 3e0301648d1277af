"""kube-scheduler's extender protocol, filter and prioritize: request in, answer out, no I/O.

The Go types (`k8s.io/kube-scheduler/extender/v1`) carry no JSON tags, so the wire keys are the
Go field names: `Pod`, `Nodes`, `NodeNames` in; `Nodes`, `NodeNames`, `FailedNodes`,
`FailedAndUnresolvableNodes`, `Error` out of filter; `[{"Host", "Score"}]` out of prioritize.
With `nodeCacheCapable` the scheduler sends `NodeNames` and expects `NodeNames` back (an absent
list would filter every node out); otherwise it sends a whole `NodeList` and takes one back.

What it decides, and never more: a pod that requests no managed GPU passes with every node and
score 0 (no opinion); a node that cannot give the pod k free GPUs is filtered out; the others are
ranked by `reporter.availability.node_score`. A node whose availability is missing or damaged is
never filtered and scores `NEUTRAL_SCORE`. A request that does not read raises BadRequestError
with one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from reporter.availability import NEUTRAL_SCORE, Availability, decode_availability, node_score
from reporter.errors import ConfigError, InputError, SchemaError

DEFAULT_RESOURCE = "nvidia.com/gpu"
MAX_GPUS_PER_POD = 1 << 20
"""A request beyond this is not a GPU count (nothing fits it; it is refused as malformed)."""
MAX_NODES = 100_000
"""More nodes than any cluster's scheduler sends in one call."""
_NODE_NAME_CHARS = 253
_COUNT = re.compile(r"\d{1,7}")
_RESOURCE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


@dataclass(frozen=True, slots=True)
class NodeRank:
    """What filter and prioritize need of a node, computed once per change of its annotation."""

    free: int
    """Free GPUs."""
    scores: tuple[int, ...]
    """scores[k-1] = node_score(availability, k), for k = 1..free."""

    @classmethod
    def of(cls, availability: Availability) -> NodeRank:
        free = len(availability.free)
        return cls(free, tuple(node_score(availability, k) for k in range(1, free + 1)))


Lookup = Callable[[str], NodeRank | None]
"""A node's rank by name; None when unknown, or when its availability is missing or damaged."""


class BadRequestError(InputError):
    """The request is not an ExtenderArgs the scheduler would send; the message is one line."""


def check_resource_name(name: str) -> str:
    """`name` if it is a resource name (`nvidia.com/gpu`). Raises ConfigError otherwise."""
    prefix, _, _ = name.rpartition("/")
    if len(prefix) > 253 or not _RESOURCE.fullmatch(name):
        raise ConfigError(f"{name!r} is not a resource name such as nvidia.com/gpu")
    return name


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """The parts of a request the extender acts on."""

    gpus: int
    """GPUs of the managed resource the pod requests (0: not ours to judge)."""
    node_names: tuple[str, ...]
    """The candidate nodes, in the order the scheduler sent them."""
    node_list: Mapping[str, Any] | None
    """The `Nodes` NodeList when the scheduler sent whole Nodes; None for the NodeNames form."""


def parse_args(body: bytes, resource: str = DEFAULT_RESOURCE) -> ExtenderArgs:
    """Read an ExtenderArgs JSON body. Raises BadRequestError naming what is wrong."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequestError(f"the body is not JSON: {_first_line(e)}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("the body is not an ExtenderArgs object ({Pod, Nodes | NodeNames})")
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("Pod is missing or not an object")
    gpus = gpus_requested(pod, resource)
    nodes, names = doc.get("Nodes"), doc.get("NodeNames")
    if (nodes is None) == (names is None):
        raise BadRequestError(
            "send exactly one of Nodes (a NodeList) and NodeNames (nodeCacheCapable)"
        )
    if names is not None:
        if not isinstance(names, list):
            raise BadRequestError("NodeNames is not a list of node names")
        return ExtenderArgs(gpus, _node_names(names, "NodeNames"), None)
    if not isinstance(nodes, dict) or not isinstance(nodes.get("items") or [], list):
        raise BadRequestError("Nodes is not a NodeList ({items: [...]})")
    items = nodes.get("items") or []
    named = [_item_name(item, i) for i, item in enumerate(items)]
    return ExtenderArgs(gpus, _node_names(named, "Nodes.items"), nodes)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _node_names(names: Sequence[Any], where: str) -> tuple[str, ...]:
    if len(names) > MAX_NODES:
        raise BadRequestError(f"{where} holds {len(names)} nodes, more than {MAX_NODES}")
    # Builtins over the whole list for the common case; the loop only finds the culprit.
    if names and (
        set(map(type, names)) != {str}
        or min(map(len, names)) < 1
        or max(map(len, names)) > _NODE_NAME_CHARS
    ):
        for i, name in enumerate(names):
            if not isinstance(name, str) or not 0 < len(name) <= _NODE_NAME_CHARS:
                raise BadRequestError(f"{where}[{i}] is not a node name")
    return tuple(names)


def _item_name(item: Any, i: int) -> Any:
    meta = item.get("metadata") if isinstance(item, dict) else None
    if not isinstance(meta, dict):
        raise BadRequestError(f"Nodes.items[{i}] is not a Node with metadata")
    return meta.get("name")


def gpus_requested(pod: Mapping[str, Any], resource: str = DEFAULT_RESOURCE) -> int:
    """The pod's effective request of `resource`, as kube-scheduler counts it.

    Regular containers add up; an init container runs alone, so the pod needs the largest of them
    (plus the restartable "sidecar" init containers started before it, which keep running). A
    container's request is its `requests` entry, or its `limits` entry when only that is set (the
    apiserver defaults extended-resource requests to limits). Raises BadRequestError for a count
    that is not a whole number.
    """
    spec = pod.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise BadRequestError("Pod.spec is not an object")
    regular = sum(
        _container_gpus(c, "containers", i, resource) for i, c in _list(spec, "containers")
    )
    sidecars, init_peak = 0, 0
    for i, container in _list(spec, "initContainers"):
        count = _container_gpus(container, "initContainers", i, resource)
        if container.get("restartPolicy") == "Always":
            sidecars += count
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + count)
    total = max(regular + sidecars, init_peak)
    if total > MAX_GPUS_PER_POD:
        raise BadRequestError(f"the pod requests {total} {resource}, more than any node has")
    return total


def _list(spec: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequestError(f"Pod.spec.{key} is not a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequestError(f"Pod.spec.{key}[{i}] is not an object")
    return list(enumerate(value))


def _container_gpus(container: Mapping[str, Any], key: str, i: int, resource: str) -> int:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise BadRequestError(f"Pod.spec.{key}[{i}].resources is not an object")
    for kind in ("requests", "limits"):
        values = resources.get(kind) or {}
        if not isinstance(values, dict):
            raise BadRequestError(f"Pod.spec.{key}[{i}].resources.{kind} is not an object")
        if resource in values:
            return _count(values[resource], f"Pod.spec.{key}[{i}].resources.{kind}[{resource}]")
    return 0


def _count(value: Any, where: str) -> int:
    # Extended resources are whole numbers (the apiserver refuses "500m" for them); JSON may carry
    # the Quantity as a string or as a number.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _COUNT.fullmatch(value):
        return int(value)
    raise BadRequestError(f"{where} is {str(value)[:32]!r}, not a whole number of devices")


def rank(text: str | None) -> NodeRank | None:
    """The rank of an availability annotation value; None when absent or damaged."""
    if text is None:
        return None
    try:
        return NodeRank.of(decode_availability(text))
    except SchemaError:
        # Someone edited it, or another version wrote it: neutral, never a crash.
        return None


def node_rank(node: Mapping[str, Any], key: str) -> NodeRank | None:
    """The availability a whole Node carries under annotation `key`; None when absent or damaged."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(key) if isinstance(annotations, dict) else None
    return rank(text) if isinstance(text, str) else None


def list_lookup(node_list: Mapping[str, Any], key: str) -> Lookup:
    """A Lookup over the Nodes a request carries (the form without nodeCacheCapable)."""
    found: dict[str, NodeRank | None] = {}
    for item in node_list.get("items") or []:
        found[str(item["metadata"]["name"])] = node_rank(item, key)
    return found.get


def filter_answer(args: ExtenderArgs, lookup: Lookup, resource: str) -> dict[str, Any]:
    """The ExtenderFilterResult, in the form of the request (NodeNames or Nodes)."""
    k = args.gpus
    names = args.node_names
    kept: list[str] = list(names)
    failed: dict[str, str] = {}
    if k:
        ranks = list(map(lookup, names))
        # `can_fit`, inlined: this runs once per node per scheduling cycle.
        kept = [n for n, r in zip(names, ranks, strict=True) if r is None or r.free >= k]
        if len(kept) < len(names):
            reasons: dict[int, str] = {}
            for name, r in zip(names, ranks, strict=True):
                if r is not None and r.free < k:
                    # Not "unresolvable": preempting pods on the node would free GPUs.
                    if r.free not in reasons:
                        reasons[r.free] = (
                            f"topo-reporter: {r.free} free {resource}, the pod needs {k}"
                        )
                    failed[name] = reasons[r.free]
    answer: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    if args.node_list is None:
        answer["NodeNames"] = kept
    else:
        keep = set(kept)
        items = [i for i in args.node_list.get("items") or [] if i["metadata"]["name"] in keep]
        answer["Nodes"] = {**args.node_list, "items": items}
    return answer


def prioritize_scores(args: ExtenderArgs, lookup: Lookup) -> list[int]:
    """0..10 per node, in request order: node_score of its rank, NEUTRAL_SCORE when unreadable,
    and 0 everywhere for a pod that requests no managed GPU (no opinion)."""
    k = args.gpus
    if not k:
        return [0] * len(args.node_names)
    # `node_score`, read from the rank: scores[k-1], 0 where k GPUs do not fit.
    return [
        NEUTRAL_SCORE if r is None else r.scores[k - 1] if k <= r.free else 0
        for r in map(lookup, args.node_names)
    ]


def encode_priorities(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """The HostPriorityList as JSON, `[{"Host": name, "Score": n}, ...]`.

    Written directly rather than through json.dumps of one dict per node: at 5,000 nodes that is
    the largest cost of a call.
    """
    entries = [
        f'{{"Host":{encode_basestring_ascii(name)},"Score":{score}}}'
        for name, score in zip(names, scores, strict=True)
    ]
    return ("[" + ",".join(entries) + "]").encode()
