"""Availability: the best free set per k (`reporter.free_sets`), its compact annotation and labels
(`reporter.schema.availability`) and the node score and hold rule (`reporter.availability`).

The annotation is read back from the API server, where anyone who can edit a Node can change it:
`decode_availability` must give back exactly what was encoded, or SchemaError, for any text.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reporter import free_sets
from reporter.availability import (
    NEUTRAL_SCORE,
    can_fit,
    connected_capacity,
    connected_now,
    holds_for_connected,
    node_score,
)
from reporter.errors import PlacementError, SchemaError
from reporter.free_sets import compute_availability, free_set
from reporter.placement import GpuSet, Policy, best_gpu_set
from reporter.schema.availability import (
    MAX_TEXT_CHARS,
    Availability,
    FreeSet,
    availability_labels,
    decode_availability,
    encode_availability,
)
from reporter.schema.model import MAX_GPUS, Link, LinkKind, NvlinkHealth, Topology
from tests.placement.test_best_set import (
    MACHINES,
    REAL,
    SIMULATED,
    brute_force,
    machine,
    random_topology,
)
from tests.support.fuzz import fuzz
from tests.support.strategies import topologies

DGX_A100 = dict(REAL)["03-dgx-a100-nv12-mlx5"]
PREFIX = "gpu.topology.io"


@pytest.mark.parametrize(("name", "topology"), MACHINES, ids=[name for name, _ in MACHINES])
def test_each_k_summarises_the_exhaustive_best_free_set(name: str, topology: Topology) -> None:
    free = [i for i in range(len(topology.gpus)) if i % 3 != 1]
    usable = [i for i in free if not topology.gpus[i].lost]
    a = compute_availability(topology, free, policy=Policy.BEST)
    assert a.free == tuple(usable)
    assert len(a.best) == len(usable)
    for k, summary in enumerate(a.best, start=1):
        assert summary == free_set(topology, brute_force(topology, k, usable), usable), k


def test_a_dgx_a100_with_five_free_gpus() -> None:
    a = compute_availability(DGX_A100, [6, 0, 1, 2, 3], policy=Policy.BEST)
    assert a.free == (0, 1, 2, 3, 6)
    # Five free GPUs of an NVSwitch node: a free fit of 5, a whole-node fit of all 8.
    assert a.best[0] == FreeSet(links=0, connected=True, numa=1, nic=4, island=5, fit=5, whole=8)
    assert a.best[1] == FreeSet(links=120, connected=True, numa=1, nic=4, island=5, fit=5, whole=8)
    assert a.best[4].links == 10 * 120
    text = encode_availability(a)
    assert text == (
        "3;0-3,6;0.1.1.4.5.5.8/120.1.1.4.5.5.8/360.1.2.1.5.5.8/720.1.2.1.5.5.8/1200.1.3.1.5.5.8"
    )
    assert decode_availability(text) == a
    assert availability_labels(a, PREFIX) == {
        "gpu.topology.io/gpu-free": "5",
        "gpu.topology.io/gpu-free-nvlink-max": "5",
    }


def test_a_pcie_machine_has_no_nvlink_set_and_islands_of_one_per_gpu() -> None:
    topology = dict(SIMULATED)["simulated-pcie-8x"]
    a = compute_availability(topology, range(8), policy=Policy.BEST)
    assert all(not s.connected for s in a.best[1:])
    assert a.best[0].connected
    assert [s.island for s in a.best] == list(range(1, 9))
    assert availability_labels(a, "x.io") == {"x.io/gpu-free": "8", "x.io/gpu-free-nvlink-max": "0"}


def test_the_island_is_the_free_nvlink_component_the_set_was_taken_from() -> None:
    # 0-1 joined by NVLink, 2-3-4 a chain joined by NVLink, 5 alone.
    topology = machine(
        [
            "X NV2 SYS SYS SYS SYS",
            "NV2 X SYS SYS SYS SYS",
            "SYS SYS X NV4 SYS SYS",
            "SYS SYS NV4 X NV4 SYS",
            "SYS SYS SYS NV4 X SYS",
            "SYS SYS SYS SYS SYS X",
        ]
    )
    a = compute_availability(topology, range(6), policy=Policy.BEST)
    # The best pair is in the chain: an island of 3, but no three of it are all joined (fit 2).
    assert a.best[1] == FreeSet(links=40, connected=True, numa=1, nic=0, island=3, fit=2, whole=2)
    # With GPU 3 taken the chain breaks: the pair left on NVLink is 0-1, an island of exactly 2.
    b = compute_availability(topology, [0, 1, 2, 4, 5], policy=Policy.BEST)
    assert b.best[1] == FreeSet(links=20, connected=True, numa=1, nic=0, island=2, fit=2, whole=2)
    assert availability_labels(b, PREFIX)["gpu.topology.io/gpu-free-nvlink-max"] == "2"


def test_all_k_of_a_48_gpu_random_machine_share_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    topology = random_topology(48, 3)
    spent: list[GpuSet] = []

    def recorded(*args: Any, **kwargs: Any) -> GpuSet:
        best = best_gpu_set(*args, **kwargs)
        spent.append(best)
        return best

    monkeypatch.setattr(free_sets, "best_gpu_set", recorded)
    a = compute_availability(topology, range(48), budget=240_000)
    assert len(a.best) == len(spent) == 48
    assert sum(s.work for s in spent) <= 240_000 + 48 * 48  # each search may overrun by one step
    assert not all(s.exact for s in spent)
    assert decode_availability(encode_availability(a)) == a


def test_lost_gpus_are_not_free_and_unknown_ones_are_an_error() -> None:
    topology = machine(["X NV4 PIX", "NV4 X PIX", "PIX PIX X"], lost=[1])
    assert compute_availability(topology, [0, 1, 2]).free == (0, 2)
    with pytest.raises(PlacementError, match="free GPUs: GPU 3 is not on this node"):
        compute_availability(topology, [0, 3])


def test_no_free_gpu_encodes_and_decodes() -> None:
    a = compute_availability(DGX_A100, [])
    assert a == Availability(free=(), best=())
    assert encode_availability(a) == "3;;"
    assert (
        decode_availability("3;;") == decode_availability("2;;") == decode_availability("1;;") == a
    )
    assert availability_labels(a, PREFIX) == {
        "gpu.topology.io/gpu-free": "0",
        "gpu.topology.io/gpu-free-nvlink-max": "0",
    }


@settings(max_examples=60, deadline=None)
@given(data=st.data(), topology=topologies(max_gpus=7))
def test_computed_availability_round_trips(data: st.DataObject, topology: Topology) -> None:
    free = data.draw(
        st.sets(st.sampled_from(range(len(topology.gpus))) if topology.gpus else st.nothing()),
        "free",
    )
    a = compute_availability(topology, free)
    assert decode_availability(encode_availability(a)) == a


@st.composite
def availabilities(draw: st.DrawFn) -> Availability:
    """Any availability `decode_availability` must accept: consistent values, any sizes."""
    free = tuple(sorted(draw(st.sets(st.integers(0, 255), max_size=24))))
    version = draw(st.integers(1, 3))  # no fit before version 2, no whole before version 3
    best = []
    for k in range(1, len(free) + 1):
        pairs = k * (k - 1) // 2
        connected = k == 1 or draw(st.booleans())
        low = 10 * pairs if connected else pairs
        best.append(
            FreeSet(
                links=draw(st.integers(low, max(low, 720 * pairs))),
                connected=connected,
                numa=draw(st.integers(1, k)),
                nic=draw(st.integers(0, 5)),
                island=(island := draw(st.integers(k, len(free)))),
                fit=(
                    fit := None
                    if version == 1
                    else draw(st.integers(k, island) if connected else st.integers(0, island))
                ),
                whole=None if version < 3 else (draw(st.integers(fit, MAX_GPUS)) if fit else 0),
            )
        )
    return Availability(free=free, best=tuple(best))


@settings(max_examples=200, deadline=None)
@given(availabilities())
def test_every_consistent_availability_round_trips(a: Availability) -> None:
    text = encode_availability(a)
    assert len(text) <= MAX_TEXT_CHARS
    assert decode_availability(text) == a


def _decodes_back_or_refuses(text: str) -> None:
    try:
        a = decode_availability(text)
    except SchemaError as e:
        message = str(e)
    else:
        assert encode_availability(a) == text
        return
    assert message.startswith("availability: ")
    assert "\n" not in message
    assert len(message) < 200


@fuzz(300)
@given(st.text(alphabet=st.sampled_from("0123456789.;/,-: 1x\n\x00é"), max_size=60))
def test_hostile_text_decodes_back_exactly_or_raises_schema_error(text: str) -> None:
    _decodes_back_or_refuses(text)


@fuzz(300)
@given(data=st.data(), a=availabilities())
def test_edited_values_decode_back_exactly_or_raise_schema_error(
    data: st.DataObject, a: Availability
) -> None:
    text = encode_availability(a)
    at = data.draw(st.integers(0, len(text)), "at")
    cut = data.draw(st.integers(0, 3), "cut")
    insert = data.draw(st.text(alphabet="0123456789.;/,-", max_size=3), "insert")
    _decodes_back_or_refuses(text[:at] + insert + text[at + cut :])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "is not version;free;best", id="empty"),
        pytest.param("4;0;0.1.1.0.1.1.1", "version '4' is not 1, 2 or 3", id="a future version"),
        pytest.param("2;0;0.1.1.0.1", "is not links.c.numa.nic.island.fit", id="2 without fit"),
        pytest.param(
            "2;0;0.1.1.0.1.1.1", "1.1.1' is not links.c.numa.nic.island.fit", id="2 w/ whole"
        ),
        pytest.param("3;0;0.1.1.0.1.1", "is not links.c.numa.nic.island.fit.whole", id="no whole"),
        pytest.param("3;0;0.1.1.0.1", "is not links.c.numa.nic.island.fit.whole", id="3, 5 fields"),
        pytest.param(
            "3;0-1;0.1.1.0.2.2.2/10.1.1.0.2.2.1", "reach of 1 is below its fit of 2", id="whole<fit"
        ),
        pytest.param(
            "3;0-1;0.1.1.0.2.2.2/5.0.1.0.2.0.8",
            "reach of 8 where the on-node policy fails",
            id="whole without fit",
        ),
        pytest.param(
            "3;0;0.1.1.0.1.1.257", "reach of 257 is beyond the limit of 256", id="whole>MAX_GPUS"
        ),
        pytest.param("3;0;0.1.1.0.1.1.999", "reach of 999 is beyond the limit", id="whole 999"),
        pytest.param(
            "3;0;0.1.1.0.1.1.1000",
            "is not links.c.numa.nic.island.fit.whole",
            id="whole of four digits",
        ),
        pytest.param(
            "3;0;0.1.1.0.1.1." + "9" * 40,
            "is not links.c.numa.nic.island.fit.whole",
            id="a huge whole",
        ),
        pytest.param("3;0;0.1.1.0.1.1.01", "canonical form", id="whole with a leading zero"),
        pytest.param("1;0;0.1.1.0.1.1", "is not links.c.numa.nic.island", id="1 with a fit"),
        pytest.param("2;0-1;0.1.1.0.1.1/10.1.1.0.2.3", "beyond its island of 2", id="fit"),
        pytest.param("2;0-1;0.1.1.0.1.1/10.1.1.0.2.1", "impossible for 2 connected", id="fit<k"),
        pytest.param("1;0;0.1.1.0.1;", "is not version;free;best", id="a third separator"),
        pytest.param("1;0-1;0.1.1.0.1", "1 best sets for 2 free GPUs", id="a k missing"),
        pytest.param("1;x;", "free GPUs: ", id="free not a list"),
        pytest.param("1;0-999;", "free GPUs beyond the limit of 256", id="too many free"),
        pytest.param("1;256;0.1.1.0.1", "free GPUs beyond the limit of 256", id="index too big"),
        pytest.param("1;0;0.1.1.0", "is not links.c.numa.nic.island", id="four fields"),
        pytest.param("1;0;00.1.1.0.1", "canonical form", id="leading zero"),
        pytest.param("1;0,1;0.1.1.0.1/0.0.1.0.2", "0 link points is impossible", id="no pair"),
        pytest.param("1;0,1;0.1.1.0.1/9.1.1.0.2", "cannot be NVLink-connected", id="nvlink"),
        pytest.param("1;0,1;0.1.1.0.1/1.0.3.0.2", "3 NUMA nodes is impossible", id="numa"),
        pytest.param("1;0;0.1.1.6.1", "6 NIC points", id="nic"),
        pytest.param("1;0,1;0.1.1.0.1/1.0.1.0.3", "island of 3 is impossible", id="island"),
        pytest.param("1;0;0.0.1.0.1", "one GPU is always connected", id="k=1 disconnected"),
        pytest.param("1;1,0;0.1.1.0.1/1.0.1.0.2", "canonical form", id="free out of order"),
        pytest.param("1;0;0.1.1.0.1 ", "is not links.c.numa.nic.island", id="trailing space"),
        pytest.param("1;٣;", "holds non-ASCII characters", id="non-ascii digit"),
        pytest.param("1;0;" + "0" * MAX_TEXT_CHARS, "too long", id="too long"),
        pytest.param("1;[[[[[[[[0]]]]]]]];", "free GPUs", id="nesting"),
    ],
)
def test_malformed_values_raise_a_clear_schema_error(text: str, message: str) -> None:
    with pytest.raises(SchemaError, match=r"^availability: ") as info:
        decode_availability(text)
    assert message in str(info.value)


def test_a_value_that_is_no_string_raises_schema_error() -> None:
    with pytest.raises(SchemaError, match="is a int, not a string"):
        decode_availability(7)  # type: ignore[arg-type]


def summary(
    links: int = 120,
    connected: bool = True,
    numa: int = 1,
    island: int = 2,
    fit: int | None = 2,
    whole: int | None = None,
) -> Availability:
    """A node whose chosen pair is the one given (k=1 is a plain GPU), of `island` free GPUs."""
    single = FreeSet(
        links=0, connected=True, numa=1, nic=0, island=1, fit=1, whole=None if whole is None else 1
    )
    pair = FreeSet(links, connected, numa, nic=0, island=island, fit=fit, whole=whole)
    return Availability(free=tuple(range(max(island, 2))), best=(single, pair))


# Each row is at least as good as the next for a 2-GPU pod, by the rule its id names (version 3):
# two parts the whole-node class, one part the free class (a free fit of 2 here unless set), rounded
# up.
RANKED = [
    pytest.param(summary(numa=1, whole=2), 10, id="connected, whole exactly k, one NUMA node"),
    pytest.param(summary(numa=2, whole=2), 9, id="two NUMA nodes lose to one"),
    pytest.param(summary(numa=1, whole=4), 8, id="a whole up to 2k loses to k, free fit k too"),
    pytest.param(summary(numa=2, whole=3), 7, id="up to 2k, two NUMA nodes"),
    pytest.param(summary(numa=1, whole=8), 6, id="a larger whole, the free fit k"),
    pytest.param(summary(links=5, connected=False, fit=1, whole=1), 2, id="cuts nothing"),
    pytest.param(summary(links=5, connected=False, fit=1, whole=2), 2, id="cuts a node's pair"),
    pytest.param(summary(links=5, connected=False, fit=0, whole=0), 1, id="the policy fails"),
]

# The same rows in version 2 (no whole): ranked by the free fit, as before version 3.
RANKED_V2 = [
    pytest.param(summary(numa=1, fit=2), 10, id="connected, fit exactly k, one NUMA node"),
    pytest.param(summary(numa=2, fit=2), 9, id="two NUMA nodes lose to one"),
    pytest.param(summary(numa=1, island=4, fit=4), 7, id="a fit up to 2k loses to k"),
    pytest.param(summary(numa=2, island=4, fit=3), 6, id="fit up to 2k, two NUMA nodes"),
    pytest.param(summary(numa=1, island=8, fit=8), 4, id="a larger fit, on one NUMA node too"),
    pytest.param(summary(links=5, connected=False, fit=1), 2, id="not connected, cuts nothing"),
    pytest.param(summary(links=10, connected=False, island=3, fit=2), 1, id="not connected"),
    pytest.param(summary(links=5, connected=False, fit=0), 1, id="the on-node policy fails"),
]


@pytest.mark.parametrize(("a", "score"), RANKED)
def test_node_score_ranks_as_documented(a: Availability, score: int) -> None:
    text = encode_availability(a)
    assert text.startswith("3;")
    assert node_score(decode_availability(text), 2) == node_score(a, 2) == score


@pytest.mark.parametrize(("a", "score"), RANKED_V2)
def test_a_version_2_availability_ranks_by_its_free_fit(a: Availability, score: int) -> None:
    assert all(s.whole is None for s in a.best)
    assert node_score(a, 2) == score


def test_a_version_2_value_written_by_an_older_agent_reads_and_ranks_as_before() -> None:
    old = "2;0-3,6;0.1.1.4.5.5/120.1.1.4.5.5/360.1.2.1.5.5/720.1.2.1.5.5/1200.1.3.1.5.5"
    a = decode_availability(old)
    assert a.best[1] == FreeSet(links=120, connected=True, numa=1, nic=4, island=5, fit=5)
    assert encode_availability(a) == old
    assert [node_score(a, k) for k in range(1, 6)] == [4, 4, 6, 6, 9]
    # The same free GPUs in version 3: the node's connected 8 counts against every k below 4, two
    # parts to the free fit's one.
    v3 = compute_availability(DGX_A100, [6, 0, 1, 2, 3], policy=Policy.BEST)
    assert [node_score(v3, k) for k in range(1, 6)] == [4, 4, 5, 6, 7]


def test_a_one_gpu_pod_ranks_an_nvswitch_gpu_below_a_lone_pcie_gpu() -> None:
    # One GPU free on each: the NVSwitch node's GPU cuts into the node's connected 8 (whole 8),
    # the PCIe node's GPU into nothing (whole 1). By the free fit alone (version 2) both were a
    # snug fit of 1 and tied, and 1-GPU pods spread over the NVSwitch nodes (bench/README.md).
    h100 = decode_availability(encode_availability(compute_availability(H100, [5])))
    pcie = decode_availability(encode_availability(compute_availability(PCIE, [3])))
    assert (h100.best[0].fit, h100.best[0].whole) == (1, 8)
    assert (pcie.best[0].fit, pcie.best[0].whole) == (1, 1)
    assert node_score(h100, 1) < node_score(pcie, 1)


def test_a_version_1_value_ranks_by_its_island() -> None:
    # Written by an agent before the fit: the island, never smaller than the fit, stands in.
    old = decode_availability("1;0-3;0.1.1.4.4/120.1.1.4.4/360.1.2.1.4/720.1.2.1.4")
    assert old.best[1] == FreeSet(links=120, connected=True, numa=1, nic=4, island=4, fit=None)
    assert encode_availability(old) == "1;0-3;0.1.1.4.4/120.1.1.4.4/360.1.2.1.4/720.1.2.1.4"
    assert [node_score(old, k) for k in (1, 2, 4)] == [4, 7, 9]


WORKSTATION = dict(SIMULATED)["simulated-workstation-nvlink-bridge"]
A100 = dict(SIMULATED)["simulated-dgx-a100"]
H100 = dict(SIMULATED)["simulated-dgx-h100"]
PCIE = dict(SIMULATED)["simulated-pcie-8x"]


def test_the_entries_describe_the_set_the_on_node_policy_takes() -> None:
    # One GPU of a workstation whose GPUs 0 and 1 are an NVLink pair: `best` takes GPU 0 and cuts
    # the pair (fit 2), `packing` takes the lone GPU 2 (fit 1); NVIDIA's policy may take any, so
    # the entry is the GPU of the largest reach.
    fits = {
        policy: compute_availability(WORKSTATION, range(3), policy=policy).best[0].fit
        for policy in Policy
    }
    assert fits == {Policy.BEST: 2, Policy.PACKING: 1, Policy.NVIDIA_BESTEFFORT: 2}
    packing = compute_availability(WORKSTATION, range(3), policy=Policy.PACKING)
    best = compute_availability(WORKSTATION, range(3), policy=Policy.BEST)
    assert (node_score(packing, 1), node_score(best, 1)) == (10, 7)
    # Where go-gpuallocator answers a padded set, the device plugin fails: fit 0, the best set.
    nvidia = compute_availability(A100, [0, 2, 4, 5, 6], policy=Policy.NVIDIA_BESTEFFORT)
    best = compute_availability(A100, [0, 2, 4, 5, 6], policy=Policy.BEST)
    assert nvidia.best[2] == replace(best.best[2], fit=0, whole=0)
    assert node_score(nvidia, 3) == 1
    assert decode_availability(encode_availability(nvidia)) == nvidia


def test_node_score_and_can_fit_at_the_edges() -> None:
    a = summary()
    assert (node_score(None, 4), can_fit(None, 4)) == (NEUTRAL_SCORE, True)
    assert (node_score(a, 3), can_fit(a, 3)) == (0, False)
    assert can_fit(a, 2)
    assert node_score(a, 0) == NEUTRAL_SCORE
    # One GPU: a GPU outside any island keeps the islands whole for the pods that need them.
    alone = Availability(free=(0,), best=(FreeSet(0, True, 1, 0, 1, 1),))
    in_island = Availability(free=(0, 1), best=(FreeSet(0, True, 1, 0, 2, 2), a.best[1]))
    assert node_score(alone, 1) > node_score(in_island, 1)


# --- holding a pod for a connected set (issue 23) ---

DGX1 = dict(SIMULATED)["simulated-dgx-1-v100"]


def test_connected_now_is_the_set_the_policy_takes() -> None:
    # A DGX-1 with GPUs 0, 1 and 4 to 7 free: a connected quad (4-7) for `packing`.
    a = compute_availability(DGX1, [0, 1, 4, 5, 6, 7], policy=Policy.PACKING)
    assert [connected_now(a, k) for k in range(1, 7)] == [True, True, True, True, False, False]
    assert not connected_now(a, 7)  # 7 do not fit
    assert not connected_now(None, 2)  # unread: we know nothing to wait for
    pcie = compute_availability(PCIE, range(8), policy=Policy.PACKING)
    assert [connected_now(pcie, k) for k in (1, 2)] == [True, False]
    # The device plugin fails k = 3 here (a padded answer): nothing is handed out, connected or not.
    nvidia = compute_availability(A100, [0, 2, 4, 5, 6], policy=Policy.NVIDIA_BESTEFFORT)
    assert nvidia.best[2].connected
    assert not connected_now(nvidia, 3)


def test_connected_capacity_is_the_largest_connected_set_a_free_gpu_belongs_to() -> None:
    # Free or not: one free GPU of an NVSwitch node belongs to its connected 8.
    assert connected_capacity(compute_availability(H100, [5])) == 8
    assert connected_capacity(compute_availability(DGX1, [2])) == 4  # a quad of the cube mesh
    assert connected_capacity(compute_availability(PCIE, range(8))) == 1
    assert connected_capacity(compute_availability(WORKSTATION, [0])) == 2
    assert connected_capacity(compute_availability(WORKSTATION, [2])) == 1
    assert connected_capacity(compute_availability(H100, [])) == 0
    assert connected_capacity(None) == 0
    # A version-1 value: its island stands in, never smaller.
    old = decode_availability("1;0-3;0.1.1.4.4/120.1.1.4.4/360.1.2.1.4/720.1.2.1.4")
    assert connected_capacity(old) == 4


@pytest.mark.parametrize(
    ("k", "waited", "limit", "connected", "capable", "held"),
    [
        (4, 60.0, 7200.0, False, True, True),
        (4, 7200.0, 7200.0, False, True, False),  # waited the limit: take what there is
        (4, 60.0, 7200.0, True, True, False),  # a connected set is free: no reason to wait
        (4, 60.0, 7200.0, False, False, False),  # no node could ever give one: never wait
        (1, 60.0, 7200.0, False, True, False),  # one GPU needs no link
        (2, 60.0, 0.0, False, True, False),  # turned off
        (2, -30.0, 7200.0, False, True, True),  # created "in the future": the clocks' skew
        (2, -7200.0, 7200.0, False, True, False),  # a skew past the limit holds nothing
    ],
)
def test_holds_for_connected(
    k: int, waited: float, limit: float, connected: bool, capable: bool, held: bool
) -> None:
    assert holds_for_connected(k, waited, limit, connected=connected, capable=capable) is held


# --- degraded NVLinks (issue 22 item 2): a set with such a GPU is not connected at full bond ---


def degraded_h100(degraded: tuple[int, ...], lost_links: int = 2) -> Topology:
    """The simulated DGX H100 whose `degraded` GPUs have `lost_links` of their 18 NVLinks down:
    through the NVSwitches every pair with one of them loses that much bond."""
    base = dict(SIMULATED)["simulated-dgx-h100"]
    n = len(base.gpus)

    def cell(a: int, b: int) -> Link:
        link = base.links[a][b]
        if a == b or not (a in degraded or b in degraded):
            return link
        return Link(LinkKind.NV, link.nvlinks - lost_links)

    gpus = tuple(
        replace(g, nvlink=NvlinkHealth(18, down=tuple(range(lost_links))))
        if g.index in degraded
        else replace(g, nvlink=NvlinkHealth(18))
        for g in base.gpus
    )
    links = tuple(tuple(cell(a, b) for b in range(n)) for a in range(n))
    return replace(base, gpus=gpus, links=links)


def test_a_set_that_needs_a_degraded_gpu_is_not_connected_and_ranks_with_pcie_sets() -> None:
    # The best sets: NVIDIA's policy sees no NVLink through the NVSwitches, degraded or not.
    whole = compute_availability(degraded_h100(()), range(8), policy=Policy.BEST)
    one_bad = compute_availability(degraded_h100((3,)), range(8), policy=Policy.BEST)
    assert all(s.connected for s in whole.best)
    # Up to 7 GPUs the best set leaves GPU 3 out; all 8 need it.
    assert [s.connected for s in one_bad.best] == [True] * 7 + [False]
    assert node_score(whole, 8) >= 4
    assert 1 <= node_score(one_bad, 8) <= 3
    assert node_score(one_bad, 4) == node_score(whole, 4)
    assert availability_labels(one_bad, PREFIX)[f"{PREFIX}/gpu-free-nvlink-max"] == "7"
    assert decode_availability(encode_availability(one_bad)) == one_bad


def test_a_degraded_gpu_alone_is_still_one_connected_gpu() -> None:
    a = compute_availability(degraded_h100((0, 1, 2, 3, 4, 5, 6, 7)), [5])
    assert a.best[0].connected


def test_the_extender_prefers_a_whole_node_to_one_whose_best_set_is_degraded() -> None:
    whole = compute_availability(degraded_h100(()), range(4))
    bad = compute_availability(degraded_h100((0,)), range(4))
    assert node_score(whole, 4) > node_score(bad, 4)
