"""Node Feature Discovery's NodeFeature custom resource, as the double serves it.

The contracts a sink relies on, kept as a real apiserver keeps them for a custom resource:
`resourceVersion` bumps only on a real change; an update whose `metadata.resourceVersion` is stale
is a 409, one without it a 422; creating an existing object is a 409 (AlreadyExists); a missing
object is a 404 whose `details` name it, while a missing CRD (`installed=False`) is the bare 404
"the server could not find the requested resource"; strategic merge patch is a 415; and the body is
checked against the structural schema of NFD's CRD (string values, `elements` and `attributes`
required), with a 422 naming the field. In memory only.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .patches import PatchError, json_patch, merge_patch
from .validation import validate_metadata

GROUP = "nfd.k8s-sigs.io"
VERSION = "v1alpha1"
PLURAL = "nodefeatures"
KIND = "NodeFeature"
API = f"/apis/{GROUP}/{VERSION}"

_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PATH = re.compile(rf"{re.escape(API)}(?:/namespaces/(?P<ns>[^/]+))?/{PLURAL}(?:/(?P<name>[^/]+))?")

RESOURCE_LIST = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": f"{GROUP}/{VERSION}",
    "resources": [
        {
            "name": PLURAL,
            "singularName": KIND.lower(),
            "namespaced": True,
            "kind": KIND,
            "verbs": ["create", "delete", "get", "list", "patch", "update"],
        }
    ],
}
GROUP_ENTRY = {
    "name": GROUP,
    "versions": [{"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}],
    "preferredVersion": {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION},
}


class ApiStatusError(Exception):
    """Ends a request with this status; the server turns it into a metav1.Status reply."""

    def __init__(self, code: int, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = dict(details) if details is not None else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found(name: str) -> ApiStatusError:
    return ApiStatusError(
        404,
        f'{PLURAL}.{GROUP} "{name}" not found',
        {"name": name, "group": GROUP, "kind": PLURAL},
    )


def _missing_resource() -> ApiStatusError:
    # What a real apiserver answers for a group or resource it does not serve: no details.
    return ApiStatusError(404, "the server could not find the requested resource")


def _string_map(value: Any, field: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{field}: Invalid value: must be of type object"]
    return [
        f"{field}.{k}: Invalid value: must be of type string"
        for k, v in value.items()
        if not isinstance(v, str)
    ]


def schema_problems(obj: Mapping[str, Any]) -> list[str]:
    """What NFD's CRD schema (structural, v0.14-v0.17) rejects in a NodeFeature body."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    problems: list[str] = []
    if "labels" in spec:
        problems += _string_map(spec["labels"], "spec.labels")
    features = spec.get("features", {})
    if not isinstance(features, dict):
        return [*problems, "spec.features: Invalid value: must be of type object"]
    for kind in ("flags", "attributes", "instances"):
        sets = features.get(kind, {})
        if not isinstance(sets, dict):
            problems.append(f"spec.features.{kind}: Invalid value: must be of type object")
            continue
        for name, feature_set in sets.items():
            where = f"spec.features.{kind}.{name}"
            if not isinstance(feature_set, dict) or "elements" not in feature_set:
                problems.append(f"{where}.elements: Required value")
                continue
            elements = feature_set["elements"]
            if kind == "attributes":
                problems += _string_map(elements, f"{where}.elements")
            elif kind == "flags":
                if not isinstance(elements, dict):
                    problems.append(f"{where}.elements: Invalid value: must be of type object")
            elif not isinstance(elements, list):
                problems.append(f"{where}.elements: Invalid value: must be of type array")
            else:
                for i, instance in enumerate(elements):
                    if not isinstance(instance, dict) or "attributes" not in instance:
                        problems.append(f"{where}.elements[{i}].attributes: Required value")
                    else:
                        problems += _string_map(
                            instance["attributes"], f"{where}.elements[{i}].attributes"
                        )
    return problems


@dataclass
class NodeFeatureStore:
    """The NodeFeature objects, keyed by (namespace, name); `installed=False` drops the CRD."""

    revision: Callable[[], int]
    installed: bool = True
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- test side ---------------------------------------------------------------------------

    def put(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object as another writer would (nfd-worker, GPU Feature Discovery)."""
        return self.create(namespace, obj)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def edit(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Change an object as someone else would (a human with kubectl): bumps the version."""
        with self._lock:
            obj = merge_patch(self.objects[(namespace, name)], patch)
            obj["metadata"]["resourceVersion"] = str(self.revision())
            self.objects[(namespace, name)] = obj

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            del self.objects[(namespace, name)]

    # -- request side ------------------------------------------------------------------------

    def serve(
        self,
        method: str,
        path: str,
        query: Mapping[str, list[str]],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, Any]:
        """Answer one request under /apis/nfd.k8s-sigs.io; raises ApiStatusError to refuse it."""
        if not self.installed:
            raise _missing_resource()
        if method == "GET" and path == f"/apis/{GROUP}":
            return 200, GROUP_ENTRY
        if method == "GET" and path == API:
            return 200, RESOURCE_LIST
        match = _PATH.fullmatch(path)
        if match is None:
            raise _missing_resource()
        namespace, name = match.group("ns"), match.group("name")
        selector = (query.get("labelSelector") or [""])[0]
        if name is None:
            if method == "GET":
                return 200, self.list(namespace, selector)
            if method == "POST" and namespace is not None:
                return 201, self.create(namespace, body)
        elif namespace is not None:
            if method == "GET":
                found = self.get(namespace, name)
                if found is None:
                    raise _not_found(name)
                return 200, found
            if method == "PUT":
                return 200, self.replace(namespace, name, body)
            if method == "PATCH":
                return 200, self.patch(namespace, name, content_type or "", body)
            if method == "DELETE":
                self.delete(namespace, name)
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": name, "group": GROUP, "kind": PLURAL},
                }
        raise ApiStatusError(405, "the server does not allow this method on the requested resource")

    def list(self, namespace: str | None, selector: str) -> dict[str, Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self.objects.items())
                if (namespace is None or ns == namespace)
                and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
            revision = str(self.revision())
        return {
            "kind": f"{KIND}List",
            "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {"resourceVersion": revision},
            "items": items,
        }

    def _checked(self, obj: Any, namespace: str, name: str) -> dict[str, Any]:
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise ApiStatusError(400, "the object has no metadata")
        if obj.get("apiVersion") != f"{GROUP}/{VERSION}" or obj.get("kind") != KIND:
            raise ApiStatusError(
                400,
                f"the API version in the data ({obj.get('apiVersion')}) and kind "
                f"({obj.get('kind')}) do not match {GROUP}/{VERSION} {KIND}",
            )
        if obj["metadata"].get("namespace", namespace) != namespace:
            raise ApiStatusError(
                400, "the namespace of the provided object does not match the namespace sent"
            )
        causes = [c.text for c in validate_metadata(obj["metadata"].get("labels") or {}, {})]
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
            causes.insert(
                0, f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain'
            )
        causes += schema_problems(obj)
        if causes:
            summary = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
            raise ApiStatusError(
                422,
                f'{KIND}.{GROUP} "{name}" is invalid: {summary}',
                {
                    "name": name,
                    "group": GROUP,
                    "kind": KIND,
                    "causes": [
                        {"reason": "FieldValueInvalid", "message": c, "field": c.split(":")[0]}
                        for c in causes
                    ],
                },
            )
        return obj

    def create(self, namespace: str, obj: Any) -> dict[str, Any]:
        name = str((obj.get("metadata") or {}).get("name", "")) if isinstance(obj, dict) else ""
        if not name:
            raise ApiStatusError(422, f"{KIND}.{GROUP} is invalid: metadata.name: Required value")
        stored = copy.deepcopy(self._checked(obj, namespace, name))
        with self._lock:
            if (namespace, name) in self.objects:
                raise ApiStatusError(
                    409,
                    f'{PLURAL}.{GROUP} "{name}" already exists',
                    {"name": name, "group": GROUP, "kind": PLURAL},
                )
            metadata = stored["metadata"]
            metadata.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                creationTimestamp=_now(),
                generation=1,
                resourceVersion=str(self.revision()),
            )
            self.objects[(namespace, name)] = stored
            return copy.deepcopy(stored)

    def replace(self, namespace: str, name: str, obj: Any) -> dict[str, Any]:
        if isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") != name:
            raise ApiStatusError(400, "the name of the object does not match the name on the URL")
        updated = copy.deepcopy(self._checked(obj, namespace, name))
        with self._lock:
            return self._store(namespace, name, updated, required_version=True)

    def patch(self, namespace: str, name: str, content_type: str, patch: Any) -> dict[str, Any]:
        with self._lock:
            current = self.objects.get((namespace, name))
            if current is None:
                raise _not_found(name)
            try:
                if content_type == _MERGE:
                    if not isinstance(patch, dict):
                        raise ApiStatusError(400, "a merge patch must be a JSON object")
                    updated = merge_patch(current, patch)
                elif content_type == _JSON_PATCH:
                    updated = json_patch(current, patch)
                else:
                    # Custom resources have no strategic merge patch.
                    raise ApiStatusError(
                        415,
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: {_JSON_PATCH}, {_MERGE}, application/apply-patch+yaml",
                    )
            except PatchError as e:
                raise ApiStatusError(400, str(e)) from e
        self._checked(updated, namespace, name)
        with self._lock:
            return self._store(namespace, name, updated, required_version=False)

    def _store(
        self, namespace: str, name: str, updated: dict[str, Any], *, required_version: bool
    ) -> dict[str, Any]:
        current = self.objects.get((namespace, name))
        if current is None:
            raise _not_found(name)
        wanted = updated["metadata"].get("resourceVersion")
        have = current["metadata"]["resourceVersion"]
        if wanted is None and required_version:
            raise ApiStatusError(
                422,
                f'{KIND}.{GROUP} "{name}" is invalid: metadata.resourceVersion: Invalid value: '
                "0x0: must be specified for an update",
            )
        if wanted is not None and wanted != have:
            raise ApiStatusError(
                409,
                f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                {"name": name, "group": GROUP, "kind": PLURAL},
            )
        metadata = updated["metadata"]
        for immutable in ("uid", "creationTimestamp", "namespace"):
            metadata[immutable] = current["metadata"][immutable]
        metadata["resourceVersion"] = have
        metadata["generation"] = current["metadata"]["generation"]
        if updated != current:
            if updated.get("spec") != current.get("spec"):
                metadata["generation"] += 1
            metadata["resourceVersion"] = str(self.revision())
            self.objects[(namespace, name)] = updated
        return copy.deepcopy(self.objects[(namespace, name)])

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            if self.objects.pop((namespace, name), None) is None:
                raise _not_found(name)
