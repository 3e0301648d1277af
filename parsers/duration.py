"""Durations as people write them in flags, environment variables and annotations: `90`, `90s`,
`5m`, `1h`, `1m30s`.

Pure text to seconds, and seconds back to those words: the agent's settings and the extender's
`connected-wait` read the same words. The bounds a caller puts on the result (at least a second,
at most a day) are its own.
"""

from __future__ import annotations

import re

from parsers.errors import ParseError, excerpt

DURATION_MAX_S = 86400.0
"""The longest duration any setting or annotation takes: a day. Beyond it a change or drift goes
unseen for longer than any operator waits, and a wait of centuries overflows the platform's
timeout (`inf`, `1e309`)."""

_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str, *, name: str) -> float:
    """`90`, `90s`, `5m`, `1h`, `1m30s` to seconds. Raises ParseError naming `name`.

    Only decimal digits: Python's float() would also take `nan`, `inf`, `1e309` and `1_0`.
    """
    value = text.strip()
    if _SECONDS.fullmatch(value):
        return float(value)
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ParseError(f"{name} {excerpt(text)} is not a duration: use seconds or 90s, 5m, 1h")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def duration_text(seconds: float) -> str:
    """`2h`, `1h30m`, `12m`, `45s`, `0s` (negative counts as none; whole seconds): the words
    `parse_duration` reads, for a message or a `--help` default."""
    left = int(max(seconds, 0.0))
    parts = [(left // 3600, "h"), (left // 60 % 60, "m"), (left % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"
