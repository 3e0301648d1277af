"""JSON and YAML documents from text, bounded: the one way the program reads either.

Everything that reads a document (topology annotations and files, Node objects, the settings file,
the kubelet config, kubeconfigs, machine profiles, API answers) may be handed something hostile. The
plain loaders are not safe for that: nesting a few hundred levels deep ends in `RecursionError` (in
the loader, or later in whatever walks the result), a YAML alias bomb of a few hundred bytes expands
to gigabytes, and an integer of 5,000 digits raises Python's int-max-str-digits `ValueError`.
These loaders refuse each of them with `ParseError` before any of that can happen:

- nesting deeper than `MAX_DEPTH`, found without recursion before the text is parsed (JSON) or as it
  is composed (YAML);
- YAML aliases (`*name`): never expanded, so a document is never larger than its text;
- integers of more than `MAX_INT_DIGITS` digits, and JSON's non-standard NaN and Infinity;
- text longer than `max_chars`.

It must never call a recursive parser or walker on input whose depth it has not bounded first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import Node, ScalarNode

from parsers.errors import EXCERPT_CHARS, ParseError
from parsers.integers import parse_decimal

# The deepest real document is a Node as kubectl prints it, whose managedFields mirror the object:
# about 12 levels. 32 leaves room and stays far below Python's recursion limit (1000).
MAX_DEPTH = 32
# A Kubernetes quantity or a memory size has at most 20 digits; 64 is generous and keeps every
# integer well inside the digit limit of int() and repr().
MAX_INT_DIGITS = 64
_INT_BOUND = 10**MAX_INT_DIGITS
# Documents are kilobytes; callers with a tighter bound (the 256 KiB annotation) pass it.
MAX_CHARS = 4 * 1024 * 1024

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class DocumentBoundError(ParseError):
    """Text that may well be valid JSON or YAML, but breaks a bound: too large, too deep, an alias,
    an integer too long. Not worth retrying as another format: it is refused as it is."""


def _too_deep(max_depth: int, line: int | None = None) -> DocumentBoundError:
    return DocumentBoundError(
        f"nested more than {max_depth} levels deep: not a document this reads", line=line
    )


def _check_size(text: str, max_chars: int | None) -> None:
    if max_chars is not None and len(text) > max_chars:
        raise DocumentBoundError(f"{len(text)} characters: at most {max_chars} are read")


def json_depth(text: str) -> int:
    """How deep JSON text nests, counted without parsing it (a bound for any text, valid or not)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    # The running sum of +1 per opening and -1 per closing bracket reaches, before the first
    # mismatch, exactly the depth a parser descends to; accumulate() keeps the walk in C.
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets), initial=0))


def _json_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise DocumentBoundError(f"an integer of {len(digits)} digits: at most {MAX_INT_DIGITS}")
    return parse_decimal(digits, field="integer", max_digits=MAX_INT_DIGITS, signed=True)


def _json_constant(name: str) -> float:
    raise ParseError(f"{name} is not a JSON number")


def load_json(
    text: str | bytes, *, max_depth: int = MAX_DEPTH, max_chars: int | None = MAX_CHARS
) -> Any:
    """The value of a JSON text. Raises ParseError (with the line where the text has one).

    `max_chars` None: text already in memory whose size someone else bounded (an API answer).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ParseError(f"not UTF-8 text (byte {e.start})") from None
    _check_size(text, max_chars)
    if json_depth(text) > max_depth:
        raise _too_deep(max_depth)
    try:
        return json.loads(text, parse_int=_json_int, parse_constant=_json_constant)
    except json.JSONDecodeError as e:
        raise ParseError(f"not JSON: {e.msg} (column {e.colno})", line=e.lineno) from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases, deep nesting and long integers as it composes."""

    def __init__(self, text: str, max_depth: int) -> None:
        super().__init__(text)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML's parser is unannotated
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, AliasEvent):
            anchor = (event.anchor or "")[:EXCERPT_CHARS]
            raise DocumentBoundError(
                f"YAML alias *{anchor} is not expanded here: write the value out",
                line=line,
            )
        # Depth counts collections, as json_depth counts brackets: `[1]` is one level deep.
        step = 1 if isinstance(event, CollectionStartEvent) else 0
        self._depth += step
        if self._depth > self._max_depth:
            raise _too_deep(self._max_depth, line)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= step
        return node

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = str(node.value).replace("_", "").lstrip("+-")
        # Every YAML 1.1 form (decimal, 0x, 0b, octal, 1:30:00) costs at least a character a digit.
        if len(text) > MAX_INT_DIGITS:
            raise DocumentBoundError(
                f"an integer of {len(text)} digits: at most {MAX_INT_DIGITS}",
                line=node.start_mark.line + 1,
            )
        value: int = super().construct_yaml_int(node)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS) -> Any:
    """The value of a YAML (or JSON) text. Raises ParseError (with the line where known)."""
    _check_size(text, max_chars)
    loader: _BoundedLoader | None = None
    try:
        # The reader refuses control characters as the loader is built: inside the try.
        loader = _BoundedLoader(text, max_depth)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ParseError(
            f"not YAML: {problem}", line=None if mark is None else mark.line + 1
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def check_document(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise ParseError when an already-loaded value breaks the bounds this module's loaders keep.

    For values loaded elsewhere (a caller's own `json.loads`, a dict built in code): nesting deeper
    than `max_depth`, or an integer of more than MAX_INT_DIGITS digits. Walks with its own stack,
    not recursion, so any depth is safe to check.
    """
    stack: list[tuple[Iterable[Any], int]] = [((value,), 0)]
    while stack:
        children, depth = stack.pop()
        for child in children:
            if isinstance(child, dict | list | tuple):
                if depth + 1 > max_depth:
                    raise _too_deep(max_depth)
                stack.append((child.values() if isinstance(child, dict) else child, depth + 1))
            elif isinstance(child, int) and abs(child) >= _INT_BOUND:
                raise DocumentBoundError(f"an integer of more than {MAX_INT_DIGITS} digits")
