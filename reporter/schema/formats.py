"""Every way a command prints a topology, in one place, so `parse`, `render` and `collect` agree."""

from __future__ import annotations

import json

import yaml

from parsers.errors import excerpt
from reporter.schema.annotations import annotations as annotation_values
from reporter.schema.codec import encode, to_document, to_json
from reporter.schema.labels import labels
from reporter.schema.matrix import render_matrix
from reporter.schema.model import Topology
from reporter.schema.pictures import to_dot, to_mermaid

FORMATS = ("json", "yaml", "annotation", "matrix", "labels", "dot", "mermaid")
"""json and yaml give the document, each GPU whole, the same shape on every machine; annotation
gives the Node annotation's exact value, whose `gpu_common` holds what every GPU shares."""


def format_topology(topology: Topology, fmt: str, prefix: str, node: str | None = None) -> str:
    """The text of `topology` in `fmt` (one of FORMATS), ending in a newline; `node` names the
    Node for the labels (a node without a multi-node fabric is its own NVLink domain)."""
    if fmt == "json":
        return to_json(topology) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(to_document(topology), sort_keys=False, width=120)
    if fmt == "annotation":
        return encode(topology) + "\n"
    if fmt == "matrix":
        return render_matrix(topology)
    if fmt == "labels":
        pairs = {**labels(topology, prefix, node), **annotation_values(topology, prefix)}
        # One key=value per line: a multi-line value (the matrix) is printed JSON-quoted.
        return "".join(f"{k}={json.dumps(v) if chr(10) in v else v}\n" for k, v in pairs.items())
    if fmt == "dot":
        return to_dot(topology)
    if fmt == "mermaid":
        return to_mermaid(topology)
    raise ValueError(f"unknown format {excerpt(fmt)}")
