"""Simulated NVL72 racks: N racks x 18 nodes from the shipped gb200-nvl profile."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from reporter.cli import main as cli
from reporter.collect import CollectorScanner
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.racks import main, rack_nodes
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.schema.labels import labels

PREFIX = "gpu.topology.io"


def test_two_racks_sharing_a_clique_id_are_still_two_partitions() -> None:
    nodes = rack_nodes(2, cliques=[17044, 17044])
    assert len(nodes) == 36
    assert len({n.name for n in nodes}) == 36
    partitions = Counter(n.partition for n in nodes)
    assert len(partitions) == 2
    assert all(p.endswith(".17044") for p in partitions)
    assert sorted(partitions.values()) == [18, 18]


def test_a_rack_split_in_two_partitions_has_two_cliques_of_nine_trays() -> None:
    nodes = rack_nodes(1, partitions=2)
    assert Counter(n.profile["fabric"]["clique"] for n in nodes) == {100: 9, 101: 9}


@pytest.mark.parametrize("tray", [0, 9, 10, 17])
def test_a_node_of_a_rack_publishes_its_rack_as_the_agent_would(tray: int) -> None:
    node = rack_nodes(2, cliques=[5, 6])[18 + tray]
    machine = node.machine()
    scan = CollectorScanner("auto", memory_hostfs(machine), lambda: FakeNvml(machine)).scan()
    assert scan.topology is not None
    got = labels(scan.topology, PREFIX, node.name)
    assert got[f"{PREFIX}/nvlink-partition"] == node.partition
    assert got[f"{PREFIX}/nvlink-partition"].endswith(".6")
    assert got[f"{PREFIX}/rack-tray"] == str(tray)
    # Compute trays sit above and below the 9 NVSwitch trays; slots count the switches.
    assert got[f"{PREFIX}/rack-slot"] == str(tray + 1 if tray < 10 else tray + 10)
    assert got[f"{PREFIX}/rack-serial"] == "1821622000001"


def test_two_trays_of_one_rack_have_distinct_gpu_uuids() -> None:
    a, b = rack_nodes(1, trays=2)
    uuids = [{g.uuid for g in n.machine().gpus} for n in (a, b)]
    assert not uuids[0] & uuids[1]


def test_profile_files_drive_the_agent_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "--racks",
                "2",
                "--trays",
                "2",
                "--clique",
                "7",
                "--clique",
                "7",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4
    path, partition = printed[3].split("\t")
    assert Path(path).name == "nvl72-r01-n01.yaml"
    assert (
        cli(["collect", "--simulate", path, "--format", "labels", "--node", "nvl72-r01-n01"]) == 0
    )
    assert f"{PREFIX}/nvlink-partition={partition}\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--racks", "0"],
        ["--trays", "19"],
        ["--racks", "2", "--clique", "1"],
        ["--partitions", "0"],
        ["--clique", "-1"],
        ["--clique", str(2**32)],
        ["--clique", str(2**32 - 1), "--partitions", "2"],
    ],
    ids=[
        "no rack",
        "more trays than a rack has",
        "one clique for two racks",
        "no partition",
        "a negative clique",
        "a clique over 32 bits",
        "a second partition over 32 bits",
    ],
)
def test_counts_out_of_range_are_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profiles"
    assert main([*argv, "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith("racks: error: ")
    assert printed.err.count("\n") == 1
    # Refused up front: no partition printed, no profile written.
    assert printed.out == ""
    assert not out.exists()
