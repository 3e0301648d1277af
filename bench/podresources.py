"""PodResources read cost: one `PodResourcesReader.allocated` (two gRPC calls and the mapping), and
what loading gRPC adds to the process.

Method. The server is the Python double of the kubelet (tests/support/podresources_double.py) on a
unix socket in this machine's /tmp, serving the simulated DGX H100's 8 GPUs in three shapes: whole
GPUs with one pod per GPU; time-slicing with 16 replicas per GPU and 110 pods (the kubelet's default
pod limit) holding one replica each; and 110 pods of which only 8 hold GPUs. Time is the median and
minimum of N reads after one warm-up, over one kept connection, wall clock; the double answers in
Python, so the kubelet's Go server answers faster and the numbers are an upper bound of the client
side. Memory is the peak RSS of a fresh interpreter before and after importing the reader and
opening a channel (`VmHWM`).

    python bench/podresources.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_seconds, quiet_logs, table
from reporter.collect.nvml import NvmlCollector
from reporter.collect.podresources import PodResourcesReader
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from tests.support.podresources_double import PodResourcesDouble, devices_state, pod_state

REPEAT = 200
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MAX_PODS = 110

RSS_PROBE = """
import sys
sys.path.insert(0, {root!r})
def peak():
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak across exec.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
import reporter.collect, reporter.schema.codec
before = peak()
from reporter.collect.podresources import PodResourcesReader
reader = PodResourcesReader()
reader._connect()
print(before, peak())
"""


def shapes(uuids: list[str]) -> dict[str, dict[str, Any]]:
    replicas = [f"{u}::{r}" for u in uuids for r in range(16)]
    idle = [
        {"namespace": "default", "name": f"web-{i}", "containers": [{"name": "c"}]}
        for i in range(MAX_PODS - len(uuids))
    ]
    return {
        "8 GPUs, 8 pods with one each": {
            "devices": devices_state(GPU, uuids),
            "pods": [pod_state(f"p{i}", GPU, [u]) for i, u in enumerate(uuids)],
        },
        "8 GPUs x 16 replicas, 110 pods with one replica": {
            "devices": devices_state(SHARED, replicas),
            "pods": [pod_state(f"p{i}", SHARED, [replicas[i]]) for i in range(MAX_PODS)],
        },
        "8 GPUs, 110 pods, 8 with a GPU": {
            "devices": devices_state(GPU, uuids),
            "pods": [pod_state(f"p{i}", GPU, [u]) for i, u in enumerate(uuids)] + idle,
        },
    }


def main() -> None:
    quiet_logs()
    machine = load_machine("dgx-h100")
    topology = NvmlCollector(FakeNvml(machine), memory_hostfs(machine)).collect()
    assert topology is not None
    uuids = [str(g.uuid) for g in topology.gpus]
    directory = Path(tempfile.mkdtemp(prefix="podres-bench-", dir="/tmp"))
    rows = []
    try:
        with PodResourcesDouble(directory / "kubelet.sock") as double:
            for name, state in shapes(uuids).items():
                double.state = state
                with PodResourcesReader(double.socket) as reader:
                    reader.allocated(topology)
                    median, low = median_seconds(lambda r=reader: r.allocated(topology), REPEAT)
                rows.append([name, f"{median * 1e3:.2f}", f"{low * 1e3:.2f}"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(table(["kubelet state", "median ms", "min ms"], rows))
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE.format(root=root)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    before, after = float(out[0]), float(out[1])
    print()
    print(
        table(
            ["peak RSS before MiB", "after importing grpc and opening a channel MiB", "added MiB"],
            [[f"{before:.1f}", f"{after:.1f}", f"{after - before:.1f}"]],
        )
    )


if __name__ == "__main__":
    main()
