"""NodeResourceTopology objects (`topology.node.k8s.io/v1alpha2`, cluster-scoped), as the double
serves them: get, create, replace, with the contracts of a real custom resource (resourceVersion
bumps only on a change, a stale resourceVersion is 409, creating an existing object is 409, a
missing object is a 404 naming it, a missing CRD the bare 404). In memory only.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .nodefeatures import ApiStatusError

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"
PREFIX = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
GROUP_ENTRY = {
    "name": GROUP,
    "versions": [{"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}],
    "preferredVersion": {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION},
}


def _not_found(name: str) -> ApiStatusError:
    return ApiStatusError(
        404, f'{PLURAL}.{GROUP} "{name}" not found', {"name": name, "group": GROUP, "kind": PLURAL}
    )


@dataclass
class NrtStore:
    revision: Callable[[], int]
    installed: bool = True
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object as another producer would have created it."""
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(self.revision())
        with self._lock:
            self.objects[meta["name"]] = stored
        return copy.deepcopy(stored)

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get(name)
            return None if found is None else copy.deepcopy(found)

    def serve(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not self.installed:
            raise ApiStatusError(404, "the server could not find the requested resource")
        name = path.removeprefix(PREFIX).strip("/") or None
        if method == "GET" and name is not None:
            found = self.get(name)
            if found is None:
                raise _not_found(name)
            return 200, found
        if method == "POST" and name is None:
            return 201, self._create(body)
        if method == "PUT" and name is not None:
            return 200, self._replace(name, body)
        raise ApiStatusError(405, f"{method} is not allowed here")

    def _checked(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict) or obj.get("kind") != KIND:
            raise ApiStatusError(400, f"the body is not a {KIND}")
        if obj.get("apiVersion") != f"{GROUP}/{VERSION}":
            raise ApiStatusError(400, f"apiVersion {obj.get('apiVersion')!r} is not served here")
        if not isinstance(obj.get("zones"), list):
            raise ApiStatusError(422, f"{KIND}.{GROUP} is invalid: zones: Required value")
        return copy.deepcopy(obj)

    def _create(self, body: Any) -> dict[str, Any]:
        obj = self._checked(body)
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            raise ApiStatusError(422, f"{KIND}.{GROUP} is invalid: metadata.name: Required value")
        with self._lock:
            if name in self.objects:
                raise ApiStatusError(
                    409,
                    f'{PLURAL}.{GROUP} "{name}" already exists',
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            obj["metadata"].pop("resourceVersion", None)
            obj["metadata"]["uid"] = str(uuid.uuid4())
            obj["metadata"]["resourceVersion"] = str(self.revision())
            self.objects[name] = obj
            return copy.deepcopy(obj)

    def _replace(self, name: str, body: Any) -> dict[str, Any]:
        obj = self._checked(body)
        with self._lock:
            current = self.objects.get(name)
            if current is None:
                raise _not_found(name)
            have = current["metadata"]["resourceVersion"]
            if obj.get("metadata", {}).get("resourceVersion") != have:
                raise ApiStatusError(
                    409,
                    f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            obj["metadata"]["uid"] = current["metadata"]["uid"]
            obj["metadata"]["resourceVersion"] = have
            if obj != current:
                obj["metadata"]["resourceVersion"] = str(self.revision())
                self.objects[name] = obj
            return copy.deepcopy(self.objects[name])
