"""The availability heartbeat: a `coordination.k8s.io/v1` Lease per node, in the agent's namespace.

Kubernetes puts a kubelet's heartbeat in a Lease named after its node (`kube-node-lease`), not on
the Node, so that a renewal costs one small write and wakes no Node watcher. The agent does the
same for what it vouches for: while it keeps its node's availability keys current, it renews a
Lease named after the node, holder the node, `leaseDurationSeconds` its duration, `renewTime`
the time of the renewal, labelled `<prefix>/heartbeat=availability`, owned by the Node (deleted
with it). A scheduler extender that watches these Leases stops trusting the availability of a
node whose Lease is not renewed within its duration: the agent is gone, stuck, or cannot write.

`LeaseHeartbeat` is the agent's writer: one read when it does not know the Lease, a create when
there is none, then one replace per renewal carrying the resourceVersion of the last answer (a
409 or a 404 forgets it, and the next renewal reads again). It never takes over a Lease of that
name that is not a heartbeat of ours. `LeaseWatch` is the extender's reader: list and watch of
the heartbeat Leases of one namespace, reduced to what judging needs.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from reporter.errors import ApiPermanentError, ApiTransientError, PublishError
from reporter.publish.api import LEASES, ApiClient
from reporter.publish.sink import read_node
from reporter.schema import keys

RBAC_VERBS = ("get", "create", "update")
"""Exactly the verbs the agent uses on leases, in its own namespace."""
WATCH_RBAC_VERBS = ("list", "watch")
"""Exactly the verbs the extender uses on leases, in the agent's namespace."""
RENEWALS_PER_DURATION = 4
"""The kubelet renews its node Lease every quarter of its duration (10 s of 40 s): a renewal can
be late or lost twice before the Lease expires."""
MAX_DURATION_S = 86400
PAGE_SIZE = 500
MAX_PAGES = 1000


def micro_time(seconds: float) -> str:
    """A Unix time as Kubernetes' MicroTime (RFC 3339, UTC, microseconds), as `renewTime` takes."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def heartbeat_label(prefix: str) -> tuple[str, str]:
    """The label (key, value) every heartbeat Lease carries, which the extender selects on."""
    return keys.key(prefix, keys.HEARTBEAT), keys.HEARTBEAT_AVAILABILITY


def is_heartbeat(lease: Mapping[str, Any], prefix: str) -> bool:
    """Whether a Lease is one of our heartbeats (carries our label)."""
    key, value = heartbeat_label(prefix)
    labels = (lease.get("metadata") or {}).get("labels") or {}
    return isinstance(labels, dict) and labels.get(key) == value


class ForeignLeaseError(ApiPermanentError):
    """A Lease by the node's name exists and is not our heartbeat (another component's)."""


class LeaseHeartbeat:
    """Renews the node's heartbeat Lease; `renew()` is one renewal (one request when known)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        node: str,
        namespace: str,
        prefix: str,
        duration_s: float,
        log: structlog.typing.FilteringBoundLogger,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._node = node
        self._namespace = namespace
        self._prefix = prefix
        self.duration_s = math.ceil(duration_s)
        """`leaseDurationSeconds` (whole seconds, as the API takes it)."""
        self.period_s = duration_s / RENEWALS_PER_DURATION
        """Between renewals."""
        self._log = log
        self._wall = wall
        self._lease: dict[str, Any] | None = None
        """The Lease as last stored; None: read it first."""

    def renew(self) -> None:
        """Make the Lease say the node's agent is alive now. Raises PublishError."""
        try:
            if self._lease is None:
                found = self._read()
                if found is None:
                    self._lease = self._create()
                    return
                self._lease = found
            self._lease = self._api.replace(
                LEASES, self._node, self._renewed(self._lease), self._namespace
            )
        except PublishError:
            self._lease = None
            raise

    def _read(self) -> dict[str, Any] | None:
        found = self._api.get(LEASES, self._node, self._namespace)
        if found is not None and not is_heartbeat(found, self._prefix):
            key, value = heartbeat_label(self._prefix)
            raise ForeignLeaseError(
                f"Lease {self._namespace}/{self._node} exists without the label {key}={value}: "
                "it is another component's; run the agent in a namespace of its own (the chart's "
                "release namespace), or turn the heartbeat off"
            )
        return found

    def _create(self) -> dict[str, Any]:
        # The Node's uid for the owner reference: one read, once per Lease.
        uid = read_node(self._api, self._node).uid
        created = self._api.create(LEASES, self._new(uid), self._namespace)
        self._log.info("heartbeat_created", lease=f"{self._namespace}/{self._node}")
        return created

    def _spec(self, now: str) -> dict[str, Any]:
        return {
            "holderIdentity": self._node,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": now,
        }

    def _new(self, node_uid: str | None) -> dict[str, Any]:
        now = micro_time(self._wall())
        key, value = heartbeat_label(self._prefix)
        metadata: dict[str, Any] = {
            "name": self._node,
            "namespace": self._namespace,
            "labels": {key: value},
        }
        if node_uid:
            # As the kubelet's node Lease: the garbage collector deletes it with its Node.
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": node_uid}
            ]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {**self._spec(now), "acquireTime": now},
        }

    def _renewed(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        spec = lease.get("spec")
        kept = spec if isinstance(spec, dict) else {}
        meta = lease.get("metadata")
        # Without managedFields, which the server keeps as they are when an update omits them:
        # half of each renewal's bytes otherwise (bench/README.md).
        metadata = (
            {k: v for k, v in meta.items() if k != "managedFields"}
            if isinstance(meta, dict)
            else {}
        )
        return {
            **lease,
            "metadata": metadata,
            "spec": {**kept, **self._spec(micro_time(self._wall()))},
        }


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat Lease as the extender judges it."""

    node: str
    """The Lease's name: the node it speaks for."""
    renew_time: str | None
    """`renewTime` as written (compared, never parsed: the extender trusts its own clock); None
    when absent or when the holder is not the node, which vouches for nothing."""
    duration_s: int | None
    """`leaseDurationSeconds`, None when absent or out of range (1 s to a day)."""


@dataclass(frozen=True, slots=True)
class BeatSnapshot:
    """Every heartbeat Lease of the namespace, and the resourceVersion to watch from."""

    beats: tuple[Beat, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class BeatEvent:
    """One watch event: ADDED, MODIFIED, DELETED, or BOOKMARK (beat None, progress only)."""

    type: str
    beat: Beat | None
    resource_version: str


def beat(lease: Any) -> Beat:
    """A Lease object read as a Beat. Raises ApiTransientError for an object without a name."""
    meta = lease.get("metadata") if isinstance(lease, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        raise ApiTransientError(
            "list or watch leases: the API server sent an object without a name"
        )
    spec = lease.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    renew = spec.get("renewTime")
    duration = spec.get("leaseDurationSeconds")
    held = spec.get("holderIdentity") == name and isinstance(renew, str)
    seconds = None
    if isinstance(duration, int) and not isinstance(duration, bool):
        seconds = duration if 1 <= duration <= MAX_DURATION_S else None
    return Beat(name, renew if held else None, seconds)


class LeaseWatch:
    """The heartbeat Leases of one namespace, listed in pages then watched, over any ApiClient."""

    def __init__(
        self, api: ApiClient, *, namespace: str, prefix: str, watch_timeout_s: int = 300
    ) -> None:
        self._api = api
        self.namespace = namespace
        key, value = heartbeat_label(prefix)
        self._selector = {"labelSelector": f"{key}={value}"}
        self._watch_timeout_s = watch_timeout_s

    def list_beats(self) -> BeatSnapshot:
        """Every heartbeat Lease (all pages). Raises PublishError."""
        beats: list[Beat] = []
        query = {**self._selector, "limit": str(PAGE_SIZE)}
        for _ in range(MAX_PAGES):
            page = self._api.list(LEASES, self.namespace, query=query)
            beats.extend(beat(item) for item in page["items"])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return BeatSnapshot(tuple(beats), str(meta.get("resourceVersion") or ""))
            query = {**self._selector, "limit": str(PAGE_SIZE), "continue": str(meta["continue"])}
        raise ApiTransientError(f"list leases: more than {MAX_PAGES} pages")

    def watch_beats(self, resource_version: str, stop: threading.Event) -> Iterator[BeatEvent]:
        """Start a watch from `resource_version` (raising when it is refused) and return its
        events until the server ends it or `stop` is set. Raises PublishError (WatchExpired for
        a 410, at once or while iterating)."""
        events = self._api.watch(
            LEASES,
            resource_version,
            stop,
            timeout_s=self._watch_timeout_s,
            namespace=self.namespace,
            query=self._selector,
        )
        return (_event(event) for event in events)


def _event(event: Mapping[str, Any]) -> BeatEvent:
    obj = event["object"]
    meta = obj.get("metadata")
    version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
    if event["type"] == "BOOKMARK":
        return BeatEvent("BOOKMARK", None, version)
    return BeatEvent(str(event["type"]), beat(obj), version)
