"""The PodResources reader against the kubelet's own server code: the control-plane harness's
`podresources` subcommand (tests/controlplane/) serves the kubelet's PodResources v1 server, rate
limiter included, with its providers fed from a JSON state file.

What only the Python double can do (hang, answer too much, refuse with any status) is in
tests/collect/test_podresources.py; here the reader meets the real wire, the real NUMA fan-out of
GetAllocatableResources, the real rate limit and a real server stopped and started again.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reporter.collect.podresources import (
    AllocationView,
    DraScope,
    PodResourcesError,
    PodResourcesReader,
)
from reporter.schema.model import Topology
from reporter.schema.nrt import PodRef
from tests.collect.test_podresources import GPU, MIG_1G, a100_topology, uuids
from tests.support.podresources_double import claim_pod_state, claim_state, devices_state, pod_state

# The kubelet's server code comes from the control-plane harness (Go).
pytestmark = pytest.mark.controlplane

# Bounds on waiting for the harness: generous for a loaded two-core machine, never a timing claim.
READY_S = 60.0
CONVERGE_S = 20.0


class KubeletPodResources:
    """`BIN podresources --socket PATH --state FILE`, started and stopped like a kubelet."""

    def __init__(self, binary: Path, socket: Path, state_file: Path) -> None:
        self.binary = binary
        self.socket = socket
        self.state_file = state_file
        self._process: subprocess.Popen[str] | None = None
        self._mtime_ns = time.time_ns()

    def write(self, state: dict[str, Any]) -> None:
        """Replace the state; the harness re-reads it when its mtime changes."""
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        # A strictly later mtime than any before, whatever the filesystem's clock granularity.
        self._mtime_ns += 1_000_000_000
        os.utime(tmp, ns=(self._mtime_ns, self._mtime_ns))
        tmp.replace(self.state_file)

    def start(self) -> None:
        process = subprocess.Popen(
            [
                str(self.binary),
                "podresources",
                "--socket",
                str(self.socket),
                "--state",
                str(self.state_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._process = process
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(READY_S):
                self.stop()
                pytest.fail(f"the podresources harness did not print ready in {READY_S:.0f} s")
        line = process.stdout.readline().strip()
        assert line == "ready", f"the podresources harness said {line!r} instead of ready"

    def stop(self) -> None:
        """SIGTERM, as a kubelet restart: the harness removes its socket and exits."""
        process, self._process = self._process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(READY_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail("the podresources harness did not exit on SIGTERM")
        finally:
            assert process.stdout is not None
            process.stdout.close()


@pytest.fixture
def kubelet(controlplane_bin: Path) -> Iterator[KubeletPodResources]:
    # A short directory: a unix socket path must fit in 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="podres-k-", dir="/tmp"))
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


@pytest.fixture
def topology(tmp_path: Path) -> Topology:
    return a100_topology(tmp_path, mig={6: 2})


def converge(read: Callable[[], AllocationView], want: Callable[[AllocationView], bool]) -> Any:
    """The first view `want` accepts: the harness picks a new state file up on its own time."""
    deadline = time.monotonic() + CONVERGE_S
    last: AllocationView | PodResourcesError | None = None
    while time.monotonic() < deadline:
        try:
            last = read()
        except PodResourcesError as e:
            last = e
        else:
            if want(last):
                return last
        time.sleep(0.05)
    pytest.fail(f"the reader never saw the state written; last: {last}")


def test_the_kubelets_server_answers_whole_gpus_replicas_and_mig(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    ids = uuids(topology)
    whole, shared = ids[:4], [f"{u}::{r}" for u in ids[4:6] for r in range(4)]
    migs = list(topology.gpus[6].mig_devices)
    kubelet.write(
        {
            "devices": devices_state(GPU, whole)
            + devices_state("nvidia.com/gpu.shared", shared)
            + devices_state(MIG_1G, migs, numa=None)
            + devices_state(GPU, [ids[7]], unhealthy=(ids[7],)),
            "pods": [
                pod_state("train", GPU, [whole[1], whole[2]], namespace="ml"),
                pod_state("notebook", "nvidia.com/gpu.shared", [f"{ids[5]}::3"]),
                pod_state("infer", MIG_1G, [migs[1]]),
            ],
        }
    )
    with PodResourcesReader(kubelet.socket) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: bool(v.allocated))
    assert view.allocated == {1, 2, 5, 6}
    assert view.free == (0, 3, 4)
    assert view.unhealthy == (7,)
    assert view.unknown_ids == 0
    assert view.pods == (
        PodRef("default", "infer"),
        PodRef("default", "notebook"),
        PodRef("ml", "train"),
    )


def test_a_device_on_two_numa_nodes_is_one_device(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    ids = uuids(topology)
    devices = devices_state(GPU, ids)
    devices[0]["numa"] = [0, 1]  # the kubelet answers it once per NUMA node
    kubelet.write({"devices": devices, "pods": [pod_state("a", GPU, [ids[0]])]})
    with PodResourcesReader(kubelet.socket) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: bool(v.allocated))
    assert view.allocated == {0}
    assert view.free == tuple(range(1, 8))


def test_unknown_ids_from_the_kubelet_are_counted_and_remove_no_gpu(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    ids = uuids(topology)
    stranger = "GPU-11111111-2222-3333-4444-555555555555"
    kubelet.write(
        {
            "devices": devices_state(GPU, [*ids, stranger]),
            "pods": [pod_state("a", GPU, [stranger])],
        }
    )
    with PodResourcesReader(kubelet.socket) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: v.unknown_ids > 0)
    assert view.unknown_examples == (stranger,)
    assert view.free == tuple(range(8))


def test_a_kubelet_that_stops_and_starts_again_is_read_again(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.write({"devices": devices_state(GPU, ids), "pods": [pod_state("a", GPU, [ids[0]])]})
    with PodResourcesReader(kubelet.socket) as reader:
        converge(lambda: reader.allocated(topology), lambda v: v.allocated == {0})
        kubelet.stop()
        with pytest.raises(PodResourcesError) as caught:
            reader.allocated(topology)
        assert caught.value.reason == "missing"
        kubelet.write(
            {"devices": devices_state(GPU, ids), "pods": [pod_state("b", GPU, [ids[3], ids[4]])]}
        )
        kubelet.start()
        view = reader.allocated(topology)
    assert view.allocated == {3, 4}


def test_the_kubelets_rate_limit_is_a_throttled_read_and_passes(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.write({"devices": devices_state(GPU, ids), "pods": []})
    reasons: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        # Four readers at once outrun the kubelet's 100 calls per second (burst 10).
        with PodResourcesReader(kubelet.socket) as reader:
            for _ in range(500):
                if stop.is_set():
                    return
                try:
                    reader.allocated(topology)
                except PodResourcesError as e:
                    reasons.append(e.reason)
                    if e.reason == "throttled":
                        stop.set()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "throttled" in reasons
    assert set(reasons) <= {"throttled", "no_devices"}  # no_devices: before the state is read
    with PodResourcesReader(kubelet.socket) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: True)
    assert view.free == tuple(range(8))


# --- DRA: the kubelet's own server code answering ResourceClaims' devices -----------------------

DRA_NODE = "dgx-07"


def test_the_kubelets_server_reports_claims_a_gpu_held_by_one_is_not_free(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    minor = topology.gpus[2].minor
    kubelet.write(
        {
            "devices": [],
            "pods": [claim_pod_state("train", [claim_state("gpus", [f"gpu-{minor}"], DRA_NODE)])],
        }
    )
    with PodResourcesReader(kubelet.socket, dra=DraScope(("gpu.nvidia.com",), DRA_NODE)) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: bool(v.claimed))
    assert view.sources == ("dra",)
    assert view.claimed == {2}
    assert view.free == (0, 1, 3, 4, 5, 6, 7)
    assert view.pods == (PodRef("default", "train"),)


def test_the_kubelets_server_a_mig_slice_holds_its_parent_and_release_frees_it(
    kubelet: KubeletPodResources, topology: Topology
) -> None:
    minor = topology.gpus[6].minor
    ids = uuids(topology)
    kubelet.write(
        {
            "devices": devices_state(GPU, ids[:6]),
            "pods": [
                pod_state("plugin", GPU, [ids[0]]),
                claim_pod_state(
                    "infer", [claim_state("slice", [f"gpu-{minor}-mig-1g10gb-19-0"], DRA_NODE)]
                ),
            ],
        }
    )
    with PodResourcesReader(kubelet.socket, dra=DraScope(("gpu.nvidia.com",), DRA_NODE)) as reader:
        view = converge(lambda: reader.allocated(topology), lambda v: bool(v.claimed))
        assert view.sources == ("device-plugin", "dra")
        assert view.claimed == {6}
        assert view.allocated == {0, 6}
        kubelet.write({"devices": devices_state(GPU, ids[:6]), "pods": []})
        released = converge(lambda: reader.allocated(topology), lambda v: not v.allocated)
    assert released.claimed == frozenset()
    assert released.free == (0, 1, 2, 3, 4, 5)
