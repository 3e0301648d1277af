"""Event text: what changed between two topologies, in an operator's words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reporter.schema.diff import changes, event_message
from reporter.schema.model import Link, LinkKind, Topology
from tests.agent_support import topology

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
