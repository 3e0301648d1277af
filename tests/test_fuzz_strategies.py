"""Every hypothesis strategy of the suite is a function of its draws and nothing else.

A strategy that hands out a module-level object which a test or a mutator then changes draws
differently when hypothesis replays it, and the suite fails by chance with
FlakyStrategyDefinition (issue 11 item 16). Each strategy is drawn twice, derandomized, with every
value scribbled on in between: both runs must draw the same values.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st

from tests import (
    strategies,
    test_fuzz_codec,
    test_fuzz_documents,
    test_fuzz_numbers,
    test_fuzz_parsers,
    test_hostile_values_and_shapes,
)
from tests.fuzz import CELLS, replay

STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "fuzz.CELLS": CELLS,
    "strategies.topologies": strategies.topologies(max_gpus=4),
    "strategies.text_topologies": strategies.text_topologies(max_gpus=4),
    "test_fuzz_codec.JSON_VALUES": test_fuzz_codec.JSON_VALUES,
    "test_fuzz_codec.mutated_documents": test_fuzz_codec.mutated_documents(),
    "test_fuzz_codec.node_documents": test_fuzz_codec.node_documents(),
    "test_fuzz_parsers.damaged_pastes": test_fuzz_parsers.damaged_pastes(),
    "test_fuzz_parsers.damaged_kubelet_configs": test_fuzz_parsers.damaged_kubelet_configs(),
    "test_fuzz_parsers.KUBELET_VALUES": test_fuzz_parsers.KUBELET_VALUES,
    "test_fuzz_parsers.legend_topologies": test_fuzz_parsers.legend_topologies(),
    "test_fuzz_parsers.DRIVERS": test_fuzz_parsers.DRIVERS,
    "test_fuzz_documents.DOCUMENTS": test_fuzz_documents.DOCUMENTS,
    "test_fuzz_numbers.NUMBER_TEXTS": test_fuzz_numbers.NUMBER_TEXTS,
    "test_hostile_values_and_shapes.documents_with_a_float": (
        test_hostile_values_and_shapes.documents_with_a_float()
    ),
    "test_hostile_values_and_shapes.LINES": test_hostile_values_and_shapes.LINES,
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_strategy_draws_the_same_values_when_replayed(name: str) -> None:
    first = replay(STRATEGIES[name], examples=30)
    assert replay(STRATEGIES[name], examples=30) == first
