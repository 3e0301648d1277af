"""Retry-After as servers and proxies really send it: a number, an HTTP date, or garbage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from reporter.publish.errors_map import MAX_RETRY_AFTER_S, retry_after


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0.0), ("7", 7.0), (" 120 ", 120.0), ("9" * 40, MAX_RETRY_AFTER_S)],
)
def test_seconds_are_honoured_up_to_a_day(value: str, seconds: float) -> None:
    assert retry_after({"Retry-After": value}) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "²",  # a superscript two: str.isdigit() says yes, float() says no
        "٣",  # an Arabic-Indic three
        "1²",
        "-5",
        "1.5",
        "soon",
        "",
        "9" * 5000,
        "Wed, 21 Oct 2015 07:28:00",  # a date with no zone
        "x" * 10_000,
    ],
)
def test_anything_else_is_no_retry_after_and_never_an_exception(value: str) -> None:
    assert retry_after({"Retry-After": value}) is None


def test_an_http_date_is_the_seconds_until_then() -> None:
    when = datetime.now(UTC) + timedelta(seconds=90)
    seconds = retry_after({"Retry-After": format_datetime(when, usegmt=True)})
    assert seconds is not None
    assert 80 <= seconds <= 90


def test_a_date_in_the_past_is_no_wait() -> None:
    when = datetime.now(UTC) - timedelta(days=3)
    assert retry_after({"Retry-After": format_datetime(when, usegmt=True)}) == 0.0


def test_no_header_is_none() -> None:
    assert retry_after({}) is None
    assert retry_after(None) is None
