"""The sysfs collector: real trees (built from real lspci captures), traps, and damaged trees."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from parsers.nvsmi import parse_topo
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import sysfs_entries, write_tree
from reporter.collect.sysfs import SysfsCollector
from reporter.errors import CollectError
from reporter.hostfs import DirHostFS, MemoryHostFS
from reporter.schema.model import Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import body

FIXTURES = Path(__file__).parents[1] / "fixtures"
MACHINES = FIXTURES / "machines"


def sysfs_topology(fs: DirHostFS | MemoryHostFS) -> Topology:
    topology = SysfsCollector(fs).collect().topology()
    assert topology is not None
    return topology


def test_the_asus_tree_gives_the_same_matrix_as_nvidia_smi_on_that_host() -> None:
    real = topology_from_matrix(
        parse_topo(body(FIXTURES / "nvidia-smi/10-asus-esc8000a-4x-rtx6000ada-4nic-pcie.txt"))
    )
    ours = sysfs_topology(DirHostFS(MACHINES / "asus-esc8000a/sysfs"))
    assert ours.links == real.links
    assert [(n.name, n.links, n.peers) for n in ours.nics] == [
        (n.name, n.links, n.peers) for n in real.nics
    ]
    assert [(g.cpus, g.numa) for g in ours.gpus] == [(g.cpus, g.numa) for g in real.gpus]
    assert [g.pci for g in ours.gpus] == [
        "0000:01:00.0",
        "0000:41:00.0",
        "0000:c1:00.0",
        "0000:e1:00.0",
    ]
    assert [n.distances for n in ours.numa_nodes] == [(10, 32), (32, 10)]


def test_the_p5en_switch_joins_its_gpus_and_efa_nics_through_one_switch() -> None:
    ours = sysfs_topology(DirHostFS(MACHINES / "aws-p5en-switch/sysfs"))
    assert [g.pci for g in ours.gpus] == ["0000:59:00.0", "0000:5a:00.0"]
    assert ours.links[0][1].token == "PIX"
    assert [n.name for n in ours.nics] == ["rdmap85s0", "rdmap86s0", "rdmap87s0", "rdmap88s0"]
    assert {c.token for n in ours.nics for c in (*n.links, *(n.peers or ())) if c.token != "X"} == {
        "PIX"
    }


@pytest.mark.parametrize(
    ("profile", "gpus"),
    [("pcie-8x", 8), ("dgx-a100", 8), ("dgx-h100", 8), ("single-gpu", 1)],
    ids=["HD-audio functions and a BMC VGA", "NVSwitches", "BMC VGA and NVMe", "desktop"],
)
def test_only_nvidia_display_controllers_are_gpus(profile: str, gpus: int) -> None:
    files, links = sysfs_entries(load_machine(profile))
    assert len(sysfs_topology(MemoryHostFS(files, links)).gpus) == gpus


def damaged(profile: str, change: str) -> MemoryHostFS:
    files, links = sysfs_entries(load_machine(profile))
    first_gpu_dir = next(
        f.rsplit("/", 1)[0] for f, v in files.items() if f.endswith("/class") and v == "0x030200\n"
    )
    if change == "broken gpu symlink":
        address = first_gpu_dir.rsplit("/", 1)[1]
        links[f"bus/pci/devices/{address}"] = "../../../devices/pci0000:00/gone"
    elif change == "missing vendor":
        del files[f"{first_gpu_dir}/vendor"]
    elif change == "garbage class":
        files[f"{first_gpu_dir}/class"] = "display\n"
    elif change in ("garbage numa_node", "numa_node -1", "numa_node -7"):
        files[f"{first_gpu_dir}/numa_node"] = {
            "garbage numa_node": "zero\n",
            "numa_node -1": "-1\n",
            "numa_node -7": "-7\n",
        }[change]
    elif change == "garbage local_cpulist":
        files[f"{first_gpu_dir}/local_cpulist"] = "0-3,x\n"
    elif change == "missing local_cpulist":
        del files[f"{first_gpu_dir}/local_cpulist"]
    elif change == "broken nic symlink":
        nic = next(p for p in links if p.startswith("devices/") and p.endswith("/device"))
        links[nic] = "../../../nowhere"
    elif change == "no infiniband class":
        for p in [p for p in links if p.startswith("class/infiniband/")]:
            del links[p]
    elif change == "garbage distance":
        files["devices/system/node/node0/distance"] = "ten twenty\n"
    elif change == "missing node cpulist":
        del files["devices/system/node/node1/cpulist"]
    elif change == "symlink loop":
        address = first_gpu_dir.rsplit("/", 1)[1]
        links[f"bus/pci/devices/{address}"] = f"../../bus/pci/devices/{address}"
    return MemoryHostFS(files, links)


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ("broken gpu symlink", lambda t: len(t.gpus) == 7),
        ("symlink loop", lambda t: len(t.gpus) == 7),
        ("missing vendor", lambda t: len(t.gpus) == 7),
        ("garbage class", lambda t: len(t.gpus) == 7),
        ("garbage numa_node", lambda t: t.gpus[0].numa is None and t.gpus[1].numa == {0}),
        ("numa_node -1", lambda t: t.gpus[0].numa is None and t.links[0][4].token == "SYS"),
        ("numa_node -7", lambda t: t.gpus[0].numa is None),
        ("garbage local_cpulist", lambda t: t.gpus[0].cpus is None and t.gpus[1].cpus),
        ("missing local_cpulist", lambda t: t.gpus[0].cpus is None),
        ("broken nic symlink", lambda t: len(t.nics) == 7),
        ("no infiniband class", lambda t: t.nics == ()),
        ("garbage distance", lambda t: t.numa_nodes[0].distances == ()),
        ("missing node cpulist", lambda t: [n.id for n in t.numa_nodes] == [0]),
    ],
)
def test_a_damaged_tree_degrades_what_is_damaged_and_nothing_else(
    change: str, check: Callable[[Topology], object]
) -> None:
    assert check(sysfs_topology(damaged("dgx-h100", change)))


def test_an_unreadable_root_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CollectError, match="check --sysfs-root"):
        SysfsCollector(DirHostFS(tmp_path / "missing")).collect()


def test_a_tree_without_gpus_has_no_topology(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    assert SysfsCollector(DirHostFS(tmp_path)).collect().topology() is None


def test_a_symlink_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    os.symlink("/etc", tmp_path / "bus/pci/devices/0000:01:00.0")
    with pytest.raises(FileNotFoundError):
        DirHostFS(tmp_path).realpath("bus/pci/devices/0000:01:00.0")
    with pytest.raises(FileNotFoundError):
        DirHostFS(tmp_path).read_text("../etc/hostname")


def test_the_memory_tree_resolves_like_the_disk_tree(tmp_path: Path) -> None:
    machine = load_machine("dgx-a100")
    files, links = sysfs_entries(machine)
    memory = MemoryHostFS(files, links)
    write_tree(machine, tmp_path)
    disk = DirHostFS(tmp_path)
    for path in ["bus/pci/devices/0000:c1:00.0", "class/infiniband/mlx5_3/device"]:
        assert memory.realpath(path) == disk.realpath(path)
        assert memory.listdir(path) == disk.listdir(path)
    assert sysfs_topology(memory) == sysfs_topology(disk)
    with pytest.raises(IsADirectoryError):
        memory.read_text("bus/pci/devices")
    with pytest.raises(NotADirectoryError):
        memory.listdir("devices/system/cpu/possible")
