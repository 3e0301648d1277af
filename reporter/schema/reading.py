"""The topology in what a user holds: an annotation value, a Node as kubectl prints it (JSON or
YAML), or the text of `nvidia-smi topo -m`. Text in, a Topology or one InputError line out; the
commands read the file (reporter.inputs) and hand its text here.
"""

from __future__ import annotations

from typing import Any

from parsers.documents import MAX_CHARS, DocumentBoundError, load_json, load_yaml
from parsers.errors import ParseError
from parsers.nvsmi import parse_topo
from reporter.errors import InputError, SchemaError
from reporter.schema.codec import MAX_DOCUMENT_DEPTH, from_document, to_document
from reporter.schema.model import Topology
from reporter.schema.node import node_name, topology_annotation
from reporter.schema.normalize import topology_from_matrix


def topology_from_text(text: str, source: str) -> Topology:
    """Parse `nvidia-smi topo -m` text. Raises InputError naming the file and line."""
    try:
        topology = topology_from_matrix(parse_topo(text))
    except ParseError as e:
        raise InputError(f"{source}: {e}") from None
    try:
        # What `parse` prints, `render` must read back: the schema is the one judge of both.
        from_document(to_document(topology))
    except SchemaError as e:
        raise InputError(f"{source}: the matrix does not fit the schema: {e}") from None
    return topology


def _load_document(text: str) -> Any:
    """JSON, else YAML. Raises DocumentBoundError (refused in any format), ParseError (neither)."""
    try:
        return load_json(text, max_chars=MAX_CHARS)
    except DocumentBoundError:
        raise
    except ParseError:
        return load_yaml(text, max_chars=MAX_CHARS)


def _topology_from_document(doc: Any, source: str, prefix: str) -> Topology:
    if isinstance(doc, dict) and doc.get("kind") in ("NodeList", "List"):
        items = doc.get("items")
        if not isinstance(items, list) or len(items) != 1:
            count = len(items) if isinstance(items, list) else 0
            raise InputError(
                f"{source} holds {count} nodes: pass one (`kubectl get node NAME -o json`)"
            )
        doc = items[0]
    if isinstance(doc, dict) and doc.get("kind") == "Node":
        name = node_name(doc)
        annotation = topology_annotation(doc, prefix)
        try:
            doc = load_json(annotation, max_depth=MAX_DOCUMENT_DEPTH)
        except ParseError as e:
            raise InputError(f"node {name}: the topology annotation does not read: {e}") from None
    return from_document(doc)


def topology_from_document_text(text: str, source: str, prefix: str) -> Topology:
    """Decode an annotation value, or the annotation of a Node (JSON or YAML, as kubectl prints).

    Raises InputError (SchemaError for a document that does not validate) naming the field.
    """
    if len(text) > MAX_CHARS:
        raise InputError(f"{source} is larger than {MAX_CHARS} bytes: not a topology")
    try:
        doc = _load_document(text)
    except DocumentBoundError as e:
        raise InputError(f"{source}: {e}") from None
    except ParseError:
        raise InputError(
            f"{source} is neither JSON nor YAML: expected a topology annotation or a Node "
            "object (`kubectl get node NAME -o json`)"
        ) from None
    return _topology_from_document(doc, source, prefix)


def topology_from_any_text(text: str, source: str, prefix: str) -> Topology:
    """A topology from whatever a user holds: an annotation, a Node (JSON or YAML), or the text of
    `nvidia-smi topo -m`. A JSON or YAML mapping with `v` or `kind` is a document; the rest is text.
    """
    doc: Any = None
    refused: DocumentBoundError | None = None
    try:
        doc = _load_document(text)
    except DocumentBoundError as e:
        refused = e
    except ParseError:
        doc = None
    if isinstance(doc, dict) and ("v" in doc or "kind" in doc):
        return _topology_from_document(doc, source, prefix)
    try:
        return topology_from_text(text, source)
    except InputError:
        if refused is not None:
            # A document refused for its size, depth or aliases, not a paste: say why.
            raise InputError(f"{source}: {refused}") from None
        raise
