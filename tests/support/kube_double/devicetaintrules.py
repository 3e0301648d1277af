"""DRA DeviceTaintRules (`resource.k8s.io/v1alpha3`, cluster-scoped), as the double serves them:
list (with an equality label selector), create and delete, with the contracts of the real server
(creating an existing object is a 409, deleting a missing one a 404 naming it). Off by default, as
on a 1.34 cluster without the `DRADeviceTaints` gate: every version is then the bare 404 "the
server could not find the requested resource". In memory only; the real apiserver's behaviour is
tested in tests/publish/test_devicetaints.py and tests/controlplane/test_dra.py.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .nodefeatures import ApiStatusError

GROUP = "resource.k8s.io"
VERSION = "v1alpha3"
PLURAL = "devicetaintrules"
KIND = "DeviceTaintRule"
PREFIX = f"/apis/{GROUP}/"
PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"


def _selected(labels: dict[str, str], selector: str) -> bool:
    """`a=b,c=d`: the equality selectors the sink sends."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


@dataclass
class DeviceTaintRuleStore:
    revision: Callable[[], int]
    installed: bool = False
    """On: the gate and resource.k8s.io/v1alpha3 are on."""
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        if not self.installed or not (path == PATH or path.startswith(PATH + "/")):
            raise ApiStatusError(404, "the server could not find the requested resource")
        name = path.removeprefix(PATH).strip("/") or None
        if method == "GET" and name is None:
            selector = (query.get("labelSelector") or [""])[0]
            with self._lock:
                items = [
                    copy.deepcopy(o)
                    for o in self.objects.values()
                    if _selected(o["metadata"].get("labels") or {}, selector)
                ]
            return 200, {"kind": f"{KIND}List", "apiVersion": f"{GROUP}/{VERSION}", "items": items}
        if method == "POST" and name is None:
            return 201, self._create(body)
        if method == "DELETE" and name is not None:
            with self._lock:
                gone = self.objects.pop(name, None)
            if gone is None:
                raise ApiStatusError(
                    404,
                    f'{PLURAL}.{GROUP} "{name}" not found',
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            return 200, gone
        raise ApiStatusError(405, f"{method} is not allowed here")

    def _create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or body.get("kind") != KIND:
            raise ApiStatusError(400, f"the body is not a {KIND}")
        obj = copy.deepcopy(body)
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
            obj["metadata"]["uid"] = str(uuid.uuid4())
            obj["metadata"]["resourceVersion"] = str(self.revision())
            self.objects[name] = obj
            return copy.deepcopy(obj)
