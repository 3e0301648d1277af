"""Whole numbers in text someone else wrote: the one place where such text becomes an `int`.

`int()` accepts more than any file, annotation or header we read ever holds (digits of every
script, `'٣'` and `'３'`; underscores; signs; surrounding whitespace), and past 4,300 digits it
raises a plain `ValueError` that no caller expects: one such annotation killed the extender's watch
thread. So every parser, decoder and reader turns digits into a number here: ASCII digits only, at
most `max_digits` of them, a ParseError naming the field otherwise. Callers that must not raise a
parser's error map it once, at their boundary, as they map every other ParseError.
"""

from __future__ import annotations

from parsers.errors import ParseError, excerpt

MAX_DIGITS = 20
"""The default bound: 2**64 has 20 decimal digits, more than any count, id or size we read."""

_DECIMAL = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


def parse_decimal(
    text: str, *, field: str = "number", max_digits: int = MAX_DIGITS, signed: bool = False
) -> int:
    """`text`, ASCII decimal digits (a leading `-` when `signed`), as an int.

    Nothing else is accepted: no sign unless `signed`, no `+`, no spaces, no `_`, no other script's
    digits. Raises ParseError naming `field` for anything else, or for more than `max_digits`
    digits (checked before any conversion, so the cost is bounded by the text's length).
    """
    digits = text[1:] if signed and text.startswith("-") else text
    return _convert(text, digits, _DECIMAL, 10, field, max_digits, "a decimal number")


def parse_hex_digits(text: str, *, field: str = "number", max_digits: int = 16) -> int:
    """`text`, ASCII hex digits without a `0x` prefix, as an int.

    Raises ParseError naming `field` for anything else, or for more than `max_digits` digits.
    """
    return _convert(text, text, _HEX, 16, field, max_digits, "a hex number")


def _convert(
    text: str,
    digits: str,
    alphabet: frozenset[str],
    base: int,
    field: str,
    max_digits: int,
    what: str,
) -> int:
    if len(digits) > max_digits:
        # Said before anything else is looked at: a megabyte of digits costs one len().
        raise ParseError(f"a number of {len(digits)} digits: at most {max_digits}", field=field)
    if not digits or not alphabet.issuperset(digits):
        raise ParseError(f"{excerpt(text)} is not {what}", field=field)
    return int(text, base)
