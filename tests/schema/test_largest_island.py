"""`Topology.largest_island`, the one computation of the largest NVLink island, and each of the
five places that computed it on their own before (issue 29, item 4), each with the default it had.

The one answer: the size of the largest NVLink island; 1 where GPUs have no NVLink peer (each is
an island of its own), 0 without GPUs. The former defaults (1, `min(n, 1)`, `1 if gpus else 0`
and 0) differed only where their caller could not tell them apart; these tests pin that down.
"""

from __future__ import annotations

import pytest

from parsers.links import SELF, Link, LinkKind
from reporter.agent import _worse
from reporter.doctor.node import local_findings
from reporter.schema.labels import labels, summary
from reporter.schema.model import Gpu, Source, Topology
from reporter.serve.metrics import Metrics

NV4, PIX = Link(LinkKind.NV, 4), Link(LinkKind.PIX)


def machine(n: int, nvlink: set[frozenset[int]], *, nvswitch: bool = False) -> Topology:
    """n GPUs, NVLink between the pairs in `nvlink`, PCIe between the others."""
    links = tuple(
        tuple(SELF if a == b else NV4 if frozenset({a, b}) in nvlink else PIX for b in range(n))
        for a in range(n)
    )
    gpus = tuple(Gpu(i, model="GPU") for i in range(n))
    return Topology(source=Source.NVML, gpus=gpus, links=links, nvswitch=nvswitch)


def pairs(*members: tuple[int, ...]) -> set[frozenset[int]]:
    return {frozenset({a, b}) for group in members for a in group for b in group if a != b}


NONE = machine(0, set())
PCIE = machine(4, set())
BRIDGED = machine(4, pairs((0, 1)))
SPLIT = machine(8, pairs((0, 1, 2, 3), (4, 5, 6, 7)), nvswitch=True)
WHOLE = machine(8, pairs(tuple(range(8))), nvswitch=True)


@pytest.mark.parametrize(
    ("topology", "largest"),
    [(NONE, 0), (PCIE, 1), (BRIDGED, 2), (SPLIT, 4), (WHOLE, 8)],
    ids=[
        "no GPUs have no island",
        "GPUs without NVLink are islands of one",
        "a bridged pair beside lone GPUs is an island of two",
        "a split NVSwitch node's largest half",
        "a whole NVSwitch node",
    ],
)
def test_the_largest_island(topology: Topology, largest: int) -> None:
    assert topology.largest_island == largest


@pytest.mark.parametrize(
    ("topology", "label"),
    [(NONE, "0"), (PCIE, "1"), (BRIDGED, "2"), (WHOLE, "8")],
    ids=["no GPUs", "no NVLink", "a bridged pair", "NVSwitch"],
)
def test_the_island_size_label_was_min_n_1_without_islands(topology: Topology, label: str) -> None:
    assert labels(topology, "p")["p/nvlink-island-size"] == label


def test_the_summary_names_the_largest_island_of_an_nvlink_node() -> None:
    """Only an NVLink node's summary names it, so its former default (1) was never used."""
    assert "NVLink NV4, 1 island(s), largest 2" in summary(BRIDGED)
    assert "largest" not in summary(PCIE)


@pytest.mark.parametrize(
    ("topology", "gauge"),
    [(NONE, 0.0), (PCIE, 1.0), (SPLIT, 4.0)],
    ids=["no GPUs: 0", "no NVLink: 1", "split: its largest half"],
)
def test_the_island_gauge_was_1_with_gpus_else_0(topology: Topology, gauge: float) -> None:
    metrics = Metrics()
    metrics.topology(topology)
    assert metrics.registry.get_sample_value("topo_reporter_nvlink_island_size") == gauge


@pytest.mark.parametrize(
    ("topology", "split"),
    [(SPLIT, True), (WHOLE, False), (NONE, False)],
    ids=["a split NVSwitch node", "a whole one", "no GPUs (the former 1 was never below 0 GPUs)"],
)
def test_the_doctor_tells_a_split_nvswitch_node(topology: Topology, split: bool) -> None:
    told = any(
        "NVSwitch system split into islands" in line
        for finding in local_findings(topology, None)
        for line in finding.evidence
    )
    assert told is split


@pytest.mark.parametrize(
    ("old", "new", "worse"),
    [
        (WHOLE, SPLIT, True),
        (BRIDGED, PCIE, True),
        (PCIE, BRIDGED, False),
        (PCIE, PCIE, False),
        (PCIE, NONE, True),
        (NONE, PCIE, False),
    ],
    ids=[
        "an NVSwitch node split in two",
        "a pair losing its bridge",
        "a pair gaining one",
        "no NVLink before and after",
        "GPUs gone (fewer GPUs decides; the former default 0 could not tell)",
        "GPUs come (islands of one are larger than none)",
    ],
)
def test_a_smaller_island_is_worth_a_warning(old: Topology, new: Topology, worse: bool) -> None:
    assert _worse(old, new) is worse
