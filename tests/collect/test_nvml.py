"""The NVML collector against the fake binding: real error classes, injected one by one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from reporter.collect import CollectorScanner, SourceState
from reporter.collect.nvml import NvmlCollector
from reporter.collect.simulate import fake_nvml as fake
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import Machine, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.errors import CollectError, ConfigError, NvmlUnavailable
from reporter.hostfs import DirHostFS
from reporter.schema.model import NvlinkHealth, Source, Topology


def collect(profile: str, faults: Faults | None = None, **kwargs: int) -> Topology:
    machine = load_machine(profile)
    topology = NvmlCollector(FakeNvml(machine, faults, **kwargs), memory_hostfs(machine)).collect()
    assert topology is not None
    return topology


def scanner(profile: str, backend: str, faults: Faults) -> CollectorScanner:
    machine = load_machine(profile)
    return CollectorScanner(backend, memory_hostfs(machine), lambda: FakeNvml(machine, faults))


def test_fake_errors_are_built_like_the_binding_builds_them() -> None:
    error = fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST)
    assert type(error).__name__ == "NVMLError_GpuIsLost"
    assert isinstance(error, fake.ERROR_CLASSES["NVMLError_GpuIsLost"])
    assert error.value == 15
    assert fake.ERROR_CLASSES["NVMLError_LibRmVersionMismatch"](0).value == 18
    assert set(fake.ERROR_CLASSES) >= {
        "NVMLError_NotSupported",
        "NVMLError_GpuIsLost",
        "NVMLError_LibraryNotFound",
        "NVMLError_DriverNotLoaded",
        "NVMLError_NoPermission",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_FunctionNotFound",
        "NVMLError_InvalidArgument",
    }


INIT_ERRORS = [
    fake.NVML_ERROR_LIBRARY_NOT_FOUND,
    fake.NVML_ERROR_DRIVER_NOT_LOADED,
    fake.NVML_ERROR_NO_PERMISSION,
    fake.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    fake.NVML_ERROR_UNKNOWN,
]


@pytest.mark.parametrize("code", INIT_ERRORS, ids=lambda c: f"init error {c}")
def test_an_init_error_is_one_line_saying_what_to_check(code: int) -> None:
    with pytest.raises(NvmlUnavailable) as caught:
        collect("dgx-h100", Faults(init=code))
    message = str(caught.value)
    assert "\n" not in message
    for hint in ("driver", "runtimeClassName", "NVIDIA_VISIBLE_DEVICES", "utility"):
        assert hint in message


@pytest.mark.parametrize("code", INIT_ERRORS, ids=lambda c: f"init error {c}")
def test_auto_falls_back_to_sysfs_and_marks_nvml_failed(code: int) -> None:
    result = scanner("dgx-a100", "auto", Faults(init=code)).scan()
    assert result.topology is not None
    assert result.topology.source is Source.SYSFS
    assert not result.topology.nvlink_observed
    assert len(result.topology.nics) == 12
    assert [s.state for s in result.sources] == [SourceState.FAILED, SourceState.OK]
    assert result.degraded


def test_backend_nvml_publishes_nothing_when_nvml_fails() -> None:
    result = scanner("dgx-a100", "nvml", Faults(init=fake.NVML_ERROR_DRIVER_NOT_LOADED)).scan()
    assert result.topology is None
    assert result.failed[0].name == "nvml"
    assert result.failed[0].error is not None


@pytest.mark.parametrize(
    ("backend", "source"), [("auto", Source.SYSFS), ("nvml", None)], ids=["auto", "nvml"]
)
@pytest.mark.parametrize("visible", [(), (0, 1, 2, 3), (1, 2, 3, 4, 5, 6, 7)])
def test_nvml_seeing_fewer_gpus_than_sysfs_has_failed(
    backend: str, source: Source | None, visible: tuple[int, ...]
) -> None:
    result = scanner("dgx-h100", backend, Faults(visible=frozenset(visible))).scan()
    assert [s.state for s in result.sources] == [SourceState.FAILED, SourceState.OK]
    assert result.degraded
    error = result.failed[0].error
    assert error is not None
    assert error.startswith(f"NVML sees {len(visible)} of the 8 NVIDIA GPUs in sysfs")
    assert "NVIDIA_VISIBLE_DEVICES=all" in error
    assert "\n" not in error
    assert (None if result.topology is None else result.topology.source) is source


def test_nvml_seeing_every_gpu_sysfs_lists_is_ok_and_a_lost_gpu_counts_as_seen() -> None:
    for faults in (Faults(), Faults(visible=frozenset(range(8))), Faults(lost=frozenset({2}))):
        result = scanner("dgx-h100", "auto", faults).scan()
        assert not result.degraded
        assert result.topology is not None
        assert result.topology.source is Source.NVML


@pytest.mark.parametrize("lost", [0, 3, 7])
def test_a_lost_gpu_is_reported_lost_and_the_others_as_usual(lost: int) -> None:
    healthy = collect("dgx-h100")
    with capture_logs() as logs:
        topology = collect("dgx-h100", Faults(lost=frozenset({lost})))
    assert [g.lost for g in topology.gpus] == [i == lost for i in range(8)]
    assert topology.gpus[lost].uuid is None
    for i in range(8):
        for j in range(8):
            if i == j:
                continue
            expected = "SYS" if lost in (i, j) else healthy.links[i][j].token
            assert topology.links[i][j].token == expected
    others = [g for g in topology.gpus if not g.lost]
    assert others == [g for g in healthy.gpus if g.index != lost]
    assert {"event": "nvml_gpu_lost", "gpu": lost, "log_level": "warning"} in logs


@pytest.mark.parametrize(
    "function",
    ["nvmlDeviceGetNvLinkState", "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetUUID"],
)
def test_gpu_is_lost_from_any_call_marks_only_that_gpu(function: str) -> None:
    faults = Faults(calls={(function, 2): fake.NVML_ERROR_GPU_IS_LOST})
    topology = collect("dgx-a100", faults)
    if function == "nvmlDeviceGetTopologyCommonAncestor":
        # The pair query cannot say which side fell off; its pairs read SYS, no GPU is blamed.
        assert topology.links[2][3].token == "NV12"
        assert topology.pcie is not None
        assert topology.pcie[2][3].token == "SYS"
        return
    assert [g.index for g in topology.gpus if g.lost] == [2]
    assert topology.links[0][1].token == "NV12"
    assert topology.links[0][2].token == "SYS"


@pytest.mark.parametrize(
    "code", [fake.NVML_ERROR_NOT_SUPPORTED, fake.NVML_ERROR_FUNCTION_NOT_FOUND]
)
@pytest.mark.parametrize(
    ("function", "field", "value"),
    [
        ("nvmlDeviceGetUUID", "uuid", None),
        ("nvmlDeviceGetName", "model", None),
        ("nvmlDeviceGetPciInfo", "pci", None),
        ("nvmlDeviceGetMemoryInfo", "mem_mib", None),
        ("nvmlDeviceGetMigMode", "mig", None),
        ("nvmlDeviceGetNumaNodeId", "gpu_numa", None),
        ("nvmlDeviceGetGpuFabricInfoV", "clique", None),
        ("nvmlDeviceGetMemoryAffinity", "numa", frozenset({0})),
    ],
)
def test_a_call_the_driver_lacks_degrades_one_field_of_one_gpu(
    code: int, function: str, field: str, value: object
) -> None:
    healthy = collect("gb200-nvl")
    topology = collect("gb200-nvl", Faults(calls={(function, 1): code}))
    assert getattr(topology.gpus[1], field) == value
    assert not topology.gpus[1].lost
    assert topology.gpus[0] == healthy.gpus[0]
    if field != "pci":
        assert topology.links == healthy.links


@pytest.mark.parametrize(
    ("function", "code"),
    [
        ("nvmlDeviceGetNvLinkState", fake.NVML_ERROR_NOT_SUPPORTED),
        ("nvmlDeviceGetNvLinkState", fake.NVML_ERROR_INVALID_ARGUMENT),
    ],
)
def test_a_link_query_saying_no_such_link_leaves_the_gpu_on_pcie(function: str, code: int) -> None:
    topology = collect("dgx-a100", Faults(calls={(function, 4): code}))
    assert not topology.gpus[4].lost
    assert topology.links[4][5].token == "PXB"
    assert topology.links[0][1].token == "NV12"


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetCpuAffinityWithinScope",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetCount",
    ],
)
def test_an_unexpected_error_fails_the_source_naming_the_call(function: str) -> None:
    faults = Faults(calls={(function, None): fake.NVML_ERROR_UNKNOWN})
    with pytest.raises(CollectError, match=function):
        collect("dgx-a100", faults)
    result = scanner("dgx-a100", "auto", faults).scan()
    assert result.topology is not None
    assert result.topology.source is Source.SYSFS
    assert result.failed[0].name == "nvml"


def test_an_old_driver_still_finds_switch_links_through_the_pci_class() -> None:
    topology = collect("dgx-a100", Faults(old_driver=True))
    assert topology.nvswitch
    assert topology.links[0][7].token == "NV12"
    assert topology.gpus[0].cpus == frozenset(range(48, 64)) | frozenset(range(176, 192))
    assert topology.gpus[0].clique is None


def test_cpu_affinity_falls_back_when_the_scoped_call_is_missing() -> None:
    faults = Faults(calls={("nvmlDeviceGetCpuAffinityWithinScope", None): 13})
    assert collect("dgx-h100", faults).gpus == collect("dgx-h100").gpus


@pytest.mark.parametrize("max_links", [12, 18, 36], ids=lambda n: f"binding walks {n} links")
def test_links_beyond_the_hardware_are_no_such_link_whatever_the_binding(max_links: int) -> None:
    topology = collect("dgx-a100", nvlink_max_links=max_links)
    assert topology.links[0][1].token == "NV12"


def test_the_gpus_own_link_count_decides_not_the_bindings_maximum() -> None:
    # NVML_FI_DEV_NVLINK_LINK_COUNT says 18: walked whatever NVML_NVLINK_MAX_LINKS says (12 in
    # old bindings, 36 in nvidia-ml-py 13), and only 18 state queries per GPU are made.
    machine = load_machine("dgx-h100")
    for max_links in (12, 18, 36):
        nvml = FakeNvml(machine, nvlink_max_links=max_links)
        topology = NvmlCollector(nvml, memory_hostfs(machine)).collect()
        assert topology is not None
        assert topology.links[0][1].token == "NV18"
        assert topology.gpus[0].nvlink == NvlinkHealth(18)
        assert nvml.calls.count("nvmlDeviceGetNvLinkState") == 8 * 18


def test_without_the_link_count_field_the_bindings_maximum_is_walked() -> None:
    # A driver without nvmlDeviceGetFieldValues: the walk of old, as far as the binding goes.
    faults = Faults(calls={("nvmlDeviceGetFieldValues", None): fake.NVML_ERROR_FUNCTION_NOT_FOUND})
    assert collect("dgx-h100", faults, nvlink_max_links=12).links[0][1].token == "NV12"
    topology = collect("dgx-h100", faults, nvlink_max_links=36)
    assert topology.links[0][1].token == "NV18"
    assert topology.gpus[0].nvlink == NvlinkHealth(18)


def test_a_gpu_whose_links_are_all_down_shows_its_pcie_paths_only() -> None:
    topology = collect("dgx-h100", Faults(links_down={5: 18}))
    assert topology.pcie is not None
    assert [c.token for c in topology.links[5]] == [c.token for c in topology.pcie[5]]
    assert topology.links[0][1].token == "NV18"
    assert topology.islands == ((0, 1, 2, 3, 4, 6, 7),)


def test_direct_nvlink_bonds_are_counted_by_remote_pci_address() -> None:
    topology = collect("dgx-1-v100")
    assert topology.links[0][3].token == "NV2"
    assert topology.links[0][1].token == "NV1"
    assert topology.links[0][5].token == "SYS"
    assert not topology.nvswitch


def test_nvml_bus_ids_are_normalized_to_the_sysfs_spelling() -> None:
    machine = load_machine("dgx-a100")
    nvml = FakeNvml(machine)
    nvml.nvmlInit()
    raw = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(7)).busId
    assert raw.startswith(b"00000000:")
    assert collect("dgx-a100").gpus[7].pci == raw.decode().lower()[4:]


def test_nvml_shuts_down_after_each_collect() -> None:
    machine = load_machine("single-gpu")
    nvml = FakeNvml(machine)
    NvmlCollector(nvml, memory_hostfs(machine)).collect()
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"
    assert not nvml.initialized


def test_a_node_without_nvidia_gpus_and_without_nvml_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    machine = load_machine("single-gpu")
    faults = Faults(init=fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    result = CollectorScanner("auto", DirHostFS(tmp_path), lambda: FakeNvml(machine, faults)).scan()
    assert result.topology is None
    assert [s.state for s in result.sources] == [SourceState.NO_DATA, SourceState.NO_DATA]
    assert not result.degraded


def _mig_machine(tmp_path: Path, spec: dict[str, object]) -> Machine:
    data = yaml.safe_load(
        (
            Path(__file__).resolve().parents[2] / "reporter/collect/simulate/profiles/dgx-a100.yaml"
        ).read_text(encoding="utf-8")
    )
    data["gpus"] = [{"index": 1, **spec}]
    path = tmp_path / "mig.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_machine(str(path))


def test_a_mig_gpu_lists_its_mig_device_uuids_and_the_others_none(tmp_path: Path) -> None:
    machine = _mig_machine(tmp_path, {"mig": True, "mig_devices": 3})
    topology = NvmlCollector(FakeNvml(machine), memory_hostfs(machine)).collect()
    assert topology is not None
    assert topology.gpus[1].mig is True
    assert topology.gpus[1].mig_devices == machine.gpus[1].mig_devices
    assert len(set(topology.gpus[1].mig_devices)) == 3
    assert all(d.startswith("MIG-") for d in topology.gpus[1].mig_devices)
    assert [g.mig_devices for g in topology.gpus if g.index != 1] == [()] * 7


def test_a_mig_gpu_without_mig_devices_yet_lists_none(tmp_path: Path) -> None:
    machine = _mig_machine(tmp_path, {"mig": True})
    nvml = FakeNvml(machine)
    topology = NvmlCollector(nvml, memory_hostfs(machine)).collect()
    assert topology is not None
    assert topology.gpus[1].mig_devices == ()
    assert nvml.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 7


def test_a_failing_mig_walk_fails_the_source_with_one_line(tmp_path: Path) -> None:
    machine = _mig_machine(tmp_path, {"mig": True, "mig_devices": 2})
    faults = Faults(calls={("nvmlDeviceGetMigDeviceHandleByIndex", 1): fake.NVML_ERROR_UNKNOWN})
    with pytest.raises(CollectError, match=r"GetMigDeviceHandleByIndex.*GPU 1"):
        NvmlCollector(FakeNvml(machine, faults), memory_hostfs(machine)).collect()


def test_a_profile_with_mig_devices_but_mig_off_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mig_devices but not mig: true"):
        _mig_machine(tmp_path, {"mig": False, "mig_devices": 2})
