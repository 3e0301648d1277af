"""kube-scheduler's extender protocol, filter, prioritize and preempt: request in, answer out,
no I/O.

The Go types (`k8s.io/kube-scheduler/extender/v1`) carry no JSON tags, so the wire keys are the
Go field names: `Pod`, `Nodes`, `NodeNames` in; `Nodes`, `NodeNames`, `FailedNodes`,
`FailedAndUnresolvableNodes`, `Error` out of filter; `[{"Host", "Score"}]` out of prioritize.
With `nodeCacheCapable` the scheduler sends `NodeNames` and expects `NodeNames` back (an absent
list would filter every node out); otherwise it sends a whole `NodeList` and takes one back.

What it decides, and never more: a pod that requests no managed GPU passes with every node and
score 0 (no opinion); a node that cannot give the pod k free GPUs is filtered out; the others are
ranked by `reporter.availability.node_score`. A node whose availability is missing or damaged is
never filtered and scores `NEUTRAL_SCORE`. A pod of k >= 2 GPUs that no candidate node gives an
NVLink-connected set now, while some known node could once its pods end, is held for one up to a
limit from its creation (`hold_reason`, `reporter.availability.holds_for_connected`): the
candidates that would give it a set that is not connected are filtered out too, and the nodes it
waits for count only where the pod may run (`reporter.extender.eligibility`). While a pod is
held, preemption may evict only where that surely gives it a connected set (`connected_whole`):
filter answers the other failed nodes as FailedAndUnresolvableNodes, and preempt keeps only
those candidates (`preempt_answer`). What the pod itself carries for that (its creation time, its
`connected-wait` annotation, its placement) never makes a request fail: unreadable, it is as if
absent, and a pod whose creation time does not read is never held. A request that does not read
raises BadRequestError with one line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import compress
from json.encoder import encode_basestring_ascii
from operator import is_, not_
from typing import Annotated, Any, cast

import msgspec

from parsers.duration import DURATION_MAX_S, duration_text, parse_duration
from parsers.errors import ParseError
from reporter.availability import (
    holds_for_connected,
)
from reporter.errors import InputError
from reporter.extender.cache import DEFAULT_RESOURCE, HELD, RankTable, Verdicts
from reporter.extender.eligibility import ANYWHERE, OPEN_NODE, NodeFacts, Placement
from reporter.extender.eligibility import placement as pod_placement
from reporter.schema.keys import (
    CONNECTED_WAIT,
    DEFAULT_PREFIX,
    key,
)
from reporter.schema.scheduler import PodRequestError, gpus_requested

MAX_NODES = 100_000
"""More nodes than any cluster's scheduler sends in one call."""
_NODE_NAME_CHARS = 253
MAX_WAIT_CHARS = 32
"""Longer than any duration up to a day (`86400`, `23h59m59s`): a longer annotation is not one."""
_CREATED = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:[0-5][0-9])"
)
"""RFC 3339 as the API server writes `creationTimestamp` (`2026-12-02T08:00:00Z`); an offset and
a fraction as Go's time.RFC3339 reads them; ASCII digits only. The form checked, datetime reads
the values (and refuses a date or an offset that does not exist)."""


class BadRequestError(InputError):
    """The request is not an ExtenderArgs the scheduler would send; the message is one line."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """The parts of a request the extender acts on."""

    gpus: int
    """GPUs of the managed resource the pod requests (0: not ours to judge)."""
    node_names: tuple[str, ...]
    """The candidate nodes, in the order the scheduler sent them."""
    node_list: Mapping[str, Any] | None
    """The `Nodes` NodeList when the scheduler sent whole Nodes; None for the NodeNames form."""
    created_s: float | None = None
    """The pod's `metadata.creationTimestamp` in POSIX seconds; None when absent or unreadable
    (such a pod is never held)."""
    connected_wait_s: float | None = None
    """The pod's own hold limit (its `connected-wait` annotation), 0..24h; None when absent or
    unreadable (the extender's limit applies)."""
    placement: Placement = ANYWHERE
    """Where the pod may run (its nodeSelector, required node affinity, tolerations), read only
    for a pod that could be held; ANYWHERE otherwise or when it does not read."""
    uid: str | None = None
    """The pod's `metadata.uid`, read only for a pod that could be held (what `HeldPods` counts
    it by); None otherwise or when it is not a string of 1 to MAX_UID_CHARS characters."""


class _NamesArgs(msgspec.Struct, frozen=True):
    """An ExtenderArgs of the NodeNames form (nodeCacheCapable), as far as the extender reads it,
    its bounds checked as it is decoded: what every scheduling cycle sends, in one C pass."""

    Pod: msgspec.Raw
    """Kept as its text: the standard decoder reads it, as in every other form."""
    NodeNames: Annotated[
        tuple[
            Annotated[str, msgspec.Meta(min_length=1, max_length=_NODE_NAME_CHARS)],
            ...,
        ],
        msgspec.Meta(max_length=MAX_NODES),
    ]
    Nodes: None = None
    """Sent as null beside NodeNames; anything else is not this form."""


_NAMES_ARGS = msgspec.json.Decoder(_NamesArgs)


def parse_args(
    body: bytes,
    resource: str = DEFAULT_RESOURCE,
    wait_key: str = key(DEFAULT_PREFIX, CONNECTED_WAIT),
) -> ExtenderArgs:
    """Read an ExtenderArgs JSON body; `wait_key` is the pod annotation that sets its own hold
    limit. Raises BadRequestError naming what is wrong (never for the pod's metadata: what the
    extender reads there is only ever a reason to hold, and unreadable means absent)."""
    try:
        names = _NAMES_ARGS.decode(body)
        pod = json.loads(bytes(names.Pod))
    except (msgspec.DecodeError, ValueError, RecursionError):
        # Not the NodeNames form with its bounds kept, or JSON only the standard decoder takes
        # (NaN, a lone surrogate): the general reading decides, and says what is wrong.
        return _parse_any(body, resource, wait_key)
    if not isinstance(pod, dict):
        return _parse_any(body, resource, wait_key)
    return replace(_hold_facts(pod, wait_key, resource), node_names=names.NodeNames)


def _parse_any(body: bytes, resource: str, wait_key: str) -> ExtenderArgs:
    """`parse_args` for every form, each check in Python."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequestError(f"the body is not JSON: {_first_line(e)}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("the body is not an ExtenderArgs object ({Pod, Nodes | NodeNames})")
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("Pod is missing or not an object")
    hold = _hold_facts(pod, wait_key, resource)
    nodes, names = doc.get("Nodes"), doc.get("NodeNames")
    if (nodes is None) == (names is None):
        raise BadRequestError(
            "send exactly one of Nodes (a NodeList) and NodeNames (nodeCacheCapable)"
        )
    if names is not None:
        if not isinstance(names, list):
            raise BadRequestError("NodeNames is not a list of node names")
        return replace(hold, node_names=_node_names(names, "NodeNames"))
    if not isinstance(nodes, dict) or not isinstance(nodes.get("items") or [], list):
        raise BadRequestError("Nodes is not a NodeList ({items: [...]})")
    items = nodes.get("items") or []
    named = [_item_name(item, i) for i, item in enumerate(items)]
    return replace(hold, node_names=_node_names(named, "Nodes.items"), node_list=nodes)


def _hold_facts(pod: Mapping[str, Any], wait_key: str, resource: str) -> ExtenderArgs:
    """The pod's GPUs and, for a pod that could be held (2 or more), its creation in POSIX
    seconds, its own hold limit and where it may run; each None or ANYWHERE when unreadable.
    No candidate nodes yet."""
    try:
        gpus = gpus_requested(pod, resource)
    except PodRequestError as e:
        raise BadRequestError(str(e)) from None
    meta = pod.get("metadata")
    if gpus < 2 or not isinstance(meta, dict):
        return ExtenderArgs(gpus, (), None)
    annotations = meta.get("annotations")
    wait = annotations.get(wait_key) if isinstance(annotations, dict) else None
    return ExtenderArgs(
        gpus,
        (),
        None,
        created_seconds(meta.get("creationTimestamp")),
        hold_limit(wait),
        pod_placement(pod.get("spec")),
        _uid(meta.get("uid")),
    )


def _uid(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_UID_CHARS else None


def created_seconds(value: Any) -> float | None:
    """A `creationTimestamp` (RFC 3339, `2026-12-02T08:00:00Z`) in POSIX seconds; None for
    anything else: another type, another form, a date that does not exist."""
    if not isinstance(value, str) or len(value) > 40 or _CREATED.fullmatch(value) is None:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None  # month 13, February 30, second 60, year 0, offset +24:00


def hold_limit(value: Any) -> float | None:
    """A pod's `connected-wait` annotation in seconds: `0` (never hold) or a duration such as
    `30m`, at most 24h; None for anything else (the extender's own limit then applies)."""
    if not isinstance(value, str) or len(value) > MAX_WAIT_CHARS or not value.isascii():
        return None
    try:
        seconds = parse_duration(value, name="connected-wait")
    except ParseError:
        return None
    return seconds if math.isfinite(seconds) and seconds <= DURATION_MAX_S else None


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _node_names(names: Sequence[Any], where: str) -> tuple[str, ...]:
    if len(names) > MAX_NODES:
        raise BadRequestError(f"{where} holds {len(names)} nodes, more than {MAX_NODES}")
    # Builtins over the whole list for the common case (join refuses anything but strings,
    # encode a lone surrogate); the loop only finds the culprit.
    try:
        "".join(names).encode()
        valid = "" not in names and max(map(len, names), default=1) <= _NODE_NAME_CHARS
    except (TypeError, UnicodeEncodeError):
        valid = False
    if not valid:
        for i, name in enumerate(names):
            if not isinstance(name, str) or not 0 < len(name) <= _NODE_NAME_CHARS:
                raise BadRequestError(f"{where}[{i}] is not a node name")
            if not _is_unicode(name):
                raise BadRequestError(
                    f"{where}[{i}] is not a node name: it holds a lone surrogate escape "
                    "(\\ud800 to \\udfff), which no Kubernetes name can"
                )
    return tuple(names)


def _is_unicode(text: str) -> bool:
    """Whether `text` is Unicode text, without the lone surrogates a JSON escape can carry
    (`"\\ud800"`): the standard decoder admits them, no encoder of the answer does."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _item_name(item: Any, i: int) -> Any:
    meta = item.get("metadata") if isinstance(item, dict) else None
    if not isinstance(meta, dict):
        raise BadRequestError(f"Nodes.items[{i}] is not a Node with metadata")
    return meta.get("name")


def hold_reason(
    args: ExtenderArgs,
    verdicts: Verdicts,
    *,
    now: float,
    limit_s: float,
    facts: Mapping[str, NodeFacts] | None = None,
) -> str | None:
    """The reason filter gives the nodes it fails while it holds the pod for an NVLink-connected
    set, or None when it does not hold it (`holds_for_connected`): `now` in POSIX seconds, by the
    extender's clock; `limit_s` the extender's limit, which the pod's own annotation replaces;
    `facts` where pods may go on each node (`RankTable.facts`; None: every node open)."""
    k = args.gpus
    if k < 2 or args.created_s is None:
        return None  # nothing to wait for, or nothing we can read: never withhold blindly
    limit = limit_s if args.connected_wait_s is None else args.connected_wait_s
    waited = now - args.created_s
    # The candidates passed the scheduler's own filters: whether one is connected is a C-level
    # read of a set kept as nodes change.
    connected = not verdicts.connected.isdisjoint(args.node_names)
    if not holds_for_connected(k, waited, limit, connected=connected, capable=True):
        return None
    # Whether a node worth waiting for admits the pod is weighed last: the one check that can
    # loop over nodes.
    if not _usable_capable(args.placement, verdicts.capable, facts):
        return None
    return (
        f"topo-reporter: no NVLink-connected set of {k} {verdicts.resource} free here; holding "
        f"the pod for one up to {duration_text(limit)} (waited {duration_text(waited)})"
    )


def _usable_capable(
    where: Placement, capable: set[str], facts: Mapping[str, NodeFacts] | None
) -> bool:
    """Whether some node worth waiting for (`Verdicts.capable`) is one the pod may run on (issue
    28, item 10): the scheduler never sends a busy node, so the extender judges it itself. The
    first such node ends the search: for a pod that may go anywhere, one look."""
    if facts is None or where is ANYWHERE:
        return bool(capable)
    get = facts.get
    # A copy: the watch thread may change the set while this call reads it.
    return any(where.allows(name, get(name, OPEN_NODE)) for name in list(capable))


def filter_answer(
    args: ExtenderArgs, verdicts: Verdicts, held: str | None = None
) -> tuple[bytes, int]:
    """The ExtenderFilterResult as JSON, in the form of the request (NodeNames or Nodes), and
    how many nodes it filtered out; `held`, the `hold_reason` of a pod held for a connected set,
    also fails the nodes known to give it a set that is not connected, with that reason."""
    names = args.node_names
    # One snapshot of the verdicts: a node updated during the call is read once.
    members = verdicts.failed if held is None else verdicts.held
    failed = list(map(members.get, names)) if args.gpus else []
    kept: Sequence[str]
    if held is None:
        unresolvable: list[str | None] = []
        # Counted by what compress keeps: `failed.count(None)` compares every member string
        # with None through both types' __eq__, a third of the call's time when most nodes fail.
        kept = list(compress(names, map(not_, failed))) if failed else names
    else:
        # Held: a node is in one map or the other, or neither (kept: None is None), never both.
        unresolvable = list(map(verdicts.unresolvable.get, names))
        kept = list(compress(names, map(is_, failed, unresolvable)))
    dropped = len(names) - len(kept)
    if args.node_list is None:
        nodes, node_names = b"null", _names_json(kept)
    else:
        keep = set(kept)
        items = [i for i in args.node_list.get("items") or [] if i["metadata"]["name"] in keep]
        nodes = json.dumps({**args.node_list, "items": items}, separators=(",", ":")).encode()
        node_names = b"null"
    joined = ",".join(filter(None, failed))
    unjoined = ",".join(filter(None, unresolvable))
    if held is not None:
        reason = encode_basestring_ascii(held)
        joined, unjoined = joined.replace(HELD, reason), unjoined.replace(HELD, reason)
    return b"".join(
        (
            b'{"Nodes":',
            nodes,
            b',"NodeNames":',
            node_names,
            f',"FailedNodes":{{{joined}}},"FailedAndUnresolvableNodes":{{{unjoined}}},'.encode(),
            b'"Error":""}',
        )
    ), dropped


_ENCODE = msgspec.json.Encoder()


def _names_json(names: Sequence[str]) -> bytes:
    """`json.dumps(names)` without spaces, byte for byte: msgspec's encoding where it is the
    same, ASCII without DEL (node names always are), a third of the standard encoder's time."""
    encoded = _ENCODE.encode(names)
    # Both escape quotes, backslashes and control characters alike; json.dumps alone escapes DEL
    # and non-ASCII (`ensure_ascii`).
    if encoded.isascii() and b"\x7f" not in encoded:
        return encoded
    return json.dumps(names, separators=(",", ":")).encode()


MAX_UID_CHARS = 128
"""Longer than any pod UID (36 characters): a longer one is not a UID."""


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """The parts of an ExtenderPreemptionArgs the extender acts on."""

    hold: ExtenderArgs
    """The pod's GPUs and hold facts (no candidate nodes: those are the victims' keys)."""
    victims: Mapping[str, tuple[tuple[str, ...], int]]
    """Node name to the UIDs of the pods preemption would evict there and its
    NumPDBViolations, as the scheduler sent them."""


def parse_preemption_args(
    body: bytes,
    resource: str = DEFAULT_RESOURCE,
    wait_key: str = key(DEFAULT_PREFIX, CONNECTED_WAIT),
) -> PreemptionArgs:
    """Read an ExtenderPreemptionArgs JSON body: `Pod` and one of `NodeNameToMetaVictims`
    (nodeCacheCapable: victims by UID) and `NodeNameToVictims` (whole Pods). Raises
    BadRequestError naming what is wrong."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequestError(f"the body is not JSON: {_first_line(e)}") from None
    if not isinstance(doc, dict):
        raise BadRequestError(
            "the body is not an ExtenderPreemptionArgs object "
            "({Pod, NodeNameToMetaVictims | NodeNameToVictims})"
        )
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("Pod is missing or not an object")
    hold = _hold_facts(pod, wait_key, resource)
    meta_victims, whole_victims = doc.get("NodeNameToMetaVictims"), doc.get("NodeNameToVictims")
    if meta_victims is not None and whole_victims is not None:
        raise BadRequestError("send one of NodeNameToMetaVictims and NodeNameToVictims, not both")
    where = "NodeNameToVictims" if meta_victims is None else "NodeNameToMetaVictims"
    found = meta_victims if meta_victims is not None else whole_victims or {}
    if not isinstance(found, dict):
        raise BadRequestError(f"{where} is not an object of node names")
    if len(found) > MAX_NODES:
        raise BadRequestError(f"{where} holds {len(found)} nodes, more than {MAX_NODES}")
    victims = {
        _node_names([name], where)[0]: _victims(value, f"{where}[{name[:64]!r}]", meta_victims)
        for name, value in found.items()
    }
    return PreemptionArgs(hold, victims)


def _victims(value: Any, where: str, by_uid: Any) -> tuple[tuple[str, ...], int]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{where} is not a Victims object")
    pods = value.get("Pods") or []
    violations = value.get("NumPDBViolations") or 0
    if not isinstance(pods, list):
        raise BadRequestError(f"{where}.Pods is not a list")
    if not isinstance(violations, int) or isinstance(violations, bool) or violations < 0:
        raise BadRequestError(f"{where}.NumPDBViolations is not a count")
    uids = []
    for i, victim in enumerate(pods):
        # MetaPod {"UID"} with nodeCacheCapable, a whole Pod otherwise.
        meta = victim if by_uid is not None else _get(victim, "metadata")
        uid = _get(meta, "UID" if by_uid is not None else "uid")
        if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_CHARS:
            raise BadRequestError(f"{where}.Pods[{i}] has no pod UID")
        uids.append(uid)
    return tuple(uids), violations


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else None


def preempt_answer(
    args: PreemptionArgs, table: RankTable, *, now: float, limit_s: float
) -> tuple[bytes, int]:
    """The ExtenderPreemptionResult as JSON, `{"NodeNameToMetaVictims": {...}}`, and how many
    candidate nodes it took away.

    The extender's hold decides (issue 28, item 1): for a pod it holds for an NVLink-connected set
    (`holds_for_connected`, judged as filter would with no candidate connected now: preemption
    runs only where none passed), a node stays a candidate only where evicting pods that free
    k GPUs gives a connected set (`connected_whole` >= k: every pair of its GPUs connected);
    evicting elsewhere could not give the pod what it is held for. Any other pod keeps every
    candidate. A node without victims never stays: the extender's own filter removed it, and
    the scheduler drops such a node or, with an extender that is not ignorable, fails.
    """
    hold = args.hold
    k = hold.gpus
    held = (
        hold_reason(hold, table.verdicts(k), now=now, limit_s=limit_s, facts=table.facts)
        is not None
    )
    wholes = table.wholes
    kept = {
        name: found
        for name, found in args.victims.items()
        if found[0] and (not held or wholes.get(name, 0) >= k)
    }
    members = ",".join(
        f'{encode_basestring_ascii(name)}:{{"Pods":['
        + ",".join(f'{{"UID":{encode_basestring_ascii(uid)}}}' for uid in uids)
        + f'],"NumPDBViolations":{violations}}}'
        for name, (uids, violations) in kept.items()
    )
    return f'{{"NodeNameToMetaVictims":{{{members}}}}}'.encode(), len(args.victims) - len(kept)


def prioritize_answer(args: ExtenderArgs, verdicts: Verdicts) -> bytes:
    """The HostPriorityList as JSON, `[{"Host": name, "Score": 0..10}, ...]` in request order:
    node_score of each node's rank, NEUTRAL_SCORE when unreadable or unknown, and 0 everywhere
    for a pod that requests no managed GPU (no opinion)."""
    names = args.node_names
    entries = list(map(verdicts.entries.get, names))
    try:
        # join refuses the None of a node the table does not know: no pass of its own to look.
        joined = ",".join(cast(list[str], entries))
    except TypeError:
        # Nodes the table does not know (not seen yet, or not in the request's Nodes).
        joined = ",".join(e or verdicts.entry(n) for e, n in zip(entries, names, strict=True))
    return f"[{joined}]".encode()
