"""The one error every parser raises: what was wrong, and where."""

import reprlib


class ParseError(ValueError):
    """Input that does not parse.

    `line` is the 1-based line number of the offending text when the input has lines, `field` the
    name of the value being parsed; both appear in the message so a user can find the spot.
    """

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None) -> None:
        self.reason = message
        self.line = line
        self.field = field
        where = []
        if field is not None:
            where.append(field)
        if line is not None:
            where.append(f"line {line}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


# Error messages quote what the user wrote so they can find it, but never all of it: a value can
# be megabytes, or (read from YAML) a structure far larger than its text.
EXCERPT_CHARS = 60


class _Excerpt(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = EXCERPT_CHARS
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxdict = 4

    def repr_int(self, x: int, level: int) -> str:
        # repr() of an int past sys.get_int_max_str_digits() raises ValueError; say its size.
        if x.bit_length() > 4 * EXCERPT_CHARS:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_EXCERPT = _Excerpt()


def excerpt(value: object) -> str:
    """`repr(value)` cut to a few dozen characters: what an error message may quote of input."""
    return _EXCERPT.repr(value)
