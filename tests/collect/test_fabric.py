"""The fabric, the rack position, minor numbers and NVLink health, read through the fake binding.

The fake pynvml serves a profile's `fabric`, `minor` and `links_down` through the binding's own
function names, structs and errors; what is asserted is what the collector made of it, and, for
the profile interface and every bad input of issue 21, what `run --once --dry-run` and
`collect` print.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from parsers.errors import ParseError
from parsers.nvidia_proc import parse_device_minor
from reporter.cli import main
from reporter.collect import (
    LINK_ERROR_COUNTERS,
    CollectorScanner,
    LinkErrors,
    SourceState,
    build_scanner,
)
from reporter.collect import nvml as nvml_module
from reporter.collect.fabricinfo import decode_health_mask, health_mask
from reporter.collect.nvml import NvmlCollector
from reporter.collect.simulate import fake_nvml as fake
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import Machine, load_machine, shipped_profile
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs
from reporter.errors import CollectError
from reporter.schema.fabric import CONDITIONS
from reporter.schema.model import (
    FabricHealth,
    FabricState,
    GpuFabric,
    NvlinkHealth,
    RackPosition,
    Topology,
)
from reporter.serve.metrics import Metrics

CLUSTER = "6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31"
PARTITION = f"{CLUSTER}.32766"
PREFIX = "gpu.topology.io"


def collect(machine: Machine, faults: Faults | None = None, **kwargs: Any) -> Topology:
    topology = NvmlCollector(FakeNvml(machine, faults, **kwargs), memory_hostfs(machine)).collect()
    assert topology is not None
    return topology


def profile_file(tmp_path: Path, base: str, **changes: Any) -> Path:
    """A profile file: a shipped one with top-level keys replaced (`fabric` merged)."""
    data = shipped_profile(base)
    for key, value in changes.items():
        data[key] = {**data[key], **value} if key == "fabric" else value
    path = tmp_path / f"{base}-changed.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# --- the fabric -------------------------------------------------------------------------------


def test_a_gb200_tray_reports_its_fabric_health_and_rack_position() -> None:
    topology = collect(load_machine("gb200-nvl"))
    for gpu in topology.gpus:
        assert gpu.fabric == GpuFabric(
            FabricState.COMPLETED,
            CLUSTER,
            32766,
            health=FabricHealth.HEALTHY,
            position=RackPosition("1821622000007", 3, 2, 0),
        )
        assert gpu.clique == PARTITION


def test_a_driver_that_knows_only_the_v2_struct_is_read_with_it() -> None:
    machine = load_machine("gb200-nvl")
    nvml = FakeNvml(machine, Faults(fabric_v2_only=True))
    topology = NvmlCollector(nvml, memory_hostfs(machine)).collect()
    assert topology is not None
    assert [g.fabric.health if g.fabric else "none" for g in topology.gpus] == [None] * 4
    assert [g.clique for g in topology.gpus] == [PARTITION] * 4
    # v3 first, refused with a version mismatch, then v2: two calls per GPU.
    assert nvml.calls.count("nvmlDeviceGetGpuFabricInfoV") == 8


@pytest.mark.parametrize(
    "code",
    [fake.NVML_ERROR_NOT_SUPPORTED, fake.NVML_ERROR_FUNCTION_NOT_FOUND],
    ids=["the GPU has no fabric", "the driver predates the call"],
)
def test_no_fabric_is_no_fabric_and_not_an_error(code: int) -> None:
    machine = load_machine("gb200-nvl")
    faults = Faults(calls={("nvmlDeviceGetGpuFabricInfoV", None): code})
    scanner = CollectorScanner("auto", memory_hostfs(machine), lambda: FakeNvml(machine, faults))
    result = scanner.scan()
    assert [s.state for s in result.sources] == [SourceState.OK, SourceState.OK]
    assert result.topology is not None
    assert [g.fabric for g in result.topology.gpus] == [None] * 4


def test_a_platform_that_does_not_say_where_the_tray_is_leaves_the_rack_unknown() -> None:
    faults = Faults(calls={("nvmlDeviceGetPlatformInfo", None): fake.NVML_ERROR_NOT_SUPPORTED})
    topology = collect(load_machine("gb200-nvl"), faults)
    assert [g.fabric.position if g.fabric else 0 for g in topology.gpus] == [None] * 4
    assert [g.clique for g in topology.gpus] == [PARTITION] * 4


@pytest.mark.parametrize("function", ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetPlatformInfo"])
def test_an_unexpected_fabric_error_fails_the_source_naming_the_call(function: str) -> None:
    faults = Faults(calls={(function, 2): fake.NVML_ERROR_UNKNOWN})
    with pytest.raises(CollectError, match=f"{function} on GPU 2"):
        collect(load_machine("gb200-nvl"), faults)


class _LegacyFabricStruct(ctypes.Structure):
    """The C header's unversioned nvmlGpuFabricInfo_t, 28 bytes: smaller than v2 and v3."""

    _fields_ = (
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint8),
    )


def test_a_binding_whose_fabric_struct_is_not_nvmls_is_not_read_and_says_so() -> None:
    machine = load_machine("gb200-nvl")
    nvml = FakeNvml(machine)
    nvml.c_nvmlGpuFabricInfo_v3_t = _LegacyFabricStruct  # type: ignore[attr-defined]
    topology = NvmlCollector(nvml, memory_hostfs(machine)).collect()
    assert topology is not None
    fabric = topology.gpus[0].fabric
    assert fabric is not None
    assert fabric.state is FabricState.UNKNOWN
    assert fabric.problems == (
        "the binding's c_nvmlGpuFabricInfo_v3_t is not NVML's: upgrade nvidia-ml-py",
    )
    assert "nvmlDeviceGetGpuFabricInfoV" not in nvml.calls


# --- the health mask --------------------------------------------------------------------------


@pytest.mark.parametrize("condition", [c for c in CONDITIONS if c != "health-mask-invalid"])
def test_every_health_mask_condition_decodes_to_its_name(condition: str) -> None:
    assert decode_health_mask(health_mask([condition])) == ((condition,), ())


def test_a_mask_of_every_field_saying_fine_or_nothing_names_no_condition() -> None:
    assert decode_health_mask(health_mask([])) == ((), ())
    assert decode_health_mask(0) == ((), ())


def test_a_health_mask_with_every_bit_set_is_invalid_and_says_which_fields() -> None:
    conditions, problems = decode_health_mask(0xFFFFFFFF)
    assert conditions == ("health-mask-invalid",)
    assert "health mask 0xffffffff: incorrect configuration value 15 is not defined" in problems
    assert "health mask 0xffffffff: bits 0xffff0000 are not defined" in problems
    assert len(problems) == 8


def test_an_undefined_configuration_value_is_invalid_beside_the_good_conditions() -> None:
    mask = health_mask(["route-unhealthy"]) & ~(0xF << 8) | (9 << 8)
    assert decode_health_mask(mask) == (
        ("route-unhealthy", "health-mask-invalid"),
        (f"health mask {mask:#x}: incorrect configuration value 9 is not defined",),
    )


def test_a_profile_naming_an_unknown_condition_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile_file(tmp_path, "gb200-nvl", fabric={"conditions": ["on-fire"]})
    assert main(["collect", "--simulate", str(path)]) == 2
    assert "'on-fire' is not a fabric health condition" in capsys.readouterr().err


# --- the profile interface and bad input, through the CLI ---------------------------------------


def dry_run(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, str], dict[str, str], list[dict[str, Any]]]:
    """(status, labels by name, annotations by name, JSON log lines) of `run --once --dry-run`."""
    capsys.readouterr()  # what earlier steps of the test printed is not the run's
    status = main(["run", "--once", "--dry-run", "--log-format", "json", *argv])
    out, err = capsys.readouterr()
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    if not out.strip():
        return status, {}, {}, logs
    metadata = json.loads(out)["metadata"]
    labels = {k.split("/", 1)[1]: v for k, v in metadata.get("labels", {}).items()}
    annotations = {k.split("/", 1)[1]: v for k, v in metadata.get("annotations", {}).items()}
    return status, labels, annotations, logs


def warning_events(logs: list[dict[str, Any]]) -> list[str]:
    return [
        str(line["message"])
        for line in logs
        if line.get("event") == "event"
        and line.get("type") == "Warning"
        # A simulated node has no kubelet config: that Warning is not the fabric's.
        and line.get("reason") != "KubeletPolicyUnknown"
    ]


def fabric_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(("nvlink-d", "nvlink-p", "fabric"))}


def test_the_gb200_profile_publishes_its_rack_as_labels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, labels, _, logs = dry_run(["--simulate", "gb200-nvl", "--node", "gb-07"], capsys)
    assert status == 0
    assert {
        k: v for k, v in labels.items() if k.startswith(("nvlink-d", "nvlink-p", "fabric", "rack"))
    } == {
        "nvlink-domain": CLUSTER,
        "nvlink-partition": PARTITION,
        "fabric-health": "healthy",
        "rack-serial": "1821622000007",
        "rack-slot": "3",
        "rack-tray": "2",
        "rack-host": "0",
    }
    assert labels["schema"] == "v2"
    assert warning_events(logs) == []


def test_collect_prints_the_same_labels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--simulate", "gb200-nvl", "--format", "labels"]) == 0
    out = capsys.readouterr().out
    assert f"{PREFIX}/nvlink-partition={PARTITION}\n" in out
    assert f"{PREFIX}/fabric-health=healthy\n" in out


@pytest.mark.parametrize(
    ("fabric", "want", "problem"),
    [
        (
            {"state": "in-progress"},
            {"nvlink-domain": "node-gb-07", "fabric-health": "in-progress"},
            "no nvlink-partition label: fabric not completed: GPU0 in-progress",
        ),
        (
            {"health": "degraded"},
            {"nvlink-domain": CLUSTER, "nvlink-partition": PARTITION, "fabric-health": "degraded"},
            None,
        ),
        (
            {"health": "healthy", "conditions": ["route-unhealthy"]},
            {"nvlink-domain": CLUSTER, "nvlink-partition": PARTITION, "fabric-health": "unhealthy"},
            None,
        ),
        (
            {"state": 255},
            {"nvlink-domain": "node-gb-07", "fabric-health": "unknown"},
            "no nvlink-partition label: fabric not completed: GPU0 unknown",
        ),
        (
            {"clique": 2**32 - 1},
            {"nvlink-domain": CLUSTER, "fabric-health": "healthy"},
            "no nvlink-partition label: GPUs disagree on the clique",
        ),
        (
            {"health_mask": 2**32 - 1},
            {"nvlink-domain": CLUSTER, "nvlink-partition": PARTITION, "fabric-health": "degraded"},
            "NVLink fabric: GPU0,GPU1,GPU2,GPU3: health mask 0xffffffff",
        ),
        (
            {"cluster_uuid": "00000000-0000-0000-0000-000000000000"},
            {
                "nvlink-domain": "node-gb-07",
                "nvlink-partition": "node-gb-07",
                "fabric-health": "healthy",
            },
            "NVLink fabric: GPU0,GPU1,GPU2,GPU3: cluster UUID is all zero beside clique 32766",
        ),
        (
            {"chassis_serial": "18216\a\x1b[2J"},
            {"nvlink-domain": CLUSTER, "nvlink-partition": PARTITION, "fabric-health": "healthy"},
            "NVLink fabric: GPU0,GPU1,GPU2,GPU3: chassis serial '18216\\x07\\x1b[2J' is not",
        ),
        (
            {"chassis_serial": "S" * 200},
            {"nvlink-domain": CLUSTER, "nvlink-partition": PARTITION, "fabric-health": "healthy"},
            "NVLink fabric: GPU0,GPU1,GPU2,GPU3: chassis serial fills all 16 bytes",
        ),
    ],
    ids=[
        "a fabric still joining",
        "health: degraded",
        "a condition worse than the summary",
        "state 255",
        "the clique 2^32-1",
        "a health mask with every bit set",
        "an all-zero cluster UUID",
        "a rack serial with control characters",
        "a 200-byte rack serial",
    ],
)
def test_a_profile_fabric_reaches_the_labels_and_bad_values_never_a_wrong_domain(
    fabric: dict[str, Any],
    want: dict[str, str],
    problem: str | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = profile_file(tmp_path, "gb200-nvl", fabric=fabric)
    status, labels, _, logs = dry_run(["--simulate", str(path), "--node", "gb-07"], capsys)
    assert status == 0
    assert fabric_labels(labels) == want
    events = warning_events(logs)
    if problem is None:
        assert events == []
        return
    assert len(events) == 1
    assert events[0].startswith(problem)
    assert any(line["event"] == "fabric_problem" for line in logs)
    if "serial" in problem:
        assert "rack-serial" not in labels
        assert labels["rack-slot"] == "3"


def test_one_gpu_on_another_clique_withholds_the_partition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile_file(tmp_path, "gb200-nvl", gpus=[{"index": 2, "fabric": {"clique": 7}}])
    status, labels, _, logs = dry_run(["--simulate", str(path), "--node", "gb-07"], capsys)
    assert status == 0
    assert fabric_labels(labels) == {"nvlink-domain": CLUSTER, "fabric-health": "healthy"}
    (event,) = warning_events(logs)
    assert f"GPU1 {CLUSTER} clique 32766, GPU2 {CLUSTER} clique 7" in event


def test_a_15_byte_cluster_uuid_is_a_profile_error_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # NVML's clusterUuid is 16 bytes: no driver can answer 15, so the profile is wrong.
    path = profile_file(
        tmp_path, "gb200-nvl", fabric={"cluster_uuid": "6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c"}
    )
    for command in (["collect"], ["run", "--once", "--dry-run"]):
        assert main([*command, "--simulate", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "cluster_uuid: '6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c' is not a UUID (16 bytes" in err


# --- minor numbers -----------------------------------------------------------------------------


def test_collect_gives_each_gpu_its_minor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--simulate", "dgx-h100"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [g["minor"] for g in document["gpus"]] == list(range(8))


def test_a_profile_sets_minors_that_are_not_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = [{"index": i, "minor": 7 - i} for i in range(8)]
    path = profile_file(tmp_path, "dgx-h100", gpus=gpus)
    assert main(["collect", "--simulate", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [g["minor"] for g in document["gpus"]] == [7, 6, 5, 4, 3, 2, 1, 0]


def scanner_of(machine: Machine, backend: str, faults: Faults | None = None) -> CollectorScanner:
    return CollectorScanner(
        backend,
        memory_hostfs(machine),
        lambda: FakeNvml(machine, faults),
        procfs=memory_procfs(machine),
    )


def test_without_nvml_the_minor_comes_from_the_drivers_procfs_file() -> None:
    machine = load_machine("dgx-a100")
    result = scanner_of(machine, "sysfs").scan()
    assert result.topology is not None
    assert [g.minor for g in result.topology.gpus] == list(range(8))


def test_where_nvml_lacks_the_minor_procfs_fills_it() -> None:
    machine = load_machine("dgx-a100")
    faults = Faults(calls={("nvmlDeviceGetMinorNumber", None): fake.NVML_ERROR_FUNCTION_NOT_FOUND})
    result = scanner_of(machine, "auto", faults).scan()
    assert result.topology is not None
    assert [g.minor for g in result.topology.gpus] == list(range(8))
    no_proc = CollectorScanner("auto", memory_hostfs(machine), lambda: FakeNvml(machine, faults))
    topology = no_proc.scan().topology
    assert topology is not None
    assert [g.minor for g in topology.gpus] == [None] * 8


def test_the_procfs_file_as_the_driver_writes_it() -> None:
    text = (
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 583\nGPU UUID: \t GPU-0a\n"
        "Bus Location: \t 0000:1b:00.0\nDevice Minor: \t 3\nGPU Excluded:\t No\n"
    )
    assert parse_device_minor(text) == 3
    for bad in ("Model: \t\t x\n", "Device Minor: \t -1\n", "Device Minor: \t 2000000\n"):
        with pytest.raises(ParseError):
            parse_device_minor(bad)


# --- NVLink health -----------------------------------------------------------------------------


def test_links_down_on_a_switch_system_lower_every_bond_of_that_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile_file(tmp_path, "dgx-h100", gpus=[{"index": 3, "links_down": 2}])
    topology = collect(load_machine(str(path)))
    assert topology.gpus[3].nvlink == NvlinkHealth(18, (16, 17))
    assert [c.token for c in topology.links[3]] == ["NV16"] * 3 + ["X"] + ["NV16"] * 4
    assert topology.links[0][1].token == "NV18"
    status, labels, annotations, _ = dry_run(["--simulate", str(path), "--node", "dgx-01"], capsys)
    assert status == 0
    assert labels["nvlink-health"] == "degraded"
    assert "GPU3 NV16 NV16 NV16 X    NV16" in annotations["matrix"]
    assert "NVLINKS DOWN: GPU3 2/18" in annotations["matrix"]


def test_a_gpu_with_no_active_link_left_is_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile_file(tmp_path, "dgx-h100", gpus=[{"index": 5, "links_down": 18}])
    status, labels, _, _ = dry_run(["--simulate", str(path), "--node", "dgx-01"], capsys)
    assert status == 0
    assert labels["nvlink-health"] == "down"


def test_a_direct_link_down_names_the_peer_whose_bond_it_lowered(tmp_path: Path) -> None:
    healthy = collect(load_machine("dgx-1-v100"))
    path = profile_file(tmp_path, "dgx-1-v100", gpus=[{"index": 0, "links_down": 1}])
    topology = collect(load_machine(str(path)))
    nvlink = topology.gpus[0].nvlink
    assert nvlink is not None
    assert nvlink.count == 6
    assert nvlink.down == (5,)
    ((peer, links),) = nvlink.lost
    assert links == 1
    assert healthy.links[0][peer].nvlinks - 1 == topology.links[0][peer].nvlinks


def test_a_down_link_whose_far_end_the_driver_will_not_name_does_not_fail_the_scan() -> None:
    # Only GPU 5's links are down, so only down links ask for their far end on it.
    faults = Faults(
        links_down={5: 18},
        calls={("nvmlDeviceGetNvLinkRemotePciInfo", 5): fake.NVML_ERROR_UNKNOWN},
    )
    topology = collect(load_machine("dgx-h100"), faults)
    assert topology.gpus[5].nvlink == NvlinkHealth(18, tuple(range(18)))
    assert not topology.gpus[5].lost


def test_a_failing_field_query_leaves_the_walk_of_old_and_no_counters() -> None:
    faults = Faults(calls={("nvmlDeviceGetFieldValues", 2): fake.NVML_ERROR_UNKNOWN})
    with capture_logs() as logs:
        topology = collect(load_machine("dgx-h100"), faults)
    assert topology.gpus[2].nvlink == NvlinkHealth(18)
    assert topology.links[2][3].token == "NV18"
    assert any(e["event"] == "nvml_field_values_failed" and e["gpu"] == 2 for e in logs)


@pytest.mark.parametrize(
    ("count", "event"),
    [(40, "nvml_link_count_above_binding"), (2**32 - 1, "nvml_link_count_invalid")],
    ids=["more links than the binding allows", "a count that is garbage"],
)
def test_a_link_count_the_binding_cannot_hold_counts_the_links_that_answer(
    count: int, event: str
) -> None:
    with capture_logs() as logs:
        topology = collect(load_machine("dgx-h100"), Faults(link_count={0: count}))
    assert topology.gpus[0].nvlink == NvlinkHealth(18)
    assert topology.links[0][1].token == "NV18"
    assert {"gpu": 0, "event": event}.items() <= next(
        e for e in logs if e["event"] == event
    ).items()


def test_a_profile_wiring_more_links_than_the_binding_allows_is_counted(tmp_path: Path) -> None:
    # 4 switches x 10 links: 40 per GPU, more than nvidia-ml-py 13's NVML_NVLINK_MAX_LINKS (36).
    nvlink = [{"gpus": "all", "switches": ["sw0", "sw1", "sw2", "sw3"], "links": 10}]
    path = profile_file(tmp_path, "dgx-h100", nvlink=nvlink)
    topology = collect(load_machine(str(path)))
    assert topology.gpus[0].nvlink == NvlinkHealth(40)
    assert topology.links[0][1].token == "NV40"


def counting_scanner(
    machine: Machine, counters: list[dict[int, dict[str, int]]]
) -> CollectorScanner:
    """A scanner whose n-th scan sees the n-th counters (the last one after that)."""
    scans = iter(counters)
    last: list[dict[int, dict[str, int]]] = []

    def load() -> FakeNvml:
        last[:] = [next(scans, last[0] if last else {})]
        return FakeNvml(machine, Faults(counters=last[0]))

    return CollectorScanner("auto", memory_hostfs(machine), load)


def test_the_counters_nvml_reads_are_the_counters_the_metric_starts_at_zero() -> None:
    read = {name for name, _ in nvml_module._ERROR_FIELDS} | {"recovery_failed"}
    assert read == set(LINK_ERROR_COUNTERS)


def test_nvlink_error_counters_are_reported_as_what_each_scan_added() -> None:
    machine = load_machine("dgx-h100")
    scanner = counting_scanner(
        machine,
        [
            {0: {"replay": 100, "recovery_failed": 1}},
            {0: {"replay": 105, "recovery_failed": 1}, 4: {"crc_data": 2}},
            {0: {"replay": 3, "recovery_failed": 1}},
        ],
    )
    assert scanner.scan().link_errors == ()  # the first reading is the baseline
    metrics = Metrics()
    # Every counter has a series from the start, so a rate over it reads 0, not nothing.
    for counter in LINK_ERROR_COUNTERS:
        line = f'topo_reporter_nvlink_errors_total{{counter="{counter}"}} 0.0'
        assert line.encode() in metrics.render()
    second = scanner.scan()
    assert second.link_errors == (LinkErrors(0, "replay", 5), LinkErrors(4, "crc_data", 2))
    metrics.scanned(second, 0.01)
    assert b'topo_reporter_nvlink_errors_total{counter="replay"} 5.0' in metrics.render()
    with capture_logs() as logs:
        third = scanner.scan()
    # The driver reloaded: replay went back to 3, which is what happened since.
    assert third.link_errors == (LinkErrors(0, "replay", 3),)
    assert any(e["event"] == "nvlink_counter_reset" and e["was"] == 105 for e in logs)
    assert second.topology == third.topology  # counters never change the published topology


def test_the_scanner_of_a_simulated_machine_reads_its_procfs() -> None:
    scan: Callable[[], Any] = build_scanner("sysfs", Path("/sys"), "dgx-h100").scan
    topology = scan().topology
    assert topology is not None
    assert [g.minor for g in topology.gpus] == list(range(8))
