"""Event text: what changed between two topologies, in an operator's words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reporter.schema.diff import changes, event_message
from reporter.schema.model import Gpu, Link, LinkKind, Topology
from tests.support.agent_support import topology

BASE = topology()


def _renumbered_without(t: Topology, gone: int) -> Topology:
    keep = [g for g in t.gpus if g.index != gone]
    gpus = tuple(replace(g, index=i) for i, g in enumerate(keep))
    idx = [g.index for g in keep]
    links = tuple(tuple(t.links[a][b] for b in idx) for a in idx)
    nics = tuple(replace(n, links=tuple(n.links[i] for i in idx)) for n in t.nics)
    return replace(t, gpus=gpus, links=links, nics=nics)


CASES = [
    ("identical topologies say nothing", BASE, ()),
    (
        "a weaker NVLink bond between two GPUs is named by both GPUs and both bonds",
        topology(overrides={(3, 5): Link(LinkKind.NV, 12)}),
        ("GPU3↔GPU5: NV18 → NV12",),
    ),
    ("a GPU NVML reports lost", topology(lost=[6]), ("GPU6 lost",)),
    (
        "a GPU that fell off the bus: count, which one, and no noise from renumbering",
        _renumbered_without(BASE, 6),
        ("GPU count 8 → 7", "GPU6 gone", "GPU7 is now GPU6"),
    ),
    ("a NIC gone", topology(nics=("mlx5_0",)), ("mlx5_1 gone",)),
    ("a NIC added", topology(nics=("mlx5_0", "mlx5_1", "mlx5_2")), ("mlx5_2 added",)),
    ("a driver upgrade", replace(BASE, driver="560.35.03"), ("driver 550.54.15 → 560.35.03",)),
    (
        "MIG devices created on a GPU, which moves what the device plugin hands out",
        replace(
            BASE,
            gpus=tuple(
                replace(g, mig=True, mig_devices=("MIG-a", "MIG-b")) if g.index == 2 else g
                for g in BASE.gpus
            ),
        ),
        ("GPU2 MIG on", "GPU2 MIG devices 0 → 2"),
    ),
]


@pytest.mark.parametrize(("new", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_changes(new: Topology, expected: tuple[str, ...]) -> None:
    assert changes(BASE, new) == expected


def test_a_gpu_coming_back_is_reported() -> None:
    assert changes(topology(lost=[2]), BASE) == ("GPU2 back",)


def test_event_message_joins_lines_and_stays_within_its_budget() -> None:
    assert event_message(["GPU6 lost", "GPU count 8 → 7"]) == "GPU6 lost; GPU count 8 → 7"
    lines = [f"GPU{a}↔GPU{b}: NV18 → NV12" for a in range(8) for b in range(a + 1, 8)]
    text = event_message(lines, max_bytes=200)
    assert len(text.encode()) <= 200
    shown = text.split("; and ")[0].count("↔")
    assert text.endswith(f"; and {len(lines) - shown} more")


def _as_nvml_reports_lost(t: Topology, index: int) -> Topology:
    """`t` with GPU `index` as the NVML collector reports a lost GPU: its index and nothing else."""
    gpus = tuple(Gpu(index=g.index, lost=True) if g.index == index else g for g in t.gpus)
    links = tuple(
        tuple(c if index not in (a, b) or a == b else Link(LinkKind.SYS) for b, c in enumerate(row))
        for a, row in enumerate(t.links)
    )
    nics = tuple(
        replace(
            n, links=tuple(Link(LinkKind.SYS) if i == index else c for i, c in enumerate(n.links))
        )
        for n in t.nics
    )
    return replace(t, gpus=gpus, links=links, nics=nics)


@pytest.mark.parametrize("index", [0, 3, 7])
def test_a_gpu_known_by_its_index_alone_is_that_gpu_lost_not_one_gone_and_one_added(
    index: int,
) -> None:
    lost = _as_nvml_reports_lost(BASE, index)
    assert changes(BASE, lost) == (f"GPU{index} lost",)
    assert changes(lost, BASE) == (f"GPU{index} back",)


def test_a_gpu_in_the_same_slot_with_another_uuid_is_another_gpu() -> None:
    swapped = replace(
        BASE, gpus=tuple(replace(g, uuid="GPU-new") if g.index == 2 else g for g in BASE.gpus)
    )
    assert changes(BASE, swapped) == ("GPU2 gone", "GPU2 added")


def test_nic_paths_are_compared_gpu_by_gpu_across_a_renumbering() -> None:
    renumbered = _renumbered_without(BASE, 0)
    moved = replace(
        renumbered,
        nics=tuple(
            replace(n, links=(Link(LinkKind.NODE), *n.links[1:])) if n.name == "mlx5_0" else n
            for n in renumbered.nics
        ),
    )
    lines = changes(BASE, moved)
    assert "mlx5_0: GPU0 PIX → NODE" in lines
    assert not [line for line in lines if line.startswith("mlx5_1")]
