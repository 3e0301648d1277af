"""The bounded JSON and YAML loaders: nesting, aliases, long integers and size end in ParseError.

Every reader of the program goes through `parsers.documents`; these are its bounds, each tried at
the bound, one past it and far past it, and near Python's recursion limit, both the normal one
and a lowered one (a deep call stack in whoever calls us).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from parsers.documents import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    DocumentBoundError,
    check_document,
    json_depth,
    load_json,
    load_yaml,
)
from parsers.errors import ParseError, excerpt

# nine levels of nine aliases each: 9**9 (387 million) leaves from 466 bytes of text.
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_yaml(depth: int) -> str:
    """Block style, the way a hand-written file nests: one more mapping per line."""
    return "".join(f"{'  ' * i}k:\n" for i in range(depth - 1)) + f"{'  ' * (depth - 1)}k: 1\n"


@pytest.mark.parametrize("load", [load_json, load_yaml], ids=["json", "yaml (flow style, as JSON)"])
def test_nesting_up_to_the_bound_loads_and_one_level_more_is_refused(
    load: Callable[[str], Any],
) -> None:
    assert load(nested_json(MAX_DEPTH)) is not None
    with pytest.raises(DocumentBoundError, match=f"nested more than {MAX_DEPTH} levels deep"):
        load(nested_json(MAX_DEPTH + 1))


def test_block_style_yaml_nesting_is_bounded_the_same() -> None:
    assert load_yaml(nested_yaml(MAX_DEPTH)) is not None
    with pytest.raises(DocumentBoundError, match="nested more than") as e:
        load_yaml(nested_yaml(MAX_DEPTH + 1))
    assert e.value.line == MAX_DEPTH + 1


@pytest.mark.parametrize("offset", [-200, -10, -1, 0, 1, 10, 200])
@pytest.mark.parametrize(
    "load",
    [load_json, load_yaml, lambda t: check_document(json.loads(t))],
    ids=["json", "yaml", "walk"],
)
def test_nesting_near_the_recursion_limit_is_a_parse_error_never_a_recursion_error(
    load: Callable[[str], Any], offset: int, recursion_limit: int
) -> None:
    depth = max(MAX_DEPTH + 1, recursion_limit + offset)
    text = nested_json(depth)
    if load not in (load_json, load_yaml):
        # json.loads itself recurses: build the value under the normal limit, then walk it.
        before = sys.getrecursionlimit()
        sys.setrecursionlimit(max(before, depth + 1000))
        try:
            value = json.loads(text)
        finally:
            sys.setrecursionlimit(before)
        with pytest.raises(DocumentBoundError):
            check_document(value)
        return
    with pytest.raises(DocumentBoundError):
        load(text)


@pytest.mark.parametrize("depth", [985, 990, 100_000])
def test_the_hostile_depths_of_the_review_are_refused_before_parsing(depth: int) -> None:
    assert json_depth(nested_json(depth)) == depth
    with pytest.raises(DocumentBoundError):
        load_json('{"gpus":' + nested_json(depth) + "}")


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ('"[[[[[[[[[["', 0),
        ('{"a": "]]]]", "b": [[1]]}', 3),
        (r'["\"[[[["]', 1),
        ('[[[["unterminated', 4),
        ("]]]]", 0),
        ("", 0),
    ],
    ids=[
        "brackets inside a string do not count",
        "closing brackets inside a string do not count",
        "an escaped quote does not end the string",
        "an unterminated string",
        "closing brackets alone",
        "nothing",
    ],
)
def test_json_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_a_yaml_alias_bomb_is_refused_without_expanding_it() -> None:
    assert len(ALIAS_BOMB) < 500
    with pytest.raises(DocumentBoundError, match=r"alias \*a is not expanded") as e:
        load_yaml(ALIAS_BOMB)
    assert e.value.line == 2


@pytest.mark.parametrize(
    "text",
    ["a: &x 1\nb: *x\n", "base: &b {k: 1}\nother:\n  <<: *b\n", "- &s [1]\n- *s\n"],
    ids=["a scalar alias", "a merge key", "a sequence alias"],
)
def test_every_alias_is_refused_and_anchors_alone_are_fine(text: str) -> None:
    with pytest.raises(DocumentBoundError, match="alias"):
        load_yaml(text)
    assert load_yaml("a: &x 1\n") == {"a": 1}


@pytest.mark.parametrize(
    "value",
    [
        "1" * 5000,
        "-" + "1" * 5000,
        "0x" + "f" * 5000,
        "0b" + "1" * 5000,
        "0" + "7" * 5000,
        "1_0" * 40,
    ],
    ids=["decimal", "negative", "hex", "binary", "octal", "with underscores"],
)
def test_a_yaml_integer_of_thousands_of_digits_is_refused(value: str) -> None:
    with pytest.raises(DocumentBoundError, match="digits: at most 64"):
        load_yaml(f"interval: {value}\n")


def test_integers_up_to_the_digit_bound_load() -> None:
    assert load_yaml(f"a: {'9' * MAX_INT_DIGITS}") == {"a": int("9" * MAX_INT_DIGITS)}
    assert load_json(f"[{'9' * MAX_INT_DIGITS}]") == [int("9" * MAX_INT_DIGITS)]
    with pytest.raises(DocumentBoundError, match="5000 digits"):
        load_json(f"[{'9' * 5000}]")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_refuses_the_constants_json_does_not_have(constant: str) -> None:
    with pytest.raises(ParseError, match="is not a JSON number"):
        load_json(f"[{constant}]")


@pytest.mark.parametrize("load", [load_json, load_yaml], ids=["json", "yaml"])
def test_text_beyond_the_size_bound_is_refused_before_parsing(
    load: Callable[..., Any],
) -> None:
    with pytest.raises(DocumentBoundError, match="at most 100 are read"):
        load("[" + "1," * 100 + "1]", max_chars=100)


@pytest.mark.parametrize(
    ("load", "text", "message"),
    [
        (load_json, "[1,", "line 1: not JSON"),
        (load_json, b"\xff", "not UTF-8"),
        (load_yaml, "a: [\n", "line 2: not YAML"),
        (load_yaml, "a: b: c\n", "line 1: not YAML"),
        (load_yaml, "\x1f", "not YAML: unacceptable character"),
    ],
    ids=[
        "json cut short",
        "json not utf-8",
        "yaml cut short",
        "yaml mapping in a scalar",
        "a control character",
    ],
)
def test_syntax_errors_are_parse_errors_with_the_line(
    load: Callable[[Any], Any], text: str | bytes, message: str
) -> None:
    with pytest.raises(ParseError, match=message) as e:
        load(text)
    assert not isinstance(e.value, DocumentBoundError)


def test_check_document_refuses_an_integer_built_in_code() -> None:
    with pytest.raises(DocumentBoundError, match="more than 64 digits"):
        check_document({"mem_mib": [10**5000]})
    check_document({"mem_mib": [10**63]})


@pytest.mark.parametrize(
    ("value", "most"),
    [
        ("x" * 100_000, 80),
        (10**5000, 40),
        (int("f" * 5000, 16), 40),
        (json.loads(nested_json(MAX_DEPTH)), 40),
        (list(range(100_000)), 80),
        ({str(i): i for i in range(1000)}, 80),
    ],
    ids=[
        "a long string",
        "a huge int",
        "a huge hex int",
        "a deep list",
        "a long list",
        "a big dict",
    ],
)
def test_an_excerpt_is_short_whatever_the_value(value: object, most: int) -> None:
    assert len(excerpt(value)) <= most
