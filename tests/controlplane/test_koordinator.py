"""Koordinator's own code on the device-info file `run --koordinator-dir` writes, for every
simulated machine: koordlet v1.8.0's XPU reader reads the directory, its states informer builds
the node's Device (`reportDevice`: devices, labels, the gpu-partitions annotation) and creates it
in the real kube-apiserver, under Koordinator's own Device CRD (from Go's module cache); the API
server's validation judges labels and annotations; the partition table is read back with the
function koord-scheduler's deviceshare plugin uses (`apiext.GetGPUPartitionTable`).

The Go side is `tests/controlplane/consumers` (`consumers koordlet`, Kubernetes 1.35.3, Koordinator
v1.8.0); it prints what koordlet read, sent and the server stored, and these tests judge it against
the topology the agent scanned: per GPU its UUID, health, NUMA node, PCI bus address, PCIe root
complex, resources, and the NVLink partitions."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

from reporter.collect import build_scanner
from reporter.collect.simulate.machine import list_profiles, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.collect.sysfs import pcie_root
from reporter.schema.koordinator import model_label
from reporter.schema.model import Topology
from tests.cli.test_run import CLI, env
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer

pytestmark = pytest.mark.controlplane

KOORDLET_TIMEOUT_S = 90
PROFILES = [p.name for p in list_profiles()]


def write_file(profile: str, directory: Path) -> None:
    """`topo-reporter run --koordinator-dir` on the simulated machine (a dry run: the file is
    what koordlet reads; the Node patch is printed, not sent)."""
    result = subprocess.run(
        [*CLI, "run", "--simulate", profile, "--once", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TOPO_REPORTER_KOORDINATOR_DIR=str(directory), KUBECONFIG="/nonexistent"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (directory / "topo-reporter.json").is_file(), result.stderr


def koordlet(binary: Path, server: RealApiServer, directory: Path, node: str) -> dict[str, Any]:
    """koordlet's own code on `directory` for `node`: its report (see the module docstring)."""
    result = subprocess.run(
        [
            str(binary),
            "koordlet",
            "--dir",
            str(directory),
            "--kubeconfig",
            str(server.kubeconfig),
            "--node",
            node,
            "--timeout",
            f"{KOORDLET_TIMEOUT_S - 30}s",
        ],
        capture_output=True,
        text=True,
        timeout=KOORDLET_TIMEOUT_S,
        env={**os.environ, "GOTRACEBACK": "single"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def minor(t: Topology, index: int) -> int:
    """The driver's minor number of GPU `index`, which the scan knows on every simulated machine."""
    found = t.gpus[index].minor
    assert found is not None
    return found


def expected_partitions(t: Topology) -> set[tuple[int, ...]]:
    """What the NVLink wiring allows, independently of how the file says it, in minors: every
    NVLinked pair, and every NVLink island of more than two GPUs whose pairs are all NVLinked."""
    n = len(t.gpus)

    def linked(a: int, b: int) -> bool:
        return t.links[a][b].is_nvlink or t.links[b][a].is_nvlink

    pairs = {(a, b) for a in range(n) for b in range(a + 1, n) if linked(a, b)}
    islands = {
        island
        for island in t.islands
        if len(island) > 2 and all(linked(a, b) for a in island for b in island if a < b)
    }
    return {tuple(sorted(minor(t, i) for i in group)) for group in pairs | islands}


@pytest.mark.parametrize("profile", PROFILES)
def test_koordlet_reports_every_gpu_of_the_file_and_the_scheduler_reads_its_partitions(
    consumers_bin: Path,
    real_apiserver: RealApiServer,
    real_koordinator_device_crd: str,
    real_node_factory: NodeFactory,
    tmp_path: Path,
    profile: str,
) -> None:
    node = real_node_factory()
    write_file(profile, tmp_path)
    report = koordlet(consumers_bin, real_apiserver, tmp_path, node)
    t = build_scanner("nvml", Path("/nonexistent"), profile).scan().topology
    assert t is not None
    hostfs = memory_hostfs(load_machine(profile))

    # The API server took the Device koordlet built from our file: labels and annotations valid.
    assert report["refused"] == "", report["refused"]
    assert report["labelErrors"] is None
    assert report["annotationErrors"] is None
    assert report["verb"] == "create"
    stored = report["stored"]
    uid = real_apiserver.core().read_node(node).metadata.uid
    assert [(o["kind"], o["name"], o["uid"]) for o in stored["metadata"]["ownerReferences"]] == [
        ("Node", node, uid)
    ]

    # koordlet reports the file's GPUs and nothing else: no GPU of ours is lost, none invented.
    devices = {d["minor"]: d for d in stored["spec"]["devices"]}
    assert sorted(devices) == sorted(minor(t, g.index) for g in t.gpus)
    for gpu in t.gpus:
        device = devices[minor(t, gpu.index)]
        home = t.home_numa(gpu.index)
        assert device["type"] == "gpu"
        assert device["id"] == gpu.uuid
        assert device["health"] is (not gpu.lost)
        assert device["topology"] == {
            "socketID": -1,
            "nodeID": -1 if home is None else home,
            "pcieID": pcie_root(hostfs, gpu.pci or ""),
            "busID": gpu.pci,
        }
        # As koordlet's NVML path reports a whole GPU: its memory, a quantity the server keeps in
        # canonical form (32768Mi is stored as 32Gi).
        resources = {k: parse_quantity(v) for k, v in device["resources"].items()}
        assert resources == {
            "koordinator.sh/gpu-core": 100,
            "koordinator.sh/gpu-memory": (gpu.mem_mib or 0) << 20,
            "koordinator.sh/gpu-memory-ratio": 100,
        }
        (healthy,) = device["conditions"]
        assert (healthy["type"], healthy["status"]) == ("Healthy", "False" if gpu.lost else "True")

    # The labels koordlet derives, as its NVML path would write them.
    labels = stored["metadata"].get("labels") or {}
    (model,) = {g.model for g in t.gpus}
    assert labels["node.koordinator.sh/gpu-model"] == model_label(model or "")
    assert labels["node.koordinator.sh/gpu-vendor"] == "nvidia"

    # The NVLink partitions, as koord-scheduler reads them back from the Device.
    want = expected_partitions(t)
    table = report["partitionTable"] or {}
    found = {tuple(p["minors"]) for partitions in table.values() for p in partitions}
    assert found == want
    for size, partitions in table.items():
        assert all(len(p["minors"]) == int(size) for p in partitions)
        assert all(p["gpuLinkType"] == "NVLink" for p in partitions)
    if want:
        assert labels["node.koordinator.sh/gpu-partition-policy"] == "Prefer"
        assert report["partitionPolicy"] == "Prefer"
    else:
        assert "node.koordinator.sh/gpu-partition-policy" not in labels
