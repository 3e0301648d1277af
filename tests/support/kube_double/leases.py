"""`coordination.k8s.io/v1` Leases, as the double serves them: get, create, replace, list (label
selector, pages) and watch, per namespace.

The contracts the heartbeat relies on, kept as kube-apiserver keeps them: resourceVersion bumps
only on a change; an update with a stale or missing resourceVersion is a 409; creating an
existing Lease is a 409 (AlreadyExists); a missing Lease is a 404 whose `details` name it;
`renewTime` and `acquireTime` must be MicroTime (RFC 3339 with microseconds) and
`leaseDurationSeconds` a positive integer, or 422 naming the field. Changes go to their own watch
log, served per namespace and label selector. In memory only.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .nodefeatures import ApiStatusError
from .watch import NodeWatchLog

GROUP = "coordination.k8s.io"
PLURAL = "leases"
KIND = "Lease"
PATH = re.compile(rf"/apis/{re.escape(GROUP)}/v1/namespaces/([^/]+)/{PLURAL}(?:/([^/]+))?")
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")

Selector = Callable[[Mapping[str, str]], bool]
"""Whether a Lease's labels match the request's labelSelector."""


def _gone(name: str) -> ApiStatusError:
    return ApiStatusError(
        404, f'{PLURAL}.{GROUP} "{name}" not found', {"name": name, "group": GROUP, "kind": PLURAL}
    )


def _invalid(name: str, path: str, message: str) -> ApiStatusError:
    return ApiStatusError(
        422,
        f'{KIND}.{GROUP} "{name}" is invalid: {path}: {message}',
        {
            "name": name,
            "group": GROUP,
            "kind": KIND,
            "causes": [{"field": path, "message": message}],
        },
    )


@dataclass
class LeaseStore:
    revision: Callable[[], int]
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    log: NodeWatchLog = field(default_factory=NodeWatchLog)
    """Every Lease change by resourceVersion (the Node log's class serves any object)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- test side -----------------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get((namespace, name))
            return None if found is None else copy.deepcopy(found)

    def put(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Store a Lease as another writer would (a human, another component)."""
        stored = copy.deepcopy(dict(lease))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        with self._lock:
            meta["resourceVersion"] = str(self.revision())
            kind = "MODIFIED" if (meta["namespace"], meta["name"]) in self.objects else "ADDED"
            self.objects[meta["namespace"], meta["name"]] = stored
            self.log.record(kind, stored)
        return copy.deepcopy(stored)

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            lease = self.objects.pop((namespace, name))
            lease["metadata"]["resourceVersion"] = str(self.revision())
            self.log.record("DELETED", lease)

    # -- request side --------------------------------------------------------------------------

    def serve(
        self, method: str, namespace: str, name: str | None, body: Any, selected: Selector
    ) -> tuple[int, Any]:
        if method == "GET" and name is not None:
            found = self.get(namespace, name)
            if found is None:
                raise _gone(name)
            return 200, found
        if method == "GET":
            return 200, self._list(namespace, selected)
        if method == "POST" and name is None:
            return 201, self._create(namespace, body)
        if method == "PUT" and name is not None:
            return 200, self._replace(namespace, name, body)
        raise ApiStatusError(405, f"{method} is not allowed here")

    def stream(
        self, namespace: str, selected: Selector, since: int, timeout_s: float
    ) -> Iterator[dict[str, Any]]:
        """The watch of one namespace's Leases matching the selector."""
        for event in self.log.stream(since, timeout_s):
            obj = event["object"]
            meta = obj.get("metadata") or {}
            if event["type"] in ("ERROR", "BOOKMARK") or (
                meta.get("namespace") == namespace and selected(meta.get("labels") or {})
            ):
                yield event

    def _list(self, namespace: str, selected: Selector) -> dict[str, Any]:
        with self._lock:
            items = [
                copy.deepcopy(lease)
                for (ns, _), lease in sorted(self.objects.items())
                if ns == namespace and selected(lease["metadata"].get("labels") or {})
            ]
            revision = max(
                [int(o["metadata"]["resourceVersion"]) for o in self.objects.values()]
                + [e[0] for e in self.log.events],
                default=1,
            )
        return {
            "kind": "LeaseList",
            "apiVersion": f"{GROUP}/v1",
            "metadata": {"resourceVersion": str(revision)},
            "items": items,
        }

    def _checked(self, namespace: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or body.get("kind") != KIND:
            raise ApiStatusError(400, f"the body is not a {KIND}")
        if body.get("apiVersion") != f"{GROUP}/v1":
            raise ApiStatusError(400, f"apiVersion {body.get('apiVersion')!r} is not served here")
        lease = copy.deepcopy(body)
        meta = lease.setdefault("metadata", {})
        name = str(meta.get("name") or "")
        if not name:
            raise _invalid(name, "metadata.name", "Required value")
        if meta.setdefault("namespace", namespace) != namespace:
            raise ApiStatusError(400, "the namespace of the object does not match the request")
        spec = lease.get("spec") or {}
        for key in ("renewTime", "acquireTime"):
            if key in spec and not (
                isinstance(spec[key], str) and _MICRO_TIME.fullmatch(spec[key])
            ):
                raise _invalid(name, f"spec.{key}", "must be a MicroTime (RFC 3339, microseconds)")
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            raise _invalid(name, "spec.leaseDurationSeconds", "must be greater than 0")
        return lease

    def _create(self, namespace: str, body: Any) -> dict[str, Any]:
        lease = self._checked(namespace, body)
        meta = lease["metadata"]
        with self._lock:
            if (namespace, meta["name"]) in self.objects:
                raise ApiStatusError(
                    409,
                    f'{PLURAL}.{GROUP} "{meta["name"]}" already exists',
                    {"name": meta["name"], "group": GROUP, "kind": PLURAL},
                )
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(self.revision())
            self.objects[namespace, meta["name"]] = lease
            self.log.record("ADDED", lease)
            return copy.deepcopy(lease)

    def _replace(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        lease = self._checked(namespace, body)
        with self._lock:
            current = self.objects.get((namespace, name))
            if current is None:
                raise _gone(name)
            have = current["metadata"]["resourceVersion"]
            if lease["metadata"].get("resourceVersion") != have:
                raise ApiStatusError(
                    409,
                    f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            lease["metadata"]["uid"] = current["metadata"]["uid"]
            if lease != current:
                lease["metadata"]["resourceVersion"] = str(self.revision())
                self.objects[namespace, name] = lease
                self.log.record("MODIFIED", lease)
            return copy.deepcopy(self.objects[namespace, name])
