"""Told once: what was last said about one condition.

The agent's loops see the same condition at every tick (a read that keeps failing, a file that
stays withheld, a kubelet config that stays unreadable). Operators need it said when it starts,
again when it changes, and once when it clears, not once per tick. Each such condition keeps one
`Told`; the caller says what it has to say when `changed` answers True.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Told(Generic[T]):
    """The value last told about one condition (`None`, `False` or `()` for "fine", by the
    caller's choice of `initial`)."""

    __slots__ = ("last",)

    def __init__(self, initial: T) -> None:
        self.last = initial

    def changed(self, value: T) -> bool:
        """Note `value`; True when it differs from the last one noted, which is when to tell it
        (or tell that it cleared)."""
        if value == self.last:
            return False
        self.last = value
        return True
