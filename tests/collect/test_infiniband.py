"""InfiniBand discovery from the node against the real ibsim: every host of each generated fabric
walked in turn, its tiers checked against the fabric's true leaf groups and spine groups."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from parsers.links import SELF, Link, LinkKind
from reporter.collect.infiniband import (
    NO_PAIRED_HCA,
    InfinibandTierSource,
    gpu_paired_hcas,
    walk_ports,
)
from reporter.collect.infiniband_tiers import (
    Discovery,
    PortView,
    SmpCounts,
    discovery_json,
    summarize,
)
from reporter.hostfs import DirHostFS, HostFS, MemoryHostFS
from reporter.schema.fabric import is_label_value
from reporter.schema.model import Gpu, Nic, Source, Topology
from tests.support.ibsim import FatTree, IbSim, WalkError, have_ibsim


@pytest.fixture(autouse=True)
def _ibsim_installed() -> None:
    if not have_ibsim():
        pytest.fail("ibsim is missing: run `sh tests/prereqs.sh`, which installs it", pytrace=False)


FABRICS = [
    pytest.param(FatTree(units=3, hosts_per_unit=2), id="2-tier, three leaf groups, one rail"),
    pytest.param(
        FatTree(units=2, rails=4), id="rail-optimized, 4 rails: a host's HCAs on four leaves"
    ),
    pytest.param(
        FatTree(units=2, rails=2, aggregation_nodes=True),
        id="an Aggregation Node CA on every switch makes no switch a leaf",
    ),
    pytest.param(
        FatTree(units=3, rails=2, missing_link=(0, 1, 1, 0)),
        id="one leaf-spine link missing: the spine group does not split",
    ),
    pytest.param(
        FatTree(subnets=2, units=2, rails=2, aggregation_nodes=True),
        id="two subnets: two spine groups",
    ),
]


def _partition(values: dict[str, str]) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = defaultdict(set)
    for host, value in values.items():
        groups[value].add(host)
    return {frozenset(group) for group in groups.values()}


@pytest.mark.parametrize("fabric", FABRICS)
def test_every_host_gets_its_fabrics_true_tiers(fabric: FatTree) -> None:
    with IbSim(fabric.netlist()) as sim:
        found = {host: sim.walk_host(hcas) for host, hcas in fabric.hosts().items()}
    guids = fabric.switch_guids()
    for host, hcas in fabric.hosts().items():
        discovery = found[host]
        assert len(discovery.tiers) == 3, host
        assert all(is_label_value(value) and len(value) <= 63 for value in discovery.tiers)
        assert [view.leaf for view in discovery.views] == [
            guids[fabric.leaf_of(hca)] for hca in hcas
        ]
        assert discovery.smps.unanswered == 0
    hosts = fabric.hosts()
    assert _partition({host: found[host].tiers[0] for host in hosts}) == _partition(
        {host: fabric.leaf_group(host) for host in hosts}
    )
    assert _partition({host: found[host].tiers[1] for host in hosts}) == _partition(
        {host: fabric.spine_group(host) for host in hosts}
    )
    spine_of_leaf_group: dict[str, set[str]] = defaultdict(set)
    for discovery in found.values():
        spine_of_leaf_group[discovery.tiers[0]].add(discovery.tiers[1])
    assert all(len(spines) == 1 for spines in spine_of_leaf_group.values())


def _expected_smps(fabric: FatTree) -> tuple[int, int, int]:
    """NodeInfo, PortInfo and NodeDescription one HCA's walk sends in a 2-tier `fabric` with
    every link there: its own node and its leaf; each port of the leaf and of every spine, but the
    one it came in by; the node behind each of those ports that has a link; for each other leaf
    its port 1, the host there and that host's NodeDescription (a host: a leaf, not a core); its
    own port's PortInfo (its SM's LID)."""
    spines = fabric.spines_per_rail
    agg = int(fabric.aggregation_nodes)
    leaf_live = fabric.hosts_per_unit - 1 + spines + agg
    spine_live = fabric.units - 1 + agg
    others = fabric.units - 1
    port_info = (fabric.radix - 1) * (1 + spines) + others + 1
    return 2 + leaf_live + spines * spine_live + others, port_info, others


@pytest.mark.parametrize(
    "fabric",
    [
        pytest.param(FatTree(units=2, hosts_per_unit=2), id="2 leaf groups"),
        pytest.param(
            FatTree(units=4, hosts_per_unit=3, aggregation_nodes=True),
            id="4 leaf groups, SHARP CAs",
        ),
    ],
)
def test_an_hca_asks_only_its_leaf_and_spines_ports(fabric: FatTree) -> None:
    expected = _expected_smps(fabric)
    with IbSim(fabric.netlist()) as sim:
        discovery = sim.walk_host(fabric.hosts()["s0u1h1"])
    smps = discovery.smps
    assert (smps.node_info, smps.port_info, smps.node_description) == expected
    assert discovery_json(discovery)["mads"] == sum(expected)


def test_one_level_asks_only_the_leaf() -> None:
    fabric = FatTree(units=2, rails=2)
    with IbSim(fabric.netlist()) as sim:
        views, smps = sim.walk("s0u1h0-hca1", "--levels", "1")
    assert [view.leaf for view in views] == [fabric.switch_guids()["leaf-s0u1r1"]]
    assert (smps.node_info, smps.port_info) == (2, 0)
    assert len(summarize(views, smps).tiers) == 1


def test_the_json_names_the_hcas_leaves_and_the_mads_sent() -> None:
    fabric = FatTree(units=1, hosts_per_unit=1, spines_per_rail=1)
    with IbSim(fabric.netlist()) as sim:
        discovery: Discovery = sim.walk_host(fabric.hosts()["s0u0h0"])
    leaf = fabric.switch_guids()["leaf-s0u0r0"]
    document = discovery_json(discovery)
    assert document == {
        "source": "infiniband",
        "tiers": list(discovery.tiers),
        "hcas": [
            {
                "name": "s0u0h0-hca0",
                "port": 1,
                "guid": f"0x{discovery.views[0].port_guid:016x}",
                "leaf": f"0x{leaf:016x}",
            }
        ],
        "mads": discovery.smps.total,
    }
    assert discovery.views[0].port_guid not in (0, leaf)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param(
            ("mlx5_9",),
            "no InfiniBand umad device for HCA mlx5_9 (found: ibsim0)",
            id="an HCA not here",
        ),
        pytest.param(
            ("--budget", "5"), "stopped at its budget of 5 SMPs", id="the SMP budget reached"
        ),
    ],
)
def test_a_walk_that_cannot_finish_says_why_in_one_line(
    arguments: tuple[str, ...], message: str
) -> None:
    fabric = FatTree(units=2)
    with IbSim(fabric.netlist()) as sim, pytest.raises(WalkError) as raised:
        sim.walk("s0u0h0-hca0", *arguments)
    assert raised.value.status == 1
    assert message in raised.value.line


def test_an_hca_named_is_walked() -> None:
    fabric = FatTree(units=2)
    with IbSim(fabric.netlist()) as sim:
        views, _ = sim.walk("s0u0h0-hca0", "ibsim0")
    assert [(view.name, view.port, view.leaf) for view in views] == [
        ("ibsim0", 1, fabric.switch_guids()["leaf-s0u0r0"])
    ]


def test_a_port_cabled_to_another_host_has_no_leaf_and_no_tiers() -> None:
    netlist = 'Hca\t1 "a-hca0"\n[1]\t"b-hca0"[1]\n\nHca\t1 "b-hca0"\n[1]\t"a-hca0"[1]\n'
    with IbSim(netlist) as sim:
        discovery = sim.walk_host(("a-hca0",))
    assert discovery.tiers == ()
    assert [view.leaf for view in discovery.views] == [None]
    assert (discovery.smps.node_info, discovery.smps.port_info) == (2, 0)
    assert discovery_json(discovery)["hcas"] == [
        {
            "name": "a-hca0",
            "port": 1,
            "guid": f"0x{discovery.views[0].port_guid:016x}",
            "leaf": None,
        }
    ]


@pytest.mark.parametrize(
    "levels", [0, 3], ids=["no level", "a third hop above the leaf: the spines reach the cores"]
)
def test_levels_other_than_the_leaf_and_spine_groups_are_refused(levels: int) -> None:
    with pytest.raises(ValueError, match=f"not {levels}"):
        walk_ports((), levels=levels)


# -- which HCAs: the compute ones ------------------------------------------------------------------


def _topology(nics: dict[str, tuple[str, ...]]) -> Topology:
    """Two GPUs (PIX to each other) and `nics`, each with its path to GPU 0 and GPU 1."""
    gpus = (Gpu(0), Gpu(1))
    links = ((SELF, Link(LinkKind.PIX)), (Link(LinkKind.PIX), SELF))
    return Topology(
        source=Source.SYSFS,
        gpus=gpus,
        links=links,
        nics=tuple(
            Nic(name, tuple(Link(LinkKind[token]) for token in paths))
            for name, paths in nics.items()
        ),
    )


@pytest.mark.parametrize(
    ("nics", "paired"),
    [
        pytest.param(
            {"mlx5_0": ("PIX", "PXB"), "mlx5_1": ("PXB", "PIX"), "mlx5_4": ("NODE", "NODE")},
            ("mlx5_0", "mlx5_1"),
            id="a compute HCA behind each GPU's PCIe switch; the storage HCA on the CPU is none",
        ),
        pytest.param(
            {"mlx5_0": ("NODE", "SYS"), "mlx5_1": ("NODE", "SYS"), "mlx5_2": ("SYS", "NODE")},
            ("mlx5_0", "mlx5_1", "mlx5_2"),
            id="no PCIe switch: each GPU's closest HCAs, ties and all",
        ),
        pytest.param(
            {"mlx5_0": ("SYS", "SYS")},
            (),
            id="an HCA on the other socket from every GPU is paired with none",
        ),
        pytest.param({}, (), id="no RDMA device"),
    ],
)
def test_the_compute_hcas_are_each_gpus_closest(
    nics: dict[str, tuple[str, ...]], paired: tuple[str, ...]
) -> None:
    assert gpu_paired_hcas(_topology(nics)) == paired


@dataclass
class ScanDouble:
    """A double of discover for the source: it records the HCAs it is asked to walk."""

    asked: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, names: Sequence[str], total_s: float) -> Discovery:
        self.asked.append(tuple(names))
        view = PortView(names[0], 1, 0x100001, 0x200001, frozenset({0x200001}))
        return summarize([view], SmpCounts(node_info=2))


MACHINES = Path(__file__).parents[1] / "fixtures" / "machines"


@pytest.mark.parametrize(
    ("machine", "hcas", "asked"),
    [
        pytest.param(
            "aws-p5en-switch",
            (),
            ("rdmap85s0", "rdmap86s0", "rdmap87s0", "rdmap88s0"),
            id="a p5en's NICs behind the GPUs' PCIe switches are walked",
        ),
        pytest.param(
            "asus-esc8000a",
            (),
            ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"),
            id="no PCIe switch: the HCAs on each GPU's NUMA node are walked",
        ),
        pytest.param(
            "asus-esc8000a", ("mlx5_3",), ("mlx5_3",), id="the HCAs the setting names, only"
        ),
    ],
)
def test_the_source_walks_the_compute_hcas(
    machine: str, hcas: tuple[str, ...], asked: tuple[str, ...]
) -> None:
    scan = ScanDouble()
    source = InfinibandTierSource(
        False, hcas=hcas, sysfs=DirHostFS(MACHINES / machine / "sysfs"), scan=scan
    )
    reading = source.read()
    assert reading.state.value == "ok"
    assert scan.asked == [asked]


@dataclass
class _EthernetPorts:
    """A HostFS over a fixture tree that adds port 1, link layer Ethernet, to every RDMA device."""

    under: DirHostFS

    def read_text(self, path: str) -> str:
        if path.startswith("class/infiniband/") and path.endswith("/ports/1/link_layer"):
            return "Ethernet\n"
        return self.under.read_text(path)

    def listdir(self, path: str) -> list[str]:
        if path.startswith("class/infiniband/") and path.endswith("/ports"):
            return ["1"]
        return self.under.listdir(path)

    def realpath(self, path: str) -> str:
        return self.under.realpath(path)


@pytest.mark.parametrize(
    "sysfs",
    [
        pytest.param(
            MemoryHostFS({"bus/pci/devices/0000:00:00.0/vendor": "0x8086\n"}, {}),
            id="no GPU, no RDMA device",
        ),
        pytest.param(
            _EthernetPorts(DirHostFS(MACHINES / "asus-esc8000a" / "sysfs")),
            id="every HCA paired with a GPU has Ethernet ports (RoCE: LLDP's)",
        ),
    ],
)
def test_no_hca_paired_with_a_gpu_is_no_data_and_nothing_walked(sysfs: HostFS) -> None:
    scan = ScanDouble()
    reading = InfinibandTierSource(False, sysfs=sysfs, scan=scan).read()
    assert (reading.value, reading.state.value, reading.problem) == (
        None,
        "no_data",
        NO_PAIRED_HCA,
    )
    assert scan.asked == []


def test_a_sysfs_that_cannot_be_read_is_a_failure_in_one_line() -> None:
    reading = InfinibandTierSource(False, sysfs=MemoryHostFS({}, {}), scan=ScanDouble()).read()
    assert reading.state.value == "failed"
    assert reading.problem is not None
    assert reading.problem.startswith("cannot list bus/pci/devices under the sysfs root")
