"""Koordinator's device-info file: the format koordlet decodes and its API server accepts,
partitions from NVLink, no file where it cannot be right, and an atomic write that koordlet never
sees half done and that follows nothing another program planted in the directory.

koordlet's own code judges the file in tests/controlplane/test_koordinator.py; these check our side
of it without Go."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from parsers.links import Link, LinkKind
from reporter.collect.scanner import build_scanner
from reporter.collect.simulate.machine import list_profiles, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.collect.sysfs import pcie_root
from reporter.errors import PublishError
from reporter.publish.client import EventType
from reporter.publish.koordinator import (
    MAX_FILE_BYTES,
    REASON_WITHHELD,
    DeviceInfoFile,
    DeviceInfoOutput,
)
from reporter.schema.koordinator import (
    KoordinatorFileError,
    device_infos,
    device_infos_text,
    model_label,
)
from reporter.schema.model import Topology
from tests.cli.test_run import CLI, env
from tests.support.agent_support import topology

PROFILES = [p.name for p in list_profiles()]


def roots(t: Topology) -> dict[int, str]:
    """A root complex per GPU, as the tests' machines have them: one per GPU's bus."""
    return {g.index: f"pci0000:{int((g.pci or '0000:00')[5:7], 16):02x}" for g in t.gpus}


def partitions(devices: list[dict[str, Any]]) -> set[tuple[int, ...]]:
    """The partitions koordlet derives (getPartitionTableFromXPUDevices): each link, with its
    device, is one sorted set of minors."""
    found = set()
    for device in devices:
        for link in device.get("topology", {}).get("p2pLinks", []):
            minors = {int(m) for m in link["peerMinor"].split(",")} | {int(device["minor"])}
            found.add(tuple(sorted(minors)))
    return found


def test_an_nvswitch_machine_gives_every_pair_and_the_whole_fabric() -> None:
    t = topology(4)
    devices = device_infos(t, roots(t))
    assert devices[0] == {
        "vendor": "nvidia",
        "model": "H100-80GB-HBM3",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "minor": "0",
        "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "81559Mi"},
        "status": {"healthy": True},
        "topology": {
            "p2pLinks": [
                {"peerMinor": "1", "type": "NVLink"},
                {"peerMinor": "2", "type": "NVLink"},
                {"peerMinor": "3", "type": "NVLink"},
                {"peerMinor": "1,2,3", "type": "NVLink"},
            ],
            "nodeID": "0",
            "pcieID": "pci0000:18",
            "busID": "0000:18:00.0",
        },
    }
    assert partitions(devices) == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1, 2, 3)}


def test_bridged_pairs_give_pairs_only_and_pcie_gives_no_links() -> None:
    # Two NVLink bridges (0-1, 2-3); the rest is PCIe.
    sys_ = Link(LinkKind.SYS)
    t = topology(4, overrides={(0, 2): sys_, (0, 3): sys_, (1, 2): sys_, (1, 3): sys_})
    assert partitions(device_infos(t, roots(t))) == {(0, 1), (2, 3)}
    pcie = topology(2, overrides={(0, 1): Link(LinkKind.PIX)})
    assert all("p2pLinks" not in d["topology"] for d in device_infos(pcie, roots(pcie)))


def test_an_island_that_is_not_all_to_all_is_no_partition() -> None:
    # 0-1-2 chained: 0 and 2 are not linked, so {0,1,2} is no NVLink partition.
    t = topology(3, overrides={(0, 2): Link(LinkKind.SYS)})
    assert partitions(device_infos(t, roots(t))) == {(0, 1), (1, 2)}


def test_a_lost_gpu_is_reported_unhealthy() -> None:
    t = topology(2, lost=(1,))
    assert [d["status"]["healthy"] for d in device_infos(t, roots(t))] == [True, False]


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada-Generation"),
        ("NVIDIA GB200", "GB200"),
    ],
    ids=lambda v: v,
)
def test_the_model_takes_the_form_koordlets_nvml_path_labels_the_device_with(
    model: str, label: str
) -> None:
    # koordlet's getGPUDriverAndModel: the "NVIDIA " prefix dropped, spaces as dashes.
    assert model_label(model) == label


@pytest.mark.parametrize("profile", PROFILES)
def test_every_simulated_machine_gives_a_file_with_root_complexes_from_its_sysfs(
    profile: str,
) -> None:
    machine = load_machine(profile)
    t = build_scanner("nvml", Path("/nonexistent"), profile).scan().topology
    assert t is not None
    hostfs = memory_hostfs(machine)
    found = {g.index: pcie_root(hostfs, g.pci or "") for g in t.gpus}
    devices = device_infos(t, {i: r for i, r in found.items() if r is not None})
    assert [d["minor"] for d in devices] == [str(g.index) for g in t.gpus]
    for gpu, device in zip(t.gpus, devices, strict=True):
        assert device["topology"]["busID"] == gpu.pci
        # The host bridge the GPU's sysfs path runs through, as koordlet's regexp finds it.
        assert device["topology"]["pcieID"].startswith("pci")
        assert f"/{device['topology']['pcieID']}/" in "/" + hostfs.realpath(
            f"bus/pci/devices/{gpu.pci}"
        )
        assert device["vendor"] == "nvidia"
        assert " " not in device["model"]


def test_the_file_is_the_json_array_koordlet_decodes() -> None:
    t = topology(8)
    text = device_infos_text(t, roots(t))
    assert text.endswith("\n")
    assert text.count("\n") == 1
    decoded = json.loads(text)
    assert isinstance(decoded, list)
    assert {tuple(sorted(d)) for d in decoded} == {
        ("minor", "model", "resources", "status", "topology", "uuid", "vendor")
    }


def _without(t: Topology, index: int, **change: Any) -> Topology:
    gpus = list(t.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **change)
    return dataclasses.replace(t, gpus=tuple(gpus))


@pytest.mark.parametrize(
    ("change", "roots_of", "reason"),
    [
        ({"uuid": None}, roots, "the UUID of GPU 1 is unknown"),
        ({"pci": None}, roots, "the PCI address of GPU 1 is unknown"),
        ({"mem_mib": None}, roots, "the memory size of GPU 1 is unknown"),
        ({"model": None}, roots, "the model of GPU 1 is unknown"),
        (
            {},
            lambda t: {0: "pci0000:18"},
            "the PCIe root complex of GPU 1 (0000:28:00.0) is unknown",
        ),
        ({"model": "NVIDIA H200"}, roots, "the GPUs are of 2 models"),
        ({}, lambda t: {0: "pci0000:18", 1: "/devices/x"}, "PCIe root complex of GPU 1"),
    ],
    ids=[
        "no UUID",
        "no PCI address",
        "no memory size",
        "no model",
        "no root complex",
        "two models",
        "a root complex that is not one",
    ],
)
def test_a_file_that_cannot_be_right_is_refused_with_the_reason(
    change: dict[str, Any], roots_of: Any, reason: str
) -> None:
    t = _without(topology(2), 1, **change)
    with pytest.raises(KoordinatorFileError, match=re.escape(reason)) as refused:
        device_infos(t, roots_of(t))
    assert "\n" not in str(refused.value)


def test_a_model_that_makes_no_label_value_is_refused() -> None:
    t = topology(2)
    odd = dataclasses.replace(
        t, gpus=tuple(dataclasses.replace(g, model="NVIDIA H100 (rev a1)") for g in t.gpus)
    )
    with pytest.raises(KoordinatorFileError, match="no Kubernetes label value"):
        device_infos(odd, roots(odd))


# --- the write: atomic, only on change, following nothing planted ------------------------------


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
    assert os.stat(tmp_path / ".topo-reporter").st_mode & 0o077 == 0


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    target = DeviceInfoFile(tmp_path)
    texts = [device_infos_text(t, roots(t)) for t in (topology(8), topology(2))]
    target.write(texts[0])
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
        target.write(texts[i % 2])
    stop.set()
    reader.join(timeout=10)
    assert seen
    assert set(seen) <= set(texts)


def test_a_directory_that_cannot_be_written_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DeviceInfoFile(tmp_path / "missing").write("[]\n")


def test_a_symlink_planted_at_the_scratch_file_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    infos = tmp_path / "infos"
    (infos / ".topo-reporter").mkdir(parents=True, mode=0o700)
    (infos / ".topo-reporter" / "topo-reporter.json").symlink_to(victim)
    target = DeviceInfoFile(infos)
    assert target.write("[1]\n") is True
    assert victim.read_text() == "precious\n"
    assert target.path.read_text() == "[1]\n"
    assert not target.path.is_symlink()


def test_a_symlinked_scratch_directory_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kept = elsewhere / "topo-reporter.json"
    kept.write_text("someone else's\n")
    infos = tmp_path / "infos"
    infos.mkdir()
    (infos / ".topo-reporter").symlink_to(elsewhere, target_is_directory=True)
    target = DeviceInfoFile(infos)
    assert target.write("[1]\n") is True
    # The file in the link's target is neither truncated nor moved.
    assert kept.read_text() == "someone else's\n"
    assert target.path.read_text() == "[1]\n"
    # The planted link is gone (koordlet, which opens every non-directory entry, would have read
    # the directory it points to as a file and dropped every file-reported device).
    assert (infos / ".topo-reporter").is_dir()
    assert not (infos / ".topo-reporter").is_symlink()


def test_a_fifo_at_the_target_is_replaced_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "topo-reporter.json")
    target = DeviceInfoFile(tmp_path)
    done: list[bool] = []
    writer = threading.Thread(target=lambda: done.append(target.write("[1]\n")), daemon=True)
    writer.start()
    writer.join(timeout=20)
    if writer.is_alive():
        # Unblock the hung open so the thread ends, then fail: the write waited on the FIFO.
        fd = os.open(tmp_path / "topo-reporter.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("the write waited for a writer on the FIFO at the target")
    assert done == [True]
    assert target.path.read_text() == "[1]\n"


def test_a_symlink_to_dev_zero_at_the_target_is_replaced_unread(tmp_path: Path) -> None:
    (tmp_path / "topo-reporter.json").symlink_to("/dev/zero")
    # In a child with a 1 GiB address space: reading /dev/zero to its end fails fast there with
    # MemoryError instead of eating the machine's memory.
    program = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))\n"
        "from reporter.publish.koordinator import DeviceInfoFile\n"
        "print(DeviceInfoFile(Path(sys.argv[1])).write('[1]\\n'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "True\n"
    assert (tmp_path / "topo-reporter.json").read_text() == "[1]\n"
    assert not (tmp_path / "topo-reporter.json").is_symlink()


def test_a_file_larger_than_the_bound_is_replaced_unread(tmp_path: Path) -> None:
    big = tmp_path / "topo-reporter.json"
    big.write_bytes(b"[" + b" " * MAX_FILE_BYTES + b"]")
    assert DeviceInfoFile(tmp_path).write("[1]\n") is True
    assert big.read_text() == "[1]\n"


def test_a_scratch_directory_others_may_write_in_is_refused(tmp_path: Path) -> None:
    scratch = tmp_path / ".topo-reporter"
    scratch.mkdir()
    scratch.chmod(0o777)
    with pytest.raises(PermissionError) as refused:
        DeviceInfoFile(tmp_path).write("[1]\n")
    assert refused.value.errno == errno.EPERM
    assert "not the agent's own private directory" in str(refused.value)
    assert not (tmp_path / "topo-reporter.json").exists()


# --- the agent's output -------------------------------------------------------------------------


class Events:
    """What the output posts on the Node (the sink's `event`); can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.posted: list[tuple[EventType, str, str]] = []
        self.fail = fail

    def __call__(self, event_type: EventType, reason: str, message: str) -> None:
        self.posted.append((event_type, reason, message))
        if self.fail:
            raise PublishError("events: forbidden (403)")


def output(
    directory: Path, events: Events, known: dict[str, str] | None = None
) -> DeviceInfoOutput:
    t = topology(2)
    by_address = known if known is not None else {g.pci or "": roots(t)[g.index] for g in t.gpus}
    return DeviceInfoOutput(
        DeviceInfoFile(directory),
        structlog.get_logger(),
        pcie_root=by_address.get,
        event=events,
    )


def test_a_file_that_cannot_be_right_is_removed_and_told_once_then_written_again(
    tmp_path: Path,
) -> None:
    events = Events()
    out = output(tmp_path, events)
    good = topology(2)
    out(good)
    assert json.loads((tmp_path / "topo-reporter.json").read_text())[0]["model"] == "H100-80GB-HBM3"
    bad = _without(good, 1, uuid=None)
    with capture_logs() as logs:
        out(bad)
        out(bad)
    # No file: koordlet falls back to the GPUs NVML shows it.
    assert not (tmp_path / "topo-reporter.json").exists()
    withheld = [e for e in logs if e["event"] == "koordinator_file_withheld"]
    assert len(withheld) == 1
    assert withheld[0]["reason"] == "the UUID of GPU 1 is unknown"
    assert withheld[0]["removed"] is True
    assert events.posted == [
        (
            EventType.WARNING,
            REASON_WITHHELD,
            "Koordinator device-info file not written: the UUID of GPU 1 is unknown; koordlet "
            "reports the GPUs NVML shows it, without NVLink partitions",
        )
    ]
    out(good)
    assert (tmp_path / "topo-reporter.json").exists()
    # A new refusal after a recovery is told again.
    out(bad)
    assert len(events.posted) == 2


def test_a_root_complex_sysfs_does_not_resolve_withholds_the_file(tmp_path: Path) -> None:
    events = Events(fail=True)
    with capture_logs() as logs:
        output(tmp_path, events, known={})(topology(2))
    assert not (tmp_path / "topo-reporter.json").exists()
    assert [e["event"] for e in logs] == ["koordinator_file_withheld", "event_failed"]
    assert "check --sysfs-root" in logs[0]["reason"]


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
    # The simulated DGX H100's sysfs: each GPU under its own root port of its own host bridge.
    assert {d["topology"]["pcieID"] for d in devices} <= {
        f"pci0000:{bus:02x}" for bus in range(0x100)
    }
    assert all(d["model"] == "H100-80GB-HBM3" for d in devices)


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


def test_minors_are_the_drivers_where_known_peers_named_by_them_too() -> None:
    t = topology(4)
    numbered = dataclasses.replace(
        t, gpus=tuple(dataclasses.replace(g, minor=10 + g.index) for g in t.gpus)
    )
    devices = device_infos(numbered, roots(numbered))
    assert [d["minor"] for d in devices] == ["10", "11", "12", "13"]
    assert partitions(devices) == {
        (10, 11),
        (10, 12),
        (10, 13),
        (11, 12),
        (11, 13),
        (12, 13),
        (10, 11, 12, 13),
    }
    # One GPU without a minor (a parsed nvidia-smi text): the index for every GPU.
    partly = _without(numbered, 2, minor=None)
    assert [d["minor"] for d in device_infos(partly, roots(partly))] == ["0", "1", "2", "3"]


def test_two_gpus_of_one_minor_are_refused() -> None:
    t = topology(2)
    same = dataclasses.replace(t, gpus=tuple(dataclasses.replace(g, minor=0) for g in t.gpus))
    with pytest.raises(KoordinatorFileError, match="two GPUs have one minor number"):
        device_infos(same, roots(same))
