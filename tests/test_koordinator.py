"""Koordinator's device-info file: the format koordlet decodes, partitions from NVLink, and an
atomic write that koordlet never sees half done."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from parsers.links import Link, LinkKind
from reporter.publish.koordinator import DeviceInfoFile
from reporter.schema.koordinator import device_infos, device_infos_text
from tests.agent_support import topology
from tests.test_agent_cli import CLI, env


def partitions(devices: list[dict]) -> set[tuple[int, ...]]:
    """The partitions koordlet derives (getPartitionTableFromXPUDevices): each link, with its
    device, is one sorted set of minors."""
    found = set()
    for device in devices:
        for link in device.get("topology", {}).get("p2pLinks", []):
            minors = {int(m) for m in link["peerMinor"].split(",")} | {int(device["minor"])}
            found.add(tuple(sorted(minors)))
    return found


def test_an_nvswitch_machine_gives_every_pair_and_the_whole_fabric() -> None:
    devices = device_infos(topology(4))
    assert devices[0] == {
        "vendor": "NVIDIA",
        "model": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "minor": "0",
        "status": {"healthy": True},
        "topology": {
            "p2pLinks": [
                {"peerMinor": "1", "type": "NVLink"},
                {"peerMinor": "2", "type": "NVLink"},
                {"peerMinor": "3", "type": "NVLink"},
                {"peerMinor": "1,2,3", "type": "NVLink"},
            ],
            "nodeID": "0",
            "busID": "0000:18:00.0",
        },
    }
    assert partitions(devices) == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1, 2, 3)}


def test_bridged_pairs_give_pairs_only_and_pcie_gives_no_links() -> None:
    # Two NVLink bridges (0-1, 2-3); the rest is PCIe.
    sys = Link(LinkKind.SYS)
    t = topology(4, overrides={(0, 2): sys, (0, 3): sys, (1, 2): sys, (1, 3): sys})
    assert partitions(device_infos(t)) == {(0, 1), (2, 3)}
    pcie = topology(2, overrides={(0, 1): Link(LinkKind.PIX)})
    assert all("p2pLinks" not in d["topology"] for d in device_infos(pcie))


def test_an_island_that_is_not_all_to_all_is_no_partition() -> None:
    # 0-1-2 chained: 0 and 2 are not linked, so {0,1,2} is no NVLink partition.
    t = topology(3, overrides={(0, 2): Link(LinkKind.SYS)})
    assert partitions(device_infos(t)) == {(0, 1), (1, 2)}


def test_a_lost_gpu_is_reported_unhealthy() -> None:
    assert [d["status"]["healthy"] for d in device_infos(topology(2, lost=(1,)))] == [True, False]


def test_the_file_is_the_json_array_koordlet_decodes() -> None:
    text = device_infos_text(topology(8))
    assert text.endswith("\n")
    assert text.count("\n") == 1
    decoded = json.loads(text)
    assert isinstance(decoded, list)
    assert {tuple(sorted(d)) for d in decoded} == {
        ("minor", "model", "status", "topology", "uuid", "vendor")
    }


def test_write_is_atomic_and_only_on_change(tmp_path: Path) -> None:
    target = DeviceInfoFile(tmp_path)
    assert target.write("[1]\n") is True
    first = os.stat(target.path).st_ino
    assert target.write("[1]\n") is False
    assert os.stat(target.path).st_ino == first
    assert target.write("[2]\n") is True
    assert target.path.read_text() == "[2]\n"
    # Only the file and the scratch directory koordlet skips: no stray plain file to decode.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["topo-reporter.json"]


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    target = DeviceInfoFile(tmp_path)
    big = [device_infos_text(topology(n)) for n in (8, 2)]
    target.write(big[0])
    stop = threading.Event()
    seen: list[str] = []

    def read() -> None:
        while not stop.is_set():
            for entry in tmp_path.iterdir():
                if entry.is_file():
                    seen.append(entry.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(200):
        target.write(big[i % 2])
    stop.set()
    reader.join(timeout=10)
    assert seen
    assert set(seen) <= set(big)


def test_a_directory_that_cannot_be_written_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DeviceInfoFile(tmp_path / "missing").write("[]\n")


def test_run_writes_the_file_beside_the_node_patch(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TOPO_REPORTER_KOORDINATOR_DIR=str(tmp_path), KUBECONFIG="/nonexistent"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    devices = json.loads((tmp_path / "topo-reporter.json").read_text())
    assert [d["minor"] for d in devices] == [str(i) for i in range(8)]
    assert (0, 1, 2, 3, 4, 5, 6, 7) in partitions(devices)


def test_run_keeps_publishing_when_the_directory_is_missing(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(
            TOPO_REPORTER_KOORDINATOR_DIR=str(tmp_path / "absent"),
            TOPO_REPORTER_LOG_FORMAT="json",
            KUBECONFIG="/nonexistent",
        ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metadata"]["labels"]["gpu.topology.io/count"] == "8"
    failures = [json.loads(x) for x in result.stderr.splitlines() if "koordinator_file" in x]
    assert [f["event"] for f in failures] == ["koordinator_file_failed"]
