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

from tests.fuzz import test_codec, test_documents, test_numbers, test_parsers
from tests.hostile import test_values_and_shapes
from tests.support import strategies
from tests.support.fuzz import CELLS, replay

STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "fuzz.CELLS": CELLS,
    "strategies.topologies": strategies.topologies(max_gpus=4),
    "strategies.text_topologies": strategies.text_topologies(max_gpus=4),
    "test_codec.JSON_VALUES": test_codec.JSON_VALUES,
    "test_codec.mutated_documents": test_codec.mutated_documents(),
    "test_codec.node_documents": test_codec.node_documents(),
    "test_parsers.damaged_pastes": test_parsers.damaged_pastes(),
    "test_parsers.damaged_kubelet_configs": test_parsers.damaged_kubelet_configs(),
    "test_parsers.KUBELET_VALUES": test_parsers.KUBELET_VALUES,
    "test_parsers.legend_topologies": test_parsers.legend_topologies(),
    "test_parsers.DRIVERS": test_parsers.DRIVERS,
    "test_documents.DOCUMENTS": test_documents.DOCUMENTS,
    "test_numbers.NUMBER_TEXTS": test_numbers.NUMBER_TEXTS,
    "test_values_and_shapes.documents_with_a_float": (
        test_values_and_shapes.documents_with_a_float()
    ),
    "test_values_and_shapes.LINES": test_values_and_shapes.LINES,
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_strategy_draws_the_same_values_when_replayed(name: str) -> None:
    first = replay(STRATEGIES[name], examples=30)
    assert replay(STRATEGIES[name], examples=30) == first
