"""HeldPods: the count of held pods, the longest hold, and each ended hold's length."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reporter.extender.holds import FORGET_S, MAX_HELD, HeldPods


def tracker(forget_s: float = FORGET_S, bound: int = MAX_HELD) -> tuple[HeldPods, list[float]]:
    ended: list[float] = []
    return HeldPods(ended.append, forget_s=forget_s, bound=bound), ended


def counted_tracker(bound: int) -> tuple[HeldPods, list[float], list[None]]:
    """A tracker, the holds it ended and the holds it dropped for want of room."""
    ended: list[float] = []
    dropped: list[None] = []
    held = HeldPods(ended.append, dropped=lambda: dropped.append(None), bound=bound)
    return held, ended, dropped


def test_a_pod_held_again_is_one_pod_and_its_hold_ends_when_it_passes() -> None:
    held, ended = tracker()
    held.held("a", 100.0)
    held.held("a", 160.0)
    held.held("b", 170.0)
    assert held.count(170.0) == 2
    assert held.longest_s(170.0) == 70.0
    held.passed("a", 200.0)
    assert ended == [100.0]
    assert held.count(200.0) == 1
    held.passed("a", 210.0)  # no longer held: nothing ends twice
    assert ended == [100.0]


def test_a_pod_not_seen_is_forgotten_and_timed_to_its_last_hold() -> None:
    held, ended = tracker(forget_s=360.0)
    held.held("gone", 0.0)
    held.held("gone", 50.0)
    assert held.count(410.0) == 1  # 360 s since it was last seen: still waiting
    assert held.count(410.5) == 0
    assert ended == [50.0]
    assert held.longest_s(411.0) == 0.0


def test_at_the_bound_a_new_pod_is_dropped_and_counted_and_no_tracked_pod_ends() -> None:
    # Issue 41, item 6: a tracked pod is never evicted for a new UID.
    held, ended, dropped = counted_tracker(bound=2)
    held.held("a", 0.0)
    held.held("b", 1.0)
    held.held("c", 2.0)
    held.held("c", 3.0)
    assert (ended, len(dropped)) == ([], 2)
    assert held.count(3.0) == 2
    assert held.longest_s(3.0) == 3.0  # a, from its first hold
    held.passed("a", 5.0)
    assert ended == [5.0]
    held.held("c", 6.0)  # room again: c is tracked from now
    assert (held.count(6.0), len(dropped)) == (2, 2)


def test_at_the_bound_a_pod_no_longer_seen_makes_room() -> None:
    held, ended, dropped = counted_tracker(bound=1)
    held.held("gone", 0.0)
    held.held("new", FORGET_S + 1.0)  # gone was last seen more than FORGET_S ago
    assert (ended, dropped) == ([0.0], [])
    assert held.longest_s(FORGET_S + 1.0) == 0.0


def test_a_flood_of_made_up_uids_never_restarts_a_held_pods_hold() -> None:
    # The repro: a pod held 2,100 s read 540 s after 10,000 made-up UIDs came between its calls
    # (the scheduler retries a held pod at least every 5 minutes).
    held, ended, dropped = counted_tracker(bound=MAX_HELD)
    held.held("real", 0.0)
    for i in range(10_000):
        held.held(f"made-up-{i}", 100.0 + i * 0.01)
    for t in range(300, 2101, 300):
        held.held("real", float(t))
    assert held.longest_s(2100.0) == 2100.0
    assert held.count(2100.0) == 1  # the made-up ones, not seen since, are forgotten
    assert len(dropped) == 1  # the real pod and 9,999 made-up ones filled it
    assert ended == [0.0] * 9_999  # each made-up one held once


def test_a_pod_without_a_uid_is_not_counted() -> None:
    held, ended = tracker()
    held.held(None, 0.0)
    held.passed(None, 1.0)
    assert held.count(1.0) == 0
    assert ended == []


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.booleans(), st.floats(0, 50)),
        max_size=60,
    )
)
def test_every_hold_ends_once_with_a_length_it_could_have_had(
    calls: list[tuple[str, bool, float]],
) -> None:
    held, ended = tracker(forget_s=30.0, bound=4)
    now = 0.0
    started: dict[str, float] = {}
    for uid, holds, step in calls:
        now += step
        count_before = held.count(now)
        if holds:
            held.held(uid, now)
            started.setdefault(uid, now)
        else:
            held.passed(uid, now)
        assert 0 <= held.count(now) <= 4
        assert held.count(now) <= count_before + 1
    held.count(now + 1000.0)
    # Each pod that was ever held ended at least once and never more often than it was held.
    assert len(ended) >= len(started)
    assert all(0.0 <= length <= now for length in ended)
