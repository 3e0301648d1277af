"""DRA claims in the PodResources reader: devices of NVIDIA's DRA driver mapped to GPUs by minor.

Against the Python double of the kubelet's server (the same state shape as the Go harness, which
tests/collect/test_podresources_kubelet.py runs the kubelet's own server code with). Each case is
a sentence of behaviour; the bad input the issue lists (another driver, another pool, `gpu-99`,
`gpu--1`, `gpu-0-mig-`, a 300-byte name) must neither crash the reader nor free a GPU wrongly.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from reporter.collect.podresources import (
    ClaimedDevice,
    DraScope,
    PodResourcesError,
    PodResourcesReader,
    allocation_view,
)
from reporter.errors import ConfigError
from reporter.schema.dra import gpu_minor
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics
from tests.collect.test_podresources import GPU, a100_topology, uuids
from tests.support.podresources_double import (
    PodResourcesDouble,
    claim_pod_state,
    claim_state,
    devices_state,
    pod_state,
)

NODE = "dgx-07"
DRA = DraScope(("gpu.nvidia.com",), NODE)


@pytest.fixture
def topology(tmp_path: Path) -> Topology:
    return a100_topology(tmp_path, mig={6: 2})


@pytest.fixture
def kubelet() -> Iterator[PodResourcesDouble]:
    # A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not.
    directory = Path(tempfile.mkdtemp(prefix="podres-dra-", dir="/tmp"))
    with PodResourcesDouble(directory / "kubelet.sock") as double:
        yield double
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def reader(kubelet: PodResourcesDouble) -> Iterator[PodResourcesReader]:
    with PodResourcesReader(kubelet.socket, dra=DRA) as r:
        yield r


def device(minor: int) -> str:
    return f"gpu-{minor}"


@pytest.mark.parametrize(
    ("name", "minor"),
    [
        ("gpu-0", 0),
        ("gpu-7", 7),
        ("gpu-123456", 123456),
        ("gpu-3-mig-1g10gb-19-0", 3),
        ("gpu-0-mig-7g80gb-0-0", 0),
        ("gpu-0-mig-", None),
        ("gpu--1", None),
        ("gpu-01", None),
        ("gpu-+1", None),
        ("gpu-1234567", None),
        ("gpu-0-mig-1g10gb-19", None),
        ("GPU-0", None),
        ("gpu-0 ", None),
        ("gpu-0-vfio", None),
        ("", None),
        ("gpu-0-mig-" + "a" * 300 + "-1-0", None),
        ("gpu-" + "9" * 296, None),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_only_nvidia_driver_gpu_and_mig_names_give_a_minor(name: str, minor: int | None) -> None:
    assert gpu_minor(name) == minor


@given(st.text(max_size=400))
def test_no_device_name_crashes_the_minor_parser(name: str) -> None:
    minor = gpu_minor(name)
    assert minor is None or name.startswith(f"gpu-{minor}")


def test_a_gpu_held_by_a_claim_is_not_free_on_a_dra_node(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    minor = topology.gpus[2].minor
    assert minor is not None
    kubelet.state = {
        "devices": [],
        "pods": [claim_pod_state("train", [claim_state("gpus", [device(minor)], NODE)])],
    }
    view = reader.allocated(topology)
    assert view.sources == ("dra",)
    assert view.claimed == {2}
    assert view.allocated == {2}
    assert view.free == (0, 1, 3, 4, 5, 6, 7)
    assert view.unknown_ids == 0


def test_a_mig_slice_held_by_a_claim_holds_its_parent(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    minor = topology.gpus[6].minor
    kubelet.state = {
        "devices": [],
        "pods": [
            claim_pod_state("infer", [claim_state("slice", [f"gpu-{minor}-mig-1g10gb-19-0"], NODE)])
        ],
    }
    view = reader.allocated(topology)
    assert view.claimed == {6}
    assert 6 not in view.free


def test_releasing_the_claim_frees_the_gpu(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    minor = topology.gpus[0].minor
    kubelet.state = {
        "devices": [],
        "pods": [claim_pod_state("a", [claim_state("c", [device(int(minor or 0))], NODE)])],
    }
    assert reader.allocated(topology).claimed == {0}
    kubelet.state = {"devices": [], "pods": []}
    view = reader.allocated(topology)
    assert view.claimed == frozenset()
    assert view.free == tuple(range(8))


def test_a_device_plugin_node_counts_claims_too(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids),
        "pods": [
            pod_state("plugin", GPU, [ids[1]]),
            claim_pod_state(
                "claim", [claim_state("c", [device(int(topology.gpus[4].minor or 0))], NODE)]
            ),
        ],
    }
    view = reader.allocated(topology)
    assert view.sources == ("device-plugin", "dra")
    assert view.allocated == {1, 4}
    assert view.claimed == {4}


@pytest.mark.parametrize(
    ("driver", "pool", "name", "unknown"),
    [
        ("gpu.example.com", NODE, "gpu-0", False),
        ("gpu.nvidia.com", "dgx-08", "gpu-0", True),
        ("gpu.nvidia.com", NODE, "gpu-99", True),
        ("gpu.nvidia.com", NODE, "gpu--1", True),
        ("gpu.nvidia.com", NODE, "gpu-0-mig-", True),
        ("gpu.nvidia.com", NODE, "g" * 300, True),
        ("gpu.nvidia.com", NODE, "gpu-0\x00", True),
        ("gpu.nvidia.com", NODE, "gpu-\u0663", True),
        ("gpu.nvidia.com", NODE, "gpu-03", True),
        ("gpu.nvidia.com", NODE, "GPU-3", True),
        ("gpu.nvidia.com", NODE, "", True),
        ("gpu.nvidia.com", NODE.upper(), "gpu-0", True),
        ("gpu.nvidia.com", "", "gpu-0", True),
        ("", NODE, "gpu-0", False),
    ],
    ids=[
        "another driver: not ours, ignored",
        "another node's pool",
        "a minor no GPU has",
        "a negative minor",
        "a MIG name without its parts",
        "300 bytes",
        "a NUL byte",
        "another script's digit",
        "a leading zero",
        "upper case",
        "no name",
        "the pool in upper case",
        "no pool",
        "no driver: not ours, ignored",
    ],
)
def test_a_claimed_device_that_is_not_a_gpu_here_frees_nothing_and_crashes_nothing(
    kubelet: PodResourcesDouble,
    reader: PodResourcesReader,
    topology: Topology,
    driver: str,
    pool: str,
    name: str,
    unknown: bool,
) -> None:
    held = device(int(topology.gpus[3].minor or 0))
    kubelet.state = {
        "devices": [],
        "pods": [
            claim_pod_state("odd", [claim_state("odd", [name], pool, driver=driver)]),
            claim_pod_state("real", [claim_state("real", [held], NODE)]),
        ],
    }
    metrics = Metrics()
    with capture_logs() as logs:
        view = reader.allocated(topology)
    metrics.podresources_read(view, topology)
    assert view.claimed == {3}
    assert view.free == (0, 1, 2, 4, 5, 6, 7)
    assert view.unknown_ids == int(unknown)
    assert b"topo_reporter_podresources_unknown_devices %d.0" % int(unknown) in metrics.render()
    warned = [e for e in logs if e["event"] == "podresources_unknown_devices"]
    assert len(warned) == int(unknown)
    if unknown:
        assert all(len(x) <= 200 for x in warned[0]["examples"])


def test_the_unknown_device_is_logged_once_while_it_stays(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    kubelet.state = {
        "devices": [],
        "pods": [claim_pod_state("odd", [claim_state("odd", ["gpu-99"], NODE)])],
    }
    with capture_logs() as logs:
        for _ in range(3):
            reader.allocated(topology)
    warned = [e for e in logs if e["event"] == "podresources_unknown_devices"]
    assert [e["examples"] for e in warned] == [[f"gpu.nvidia.com/{NODE}/gpu-99"]]


def test_without_dra_claims_are_not_counted_and_no_device_plugin_is_an_error(
    kubelet: PodResourcesDouble, topology: Topology
) -> None:
    kubelet.state = {
        "devices": [],
        "pods": [claim_pod_state("a", [claim_state("c", ["gpu-0"], NODE)])],
    }
    with PodResourcesReader(kubelet.socket) as reader, pytest.raises(PodResourcesError) as caught:
        reader.allocated(topology)
    assert caught.value.reason == "no_devices"


def test_a_dra_node_whose_topology_has_no_minors_is_an_error_not_all_free(
    topology: Topology,
) -> None:
    import dataclasses  # noqa: PLC0415

    bare = dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, minor=None) for g in topology.gpus)
    )
    with pytest.raises(PodResourcesError, match="minor number") as caught:
        allocation_view(bare, (), (), dra=DRA)
    assert caught.value.reason == "unmatched"


def test_a_lost_gpu_stays_unfree_on_a_dra_node(topology: Topology) -> None:
    import dataclasses  # noqa: PLC0415

    gpus = list(topology.gpus)
    gpus[5] = dataclasses.replace(gpus[5], lost=True)
    view = allocation_view(dataclasses.replace(topology, gpus=tuple(gpus)), (), (), dra=DRA)
    assert 5 not in view.free
    assert view.unhealthy == ()


def test_claims_of_other_drivers_need_no_minor(topology: Topology) -> None:
    claims = [ClaimedDevice("nic.example.com", NODE, "eth-0")]
    view = allocation_view(topology, (), (), claims=claims, dra=DRA)
    assert view.unknown_ids == 0
    assert view.free == tuple(range(8))


@pytest.mark.parametrize(
    ("drivers", "pool"),
    [((), NODE), (("Gpu.Nvidia.com",), NODE), (("a" * 64,), NODE), (("gpu.nvidia.com",), "")],
    ids=["no driver", "upper case", "64 characters", "no pool"],
)
def test_a_bad_dra_scope_is_a_config_error(drivers: tuple[str, ...], pool: str) -> None:
    with pytest.raises(ConfigError):
        DraScope(drivers, pool)


def test_gpus_offered_under_an_unmanaged_name_are_no_dra_node(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    """A device plugin renamed (`example.com/gpu`) is not a DRA node: publishing every GPU free
    would be wrong, so the read fails as without DRA, naming the resource."""
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state("example.com/gpu", ids),
        "pods": [pod_state("a", "example.com/gpu", ids[:2])],
    }
    with pytest.raises(PodResourcesError, match=r"offers this node's GPUs as example\.com/gpu"):
        reader.allocated(topology)
    kubelet.state = {"devices": devices_state("example.com/fpga", ["fpga-0"]), "pods": []}
    assert reader.allocated(topology).sources == ("dra",)
