"""Fuzzing the annotation decoder: any input ends in a Topology or SchemaError/InputError.

The `topology` annotation is read back from the API server, where anyone who can edit a Node can
change it, so `decode`, `from_document` and the commands' `topology_from_document_text`
(reporter.schema.reading) are fed arbitrary bytes and text, and valid documents (from the real
fixtures' goldens and from random topologies) with fields changed, removed, added or nested, with
and without the hash recomputed (without it nearly every change stops at the hash check and the
checks behind it go untested). What is accepted must round-trip. Budgets come from
tests/support/fuzz.py; no test asserts a time.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from reporter.errors import InputError, SchemaError
from reporter.schema import keys
from reporter.schema.codec import decode, encode, from_document
from reporter.schema.model import Topology
from reporter.schema.reading import topology_from_document_text
from tests.support.fuzz import HUGE, fuzz, outcome
from tests.support.strategies import topologies

PREFIX = "gpu.topology.io"
GOLDENS = [
    json.loads(p.read_text(encoding="utf-8"))
    for p in sorted((Path(__file__).parents[1] / "fixtures" / "nvidia-smi").glob("*.golden.json"))
]
FIELD_NAMES = [
    "v", "source", "driver", "nvswitch", "nvlink_observed", "gpus", "links", "pcie", "nics",
    "numa_nodes", "islands", "hash", "index", "uuid", "pci", "model", "numa", "cpus", "mem_mib",
    "mig", "gpu_numa", "clique", "lost", "name", "peers", "id", "distances", "x", "gpu_common",
    "nvlink", "minor",
]  # fmt: skip
GPU_FIELDS = [
    "index", "uuid", "pci", "model", "numa", "cpus", "mem_mib", "mig", "minor", "gpu_numa",
    "clique", "fabric", "nvlink", "mig_devices", "lost",
]  # fmt: skip
"""A GPU's fields in docs/schema.md's order, the order the hash reads each GPU whole in."""
INTERESTING = st.sampled_from(
    [
        "X", "NV18", "X NV18", "NV18 X", "PIX SYS", "SYS", "", " ", "0-65535", "0-1,1-2", "3-1",
        "0000:18:00.0", "nvml", "sysfs", "nvidia-smi", 1, 0, -1, 255, 256, 2**31, 2**63, 1.5,
        True, False, None, [], {}, [0, 1], [[0, 1]], "GPU-x",
    ]
    # A copy per draw: the mutators change what they are handed, and a shared `[]` changed once
    # makes every later draw of it differ from its replay (FlakyStrategyDefinition).
).map(copy.deepcopy)  # fmt: skip
JSON_VALUES = st.recursive(
    INTERESTING
    | st.integers(4000, 5000).map(lambda n: "0" * n)
    | st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _whole(gpu: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    merged = {**gpu, **common}
    last = len(GPU_FIELDS)
    order = sorted(merged, key=lambda k: GPU_FIELDS.index(k) if k in GPU_FIELDS else last)
    return {k: merged[k] for k in order}


def _rehash(doc: Any) -> None:
    # The hash as docs/schema.md defines it, computed here rather than borrowed from the codec:
    # over the document without it, `gpu_common` written into every GPU.
    if isinstance(doc, dict):
        body = {k: v for k, v in doc.items() if k != "hash"}
        common, gpus = body.get("gpu_common"), body.get("gpus")
        if isinstance(common, dict) and isinstance(gpus, list):
            del body["gpu_common"]
            body["gpus"] = [_whole(g, common) if isinstance(g, dict) else g for g in gpus]
        canonical = json.dumps(body, separators=(",", ":"), ensure_ascii=True)
        doc["hash"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """A valid v1 document with one to three fields changed, removed, added or nested."""
    base = draw(
        st.sampled_from(GOLDENS) | topologies(max_gpus=6).map(lambda t: json.loads(encode(t)))
    )
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = draw(st.sampled_from(["set", "remove", "add", "nest"]))
        if action == "set":
            parent[last] = draw(JSON_VALUES)
        elif action == "remove":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(FIELD_NAMES))] = draw(JSON_VALUES)
        elif action == "add":
            parent.insert(last, draw(JSON_VALUES))
        else:
            parent[last] = draw(st.sampled_from([[parent[last]], {"x": parent[last]}]))
    if draw(st.integers(0, 3)):
        _rehash(doc)
    return doc


def _check_accepted(topology: Topology) -> None:
    # Whatever the decoder accepts is a whole valid topology: it encodes and decodes to itself.
    assert decode(encode(topology)) == topology


def _accepted_or_explained(result: Topology | Exception) -> None:
    if isinstance(result, Exception):
        assert str(result)  # one line the user can act on, never empty
    else:
        _check_accepted(result)


@fuzz(1200)
@given(mutated_documents())
def test_mutated_documents_decode_or_raise_schema_error(doc: Any) -> None:
    topology = outcome(lambda: from_document(doc), SchemaError)
    if isinstance(topology, SchemaError):
        event(f"SchemaError at {topology.field.split('[')[0].split('.')[0] or '(document)'}")
        assert str(topology)
        return
    event("accepted")
    _check_accepted(topology)


@fuzz(300)
@given(mutated_documents())
def test_mutated_documents_as_text_decode_the_same_as_parsed(doc: Any) -> None:
    text = json.dumps(doc, separators=(",", ":"))
    expected = outcome(lambda: from_document(doc), SchemaError)
    got = outcome(lambda: decode(text), SchemaError)
    assert str(got) == str(expected) if isinstance(got, SchemaError) else got == expected


@fuzz(300)
@given(st.binary(max_size=3000) | st.text(max_size=3000).map(str.encode))
def test_arbitrary_bytes_decode_or_raise_schema_error(data: bytes) -> None:
    _accepted_or_explained(outcome(lambda: decode(data), SchemaError))


@fuzz(300)
@given(
    st.text(max_size=500)
    | st.sampled_from(GOLDENS).map(lambda d: json.dumps(d)[: len(json.dumps(d)) // 2])
    | st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth)
    | st.integers(1, 5000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth)
)
def test_arbitrary_text_decodes_or_raises_schema_error(text: str) -> None:
    _accepted_or_explained(outcome(lambda: decode(text), SchemaError))


def _node(annotation: Any, kind: str) -> dict[str, Any]:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-1",
            "annotations": {keys.key("gpu.topology.io", keys.TOPOLOGY): annotation},
        },
    }
    return node if kind == "Node" else {"apiVersion": "v1", "kind": kind, "items": [node]}


@st.composite
def node_documents(draw: st.DrawFn) -> str:
    """A Node or a one-item list, as kubectl prints it (JSON or YAML), with a damaged annotation."""
    doc = draw(mutated_documents())
    annotation = draw(st.just(json.dumps(doc, separators=(",", ":"))) | JSON_VALUES)
    node: Any = _node(annotation, draw(st.sampled_from(["Node", "NodeList", "List"])))
    if draw(st.booleans()):
        path = draw(st.sampled_from([("metadata",), ("metadata", "annotations"), ("items",)]))
        target = node if path[0] in node else node.get("items", [node])[0]
        *head, last = path
        for part in head:
            target = target[part]
        if last in target:
            target[last] = draw(JSON_VALUES)
    if draw(st.booleans()):
        return yaml.safe_dump(node)
    return json.dumps(node)


@fuzz(300)
@given(node_documents() | st.text(max_size=300))
def test_node_objects_and_text_decode_or_raise_input_error(text: str) -> None:
    _accepted_or_explained(
        outcome(
            lambda: topology_from_document_text(text, "node.json", "gpu.topology.io"), InputError
        )
    )


@pytest.fixture(scope="module")
def huge_document() -> str:
    # Valid-looking JSON for the first bytes, so nothing can fail on the first character.
    head = json.dumps(GOLDENS[0])[:-1] + ',"x":"'
    return head + "0" * (HUGE - len(head) - 2) + '"}'


def test_a_100_mb_annotation_is_refused_with_schema_error(huge_document: str) -> None:
    with pytest.raises(SchemaError, match="256 KiB"):
        decode(huge_document)
    with pytest.raises(SchemaError, match="256 KiB"):
        decode(huge_document.encode("ascii"))


def test_a_100_mb_node_document_is_refused_with_input_error(huge_document: str) -> None:
    with pytest.raises(InputError):
        topology_from_document_text(huge_document, "node.json", "gpu.topology.io")
