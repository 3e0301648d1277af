"""Told: a condition said when it starts, when it changes and once when it clears."""

from __future__ import annotations

from reporter.telling import Told


def test_a_repeated_condition_is_told_once_and_its_clearing_once() -> None:
    told: Told[str | None] = Told(None)
    seen = [told.changed(value) for value in ("refused", "refused", "timeout", None, None)]
    assert seen == [True, False, True, True, False]
    assert told.last is None


def test_the_initial_value_is_not_told() -> None:
    told: Told[tuple[int, ...]] = Told(())
    assert not told.changed(())
    assert told.changed((3,))
    assert told.last == (3,)
