"""Settings: defaults → YAML file → environment → flags, and one clear error for a bad value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from reporter.errors import ConfigError
from reporter.settings import Settings, add_arguments, parse_duration, resolve


def flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_defaults_are_the_agreed_contract() -> None:
    s = resolve(flags("--node", "n1"), {})
    assert s == Settings(node="n1")
    assert (s.prefix, s.interval_s, s.resync_s, s.listen) == (
        "gpu.topology.io",
        60.0,
        300.0,
        "0.0.0.0:8080",
    )


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("interval: 2m\nresync: 10m\nprefix: file.example.com\nsysfs_root: /f\n")
    env = {
        "TOPO_REPORTER_CONFIG": str(config),
        "NODE_NAME": "from-downward-api",
        "TOPO_REPORTER_RESYNC": "15m",
        "TOPO_REPORTER_PREFIX": "env.example.com",
    }
    s = resolve(flags("--prefix", "flag.example.com"), env)
    assert s.node == "from-downward-api"
    assert s.interval_s == 120.0  # file
    assert s.resync_s == 900.0  # env over file
    assert s.prefix == "flag.example.com"  # flag over env
    assert s.sysfs_root == "/f"
    assert s.config_file == str(config)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TOPO_REPORTER_NODE": "a", "NODE_NAME": "b"}, "a"),
        ({"NODE_NAME": "b"}, "b"),
        ({"TOPO_REPORTER_NODE": "", "NODE_NAME": "b"}, "b"),
    ],
    ids=["TOPO_REPORTER_NODE first", "NODE_NAME from the downward API", "empty means unset"],
)
def test_node_name_sources(env: dict[str, str], expected: str) -> None:
    assert resolve(flags(), env).node == expected


def test_namespace_falls_back_to_the_pods_and_listen_can_be_emptied() -> None:
    s = resolve(flags(), {"NODE_NAME": "n", "POD_NAMESPACE": "gpu", "TOPO_REPORTER_LISTEN": ""})
    assert (s.namespace, s.listen) == ("gpu", "")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1m30s", 90.0), ("0.5", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, name="interval") == seconds


BAD = [
    ("no node and no dry-run", [], {}, "no node name: pass --node"),
    (
        "a duration with a unit we do not know",
        ["--node", "n", "--interval", "5d"],
        {},
        "interval (--interval) '5d' is not a duration",
    ),
    ("a zero interval", ["--node", "n", "--interval", "0"], {}, "must be positive"),
    ("an upper-case prefix", ["--node", "n", "--prefix", "GPU.io"], {}, "is not a DNS subdomain"),
    (
        "the reserved kubernetes.io prefix",
        ["--node", "n", "--prefix", "kubernetes.io"],
        {},
        "prefix 'kubernetes.io' is in kubernetes.io, which Kubernetes reserves",
    ),
    (
        "a subdomain of kubernetes.io",
        ["--node", "n", "--prefix", "node-role.kubernetes.io"],
        {},
        "is in kubernetes.io, which Kubernetes reserves",
    ),
    (
        "the reserved k8s.io prefix from the environment",
        ["--node", "n"],
        {"TOPO_REPORTER_PREFIX": "k8s.io"},
        "is in k8s.io, which Kubernetes reserves",
    ),
    (
        "a subdomain of k8s.io",
        ["--node", "n", "--prefix", "gpu.x-k8s.k8s.io"],
        {},
        "is in k8s.io, which Kubernetes reserves",
    ),
    (
        "an unknown backend",
        ["--node", "n"],
        {"TOPO_REPORTER_BACKEND": "cuda"},
        "backend 'cuda' is not one of auto, nvml, sysfs",
    ),
    (
        "a listen address without a port",
        ["--node", "n", "--listen", "0.0.0.0"],
        {},
        "is not host:port",
    ),
    (
        "a bad duration in the environment names the variable",
        ["--node", "n"],
        {"TOPO_REPORTER_RESYNC": "soon"},
        "from TOPO_REPORTER_RESYNC",
    ),
]


@pytest.mark.parametrize(("argv", "env", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_values_are_one_clear_line(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        resolve(flags(*argv), env)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_dry_run_needs_no_node() -> None:
    assert resolve(flags("--dry-run", "--once"), {}).node is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("interval: [1, 2\n", "is not YAML"),
        ("- a\n", "must be a mapping"),
        ("intervall: 5m\n", "unknown setting 'intervall'"),
    ],
    ids=["broken YAML", "not a mapping", "a misspelt setting"],
)
def test_a_bad_settings_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        resolve(flags("--config", str(path), "--node", "n"), {})
