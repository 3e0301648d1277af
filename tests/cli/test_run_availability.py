"""`run --availability` as a user starts it: flags, environment and settings file, each bad value in
one line, `--simulate-used`, and what a dry run prints."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from reporter.collect import build_scanner
from reporter.collect.kubelet import POD_RESOURCES_SOCKET
from reporter.collect.podresources import DEFAULT_RESOURCES
from reporter.errors import ConfigError
from reporter.free_sets import compute_availability
from reporter.schema.availability import decode_availability
from reporter.settings import Settings, add_arguments, resolve
from tests.cli.test_run import CLI, env
from tests.support.podresources_double import PodResourcesDouble, devices_state, pod_state

PREFIX = "gpu.topology.io"


def flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_availability_is_off_by_default_with_the_agreed_defaults() -> None:
    s = resolve(flags("--node", "n"), {})
    assert (s.availability, s.availability_interval_s, s.simulate_used) == (False, 10.0, None)
    assert s.pod_resources_socket == POD_RESOURCES_SOCKET
    assert POD_RESOURCES_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config = tmp_path / "s.yaml"
    config.write_text(
        "availability: true\navailability-interval: 30s\npod-resources-socket: /f.sock\n"
        "simulate: dgx-h100\nsimulate-used: [3, 1]\n"
    )
    from_file = resolve(flags("--config", str(config), "--node", "n"), {})
    assert from_file.availability
    assert from_file.availability_interval_s == 30.0
    assert from_file.pod_resources_socket == "/f.sock"
    assert from_file.simulate_used == (1, 3)
    environ = {
        "TOPO_REPORTER_CONFIG": str(config),
        "TOPO_REPORTER_AVAILABILITY_INTERVAL": "1m",
        "TOPO_REPORTER_SIMULATE_USED": "0,2,2",
    }
    from_env = resolve(flags("--node", "n"), environ)
    assert (from_env.availability_interval_s, from_env.simulate_used) == (60.0, (0, 2))
    from_flags = resolve(
        flags("--node", "n", "--availability-interval", "5s", "--simulate-used", ""), environ
    )
    assert (from_flags.availability_interval_s, from_flags.simulate_used) == (5.0, ())


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("yes", True), ("false", False), ("0", False), ("off", False)],
)
def test_the_environment_turns_availability_on_and_off(text: str, expected: bool) -> None:
    s = resolve(flags("--node", "n"), {"TOPO_REPORTER_AVAILABILITY": text})
    assert s.availability is expected


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--simulate-used", "0,1"], {}, "--simulate-used needs --simulate PROFILE"),
        (["--simulate", "dgx-h100", "--simulate-used", "0"], {}, "needs --availability"),
        (
            ["--availability", "--simulate", "dgx-h100", "--simulate-used", "0,x"],
            {},
            "is not a comma-separated list of GPU indexes",
        ),
        (
            ["--availability", "--simulate", "dgx-h100", "--simulate-used", "-1"],
            {},
            "is not a comma-separated list of GPU indexes",
        ),
        (["--availability", "--sink", "nodefeature"], {}, "it needs --sink node"),
        (
            ["--availability-interval", "0.5s"],
            {},
            "availability-interval (--availability-interval)",
        ),
        (["--availability-interval", "soon"], {}, "is not a duration"),
        ([], {"TOPO_REPORTER_AVAILABILITY": "maybe"}, "is not true or false"),
        (["--availability", "--pod-resources-socket", ""], {}, "pod-resources-socket is empty"),
    ],
)
def test_bad_values_are_one_clear_line(
    argv: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve(flags("--node", "n", *argv), environ)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_settings_built_in_code_are_checked_the_same() -> None:
    with pytest.raises(ConfigError, match="from 1s to 24h"):
        Settings(node="n", availability_interval_s=0.1).validate()


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--dry-run", "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )


def test_an_index_not_in_the_profile_is_refused_in_one_line_before_anything_is_published() -> None:
    result = dry_run("--availability", "--simulate-used", "1,8,9")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "topo-reporter: error: --simulate-used: GPU 8 is not in profile dgx-h100, which has "
        "GPUs 0 to 7"
    )


def patches(stdout: str) -> list[dict[str, dict[str, dict[str, str]]]]:
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(stdout.rstrip()):
        doc, at = decoder.raw_decode(stdout, at)
        out.append(doc)
        at += 1
    return out


def test_a_dry_run_prints_the_topology_patch_then_the_availability_patch() -> None:
    result = dry_run("--availability", "--simulate-used", "0,1,2")
    assert result.returncode == 0, result.stderr
    topology_patch, availability_patch = patches(result.stdout)
    assert f"{PREFIX}/topology" in topology_patch["metadata"]["annotations"]
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    text = availability_patch["metadata"]["annotations"][f"{PREFIX}/availability"]
    assert decode_availability(text) == compute_availability(scan.topology, range(3, 8))
    assert availability_patch["metadata"]["labels"] == {
        f"{PREFIX}/gpu-free": "5",
        f"{PREFIX}/gpu-free-nvlink-max": "5",
    }
    assert "availability_patched" in result.stderr


def test_without_availability_a_dry_run_prints_no_availability_and_loads_no_grpc() -> None:
    result = dry_run()
    assert result.returncode == 0, result.stderr
    (only,) = patches(result.stdout)
    assert f"{PREFIX}/availability" not in only["metadata"]["annotations"]
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, reporter.cli; "
            "reporter.cli.main(['run', '--simulate', 'dgx-h100', '--once', '--dry-run', "
            "'--listen', '']); print('grpc' in sys.modules, file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TOPO_REPORTER_LOG_LEVEL="error"),
        check=True,
    )
    assert probe.stderr.strip().splitlines()[-1] == "False"


def test_once_without_a_kubelet_publishes_the_topology_and_exits_1() -> None:
    result = dry_run("--availability", "--pod-resources-socket", "/nonexistent/kubelet.sock")
    assert result.returncode == 1
    (only,) = patches(result.stdout)
    assert f"{PREFIX}/topology" in only["metadata"]["annotations"]
    assert "podresources_read_failed" in result.stderr
    assert "no PodResources socket at /nonexistent/kubelet.sock" in result.stderr


def test_gpu_resource_names_reach_the_reader(tmp_path: Path) -> None:
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    ids = [g.uuid for g in scan.topology.gpus if g.uuid is not None]
    state = {
        "devices": devices_state("example.com/gpu", ids),
        "pods": [pod_state("a", "example.com/gpu", ids[6:])],
    }
    with (
        tempfile.TemporaryDirectory(dir="/tmp") as short,
        PodResourcesDouble(Path(short) / "k.sock", state) as kubelet,
    ):
        socket = ["--pod-resources-socket", str(kubelet.socket)]
        named = dry_run("--availability", *socket, "--gpu-resource", "example.com/gpu")
        default = dry_run("--availability", *socket)
    assert named.returncode == 0, named.stderr
    assert patches(named.stdout)[1]["metadata"]["labels"][f"{PREFIX}/gpu-free"] == "6"
    # NVIDIA's names, the default, match none of this kubelet's devices: nothing is published.
    assert default.returncode == 1
    assert "the kubelet offers no device named nvidia.com/gpu" in default.stderr


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--gpu-resource", "a.io/gpu", "--gpu-resource", "b.io/*"], {}),
        ([], {"TOPO_REPORTER_GPU_RESOURCES": "a.io/gpu, b.io/*,a.io/gpu"}),
    ],
)
def test_gpu_resource_names_from_flags_or_the_environment(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert resolve(flags("--node", "n", *argv), environ).gpu_resources == ("a.io/gpu", "b.io/*")


def test_the_help_names_the_readers_default_resources() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert ", ".join(DEFAULT_RESOURCES) in text


def test_a_resource_name_the_reader_refuses_is_one_line() -> None:
    result = dry_run("--availability", "--gpu-resource", "nvidia.com/gpu shared")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        "topo-reporter: error: PodResources resource name 'nvidia.com/gpu shared' is not"
    )


def test_a_dry_run_with_nrt_prints_the_nodes_resource_topology_from_the_simulated_use() -> None:
    # A simulated machine has no kubelet config: without the policy stated, no object at all.
    absent = ("--kubelet-config", "/nonexistent/kubelet/config.yaml")
    unstated = dry_run("--availability", "--nrt", "--simulate-used", "0,1,5", *absent)
    assert unstated.returncode == 0, unstated.stderr
    assert [p for p in patches(unstated.stdout) if p.get("kind") == "NodeResourceTopology"] == []
    assert "the kubelet's Topology Manager policy is unknown" in unstated.stderr
    result = dry_run(
        "--availability",
        "--nrt",
        "--simulate-used",
        "0,1,5",
        "--topology-manager-policy",
        "single-numa-node",
        *absent,
    )
    assert result.returncode == 0, result.stderr
    printed: list[Any] = patches(result.stdout)
    (nrt_object,) = [p for p in printed if p.get("kind") == "NodeResourceTopology"]
    gpus = {
        z["name"]: next(r for r in z["resources"] if r["name"] == "nvidia.com/gpu")
        for z in nrt_object["zones"]
    }
    assert {name: (r["capacity"], r["available"]) for name, r in gpus.items()} == {
        "node-0": ("4", "2"),
        "node-1": ("4", "3"),
    }
    memory = {
        z["name"]: next(r["capacity"] for r in z["resources"] if r["name"] == "memory")
        for z in nrt_object["zones"]
    }
    # The profile's NUMA memory, through the simulated sysfs's node meminfo.
    assert memory == {"node-0": str(1 << 40), "node-1": str(1 << 40)}
