"""The node's fabric labels, judged from its GPUs: domain, partition, health, rack, link health."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.links import SELF, Link, LinkKind
from reporter.schema.fabric import gpu_health, node_fabric, own_domain
from reporter.schema.labels import labels, summary
from reporter.schema.model import (
    FabricHealth,
    FabricState,
    Gpu,
    GpuFabric,
    NvlinkHealth,
    RackPosition,
    Source,
    Topology,
)

A = "6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31"
B = "7504d9d0-c120-5319-91a6-ba473ae4cda6"
NV18 = Link(LinkKind.NV, 18)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
COMPLETED = FabricState.COMPLETED


def tray(*fabrics: GpuFabric | None, **gpu: object) -> Topology:
    n = len(fabrics)
    gpus = tuple(Gpu(i, fabric=f, **gpu) for i, f in enumerate(fabrics))  # type: ignore[arg-type]
    links = tuple(tuple(SELF if a == b else NV18 for b in range(n)) for a in range(n))
    return Topology(Source.NVML, gpus, links, nvswitch=True)


def attached(cluster: str = A, clique: int = 1, **more: object) -> GpuFabric:
    fields: dict[str, object] = {"health": FabricHealth.HEALTHY, **more}
    return GpuFabric(COMPLETED, cluster, clique, **fields)  # type: ignore[arg-type]


def fabric_labels(topology: Topology, node: str | None = "gb-07") -> dict[str, str]:
    wanted = ("nvlink-domain", "nvlink-partition", "fabric-health")
    got = labels(topology, node=node)
    return {k.split("/")[1]: v for k, v in got.items() if k.split("/")[1].startswith(wanted)}


@pytest.mark.parametrize(
    ("topology", "want"),
    [
        (
            tray(attached(), attached(), attached(), attached()),
            {"nvlink-domain": A, "nvlink-partition": f"{A}.1", "fabric-health": "healthy"},
        ),
        (
            tray(None, None),
            {"nvlink-domain": "node-gb-07", "nvlink-partition": "node-gb-07"},
        ),
        (
            tray(GpuFabric(COMPLETED, None, 0), GpuFabric(COMPLETED, None, 0)),
            {
                "nvlink-domain": "node-gb-07",
                "nvlink-partition": "node-gb-07",
                "fabric-health": "healthy",
            },
        ),
        (
            tray(attached(), GpuFabric(FabricState.IN_PROGRESS)),
            {"nvlink-domain": "node-gb-07", "fabric-health": "in-progress"},
        ),
        (
            tray(GpuFabric(FabricState.NOT_STARTED), GpuFabric(FabricState.IN_PROGRESS)),
            {"nvlink-domain": "node-gb-07", "fabric-health": "not-started"},
        ),
        (
            tray(attached(clique=1), attached(clique=2)),
            {"nvlink-domain": A, "fabric-health": "healthy"},
        ),
        (
            tray(attached(A), attached(B)),
            {"nvlink-domain": "node-gb-07", "fabric-health": "healthy"},
        ),
        (
            tray(attached(), None),
            {"nvlink-domain": "node-gb-07", "fabric-health": "healthy"},
        ),
        (
            tray(attached(), attached(error=15)),
            {"nvlink-domain": "node-gb-07", "fabric-health": "unhealthy"},
        ),
        (
            tray(attached(), GpuFabric(COMPLETED, None, None, problems=("unreadable",))),
            {"nvlink-domain": "node-gb-07", "fabric-health": "healthy"},
        ),
        (
            tray(attached(), attached(conditions=("degraded-bandwidth",))),
            {"nvlink-domain": A, "nvlink-partition": f"{A}.1", "fabric-health": "degraded"},
        ),
        (
            tray(attached(), attached(health=FabricHealth.UNHEALTHY)),
            {"nvlink-domain": A, "nvlink-partition": f"{A}.1", "fabric-health": "unhealthy"},
        ),
        (
            tray(attached(), GpuFabric(FabricState.UNKNOWN, problems=("state 255",))),
            {"nvlink-domain": "node-gb-07", "fabric-health": "unknown"},
        ),
    ],
    ids=[
        "every GPU attached to one clique: GFD's value",
        "no fabric at all: the node is its own domain and partition",
        "an NVSwitch system without a multi-node fabric (all-zero cluster UUID)",
        "a GPU still joining: no partition, the state as the health",
        "the least advanced GPU names the state",
        "GPUs on two cliques of one cluster: the domain, no partition",
        "GPUs on two clusters: no domain of theirs, no partition",
        "a GPU without a fabric beside attached ones",
        "a failed probe on one GPU",
        "a GPU whose fabric could not be read",
        "a condition of the health mask makes it degraded",
        "NVML's summary makes it unhealthy",
        "a state NVML does not define",
    ],
)
def test_domain_partition_and_health_follow_the_gpus(
    topology: Topology, want: dict[str, str]
) -> None:
    assert fabric_labels(topology) == want


def test_a_withheld_partition_says_why_naming_each_gpu_and_value() -> None:
    fabric = node_fabric(tray(attached(clique=1), attached(clique=2), attached(B, 2)))
    assert fabric.partition is None
    assert fabric.withheld == (
        f"GPUs disagree on the fabric: GPU0 {A} clique 1, GPU1 {A} clique 2, GPU2 {B} clique 2"
    )
    assert fabric.problems[0] == fabric.withheld


def test_a_lost_gpu_says_nothing_about_the_fabric() -> None:
    topology = tray(attached(), attached(), None)
    lost = Topology(
        Source.NVML,
        (*topology.gpus[:2], Gpu(2, lost=True)),
        topology.links,
        nvswitch=True,
    )
    assert fabric_labels(lost)["nvlink-partition"] == f"{A}.1"


def test_without_a_node_name_a_node_without_a_fabric_gets_no_domain_labels() -> None:
    assert fabric_labels(tray(None, None), node=None) == {}
    assert fabric_labels(tray(attached()), node=None)["nvlink-partition"] == f"{A}.1"


def test_the_rack_position_is_published_where_every_gpu_agrees() -> None:
    here = RackPosition("1821622000007", 3, 2, 0)
    got = labels(tray(attached(position=here), attached(position=here)), node="gb-07")
    assert {k: v for k, v in got.items() if "/rack-" in k} == {
        "gpu.topology.io/rack-serial": "1821622000007",
        "gpu.topology.io/rack-slot": "3",
        "gpu.topology.io/rack-tray": "2",
        "gpu.topology.io/rack-host": "0",
    }
    apart = tray(attached(position=here), attached(position=RackPosition("1821622000007", 4, 3)))
    got = labels(apart, node="gb-07")
    assert {k: v for k, v in got.items() if "/rack-" in k} == {
        "gpu.topology.io/rack-serial": "1821622000007"
    }
    assert node_fabric(apart).problems == (
        "GPUs disagree on the rack slot: GPU0 3, GPU1 4",
        "GPUs disagree on the rack tray: GPU0 2, GPU1 3",
        "GPUs disagree on the rack host id: GPU0 0, GPU1 None",
    )
    assert node_fabric(apart).withheld is None


@pytest.mark.parametrize(
    ("fabric", "word"),
    [
        (attached(), "healthy"),
        (attached(health=None), "healthy"),
        (attached(health=FabricHealth.LIMITED_CAPACITY), "degraded"),
        (attached(conditions=("route-recovery",)), "degraded"),
        (attached(conditions=("route-unhealthy",)), "unhealthy"),
        (attached(conditions=("degraded-bandwidth", "no-partition")), "unhealthy"),
        (attached(conditions=("health-mask-invalid",)), "degraded"),
        (attached(error=999), "unhealthy"),
        (GpuFabric(FabricState.IN_PROGRESS), "in-progress"),
    ],
    ids=[
        "healthy summary, no condition",
        "no summary (a v2 driver), no condition",
        "limited capacity",
        "a route being recovered",
        "an unhealthy route",
        "the worst condition wins",
        "a mask NVML does not define",
        "a failed probe",
        "not completed",
    ],
)
def test_one_gpus_fabric_health_in_one_word(fabric: GpuFabric, word: str) -> None:
    assert gpu_health(fabric) == word


def nvlink_tray(*healths: NvlinkHealth | None, **gpu: object) -> Topology:
    n = len(healths)
    gpus = tuple(Gpu(i, nvlink=h, **gpu) for i, h in enumerate(healths))  # type: ignore[arg-type]
    links = tuple(tuple(SELF if a == b else NV18 for b in range(n)) for a in range(n))
    return Topology(Source.NVML, gpus, links, nvswitch=True)


@pytest.mark.parametrize(
    ("topology", "word"),
    [
        (nvlink_tray(NvlinkHealth(18), NvlinkHealth(18)), "ok"),
        (nvlink_tray(NvlinkHealth(18), NvlinkHealth(18, (16, 17))), "degraded"),
        (nvlink_tray(NvlinkHealth(2, (0, 1)), NvlinkHealth(18, (17,))), "down"),
        (nvlink_tray(NvlinkHealth(18, (17,)), NvlinkHealth(18), mig=True), None),
        (nvlink_tray(None, None), None),
    ],
    ids=[
        "every link active",
        "a GPU lost two of its 18",
        "a GPU has none left",
        "GPUs in MIG mode, whose links NVML reports down",
        "links not known (a pasted matrix)",
    ],
)
def test_nvlink_health_counts_each_gpus_own_links(topology: Topology, word: str | None) -> None:
    assert labels(topology).get("gpu.topology.io/nvlink-health") == word


def test_the_summary_names_the_gpus_with_links_down() -> None:
    topology = nvlink_tray(NvlinkHealth(18), NvlinkHealth(18, (16, 17)), NvlinkHealth(18))
    assert summary(topology).endswith("NVLINKS DOWN: GPU1 2/18")


@pytest.mark.parametrize(
    ("node", "own"),
    [
        ("dgx-01", "node-dgx-01"),
        ("gpu-node-1.example.com", "node-gpu-node-1.example.com"),
        ("a" * 58, "node-" + "a" * 58),
    ],
)
def test_a_short_node_name_is_its_own_domain_whole(node: str, own: str) -> None:
    assert own_domain(node) == own


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_the_own_domain_is_a_valid_label_value_for_any_name(node: str) -> None:
    value = own_domain(node)
    assert len(value) <= 63
    assert LABEL_VALUE.fullmatch(value)
    assert value.startswith("node-")


def test_long_names_sharing_a_prefix_get_distinct_domains() -> None:
    a, b = "gb200-" + "x" * 60 + "-rack1", "gb200-" + "x" * 60 + "-rack2"
    assert own_domain(a) != own_domain(b)
    assert own_domain(a)[:46] == own_domain(b)[:46]
