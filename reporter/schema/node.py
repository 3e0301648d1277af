"""A Node object, as kubectl prints it or the kubernetes client returns it, into the model.

Schedulers hold Nodes, not annotation strings: this takes either shape (a dict from JSON or YAML, or
a `V1Node`-like object with `.metadata.annotations`) so that no caller digs for the key by hand.
It must never import kubernetes: it reads attributes, whatever class carries them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parsers.errors import excerpt
from reporter.errors import InputError
from reporter.schema import keys
from reporter.schema.codec import decode
from reporter.schema.model import Topology


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def node_name(node: Any) -> str:
    """The Node's `metadata.name`, or `?` when it has none."""
    name = _field(_field(node, "metadata"), "name")
    return name if isinstance(name, str) else "?"


def topology_annotation(node: Any, prefix: str = keys.DEFAULT_PREFIX) -> str:
    """The raw `<prefix>/topology` annotation value of a Node. Raises InputError when absent."""
    if isinstance(node, Mapping) and node.get("kind", "Node") != "Node":
        raise InputError(f"expected a Node object, got kind {excerpt(node.get('kind'))}")
    metadata = _field(node, "metadata")
    if metadata is None:
        raise InputError("not a Node object: it has no metadata")
    annotations = _field(metadata, "annotations") or {}
    if not isinstance(annotations, Mapping):
        raise InputError(f"node {node_name(node)}: metadata.annotations is not a mapping")
    key = keys.key(prefix, keys.TOPOLOGY)
    value = annotations.get(key)
    if value is None:
        raise InputError(
            f"node {node_name(node)} has no {key} annotation: is topo-reporter running on it, "
            "with this --prefix?"
        )
    if not isinstance(value, str):
        raise InputError(f"node {node_name(node)}: the {key} annotation is not a string")
    return value


def decode_node(node: Any, prefix: str = keys.DEFAULT_PREFIX) -> Topology:
    """Decode a Node's topology annotation (Node as a dict, or a V1Node-like object).

    Raises InputError when the Node has no annotation, SchemaError when it does not validate.
    """
    return decode(topology_annotation(node, prefix))
