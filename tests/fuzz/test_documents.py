"""Fuzzing every reader with hostile structure: deep nesting, alias chains, long integers.

Each reader of the program (the JSON and YAML loaders, the annotation decoder, Node documents,
nvidia-smi text, the kubelet config, the settings file, kubeconfigs, machine profiles) is handed
documents nested up to a few thousand levels in flow and block style, YAML alias chains of up to
ten levels of ten (10**10 leaves when expanded), and integers of up to 6,000 digits in every YAML
base, placed where that reader looks. Every input ends in a value or the reader's documented
error, in one line of bounded length: never RecursionError, MemoryError or int-max-str-digits'
ValueError. Budgets come from tests/support/fuzz.py; no test asserts a time.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from parsers.documents import load_json, load_yaml
from parsers.errors import ParseError
from parsers.kubelet import parse_kubelet_config
from parsers.nvsmi import parse_topo
from reporter.collect.simulate.machine import load_machine
from reporter.errors import ConfigError, CredentialsError, InputError, SchemaError
from reporter.publish.rest import load_rest_config
from reporter.schema.codec import decode
from reporter.schema.reading import topology_from_any_text, topology_from_document_text
from reporter.settings import resolve
from tests.support.fuzz import fuzz, outcome

# Longest message a reader may give: a line an operator reads, never a dump of the input.
MAX_MESSAGE = 600
KEYS = ["interval", "driver", "topologyManagerPolicy", "clusters", "gpus", "numa_nodes", "v"]


def _flow(depth: int, leaf: str, mapping: bool) -> str:
    if mapping:
        return '{"k": ' * depth + leaf + "}" * depth
    return "[" * depth + leaf + "]" * depth


def _block(depth: int, leaf: str) -> str:
    return "".join(f"{'  ' * i}k:\n" for i in range(depth)) + f"{'  ' * depth}{leaf}\n"


@st.composite
def integers_text(draw: st.DrawFn) -> str:
    """An integer of 1 to 6,000 digits in a YAML 1.1 form."""
    digits = draw(st.integers(1, 80) | st.integers(4000, 6000))
    form = draw(st.sampled_from(["{}", "-{}", "0x{}", "0b{}", "0{}", "1_{}", "1:{}"]))
    alphabet = "01" if form == "0b{}" else "7" if form == "0{}" else "9"
    return form.format(alphabet * digits)


@st.composite
def alias_chains(draw: st.DrawFn) -> str:
    """`levels` anchors, each a list of `fanout` aliases of the one before: fanout**levels."""
    levels, fanout = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    key = draw(st.sampled_from(KEYS))
    lines = [f"{key}0: &a0 [x]"]
    lines += [f"{key}{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@st.composite
def hostile_documents(draw: st.DrawFn) -> str:
    """A document that is deep, aliased or holds a long integer, where a reader looks."""
    leaf = draw(integers_text() | st.sampled_from(["1", '"x"', "null", "[]", "{}"]))
    depth = draw(st.integers(0, 40) | st.integers(900, 1100) | st.integers(1100, 3000))
    style = draw(st.sampled_from(["flow", "flow mapping", "block", "alias", "as JSON"]))
    event(style)
    key = draw(st.sampled_from(KEYS))
    if style == "alias":
        return draw(alias_chains())
    if style == "block":
        return f"{key}:\n" + "".join("  " + line + "\n" for line in _block(depth, leaf).split("\n"))
    body = _flow(depth, leaf, mapping=style == "flow mapping")
    if style == "as JSON":
        return '{"' + key + '": ' + body + "}"
    return f"{key}: {body}\n"


DOCUMENTS = hostile_documents() | st.text(alphabet="[]{}&*:,- \nakx01", max_size=200)


def _explained(result: object, error: type[Exception]) -> None:
    if isinstance(result, error):
        event(type(result).__name__)
        message = str(result)
        assert message
        assert "\n" not in message
        assert len(message) < MAX_MESSAGE


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    # Module scope: hypothesis runs many examples in one test call, so one file is rewritten.
    with tempfile.TemporaryDirectory(prefix="topo-reporter-fuzz-") as directory:
        yield Path(directory)


TEXT_READERS: list[tuple[str, Callable[[str], Any], type[Exception]]] = [
    ("json", load_json, ParseError),
    ("yaml", load_yaml, ParseError),
    ("annotation", decode, SchemaError),
    (
        "node document",
        lambda t: topology_from_document_text(t, "in", "gpu.topology.io"),
        InputError,
    ),
    (
        "any text (best-set)",
        lambda t: topology_from_any_text(t, "in", "gpu.topology.io"),
        InputError,
    ),
    ("nvidia-smi text", parse_topo, ParseError),
    ("kubelet config", parse_kubelet_config, ParseError),
]


@pytest.mark.parametrize(
    ("read", "error"), [r[1:] for r in TEXT_READERS], ids=[r[0] for r in TEXT_READERS]
)
@fuzz(150)
@given(text=DOCUMENTS)
def test_text_readers_refuse_depth_aliases_and_long_integers(
    read: Callable[[str], Any], error: type[Exception], text: str
) -> None:
    _explained(outcome(lambda: read(text), error), error)


FILE_READERS: list[tuple[str, Callable[[str], Any], type[Exception]]] = [
    ("settings file", lambda p: resolve({"config_file": p, "node": "n1"}, {}), ConfigError),
    ("kubeconfig", lambda p: load_rest_config(p, environ={}), CredentialsError),
    ("machine profile", load_machine, ConfigError),
]


@pytest.mark.parametrize(
    ("read", "error"), [r[1:] for r in FILE_READERS], ids=[r[0] for r in FILE_READERS]
)
@fuzz(150)
@given(text=DOCUMENTS)
def test_file_readers_refuse_depth_aliases_and_long_integers(
    read: Callable[[str], Any], error: type[Exception], text: str, scratch: Path
) -> None:
    path = scratch / "input.yaml"
    path.write_text(text, encoding="utf-8")
    _explained(outcome(lambda: read(str(path)), error), error)


@fuzz(100)
@given(depth=st.integers(0, 5000), mapping=st.booleans())
def test_json_nesting_is_refused_exactly_past_the_bound(depth: int, mapping: bool) -> None:
    text = _flow(depth, "1", mapping)
    result = outcome(lambda: load_json(text), ParseError)
    assert isinstance(result, ParseError) == (depth > 32)
    if not isinstance(result, ParseError):
        assert json.loads(text) == result
