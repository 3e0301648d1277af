"""The extender's own view of the Nodes: availability by node name, kept current by list + watch.

With `nodeCacheCapable` the scheduler sends node names only; at 5,000 nodes whole Node objects
would be megabytes per call. The cache decodes each node's availability annotation once, when the
watch says the node changed (and only when the annotation's text changed), and keeps each node's
answer pre-encoded for the request sizes asked recently (`RankTable`), so that a scheduling call
costs dictionary lookups and joins, no Python code per node: each node's rank (`NodeRank`, its
scores and hold facts per k) and its answers per request size (`Verdicts`) live here, written by
the watch and the heartbeats under one lock, read by the calls without it. A node it has not
seen, or whose annotation is missing or damaged, reads as None: never filtered, neutral score.
So does a node whose agent no longer vouches for its annotation, with heartbeats on (`vouched`,
kept by `reporter.extender.heartbeat`, which calls `revise` when a node's verdict changes).
A filter call about to hold its pod may write too: a node it read from the API server newer than
the watch has brought (`take_fresh`, `reporter.extender.fresh`), ordered by resourceVersion.

The watch goes through `NodeWatchClient`, a seam we own (`reporter.publish.watch`, where the
lean client implements it); the loop relists when the watch expires (410 Gone) and backs off on
errors. It never writes anything.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, TypeVar, Unpack

from parsers.errors import ParseError
from parsers.integers import parse_decimal
from reporter.availability import (
    NEUTRAL_SCORE,
    connected_capacity,
    connected_now,
    node_score,
)
from reporter.errors import SchemaError
from reporter.extender.eligibility import OPEN_NODE, NodeFacts, node_facts
from reporter.extender.reflector import Loop, Reflector
from reporter.publish.watch import NodeAnnotation, NodeWatchClient, WatchEvent
from reporter.schema import keys
from reporter.schema.availability import Availability, decode_availability
from reporter.schema.fabric import OWN_DOMAIN_PREFIX
from reporter.schema.keys import COUNT, DEFAULT_PREFIX, INTERCONNECT, NVLINK_HEALTH, key
from reporter.schema.network import network_tiers

DEFAULT_RESOURCE = keys.GPU_RESOURCE
KEPT_SIZES = 16
"""Request sizes whose pre-encoded answers a RankTable keeps (pods ask for a few: 1, 2, 4, 8)."""
RANKS_KEPT = 4096
"""Distinct valid annotation values whose rank is remembered (at most 6 KB each: 24 MB at worst,
about 100 bytes each for 8-GPU nodes)."""
HELD = "\x00"
"""Stands for the hold reason in a pre-encoded FailedNodes member until a call fills it in: no
JSON string that `encode_basestring_ascii` writes holds a raw control character."""
HELD_MEMBER = ":" + HELD


@dataclass(frozen=True, slots=True)
class NodeRank:
    """What filter and prioritize need of a node, computed once per change of its annotation."""

    free: int
    """Free GPUs."""
    scores: tuple[int, ...]
    """scores[k-1] = node_score(availability, k), for k = 1..free."""
    connected: tuple[bool, ...] = ()
    """connected[k-1] = connected_now(availability, k), for k = 1..free: the node hands a pod of
    k GPUs an NVLink-connected set now."""
    capacity: int = 0
    """connected_capacity(availability): the largest connected set one of its free GPUs belongs
    to, free or not."""

    @classmethod
    def of(cls, availability: Availability) -> NodeRank:
        sizes = range(1, len(availability.free) + 1)
        return cls(
            len(availability.free),
            tuple(node_score(availability, k) for k in sizes),
            tuple(connected_now(availability, k) for k in sizes),
            connected_capacity(availability),
        )


def rank(text: str | None) -> NodeRank | None:
    """The rank of an availability annotation value; None when absent or damaged.

    Remembered by text: many nodes carry the same value (same machine, same free GPUs), and the
    whole-Nodes form sends every node's annotation again with every call. Only values that decode
    are remembered: a refused one (up to the 256 KiB an annotation may hold, or megabytes in a
    request) is decoded again, or refused by its length at once, but never kept.
    """
    if text is None:
        return None
    try:
        return _decoded_rank(text)
    except SchemaError:
        # Someone edited it, or another version wrote it: neutral, never a crash.
        return None


@functools.lru_cache(maxsize=RANKS_KEPT)
def _decoded_rank(text: str) -> NodeRank:
    # lru_cache keeps what returns, not what raises: the SchemaError of a refused text.
    return NodeRank.of(decode_availability(text))


def node_rank(node: Mapping[str, Any], key: str) -> NodeRank | None:
    """The availability a whole Node carries under annotation `key`; None when absent or damaged."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(key) if isinstance(annotations, dict) else None
    return rank(text) if isinstance(text, str) else None


def _entry(quoted: str, score: int) -> str:
    return f'{{"Host":{quoted},"Score":{score}}}'


class Verdicts:
    """Every known node's answer for one request size k, encoded once as JSON fragments.

    A scheduling call at k then costs dictionary lookups and one join per node list, with no
    Python code per node (at 5,000 nodes, building and encoding per call was most of its time).
    So does deciding whether to hold a pod for a connected set: two sets kept as nodes change,
    read with one set operation per call (`hold_reason`).
    """

    __slots__ = (
        "capable",
        "connected",
        "entries",
        "failed",
        "held",
        "k",
        "resource",
        "unresolvable",
    )

    def __init__(self, k: int, resource: str) -> None:
        self.k = k
        self.resource = resource
        self.entries: dict[str, str] = {}
        """Node name to its HostPriority, `{"Host":"a","Score":9}`."""
        self.failed: dict[str, str] = {}
        """Node name to its FailedNodes member, `"a":"topo-reporter: ..."`, for the nodes that
        cannot give k free GPUs (and only those)."""
        self.held: dict[str, str] = {}
        """For k >= 2, the FailedNodes members while a pod is held, for the nodes where evicting
        pods would give it a connected set (`whole` >= k): `failed`'s, and for the nodes known
        to give k GPUs that are not connected `"a":` then HELD, the reason to come."""
        self.unresolvable: dict[str, str] = {}
        """For k >= 2, the same members for the other nodes, answered as
        FailedAndUnresolvableNodes while a pod is held: preemption there cannot serve it."""
        self.connected: set[str] = set()
        """For k >= 2, the nodes that give a pod of k GPUs an NVLink-connected set now."""
        self.capable: set[str] = set()
        """For k >= 2, the nodes whose connected capacity is k or more: worth waiting for."""

    def set(self, name: str, quoted: str, r: NodeRank | None, whole: int = 0) -> None:
        """Judge one node: `r` its rank (None: unknown or unreadable), `whole` its GPUs when
        every pair of them is connected (`connected_whole`), else 0."""
        k = self.k
        if not k:
            score = 0  # not ours to judge: no opinion
        elif r is None:
            score = NEUTRAL_SCORE
        else:
            # `node_score`, read from the rank: scores[k-1], 0 where k GPUs do not fit.
            score = r.scores[k - 1] if k <= r.free else 0
        self.entries[name] = _entry(quoted, score)
        if k and r is not None and r.free < k:
            # Not "unresolvable": preempting pods on the node would free GPUs.
            reason = f"topo-reporter: {r.free} free {self.resource}, the pod needs {k}"
            self.failed[name] = f"{quoted}:{encode_basestring_ascii(reason)}"
        else:
            self.failed.pop(name, None)
        if k < 2 or r is None:
            # An unknown or unreadable node is never filtered, nor waited for.
            self._forget(name)
            return
        member: str | None = None
        if r.free < k:
            self.connected.discard(name)
            member = self.failed[name]
        elif r.connected[k - 1]:
            self.connected.add(name)
        else:
            self.connected.discard(name)
            member = quoted + HELD_MEMBER
        # While the pod is held, a node where evicting pods cannot be known to give it a
        # connected set is no place for preemption (issue 28, item 1).
        resolvable, other = (
            (self.held, self.unresolvable) if whole >= k else (self.unresolvable, self.held)
        )
        other.pop(name, None)
        if member is None:
            resolvable.pop(name, None)
        else:
            resolvable[name] = member
        if r.capacity >= k:
            self.capable.add(name)
        else:
            self.capable.discard(name)

    def drop(self, name: str) -> None:
        self.entries.pop(name, None)
        self.failed.pop(name, None)
        self._forget(name)

    def _forget(self, name: str) -> None:
        self.held.pop(name, None)
        self.unresolvable.pop(name, None)
        self.connected.discard(name)
        self.capable.discard(name)

    def entry(self, name: str) -> str:
        """The HostPriority of a node the table does not know: neutral, or 0 for no opinion."""
        return _entry(encode_basestring_ascii(name), NEUTRAL_SCORE if self.k else 0)


class RankTable:
    """Each node's rank by name, and the Verdicts of the request sizes asked for recently.

    Writers (`set`, `drop`) and `verdicts` take the lock; readers of a Verdicts' dictionaries do
    not: each of their reads and writes is atomic, so a call that overlaps an update answers
    each node from before or after it. A NodeCache hands each table it builds its own lock, so
    that one lock guards all it holds; a table of its own (`of_nodes`) has one of its own.
    """

    def __init__(
        self, resource: str = DEFAULT_RESOURCE, lock: threading.RLock | None = None
    ) -> None:
        self.resource = resource
        self.ranks: dict[str, NodeRank | None] = {}
        self.wholes: dict[str, int] = {}
        """Node name to `connected_whole` of its labels, for the nodes where it is not 0."""
        self.facts: dict[str, NodeFacts] = {}
        """Node name to where pods may go on it (`reporter.extender.eligibility`)."""
        self._quoted: dict[str, str] = {}
        self._sizes: dict[int, Verdicts] = {}
        # Re-entrant: the cache takes it around its own bookkeeping and the table's writes.
        self._lock = lock if lock is not None else threading.RLock()

    @classmethod
    def of_nodes(
        cls,
        node_list: Mapping[str, Any],
        key: str,
        resource: str,
        vouched: Callable[[str], bool] = lambda node: True,
        prefix: str = DEFAULT_PREFIX,
    ) -> RankTable:
        """The ranks of the Nodes a request carries (the form without nodeCacheCapable); a node
        not `vouched` for (heartbeats) is unknown."""
        table = cls(resource)
        for item in node_list.get("items") or []:
            name = str(item["metadata"]["name"])
            facts = node_facts(item)
            if vouched(name):
                labels = item["metadata"].get("labels")
                table.set(name, node_rank(item, key), connected_whole(labels, prefix), facts)
            else:
                table.set(name, None, 0, facts)
        return table

    def set(
        self, name: str, r: NodeRank | None, whole: int = 0, facts: NodeFacts = OPEN_NODE
    ) -> None:
        """Take a node's rank, its `connected_whole` (0 where unknown) and its facts."""
        with self._lock:
            quoted = self._quoted.get(name)
            if quoted is None:
                # The watch's name lies among the objects of its Node's JSON; a copy made here
                # lies beside the names the table holds. Every call compares each candidate's
                # name with its key here: scattered keys made those lookups 2 to 3 times slower
                # at 15,000 nodes (bench/README.md).
                name = name.encode().decode()
                quoted = self._quoted[name] = encode_basestring_ascii(name)
            self.ranks[name] = r
            self.facts[name] = facts
            if whole:
                self.wholes[name] = whole
            else:
                self.wholes.pop(name, None)
            for verdicts in self._sizes.values():
                verdicts.set(name, quoted, r, whole)

    def drop(self, name: str) -> None:
        with self._lock:
            self.ranks.pop(name, None)
            self.wholes.pop(name, None)
            self.facts.pop(name, None)
            self._quoted.pop(name, None)
            for verdicts in self._sizes.values():
                verdicts.drop(name)

    def sizes(self) -> list[int]:
        """The request sizes whose Verdicts are kept, least recently asked first."""
        with self._lock:
            return list(self._sizes)

    def verdicts(self, k: int) -> Verdicts:
        """The Verdicts for pods of k GPUs: kept for the KEPT_SIZES sizes asked last,
        built (one pass over the nodes) on the first call for a size."""
        with self._lock:
            found = self._sizes.pop(k, None)
            if found is None:
                found = Verdicts(k, self.resource)
                wholes = self.wholes
                for name, r in self.ranks.items():
                    found.set(name, self._quoted[name], r, wholes.get(name, 0))
            self._sizes[k] = found
            while len(self._sizes) > KEPT_SIZES:
                del self._sizes[next(iter(self._sizes))]
            return found


def connected_whole(labels: Any, prefix: str = DEFAULT_PREFIX) -> int:
    """How many GPUs the node has when its agent's labels say every pair of them is joined by
    NVSwitch at full bond (`interconnect=nvswitch`, `nvlink-health=ok`), else 0: on such a node
    any k free GPUs are a connected set, so evicting pods that free k of them gives one. Labels
    that do not read count as 0 (nothing is known)."""
    if not isinstance(labels, dict):
        return 0
    if labels.get(key(prefix, INTERCONNECT)) != "nvswitch":
        return 0
    if labels.get(key(prefix, NVLINK_HEALTH)) != "ok":
        return 0
    count = labels.get(key(prefix, COUNT))
    if not isinstance(count, str):
        return 0
    try:
        return parse_decimal(count, field="count", max_digits=3)
    except ParseError:
        return 0


CAPABLE_SIZES = (2, 4, 8)
"""The set sizes capacity is counted for (`topo_reporter_extender_connected_capable_nodes`,
`kubectl gpu-topology --partitions`)."""
G = TypeVar("G", str, tuple[int, str])
NetworkGroup = tuple[int, str]
"""A network group: (tier, the value of its `network-tier-<tier>` label)."""


@dataclass(frozen=True, slots=True)
class Place:
    """Where a node stands, from its labels, for the capacity counts."""

    partition: str | None = None
    """Its NVLink partition label."""
    gpus: int | None = None
    """Its GPU `count` label."""
    networks: tuple[NetworkGroup, ...] = ()
    """Its network group at each tier it carries (`network-tier-<N>`)."""


_NOWHERE = Place()


def place_of(node: NodeAnnotation, prefix: str) -> Place:
    """The node's place, from what the watch brought of it."""
    labels = _labels(node)
    tiers = network_tiers(labels, prefix) if isinstance(labels, dict) else {}
    return Place(node.partition, node.gpus, tuple(tiers.items()))


class _Tally:
    """The counts /metrics shows, kept as nodes change rather than counted at each scrape (issue
    41, item 5: at 15,000 nodes a scrape that counted took 67 to 77 ms): nodes known and
    unreadable, nodes that hand a pod of k GPUs a connected set now, and per multi-node NVLink
    partition and per network group its nodes and its whole free ones. A node's own partition
    (`node-<name>`, a node outside a multi-node fabric) is left out: one per node, it would make
    the series as many as the nodes."""

    __slots__ = ("capable", "networks", "nodes", "partitions", "unreadable")

    def __init__(self) -> None:
        self.nodes = 0
        self.unreadable = 0
        self.capable = dict.fromkeys(CAPABLE_SIZES, 0)
        self.partitions: dict[str, list[int]] = {}
        """Partition to [nodes carrying it, those whose GPUs are all free]."""
        self.networks: dict[NetworkGroup, list[int]] = {}
        """Network group to [nodes in it, those whose GPUs are all free]."""

    def count(self, r: NodeRank | None, place: Place, sign: int) -> None:
        """Add a node of rank `r` standing at `place` (sign 1), or take it away (-1)."""
        self.nodes += sign
        if r is None:
            self.unreadable += sign
        else:
            for k in CAPABLE_SIZES:
                if k <= len(r.connected) and r.connected[k - 1]:
                    self.capable[k] += sign
        gpus = place.gpus
        whole = sign * (r is not None and gpus is not None and gpus > 0 and r.free == gpus)
        for network in place.networks:
            _add(self.networks, network, sign, whole)
        partition = place.partition
        if partition is not None and not partition.startswith(OWN_DOMAIN_PREFIX):
            _add(self.partitions, partition, sign, whole)


def _add(groups: dict[G, list[int]], group: G, sign: int, whole: int) -> None:
    entry = groups.setdefault(group, [0, 0])
    entry[0] += sign
    entry[1] += whole
    if not entry[0]:
        del groups[group]


class NodeCache:
    """Each node's rank by name, shared between the watch thread and the request threads, under
    one lock: its own bookkeeping and its table's writes take it together."""

    def __init__(
        self,
        prefix: str,
        resource: str = DEFAULT_RESOURCE,
        *,
        vouched: Callable[[str], bool] = lambda node: True,
    ) -> None:
        """`vouched(node)`: whether the node's availability is to be trusted now (heartbeats)."""
        self.prefix = prefix
        self.annotation = keys.key(prefix, keys.AVAILABILITY)
        self.vouched = vouched
        self._resource = resource
        self._lock = threading.RLock()
        self._text: dict[str, str | None] = {}
        self._whole: dict[str, int] = {}
        """Node name to `connected_whole` of its labels, as last judged."""
        self._facts: dict[str, NodeFacts] = {}
        """Node name to where pods may go on it (labels, taints), as last seen."""
        self._place: dict[str, Place] = {}
        """Each node's NVLink partition, GPU count and network group labels, for `capacity`."""
        self._table = RankTable(resource, self._lock)
        self._tally = _Tally()
        """Counts of the table's nodes: each node in it is counted once, by its rank there."""
        self._synced = threading.Event()
        self._version: dict[str, int] = {}
        """Node name to the resourceVersion of the object the cache holds, where it is a number
        (kube-apiserver's are: etcd revisions, which only grow)."""
        self._taken: dict[str, int] = {}
        """Node name to the resourceVersion of a fresh read taken ahead of the watch, until the
        watch brings a newer one: its events up to that version are older, and ignored."""

    def replace(self, nodes: Iterable[NodeAnnotation]) -> None:
        """Take a full list: nodes absent from it are gone."""
        listed = list(nodes)
        fresh = {n.name: n.value for n in listed}
        wholes = {n.name: connected_whole(_labels(n), self.prefix) for n in listed}
        facts = {n.name: node_facts(n.node) for n in listed}
        places = {n.name: place_of(n, self.prefix) for n in listed}
        with self._lock:
            old = self._table
            table = RankTable(self._resource, self._lock)
            for name, text in fresh.items():
                unchanged = self._text.get(name, ...) == text and name in old.ranks
                r = old.ranks[name] if unchanged else self._rank(name, text)
                table.set(name, r, self._whole_of(name, wholes[name]), facts[name])
            # The sizes the scheduler was asking for stay encoded: no call pays for the relist.
            for k in old.sizes():
                table.verdicts(k)
            self._text, self._whole, self._facts, self._table = fresh, wholes, facts, table
            self._place = places
            self._version = {n.name: v for n in listed if (v := revision(n.version)) is not None}
            # The watch restarts from this list, which it brings up to date.
            self._taken = {}
            self._tally = _Tally()
            for name, r in table.ranks.items():
                self._tally.count(r, self._place[name], 1)
        self._synced.set()

    def apply(self, event: WatchEvent) -> None:
        """Take one watch event; a BOOKMARK changes nothing."""
        node = event.node
        if node is None:
            return
        version = revision(event.resource_version)
        with self._lock:
            taken = self._taken.get(node.name)
            if taken is not None:
                if version is not None and version <= taken:
                    # Not newer than the object a fresh read gave the cache (`take_fresh`): the
                    # watch is behind, and taking it would put the older object back.
                    return
                del self._taken[node.name]  # the watch has caught up
            if version is None:
                self._version.pop(node.name, None)
            else:
                self._version[node.name] = version
            self._recount(node.name, -1)
            if event.type == "DELETED":
                self._text.pop(node.name, None)
                self._whole.pop(node.name, None)
                self._facts.pop(node.name, None)
                self._place.pop(node.name, None)
                self._version.pop(node.name, None)
                self._table.drop(node.name)
                return
            self._place[node.name] = place_of(node, self.prefix)
            whole = connected_whole(_labels(node), self.prefix)
            facts = node_facts(node.node)
            if (
                self._text.get(node.name, ...) != node.value
                or self._whole.get(node.name) != whole
                or self._facts.get(node.name) != facts
                or node.name not in self._table.ranks
            ):
                self._text[node.name] = node.value
                self._whole[node.name] = whole
                self._facts[node.name] = facts
                r = self._rank(node.name, node.value)
                self._table.set(node.name, r, self._whole_of(node.name, whole), facts)
            self._recount(node.name, 1)

    def take_fresh(self, node: NodeAnnotation) -> bool:
        """Take a Node read from the API server just now, if the cache holds an older version of
        it (a smaller resourceVersion): the watch has not brought it yet. True when taken. A node
        the cache does not hold is left to the watch. The watch's older events for it are then
        ignored (`apply`), so this writer and the watch never put an older object back."""
        version = revision(node.version)
        with self._lock:
            known = self._version.get(node.name)
            if version is None or known is None or version <= known:
                return False
            self.apply(WatchEvent("MODIFIED", node, node.version))
            self._taken[node.name] = version
        return True

    def text(self, name: str) -> str | None:
        """The node's availability annotation as the cache holds it; None when absent or unknown."""
        return self._text.get(name)

    def revise(self, name: str) -> None:
        """Judge the node again: whether it is vouched for changed."""
        with self._lock:
            if name in self._text:
                self._recount(name, -1)
                r = self._rank(name, self._text[name])
                whole = self._whole_of(name, self._whole.get(name, 0))
                self._table.set(name, r, whole, self._facts.get(name, OPEN_NODE))
                self._recount(name, 1)

    def _recount(self, name: str, sign: int) -> None:
        """Count the node as the table has it now (1), or take that count away (-1): around
        each change, under the lock."""
        ranks = self._table.ranks
        if name in ranks:
            self._tally.count(ranks[name], self._place.get(name, _NOWHERE), sign)

    def _rank(self, name: str, text: str | None) -> NodeRank | None:
        return rank(text) if self.vouched(name) else None

    def _whole_of(self, name: str, whole: int) -> int:
        # What a node's labels say of its wiring counts only while its agent vouches for it.
        return whole if self.vouched(name) else 0

    def get(self, name: str) -> NodeRank | None:
        """The node's rank; None when unknown, or its availability is absent or damaged."""
        return self._table.ranks.get(name)

    def table(self) -> RankTable:
        """The current ranks, for one request.

        A full relist replaces the table; a request that started before reads the old one,
        which is what it would have read a moment earlier.
        """
        return self._table

    @property
    def synced(self) -> bool:
        """True once a full list has been taken."""
        return self._synced.is_set()

    def capacity(self) -> tuple[dict[int, int], dict[str, int]]:
        """What the cluster can host now: per size k in CAPABLE_SIZES, the nodes that hand a pod
        of k GPUs an NVLink-connected set now (`connected_now`); per multi-node NVLink partition,
        its nodes whose GPUs are all free (free GPUs equal the `count` label). Every such
        partition a node carries is listed, with 0 where none is free; a node's own partition
        (`node-<name>`) is not. Nodes whose availability reads as None count nowhere. Kept as
        nodes change: no work per node here."""
        with self._lock:
            tally = self._tally
            return dict(tally.capable), {p: n[1] for p, n in tally.partitions.items()}

    def network_capacity(self) -> dict[NetworkGroup, tuple[int, int]]:
        """Per network group (every `network-tier-<N>` value a node carries): (its nodes, those
        whose GPUs are all free, as `capacity` counts them). Kept as nodes change."""
        with self._lock:
            return {g: (n[0], n[1]) for g, n in self._tally.networks.items()}

    def counts(self) -> tuple[int, int]:
        """(nodes known, nodes whose availability is missing or damaged)."""
        with self._lock:
            return self._tally.nodes, self._tally.unreadable


def revision(resource_version: str) -> int | None:
    """A resourceVersion as a number, for ordering; None when it is not one (a server whose
    versions are not etcd revisions: the cache then never orders, and takes no fresh read)."""
    if not (resource_version.isascii() and resource_version.isdigit()):
        return None
    return int(resource_version) if len(resource_version) <= 20 else None


def _labels(node: NodeAnnotation) -> object:
    meta = node.node.get("metadata")
    return meta.get("labels") if isinstance(meta, dict) else None


class NodeWatcher(Reflector[WatchEvent]):
    """Keeps a NodeCache current: list, then watch from its resourceVersion, relist on 410."""

    what = "nodes"
    thread_name = "topo-reporter-watch"

    def __init__(self, client: NodeWatchClient, cache: NodeCache, **loop: Unpack[Loop]) -> None:
        super().__init__(**loop)
        self._client = client
        self._cache = cache

    def _list(self) -> str:
        snapshot = self._client.list_nodes(self._cache.annotation)
        self._cache.replace(snapshot.nodes)
        self._log.info("nodes_listed", nodes=len(snapshot.nodes))
        return snapshot.resource_version

    def _watch_from(self, resource_version: str) -> Iterable[WatchEvent]:
        return self._client.watch_nodes(self._cache.annotation, resource_version, self._stop)

    def _apply(self, event: WatchEvent) -> None:
        self._cache.apply(event)
