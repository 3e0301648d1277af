"""The three patch types the apiserver accepts for a Node, applied to plain JSON objects.

Strategic merge patch is implemented for what a Node's metadata needs: maps merge as in a JSON
merge patch and `null` deletes. Lists are replaced whole, and a `$patch`/`$retainKeys` directive
is refused rather than misapplied, so a test relying on list merging fails loudly.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    """The patch does not apply (answered 400 or 422 by the double)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch restricted to maps and whole-list replacement."""
    if isinstance(patch, dict):
        directives = [k for k in patch if k.startswith("$")]
        if directives:
            raise PatchError(f"the double does not implement strategic directives {directives}")
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value)
        return result
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} does not start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path element {part!r} does not exist")
    return node


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace and test (what kubectl and clients send)."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"bad JSON patch operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise PatchError("the double does not patch the whole document")
        parent = _parent(doc, parts)
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            if not isinstance(parent, dict) or parent.get(last) != op.get("value"):
                raise PatchError(f"test failed at {op['path']}")
        elif kind == "remove":
            if not isinstance(parent, dict) or last not in parent:
                raise PatchError(f"remove: {op['path']} does not exist")
            del parent[last]
        elif kind in ("add", "replace"):
            if not isinstance(parent, dict):
                raise PatchError(f"{kind}: {op['path']} is not in an object")
            if kind == "replace" and last not in parent:
                raise PatchError(f"replace: {op['path']} does not exist")
            parent[last] = copy.deepcopy(op.get("value"))
        else:
            raise PatchError(f"the double does not implement JSON patch op {kind!r}")
    return doc
