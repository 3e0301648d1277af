"""The PodResources reader against a Python double of the kubelet's server: mapping and faults.

The same mapping cases run against the kubelet's own server code in
tests/collect/test_podresources_kubelet.py; this file adds what only a double can do: refuse,
hang, throttle, answer too much, and vanish.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from reporter.collect.nvml import NvmlCollector
from reporter.collect.podresources import (
    AllocationView,
    PodResourcesError,
    PodResourcesReader,
    allocation_view,
    device_key,
)
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.errors import ConfigError
from reporter.schema.model import Topology
from reporter.schema.nrt import PodRef
from reporter.serve.metrics import Metrics
from tests.support.podresources_double import PodResourcesDouble, devices_state, pod_state

GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"
PROFILES = Path(__file__).resolve().parents[2] / "reporter/collect/simulate/profiles"


def a100_topology(tmp: Path, mig: dict[int, int] | None = None) -> Topology:
    """The simulated DGX A100, with `mig[gpu]` MIG devices created on the GPUs named."""
    data = yaml.safe_load((PROFILES / "dgx-a100.yaml").read_text(encoding="utf-8"))
    data["gpus"] = [{"index": g, "mig": True, "mig_devices": n} for g, n in (mig or {}).items()]
    path = tmp / "dgx-a100-mig.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    machine = load_machine(str(path))
    topology = NvmlCollector(FakeNvml(machine), memory_hostfs(machine)).collect()
    assert topology is not None
    return topology


def uuids(topology: Topology) -> list[str]:
    return [str(g.uuid) for g in topology.gpus]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def topology(tmp_path: Path) -> Topology:
    return a100_topology(tmp_path)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[PodResourcesDouble]:
    with PodResourcesDouble(socket_dir / "kubelet.sock") as double:
        yield double


@pytest.fixture
def reader(kubelet: PodResourcesDouble) -> Iterator[PodResourcesReader]:
    with PodResourcesReader(kubelet.socket) as r:
        yield r


def serve_whole_gpus(kubelet: PodResourcesDouble, topology: Topology, held: list[int]) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids),
        "pods": [pod_state(f"p{i}", GPU, [ids[i]]) for i in held],
    }


# --- mapping ------------------------------------------------------------------------------------


def test_whole_gpus_held_by_containers_are_allocated_and_the_rest_free(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[1, 3])
    view = reader.allocated(topology)
    assert view.allocated == {1, 3}
    assert view.free == (0, 2, 4, 5, 6, 7)
    assert view.unhealthy == ()
    assert view.unknown_ids == 0
    assert kubelet.servicer.calls == ["GetAllocatableResources", "List"]


def test_every_listed_pod_is_in_the_view_for_the_nrt_fingerprint_with_or_without_devices(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids),
        "pods": [
            pod_state("web", "example.com/other", ["dev-1"], namespace="shop"),
            pod_state("train", GPU, [ids[0]], namespace="ml"),
            {"namespace": "kube-system", "name": "coredns", "containers": [{"name": "c"}]},
        ],
    }
    view = reader.allocated(topology)
    assert view.pods == (
        PodRef("kube-system", "coredns"),
        PodRef("ml", "train"),
        PodRef("shop", "web"),
    )
    assert view.allocated == {0}


def test_exclusive_cpus_of_every_container_are_in_the_view(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids),
        "pods": [
            {
                "namespace": "ml",
                "name": "train",
                "containers": [
                    {
                        "name": "main",
                        "cpus": [2, 3],
                        "devices": [{"resource": GPU, "ids": [ids[0]]}],
                    },
                    {"name": "sidecar", "cpus": [60]},
                ],
            },
            pod_state("shared-pool", GPU, [ids[1]]),
        ],
    }
    assert reader.allocated(topology).exclusive_cpus == {2, 3, 60}


def test_a_time_sliced_replica_in_use_makes_its_whole_gpu_allocated(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    replicas = [f"{u}::{r}" for u in ids for r in range(4)]
    kubelet.state = {
        "devices": devices_state("nvidia.com/gpu.shared", replicas),
        "pods": [pod_state("a", "nvidia.com/gpu.shared", [f"{ids[5]}::2"])],
    }
    view = reader.allocated(topology)
    assert view.allocated == {5}
    assert view.free == (0, 1, 2, 3, 4, 6, 7)


def test_a_mig_device_in_use_makes_its_parent_allocated(
    kubelet: PodResourcesDouble, tmp_path: Path
) -> None:
    topology = a100_topology(tmp_path, mig={2: 3, 6: 2})
    migs = {g.index: list(g.mig_devices) for g in topology.gpus if g.mig_devices}
    whole = [str(g.uuid) for g in topology.gpus if not g.mig]
    kubelet.state = {
        "devices": devices_state(GPU, whole) + devices_state(MIG_1G, migs[2] + migs[6]),
        "pods": [pod_state("m", MIG_1G, [migs[6][1]]), pod_state("w", GPU, [whole[0]])],
    }
    with PodResourcesReader(kubelet.socket) as reader:
        view = reader.allocated(topology)
    assert view.allocated == {0, 6}
    assert view.allocatable == frozenset(range(8))
    assert view.free == (1, 2, 3, 4, 5, 7)


def test_mig_single_strategy_ids_under_the_gpu_name_map_to_their_parent(
    kubelet: PodResourcesDouble, tmp_path: Path
) -> None:
    topology = a100_topology(tmp_path, mig=dict.fromkeys(range(8), 1))
    migs = [g.mig_devices[0] for g in topology.gpus]
    kubelet.state = {"devices": devices_state(GPU, migs), "pods": [pod_state("a", GPU, [migs[4]])]}
    with PodResourcesReader(kubelet.socket) as reader:
        assert reader.allocated(topology).allocated == {4}


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        ("GPU-AbC", "gpu-abc"),
        ("GPU-abc::7", "gpu-abc"),
        ("MIG-def", "mig-def"),
        ("MIG-def::1", "mig-def"),
        ("MIG-GPU-abc/1/0", "gpu-abc"),
        ("0", "0"),
    ],
    ids=[
        "a GPU UUID, in any case",
        "a replica is its GPU",
        "a MIG UUID is itself",
        "a replicated MIG device is its MIG device",
        "a pre-R470 MIG UUID names its parent",
        "an index-like ID stays as it is (and matches no UUID)",
    ],
)
def test_device_keys(device_id: str, key: str) -> None:
    assert device_key(device_id) == key


def test_unknown_ids_are_counted_and_logged_once_and_change_no_gpu(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    stranger = "GPU-00000000-0000-0000-0000-000000000000"
    kubelet.state = {
        "devices": devices_state(GPU, [*ids, stranger]),
        "pods": [pod_state("a", GPU, [stranger, "MIG-ffffffff-0000-0000-0000-000000000000"])],
    }
    with capture_logs() as logs:
        first = reader.allocated(topology)
        second = reader.allocated(topology)
    assert first == second
    assert first.free == tuple(range(8))
    assert first.unknown_ids == 2
    assert first.unknown_examples == (stranger, "MIG-ffffffff-0000-0000-0000-000000000000")
    warnings = [e for e in logs if e["event"] == "podresources_unknown_devices"]
    assert len(warnings) == 1
    assert warnings[0]["count"] == 2


def test_devices_of_other_resources_are_not_ours_even_with_a_gpu_uuid(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids) + devices_state("example.com/nic", ["GPU-x"]),
        "pods": [pod_state("a", "example.com/gpu-like", [ids[0]])],
    }
    view = reader.allocated(topology)
    assert view.free == tuple(range(8))
    assert view.unknown_ids == 0


def test_an_unhealthy_gpu_is_not_free_and_says_so(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {"devices": devices_state(GPU, ids, unhealthy=(ids[7],)), "pods": []}
    with capture_logs() as logs:
        view = reader.allocated(topology)
    assert view.unhealthy == (7,)
    assert view.free == tuple(range(7))
    assert [e["gpus"] for e in logs if e["event"] == "podresources_gpus_not_offered"] == [[7]]


def test_an_unhealthy_gpu_still_held_by_a_pod_is_allocated(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    ids = uuids(topology)
    kubelet.state = {
        "devices": devices_state(GPU, ids, unhealthy=(ids[2],)),
        "pods": [pod_state("a", GPU, [ids[2]])],
    }
    view = reader.allocated(topology)
    assert view.allocated == {2}
    assert view.unhealthy == (2,)
    assert 2 not in view.free


def test_a_gpu_nvml_reports_lost_is_never_free(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[])
    gpus = list(topology.gpus)
    gpus[3] = dataclasses.replace(gpus[3], lost=True)
    view = reader.allocated(dataclasses.replace(topology, gpus=tuple(gpus)))
    assert view.free == (0, 1, 2, 4, 5, 6, 7)
    assert view.unhealthy == ()


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ({"devices": [], "pods": []}, "no_devices"),
        ({"devices": devices_state("amd.com/gpu", ["GPU-1"]), "pods": []}, "no_devices"),
        ({"devices": devices_state(GPU, ["GPU-elsewhere"]), "pods": []}, "unmatched"),
    ],
    ids=[
        "a kubelet without devices says nothing about our GPUs",
        "devices under other names only: a misnamed resource",
        "devices that match none of our UUIDs: a topology from elsewhere",
    ],
)
def test_an_answer_that_says_nothing_about_this_node_is_an_error_not_zero_free(
    kubelet: PodResourcesDouble,
    reader: PodResourcesReader,
    topology: Topology,
    state: dict[str, object],
    reason: str,
) -> None:
    kubelet.state = state
    with pytest.raises(PodResourcesError) as caught:
        reader.allocated(topology)
    assert caught.value.reason == reason
    assert "\n" not in str(caught.value)


def test_a_topology_without_uuids_says_availability_needs_nvml(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[])
    anonymous = tuple(dataclasses.replace(g, uuid=None) for g in topology.gpus)
    with pytest.raises(PodResourcesError, match="needs the NVML source") as caught:
        reader.allocated(dataclasses.replace(topology, gpus=anonymous))
    assert caught.value.reason == "unmatched"


@functools.cache
def mixed_topology() -> Topology:
    """The DGX A100 with MIG devices on GPUs 2 (three) and 6 (two), built once."""
    with tempfile.TemporaryDirectory() as tmp:
        return a100_topology(Path(tmp), mig={2: 3, 6: 2})


def ids_of(topology: Topology, gpu: int) -> list[str]:
    """Every ID a plugin may advertise for one GPU: UUID (either case), replicas, MIG devices."""
    g = topology.gpus[gpu]
    uuid = str(g.uuid)
    return [
        uuid,
        uuid.upper(),
        f"{uuid}::0",
        f"{uuid}::3",
        *g.mig_devices,
        *(f"{m}::1" for m in g.mig_devices),
    ]


strangers = st.lists(
    st.sampled_from(["GPU-elsewhere", "MIG-elsewhere", "0", "GPU-x::1", "MIG-GPU-y/1/0", ""]),
    max_size=4,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    offered=st.frozensets(st.integers(0, 7), min_size=1),
    held=st.frozensets(st.integers(0, 7)),
    choice=st.integers(0, 100),
    unknown_offered=strangers,
    unknown_held=strangers,
)
def test_free_is_offered_minus_held_whatever_the_id_forms_and_strangers(
    offered: frozenset[int],
    held: frozenset[int],
    choice: int,
    unknown_offered: list[str],
    unknown_held: list[str],
) -> None:
    topology = mixed_topology()

    def some_id(gpu: int) -> str:
        forms = ids_of(topology, gpu)
        return forms[(choice + gpu) % len(forms)]

    view = allocation_view(
        topology,
        [some_id(g) for g in sorted(offered)] + unknown_offered,
        [some_id(g) for g in sorted(held)] + unknown_held,
    )
    assert view.free == tuple(sorted(offered - held))
    assert view.allocated == held
    assert view.unhealthy == tuple(sorted(set(range(8)) - offered))
    assert view.unknown_ids == len(set(unknown_offered) | set(unknown_held))


# --- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "code", "reason", "says"),
    [
        ("GetAllocatableResources", grpc.StatusCode.UNAVAILABLE, "unavailable", "reconnects"),
        ("List", grpc.StatusCode.RESOURCE_EXHAUSTED, "throttled", "rate limit"),
        ("GetAllocatableResources", grpc.StatusCode.UNIMPLEMENTED, "refused", "1.23"),
        ("List", grpc.StatusCode.PERMISSION_DENIED, "refused", "PERMISSION_DENIED"),
    ],
    ids=[
        "a kubelet going away is unavailable",
        "the kubelet's rate limit is throttled",
        "an old kubelet without GetAllocatableResources is refused, with the version it needs",
        "any other refusal names its status",
    ],
)
def test_a_refused_call_is_one_clear_error_and_the_next_read_works(
    kubelet: PodResourcesDouble,
    reader: PodResourcesReader,
    topology: Topology,
    method: str,
    code: grpc.StatusCode,
    reason: str,
    says: str,
) -> None:
    serve_whole_gpus(kubelet, topology, held=[0])
    kubelet.fail[method] = code
    with pytest.raises(PodResourcesError) as caught:
        reader.allocated(topology)
    assert (caught.value.reason, caught.value.method) == (reason, method)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
    kubelet.fail.clear()
    assert reader.allocated(topology).allocated == {0}


def test_a_call_that_gets_no_answer_times_out(
    kubelet: PodResourcesDouble, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[])
    kubelet.hang.add("List")
    with (
        PodResourcesReader(kubelet.socket, timeout_s=0.2) as reader,
        pytest.raises(PodResourcesError) as caught,
    ):
        reader.allocated(topology)
    assert (caught.value.reason, caught.value.method) == ("timeout", "List")


def test_an_answer_over_the_message_limit_is_refused_not_read(
    kubelet: PodResourcesDouble, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[])
    kubelet.padding = 64 * 1024
    with (
        PodResourcesReader(kubelet.socket, max_message_bytes=32 * 1024) as reader,
        pytest.raises(PodResourcesError) as caught,
    ):
        reader.allocated(topology)
    assert (caught.value.reason, caught.value.method) == ("too_large", "List")


def test_a_missing_socket_is_an_error_naming_the_mount(
    socket_dir: Path, topology: Topology
) -> None:
    with (
        PodResourcesReader(socket_dir / "kubelet.sock") as reader,
        pytest.raises(PodResourcesError, match=r"availability\.enabled") as caught,
    ):
        reader.allocated(topology)
    assert caught.value.reason == "missing"


def test_a_file_that_is_not_a_socket_is_an_error(socket_dir: Path, topology: Topology) -> None:
    (socket_dir / "kubelet.sock").write_text("not a socket")
    with (
        PodResourcesReader(socket_dir / "kubelet.sock") as reader,
        pytest.raises(PodResourcesError, match="not a socket"),
    ):
        reader.allocated(topology)


def test_a_socket_that_disappears_and_comes_back_is_read_again(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[0])
    assert reader.allocated(topology).allocated == {0}
    kubelet.stop()
    with capture_logs() as logs:
        with pytest.raises(PodResourcesError) as caught:
            reader.allocated(topology)
        assert caught.value.reason == "missing"
        serve_whole_gpus(kubelet, topology, held=[4, 5])
        kubelet.start()
        assert reader.allocated(topology).allocated == {4, 5}
    assert [e["event"] for e in logs] == ["podresources_read_failed", "podresources_recovered"]


def test_a_kubelet_restart_between_two_reads_costs_no_failed_read(
    kubelet: PodResourcesDouble, reader: PodResourcesReader, topology: Topology
) -> None:
    serve_whole_gpus(kubelet, topology, held=[0])
    assert reader.allocated(topology).allocated == {0}
    kubelet.stop()
    serve_whole_gpus(kubelet, topology, held=[1])
    kubelet.start()
    assert reader.allocated(topology).allocated == {1}


def test_repeated_failures_are_logged_once_until_they_change(
    socket_dir: Path, topology: Topology
) -> None:
    with PodResourcesReader(socket_dir / "kubelet.sock") as reader, capture_logs() as logs:
        for _ in range(3):
            with pytest.raises(PodResourcesError):
                reader.allocated(topology)
    assert [e["event"] for e in logs] == ["podresources_read_failed"]


# --- settings and metrics -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"socket": Path("/" + "d" * 120 + "/kubelet.sock")}, "longer than 107 bytes"),
        ({"resources": ()}, "give 1 to 32"),
        ({"resources": ("nvidia.com/gpu", "")}, "not a resource name"),
        ({"timeout_s": 0.0}, "positive"),
    ],
    ids=["a socket path too long", "no resource", "an empty resource", "a zero timeout"],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        PodResourcesReader(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "managed"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/gpu-other", False),
        ("amd.com/gpu", False),
    ],
)
def test_default_resource_names(name: str, managed: bool) -> None:
    assert PodResourcesReader().manages(name) is managed


def test_metrics_show_the_last_good_read_and_count_failures(topology: Topology) -> None:
    metrics = Metrics()
    view = AllocationView(
        allocatable=frozenset({0, 1, 2}),
        allocated=frozenset({1}),
        unhealthy=(3,),
        unknown_ids=2,
        unknown_examples=("GPU-x", "GPU-y"),
    )
    metrics.podresources_read(view, topology)
    metrics.podresources_failed(PodResourcesError("gone", reason="missing"))
    text = metrics.render().decode()
    assert 'topo_reporter_podresources_gpus{state="free"} 2.0' in text
    assert 'topo_reporter_podresources_gpus{state="allocated"} 1.0' in text
    assert 'topo_reporter_podresources_gpus{state="unhealthy"} 1.0' in text
    assert "topo_reporter_podresources_unknown_devices 2.0" in text
    assert 'topo_reporter_podresources_reads_total{result="ok"} 1.0' in text
    assert 'topo_reporter_podresources_reads_total{result="missing"} 1.0' in text
