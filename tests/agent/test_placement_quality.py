"""Live placement quality (issue 31, item 1): the agent's `topo_reporter_pod_gpu_sets*` and
`topo_reporter_free_connected_max` against a from-scratch judgement of every set.

Pods hold chosen GPU sets on simulated machines, served by the kubelet's own PodResources server
code (the harness's `podresources` subcommand), device plugin devices and DRA claims, and one
container holding both; the agent's reader reads them and its metrics render them. The expectation
is computed here from the link matrix's tokens and the GPUs' NUMA nodes alone, with its own order
of paths and a brute-force search for the largest free connected set: no code of the agent's
judgement is reused.
"""

from __future__ import annotations

import functools
import itertools
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reporter.collect.nvml import NvmlCollector
from reporter.collect.podresources import AllocationView, DraScope, PodResourcesReader
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.racks import rack_nodes
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.errors import SchemaError
from reporter.placement_quality import HeldSet, decode_held_sets, encode_held_sets
from reporter.schema.model import FabricState, Topology
from reporter.serve.metrics import Metrics
from tests.collect.test_podresources import GPU
from tests.collect.test_podresources_kubelet import KubeletPodResources, converge
from tests.support.podresources_double import devices_state

NODE = "gpu-node-1"
DRIVER = "gpu.nvidia.com"
# Hybrid cube mesh (NVLink between some pairs), PCIe only (PIX..SYS), NVSwitch, 16 GPUs on two
# NVSwitch planes, a workstation with one NVLink bridge.
PROFILES = ("dgx-1-v100", "pcie-8x", "dgx-h100", "dgx-2", "workstation-nvlink-bridge")
# Farthest last: a smaller NVLink bond is farther than a larger one, any NVLink closer than PCIe.
PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")


@pytest.fixture
def kubelet(controlplane_bin: Path) -> Iterator[KubeletPodResources]:
    """The kubelet's PodResources server, in a short directory (a socket path fits 107 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="podres-q-", dir="/tmp"))
    server = KubeletPodResources(
        controlplane_bin, directory / "kubelet.sock", directory / "state.json"
    )
    server.write({"devices": [], "pods": []})
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@functools.cache
def machine_topology(profile: str) -> Topology:
    machine = load_machine(profile)
    topology = NvmlCollector(FakeNvml(machine), memory_hostfs(machine)).collect()
    assert topology is not None
    return topology


def token(t: Topology, a: int, b: int) -> str:
    return t.link(a, b).token


def distance(tok: str) -> tuple[int, int]:
    if tok.startswith("NV"):
        return (0, -int(tok[2:]))
    return (1 + PATHS.index(tok), 0)


def from_scratch(t: Topology, gpus: tuple[int, ...]) -> tuple[bool, str, str]:
    """(connected, worst path class, numa) of a set, from the matrix tokens and NUMA strings."""
    pairs = list(itertools.combinations(gpus, 2))
    connected = all(token(t, a, b).startswith("NV") for a, b in pairs)
    worst = max((token(t, a, b) for a, b in pairs), key=distance)
    homes = {t.gpus[i].numa for i in gpus}
    numa = "unknown" if None in homes else "one" if len(homes) == 1 else "several"
    return connected, "NV" if worst.startswith("NV") else worst, numa


def largest_connected(t: Topology, free: list[int]) -> int:
    for size in range(len(free), 1, -1):
        for subset in itertools.combinations(free, size):
            if all(token(t, a, b).startswith("NV") for a, b in itertools.combinations(subset, 2)):
                return size
    return 1 if free else 0


def chosen_sets(t: Topology, seed: int) -> list[tuple[int, ...]]:
    """Disjoint sets of 2..n GPUs out of a shuffled node, some GPUs left free."""
    rng = random.Random(seed)
    gpus = [g.index for g in t.gpus]
    rng.shuffle(gpus)
    sets: list[tuple[int, ...]] = []
    at = 0
    pcie = [p for p in itertools.combinations(gpus, 2) if not token(t, *p).startswith("NV")]
    if seed == 0 and pcie:
        # The closest pair joined by PCIe only is a set of its own: a PIX or PXB worst path.
        closest = min(pcie, key=lambda p: distance(token(t, *p)))
        gpus = [*closest, *(g for g in gpus if g not in closest)]
        sets.append(tuple(sorted(closest)))
        at = 2
    while at + 2 <= len(gpus) - rng.randint(0, 2):
        size = min(rng.choice((2, 2, 3, 4, 4, 8)), len(gpus) - at)
        sets.append(tuple(sorted(gpus[at : at + size])))
        at += size
    return sets


def state(t: Topology, sets: list[tuple[int, ...]]) -> dict[str, object]:
    """The kubelet's state: set i held by pod `p<i>`, through the device plugin, a DRA claim, or,
    every third, one GPU of each (one container, both kinds). A one-GPU pod beside them."""
    uuids = [str(g.uuid) for g in t.gpus]
    pods: list[dict[str, object]] = []
    held = {g for s in sets for g in s}
    single = next((g.index for g in t.gpus if g.index not in held), None)
    for i, gpus in enumerate(sets):
        plugin = list(gpus) if i % 3 == 0 else [gpus[0]] if i % 3 == 2 else []
        claimed = [g for g in gpus if g not in plugin]
        container: dict[str, object] = {
            "name": "main",
            "devices": [{"resource": GPU, "ids": [uuids[g] for g in plugin]}],
            "claims": [
                {
                    "namespace": "team-a",
                    "name": f"claim-{i}",
                    "devices": [
                        {"driver": DRIVER, "pool": NODE, "device": f"gpu-{t.gpus[g].minor}"}
                        for g in claimed
                    ],
                }
            ]
            if claimed
            else [],
        }
        pods.append({"namespace": "team-a", "name": f"p{i}", "containers": [container]})
    if single is not None:
        pods.append(
            {
                "namespace": "team-b",
                "name": "one-gpu",
                "containers": [
                    {"name": "c", "devices": [{"resource": GPU, "ids": [uuids[single]]}]}
                ],
            }
        )
    return {"devices": devices_state(GPU, uuids), "pods": pods}


def samples(metrics: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.controlplane
@pytest.mark.parametrize("profile", PROFILES)
def test_the_agents_metrics_equal_a_from_scratch_judgement_of_every_set(
    kubelet: KubeletPodResources, profile: str
) -> None:
    t = machine_topology(profile)
    assert all(g.minor is not None for g in t.gpus)
    metrics = Metrics()
    with PodResourcesReader(kubelet.socket, dra=DraScope((DRIVER,), NODE)) as reader:
        for seed in range(4):
            sets = chosen_sets(t, seed)
            kubelet.write(state(t, sets))
            want = tuple(sorted(HeldSet("team-a", f"p{i}", "main", s) for i, s in enumerate(sets)))

            def written(v: AllocationView, want: tuple[HeldSet, ...] = want) -> bool:
                return v.held_sets == want

            view: AllocationView = converge(lambda: reader.allocated(t), written)
            metrics.podresources_read(view, t)
            got = samples(metrics)

            judged = [(len(s), *from_scratch(t, s)) for s in sets]
            connected = Counter((k, c) for k, c, _, _ in judged)
            assert got["topo_reporter_pod_gpu_sets"] == {
                (("connected", str(c).lower()), ("gpus", str(k))): connected[k, c]
                for k in range(2, len(t.gpus) + 1)
                for c in (True, False)
            }
            assert got.get("topo_reporter_pod_gpu_sets_worst_link", {}) == {
                (("gpus", str(k)), ("link", link)): n
                for (k, link), n in Counter((k, w) for k, _, w, _ in judged).items()
            }
            assert got.get("topo_reporter_pod_gpu_sets_numa", {}) == {
                (("gpus", str(k)), ("numa", numa)): n
                for (k, numa), n in Counter((k, m) for k, _, _, m in judged).items()
            }
            held = {g for s in sets for g in s}
            single = next((g.index for g in t.gpus if g.index not in held), None)
            free = [g.index for g in t.gpus if g.index not in held and g.index != single]
            assert got["topo_reporter_free_connected_max"] == {(): largest_connected(t, free)}


def test_sets_of_every_kind_occur_in_the_scenarios() -> None:
    """The scenarios above are worth their time: connected and unconnected sets, PCIe-only worst
    paths, sets across NUMA nodes, and free GPUs sharing no NVLink all occur."""
    seen: set[object] = set()
    for profile in PROFILES:
        t = machine_topology(profile)
        for seed in range(4):
            for s in chosen_sets(t, seed):
                connected, worst, numa = from_scratch(t, s)
                seen |= {("connected", connected), ("worst", worst), ("numa", numa)}
    assert {("connected", True), ("connected", False), ("numa", "one")} <= seen
    assert {("numa", "several"), ("worst", "NV"), ("worst", "SYS")} <= seen
    assert {("worst", "PIX")} <= seen or {("worst", "PXB")} <= seen


def test_the_held_sets_annotation_reads_back_and_bounds_its_size() -> None:
    sets = [HeldSet("ns", f"pod-{i:04d}", "main", (0, 1, 2, 3)) for i in range(1000)]
    text = encode_held_sets(sets)
    decoded, left_out = decode_held_sets(text)
    assert len(text) <= 16_384 + 8
    assert len(decoded) + left_out == 1000
    assert decoded == tuple(sorted(sets))[: len(decoded)]
    assert decode_held_sets("1;a/b/c=0-1,3") == ((HeldSet("a", "b", "c", (0, 1, 3)),), 0)
    assert decode_held_sets("1") == ((), 0)


@pytest.mark.parametrize(
    "text",
    [
        *("2;a/b/c=0-1", "1;a/b/c=0", "1;A/b/c=0-1", "1;a/b=0-1", "1;a/b/c=1,0", "1;+0"),
        *("1;a/b/c=0-300", "1;b/b/c=0-1;a/b/c=0-1"),
    ],
)
def test_a_held_sets_value_the_agent_did_not_write_is_refused(text: str) -> None:
    with pytest.raises(SchemaError, match="gpu-sets"):
        decode_held_sets(text)


def fabric_gauges(t: Topology) -> tuple[float, float, float]:
    metrics = Metrics()
    metrics.topology(t)
    got = samples(metrics)
    return (
        got["topo_reporter_gpus_lost"][()],
        got["topo_reporter_fabric_unhealthy"][()],
        got["topo_reporter_partition_withheld"][()],
    )


def test_lost_gpus_an_unready_fabric_and_a_withheld_partition_are_gauges() -> None:
    """What the alerts TopoReporterGpuLost, ...FabricUnhealthy and ...PartitionWithheld read."""
    (node,) = rack_nodes(1, trays=1)
    t = NvmlCollector(FakeNvml(node.machine()), memory_hostfs(node.machine())).collect()
    assert t is not None
    assert fabric_gauges(t) == (0, 0, 0)
    lost = replace(t, gpus=(replace(t.gpus[0], lost=True), *t.gpus[1:]))
    assert fabric_gauges(lost)[0] == 1
    joining = tuple(
        replace(g, fabric=replace(g.fabric, state=FabricState.IN_PROGRESS))
        for g in t.gpus
        if g.fabric is not None
    )
    assert fabric_gauges(replace(t, gpus=joining)) == (0, 1, 1)
    assert fabric_gauges(machine_topology("dgx-h100")) == (0, 0, 0)
