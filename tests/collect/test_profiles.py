"""Every shipped machine through both collectors, and the ones a real output exists for."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsers.nvsmi import parse_topo
from reporter.collect import SourceState, build_scanner, list_profiles
from reporter.errors import ConfigError
from reporter.schema.labels import labels
from reporter.schema.model import Source, Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import body

REAL = Path(__file__).parents[1] / "fixtures" / "nvidia-smi"
PROFILES = [p.name for p in list_profiles()]
NOWHERE = Path("/nonexistent-sysfs-root")

# Profile -> the real `nvidia-smi topo -m` of a machine of that class.
REAL_OUTPUT = {
    "dgx-1-v100": "01-dgx1-style-8x-v100-nv1-nv2-nic-gpu-numa-id.txt",
    "dgx-a100": "03-dgx-a100-nv12-mlx5.txt",
    "gb200-nvl": "08-gb200-4gpu-nv18-grace-8nic.txt",
    "workstation-nvlink-bridge": "12-3x-rtx-a6000-nv4-bridge-ansi.txt",
    "vm-no-numa": "06-aws-p3-8xlarge-4x-v100-nv1-nv2-numa-na.txt",
}


def scan(profile: str, backend: str) -> Topology:
    result = build_scanner(backend, NOWHERE, profile).scan()
    assert not result.degraded, result.sources
    assert result.topology is not None
    return result.topology


def test_the_machines_the_issue_names_are_shipped() -> None:
    required = {
        "dgx-1-v100",
        "dgx-2",
        "dgx-a100",
        "dgx-h100",
        "gb200-nvl",
        "pcie-8x",
        "pcie-8x-nvlink-pairs",
        "workstation-nvlink-bridge",
        "single-gpu",
        "vm-no-numa",
    }
    assert required <= set(PROFILES)
    assert all(p.description and "\n" not in p.description for p in list_profiles())


@pytest.mark.parametrize("profile", PROFILES)
def test_nvml_and_sysfs_see_the_same_pcie_machine(profile: str) -> None:
    nvml = scan(profile, "auto")
    sysfs = scan(profile, "sysfs")
    assert nvml.source is Source.NVML
    assert nvml.nvlink_observed
    assert sysfs.source is Source.SYSFS
    assert not sysfs.nvlink_observed
    assert nvml.pcie == sysfs.pcie
    assert [g.pci for g in nvml.gpus] == [g.pci for g in sysfs.gpus]
    assert [(g.numa, g.cpus) for g in nvml.gpus] == [(g.numa, g.cpus) for g in sysfs.gpus] or (
        profile == "gb200-nvl"  # NVML adds the Grace GPU memory nodes that sysfs cannot list
    )
    assert nvml.nics == sysfs.nics
    assert nvml.numa_nodes == sysfs.numa_nodes
    assert all(g.uuid and g.model and g.mem_mib for g in nvml.gpus)


@pytest.mark.parametrize("profile", PROFILES)
def test_sysfs_alone_never_claims_nvlink_is_absent(profile: str) -> None:
    published = labels(scan(profile, "sysfs"))
    if len(scan(profile, "sysfs").gpus) > 1:
        assert published["gpu.topology.io/interconnect"] == "unknown"
    assert "gpu.topology.io/nvlink-island-size" not in published


@pytest.mark.parametrize("profile", sorted(REAL_OUTPUT))
def test_simulated_machine_reproduces_the_real_nvidia_smi_output(profile: str) -> None:
    real = topology_from_matrix(parse_topo(body(REAL / REAL_OUTPUT[profile])))
    ours = scan(profile, "auto")
    assert [[c.token for c in row] for row in ours.links] == [
        [c.token for c in row] for row in real.links
    ]
    assert [(g.cpus, g.numa, g.gpu_numa) for g in ours.gpus] == [
        (g.cpus, g.numa, g.gpu_numa) for g in real.gpus
    ]
    assert [(n.name, n.links, n.peers) for n in ours.nics] == [
        (n.name, n.links, n.peers) for n in real.nics
    ]


@pytest.mark.parametrize(
    ("profile", "nvswitch", "islands"),
    [
        ("dgx-1-v100", False, ((0, 1, 2, 3, 4, 5, 6, 7),)),
        ("dgx-2", True, (tuple(range(16)),)),
        ("dgx-a100", True, (tuple(range(8)),)),
        ("dgx-h100", True, (tuple(range(8)),)),
        ("gb200-nvl", True, ((0, 1, 2, 3),)),
        ("pcie-8x", False, ()),
        ("pcie-8x-nvlink-pairs", False, ((0, 1), (2, 3), (4, 5), (6, 7))),
        ("workstation-nvlink-bridge", False, ((0, 1),)),
        ("single-gpu", False, ()),
    ],
)
def test_nvswitch_is_reported_only_where_nvml_saw_switch_links(
    profile: str, nvswitch: bool, islands: tuple[tuple[int, ...], ...]
) -> None:
    topology = scan(profile, "nvml")
    assert topology.nvswitch is nvswitch
    assert topology.islands == islands


def test_switch_attached_gpus_are_joined_by_the_narrower_bond() -> None:
    h100 = scan("dgx-h100", "nvml")
    assert {c.token for i, row in enumerate(h100.links) for j, c in enumerate(row) if i != j} == {
        "NV18"
    }


def test_nvlink_pairs_are_joined_only_within_a_pair_the_rest_over_pcie() -> None:
    """dra-driver-nvidia-gpu#214's machine: NV12 inside each pair, NODE to the socket's other pair,
    SYS across sockets; beneath its NVLinks a pair is two root ports of one host bridge (PHB)."""
    rows = [" ".join(c.token for c in row) for row in scan("pcie-8x-nvlink-pairs", "nvml").links]
    assert rows[0] == "X NV12 NODE NODE SYS SYS SYS SYS"
    assert rows[2] == "NODE NODE X NV12 SYS SYS SYS SYS"
    assert rows[7] == "SYS SYS SYS SYS NODE NODE NV12 X"
    pcie = scan("pcie-8x-nvlink-pairs", "nvml").pcie
    assert pcie is not None
    assert pcie[0][1].token == "PHB"  # beneath the bridge: two root ports of one host bridge


def test_pcie_8x_shows_every_pcie_class_between_gpus() -> None:
    tokens = {c.token for row in scan("pcie-8x", "nvml").links for c in row}
    assert {"PIX", "PXB", "NODE", "SYS"} <= tokens


def test_gb200_reports_the_fabric_clique_as_gpu_feature_discovery_writes_it() -> None:
    gpus = scan("gb200-nvl", "nvml").gpus
    assert {g.clique for g in gpus} == {"6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31.32766"}
    assert [g.gpu_numa for g in gpus] == [2, 10, 18, 26]


def test_vm_without_numa_reports_unknown_locality_not_node_zero() -> None:
    topology = scan("vm-no-numa", "auto")
    assert all(g.numa is None for g in topology.gpus)
    assert all(g.cpus == frozenset(range(32)) for g in topology.gpus)


def test_a_profile_file_path_is_accepted(tmp_path: Path) -> None:
    source = Path(__file__).parents[2] / "reporter/collect/simulate/profiles/single-gpu.yaml"
    mine = tmp_path / "my-box.yaml"
    mine.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    result = build_scanner("auto", NOWHERE, str(mine)).scan()
    assert [s.state for s in result.sources] == [SourceState.OK, SourceState.OK]


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("dgx-9000", "unknown simulated machine 'dgx-9000'; choose one of: dgx-1-v100"),
        ("/nonexistent/box.yaml", "cannot read machine profile /nonexistent/box.yaml"),
    ],
    ids=["unknown name", "missing file"],
)
def test_an_unknown_profile_is_one_clear_error(profile: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_scanner("auto", NOWHERE, profile)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("description: x\n", "numa_nodes"),
        ("[1, 2]", "a profile is a YAML mapping"),
        (
            "description: x\ndriver: '1'\ngpu: {model: m, mem_mib: 1}\n"
            "numa_nodes: [{id: 0, cpus: '0'}]\n"
            "pcie: [{host_bridge: '0000:00', numa: 0, root_ports: [{gpu: 1}]}]\n",
            "GPUs must be numbered 0..n-1",
        ),
        (
            "description: x\ndriver: '1'\ngpu: {model: m, mem_mib: 1}\n"
            "numa_nodes: [{id: 0, cpus: '0'}]\n"
            "pcie: [{host_bridge: '0000:00', numa: 0, root_ports: [{toaster: 1}]}]\n",
            "unknown PCI tree node",
        ),
    ],
    ids=["missing key", "not a mapping", "GPU out of bus order", "unknown device kind"],
)
def test_a_broken_profile_names_the_problem(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=field):
        build_scanner("auto", NOWHERE, str(path))
