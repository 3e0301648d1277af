"""The one error every parser raises: what was wrong, and where."""


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
