"""What every placement of bench/multinode.py's event loop must hold, whichever bench ran it:
tests/bench/test_racks.py and tests/bench/test_leaf_groups.py check their runs with it."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

from bench import multinode

R = TypeVar("R", bound=multinode.Result)


def checked_run(run: Callable[[], R], jobs: list[multinode.Job]) -> R:
    """`run()`'s result, after running it twice: the same placements and metrics both times,
    each placed job on as many distinct nodes as it asks for, started no earlier than it arrived,
    no node running two jobs at once, and the engine's metrics in range."""
    result = run()
    held: dict[str, list[tuple[float, float]]] = {}
    for job_id, (names, start, end) in result.placements.items():
        assert len(names) == len(set(names)) == jobs[job_id].nodes
        assert start >= jobs[job_id].arrival
        for name in names:
            held.setdefault(name, []).append((start, end))
    for spans in held.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert 0.0 <= result.util <= 1.0
    assert 0.0 <= result.frag <= 1.0
    assert result.wait >= 0.0
    again = run()
    assert (again.placements, again.util, again.wait) == (
        result.placements,
        result.util,
        result.wait,
    )
    return result
