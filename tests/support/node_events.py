"""Node events drawn by hypothesis and replayed on the extender's NodeCache beside a plain dict of
the nodes' states, so a test can count from scratch what the cache keeps count of as it goes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from reporter.extender.cache import NodeCache
from reporter.publish.watch import NodeAnnotation, WatchEvent

S = TypeVar("S")
Event = tuple[str, Any, Any]
"""("set", name, state), ("drop", name, None), ("relist", {name: state}, None) or ("vouch", name,
None): the node's heartbeat turns stale, or fresh again."""


def events(names: list[str], states: st.SearchStrategy[Any]) -> st.SearchStrategy[Event]:
    """One event on the nodes `names`, each node's state drawn from `states`."""
    return st.one_of(
        st.tuples(st.just("set"), st.sampled_from(names), states),
        st.tuples(st.just("drop"), st.sampled_from(names), st.none()),
        st.tuples(st.just("relist"), st.dictionaries(st.sampled_from(names), states), st.none()),
        st.tuples(st.just("vouch"), st.sampled_from(names), st.none()),
    )


def replay(
    cache: NodeCache,
    nodes: dict[str, S],
    vouched: set[str],
    event: Event,
    watched: Callable[[str, S], NodeAnnotation],
) -> dict[str, S]:
    """`event` applied to `cache` as the watch would deliver it, and to `nodes` and `vouched` as
    the truth; the nodes' states after it (a relist replaces them)."""
    kind, name, state = event
    if kind == "set":
        nodes[name] = state
        cache.apply(WatchEvent("MODIFIED", watched(name, state), "1"))
    elif kind == "drop":
        nodes.pop(name, None)
        cache.apply(WatchEvent("DELETED", NodeAnnotation(name, None), "1"))
    elif kind == "relist":
        nodes = dict(name)
        cache.replace([watched(n, s) for n, s in nodes.items()])
    else:
        vouched.symmetric_difference_update({name})
        cache.revise(name)
    return nodes
