"""Labels and the matrix text are projections of the model: docs/schema.md's label table."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings

from parsers.links import SELF, Link, LinkKind
from reporter.schema.labels import labels, summary
from reporter.schema.matrix import render_matrix
from reporter.schema.model import Gpu, Nic, NumaNode, Source, Topology
from tests.support.strategies import topologies

NV = lambda k: Link(LinkKind.NV, k)  # noqa: E731
PIX, SYS, NODE = Link(LinkKind.PIX), Link(LinkKind.SYS), Link(LinkKind.NODE)

# https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def matrix(*rows: str) -> tuple[tuple[Link, ...], ...]:
    table = {"X": SELF, "PIX": PIX, "SYS": SYS, "NODE": NODE}
    return tuple(tuple(table.get(c) or NV(int(c[2:])) for c in row.split()) for row in rows)


def gpus(n: int, numa: list[int | None] | None = None) -> tuple[Gpu, ...]:
    numa = numa or [None] * n
    return tuple(Gpu(i, numa=None if numa[i] is None else frozenset({numa[i]})) for i in range(n))


@pytest.mark.parametrize(
    ("topology", "want"),
    [
        (
            Topology(Source.NVML, gpus(2, [0, 1]), matrix("X NV18", "NV18 X"), nvswitch=True),
            {
                "count": "2",
                "interconnect": "nvswitch",
                "nvlink-island-size": "2",
                "nvlink-islands": "1",
                "numa-nodes": "2",
                "max-gpus-per-numa": "1",
            },
        ),
        (
            Topology(
                Source.NVML, gpus(3, [0, 0, 0]), matrix("X NV4 SYS", "NV4 X SYS", "SYS SYS X")
            ),
            {
                "count": "3",
                "interconnect": "nvlink",
                "nvlink-island-size": "2",
                "nvlink-islands": "1",
                "numa-nodes": "1",
                "max-gpus-per-numa": "3",
            },
        ),
        (
            Topology(Source.NVML, gpus(2), matrix("X PIX", "PIX X")),
            {
                "count": "2",
                "interconnect": "pcie",
                "nvlink-island-size": "1",
                "nvlink-islands": "0",
            },
        ),
        (
            Topology(Source.NVML, gpus(1, [0]), matrix("X")),
            {
                "count": "1",
                "interconnect": "none",
                "nvlink-island-size": "1",
                "nvlink-islands": "0",
                "numa-nodes": "1",
                "max-gpus-per-numa": "1",
            },
        ),
        (
            Topology(Source.NVML, (), ()),
            {
                "count": "0",
                "interconnect": "none",
                "nvlink-island-size": "0",
                "nvlink-islands": "0",
            },
        ),
        (
            Topology(
                Source.SYSFS, gpus(2, [0, 1]), matrix("X SYS", "SYS X"), nvlink_observed=False
            ),
            {"count": "2", "interconnect": "unknown", "numa-nodes": "2", "max-gpus-per-numa": "1"},
        ),
        (
            Topology(
                Source.NVML, gpus(3), matrix("X NV6 NV6", "NV6 X SYS", "NV6 SYS X"), nvswitch=True
            ),
            {
                "count": "3",
                "interconnect": "nvlink",
                "nvlink-island-size": "3",
                "nvlink-islands": "1",
            },
        ),
    ],
    ids=[
        "NVSwitch joining every pair",
        "an NVLink bridge joining two of three GPUs",
        "PCIe only",
        "one GPU",
        "no GPU at all",
        "sysfs cannot see NVLink, so it claims nothing about it",
        "a switch system that lost a link is no longer all-to-all",
    ],
)
def test_labels_follow_the_design_table(topology: Topology, want: dict[str, str]) -> None:
    got = labels(topology, prefix="example.com")
    assert got == {
        **{f"example.com/{k}": v for k, v in want.items()},
        "example.com/rdma-nics": "0",
        "example.com/schema": "v2",
    }


def test_a_gb200_gpu_counts_on_its_cpu_node_not_its_memory_nodes() -> None:
    t = Topology(
        Source.NVML,
        (Gpu(0, numa=frozenset({0, 3, 4})), Gpu(1, numa=frozenset({1, 19}))),
        matrix("X NV18", "NV18 X"),
        numa_nodes=(
            NumaNode(0, frozenset(range(72))),
            NumaNode(1, frozenset(range(72, 144))),
            NumaNode(3, frozenset()),
            NumaNode(19, frozenset()),
        ),
    )
    assert [t.home_numa(i) for i in range(2)] == [0, 1]
    assert labels(t)["gpu.topology.io/numa-nodes"] == "2"


@settings(max_examples=200, deadline=None)
@given(topologies(max_gpus=12))
def test_every_label_is_a_valid_kubernetes_label(topology: Topology) -> None:
    for key, value in labels(topology).items():
        assert key.startswith("gpu.topology.io/")
        assert len(key.split("/", 1)[1]) <= 63
        assert len(value) <= 63
        assert LABEL_VALUE.fullmatch(value), (key, value)


def test_the_summary_reads_like_the_design_example() -> None:
    t = Topology(
        Source.NVML,
        tuple(Gpu(i, model="NVIDIA H100 80GB HBM3", numa=frozenset({i // 4})) for i in range(8)),
        tuple(tuple(SELF if a == b else NV(18) for b in range(8)) for a in range(8)),
        nics=tuple(Nic(f"mlx5_{k}", (NODE,) * 8) for k in range(8)),
        nvswitch=True,
    )
    assert summary(t) == "8x NVIDIA H100 80GB HBM3, NVSwitch NV18, 2 NUMA nodes, 8 RDMA NICs"


def test_the_matrix_names_lost_gpus_and_lays_out_columns_like_nvidia_smi() -> None:
    t = Topology(
        Source.NVML,
        (Gpu(0, cpus=frozenset(range(4)), numa=frozenset({0})), Gpu(1, lost=True)),
        matrix("X SYS", "SYS X"),
        nics=(Nic("mlx5_0", (PIX, SYS)),),
    )
    text = render_matrix(t)
    lines = text.splitlines()
    assert lines[0].endswith("LOST: GPU1")
    assert lines[1].split() == ["GPU0", "GPU1", "NIC0", "CPU", "Affinity", "NUMA", "Affinity"]
    assert lines[2].split() == ["GPU0", "X", "SYS", "PIX", "0-3", "0"]
    assert lines[3].split() == ["GPU1", "SYS", "X", "SYS", "N/A", "N/A"]
    assert lines[4].split() == ["NIC0", "PIX", "SYS", "X"]
    assert "  NIC0: mlx5_0" in lines
    assert "\t" not in text
