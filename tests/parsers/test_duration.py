"""Durations as flags, variables and annotations write them: seconds, or h/m/s parts."""

from __future__ import annotations

import pytest

from parsers.duration import parse_duration
from parsers.errors import ParseError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1m30s", 90.0), ("0.5", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, name="interval") == seconds


@pytest.mark.parametrize("text", ["5d", "nan", "inf", "1e309", "1_0", "-5", "", "1h 5m"])
def test_what_is_not_a_duration_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ParseError, match=r"^interval .* is not a duration"):
        parse_duration(text, name="interval")
