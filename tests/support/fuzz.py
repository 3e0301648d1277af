"""Hypothesis settings and input mutators shared by the fuzz suites (tests/fuzz/).

Two profiles: `ci` (the default: a few thousand examples over all fuzz tests, about a minute on two
cores) and `fuzz-long` (fifty times as many, for a run before a release):

    HYPOTHESIS_PROFILE=fuzz-long pytest tests/fuzz/

Fuzz tests take their example count from `fuzz(n)`, where `n` is the test's share of the CI
budget; no fuzz test asserts a time, only that every input ends in a result or the documented error.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

T = TypeVar("T")
LONG_RUN_FACTOR = 50

# `ci` draws the same examples on every run and keeps no example database, so CI cannot go red on
# a lucky draw or on what an earlier run on this machine found; `fuzz-long` draws anew each run.
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz-long",
    parent=settings.get_profile("ci"),
    derandomize=False,
    max_examples=100 * LONG_RUN_FACTOR,
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "fuzz-long"):
    raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE!r}: the fuzz suites know ci and fuzz-long")
# Loaded for every test (tests/conftest.py imports this module), not only those using fuzz():
# a plain @given or @settings inherits the profile's derandomize and database.
settings.load_profile(PROFILE)


def fuzz(examples: int) -> settings:
    """Settings for a fuzz test: `examples` under `ci`, fifty times as many under `fuzz-long`."""
    factor = LONG_RUN_FACTOR if PROFILE == "fuzz-long" else 1
    return settings(settings.get_profile(PROFILE), max_examples=examples * factor)


# 100 MB: the size the issue names for "refused quickly"; built once, shared by the size tests.
HUGE = 100 * 1024 * 1024

ANSI_CODES = ["\x1b[4m", "\x1b[0m", "\x1b[1;32m", "\x1b[?25l", "\x1b[K"]

# Cells a damaged or hostile paste may hold where a path, a CPU list or a NUMA id belongs.
CELLS = st.sampled_from(
    [
        "X",
        " X ",
        "NV1",
        "NV18",
        "NV72",
        "NV73",
        "NV0",
        "NV",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
        "SOC",
        "N/A",
        "",
        "0-31",
        "0-65535",
        "0-65536",
        "0-99999999999999999999",
        "0-15:2/4",
        "3-1",
        "-1",
        "7",
        "NV18NV18",
        "SYS0-71",
        "NODENODE",
        "GPU0",
        "GPU99",
        "NIC0",
        "mlx5_0",
        "CPU Affinity",
        "\x1b[4m",
        "\u00a0",
    ]
) | st.text(max_size=12)


def outcome(call: Callable[[], T], error: type[Exception]) -> T | Exception:
    """The value of `call()`, or the `error` it raised; any other exception fails the test."""
    try:
        return call()
    except error as e:
        return e


def _scribble(value: object) -> None:
    """Change every list and dict inside `value` in place, as a test or a mutator might."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            item.append("scribbled")
        elif isinstance(item, dict):
            stack.extend(item.values())
            item["scribbled"] = True


def replay(strategy: st.SearchStrategy[T], examples: int = 60) -> list[T]:
    """What `strategy` draws in a derandomized run, each value copied before it is scribbled on.

    Hypothesis replays and shrinks by drawing again from the same choices; a strategy whose values
    share state with something outside the draw (a module-level list handed out and then changed)
    draws differently the second time: FlakyStrategyDefinition. Two replays compared find it.
    """
    seen: list[T] = []

    @settings(
        database=None,
        derandomize=True,
        max_examples=examples,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(value: T) -> None:
        seen.append(copy.deepcopy(value))
        _scribble(value)

    draw()
    return seen
