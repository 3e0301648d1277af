"""Settings: defaults → YAML file → environment → flags, and one clear error for a bad value."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from reporter.cli import main
from reporter.errors import ConfigError
from reporter.settings import Settings, add_arguments, resolve


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


BAD = [
    ("no node and no dry-run", [], {}, "no node name: pass --node"),
    (
        "a duration with a unit we do not know",
        ["--node", "n", "--interval", "5d"],
        {},
        "interval (--interval) '5d' is not a duration",
    ),
    ("a zero interval", ["--node", "n", "--interval", "0"], {}, "from 1s to 24h"),
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
        "backend (from TOPO_REPORTER_BACKEND) 'cuda' is not one of auto, nvml, sysfs",
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
    (
        "nrt without availability",
        ["--node", "n", "--nrt"],
        {},
        "--nrt needs --availability",
    ),
    (
        "nrt from the environment without availability",
        ["--node", "n"],
        {"TOPO_REPORTER_NRT": "true", "TOPO_REPORTER_AVAILABILITY": "false"},
        "--nrt needs --availability",
    ),
    (
        "a topology manager policy the kubelet does not know",
        ["--node", "n", "--topology-manager-policy", "numa"],
        {},
        "topology-manager-policy (--topology-manager-policy) 'numa' is not one of none, "
        "best-effort, restricted, single-numa-node",
    ),
    (
        "a topology manager scope from the environment the kubelet does not know",
        ["--node", "n"],
        {"TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE": "node"},
        "topology-manager-scope (from TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE) 'node' is not one of "
        "container, pod",
    ),
    (
        "a boolean that is neither true nor false",
        ["--node", "n"],
        {"TOPO_REPORTER_NRT": "yes please"},
        "nrt (from TOPO_REPORTER_NRT) 'yes please' is not true or false",
    ),
    (
        "a heartbeat without availability",
        ["--node", "n", "--heartbeat"],
        {},
        "--heartbeat needs --availability",
    ),
    (
        "a heartbeat shorter than three availability intervals",
        ["--node", "n", "--availability", "--heartbeat", "--heartbeat-duration", "20s"],
        {},
        "heartbeat-duration 20s is shorter than three availability intervals (30s)",
    ),
    (
        "withdrawing after no failed read",
        ["--node", "n", "--availability-withdraw-after", "0"],
        {},
        "availability-withdraw-after must be a number of failed reads from 1 to 100, not 0",
    ),
    (
        "a count in digits that are not ASCII",
        ["--node", "n"],
        {"TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER": "\u00b2"},
        "(from TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER) '\u00b2' is not a whole number",
    ),
    (
        "a count of 5,000 digits",
        ["--node", "n", "--availability-withdraw-after", "9" * 5000],
        {},
        "(--availability-withdraw-after) '99999",
    ),
    (
        "both network sources: each writes network-tier-0",
        ["--node", "n", "--network-lldp"],
        {"TOPO_REPORTER_NETWORK_INFINIBAND": "true"},
        "--network-lldp and --network-infiniband both publish network-tier-0",
    ),
    (
        "compute HCAs named without InfiniBand discovery",
        ["--node", "n", "--network-infiniband-hcas", "mlx5_0"],
        {},
        "--network-infiniband-hcas names the HCAs InfiniBand discovery walks from: it needs "
        "--network-infiniband",
    ),
    (
        "an HCA name that is a path",
        ["--node", "n", "--network-infiniband"],
        {"TOPO_REPORTER_NETWORK_INFINIBAND_HCAS": "mlx5_0,../../etc"},
        "--network-infiniband-hcas: '../../etc' is not an RDMA device name",
    ),
    (
        "Topograph's labels through a NodeFeature",
        ["--node", "n", "--network-label-style", "topograph", "--sink", "nodefeature"],
        {},
        "--network-label-style topograph writes fabric.topograph.run/ labels on the Node",
    ),
    (
        "a label style nobody reads",
        ["--node", "n", "--network-label-style", "kueue"],
        {},
        "'kueue'",
    ),
]


@pytest.mark.parametrize(("argv", "env", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_values_are_one_clear_line(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        resolve(flags(*argv), env)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("argv", "env", "file"),
    [
        (["--availability", "--nrt"], {}, ""),
        ([], {"TOPO_REPORTER_AVAILABILITY": "true", "TOPO_REPORTER_NRT": "True"}, ""),
        ([], {}, "availability: true\nnrt: true\n"),
        (["--nrt"], {"TOPO_REPORTER_AVAILABILITY": "true"}, "nrt: false\n"),
    ],
    ids=["flags", "the environment (the chart)", "the settings file", "a flag over the file"],
)
def test_nrt_with_availability_from_every_source(
    tmp_path: Path, argv: list[str], env: dict[str, str], file: str
) -> None:
    if file:
        (tmp_path / "s.yaml").write_text(file)
        argv = [*argv, "--config", str(tmp_path / "s.yaml")]
    s = resolve(flags("--node", "n", *argv), env)
    assert (s.availability, s.nrt) == (True, True)


@pytest.mark.parametrize(
    ("argv", "env", "file"),
    [
        (
            ["--availability-withdraw-after", "5", "--heartbeat", "--heartbeat-duration", "2m"],
            {},
            "",
        ),
        (
            [],
            {
                "TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER": "5",
                "TOPO_REPORTER_HEARTBEAT": "true",
                "TOPO_REPORTER_HEARTBEAT_DURATION": "2m",
            },
            "",
        ),
        ([], {}, "availability-withdraw-after: 5\nheartbeat: true\nheartbeat-duration: 120\n"),
    ],
    ids=["flags", "the environment (the chart)", "the settings file"],
)
def test_withdrawal_and_heartbeat_from_every_source(
    tmp_path: Path, argv: list[str], env: dict[str, str], file: str
) -> None:
    if file:
        (tmp_path / "s.yaml").write_text(file)
        argv = [*argv, "--config", str(tmp_path / "s.yaml")]
    s = resolve(flags("--node", "n", "--availability", *argv), env)
    assert (s.availability_withdraw_after, s.heartbeat, s.heartbeat_duration_s) == (5, True, 120.0)
    default = resolve(flags("--node", "n", "--availability"), {})
    assert (default.availability_withdraw_after, default.heartbeat) == (2, False)
    assert default.heartbeat_duration_s == 40.0


def test_dry_run_needs_no_node() -> None:
    assert resolve(flags("--dry-run", "--once"), {}).node is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("interval: [1, 2\n", "is not YAML"),
        ("- a\n", "must be a mapping"),
        ("intervall: 5m\n", "unknown setting 'intervall' \\(did you mean interval\\?"),
        (
            "topologyManagerPolicy: none\n",
            "unknown setting 'topologyManagerPolicy' \\(did you mean topology-manager-policy ",
        ),
        ("zzzz: 1\n", "unknown setting 'zzzz' \\(every setting is a flag"),
    ],
    ids=[
        "broken YAML",
        "not a mapping",
        "a misspelt setting",
        "the kubelet's camelCase name",
        "nothing near",
    ],
)
def test_a_bad_settings_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        resolve(flags("--config", str(path), "--node", "n"), {})


ABSURD_DURATIONS = [
    ("nan", "is not a duration"),
    ("NaN", "is not a duration"),
    ("inf", "is not a duration"),
    ("-inf", "is not a duration"),
    ("Infinity", "is not a duration"),
    ("1e309", "is not a duration"),
    ("1e-400", "is not a duration"),
    ("1_0", "is not a duration"),
    ("-5", "is not a duration"),
    ("0", "not 0 seconds"),
    ("0.5", "not 0.5 seconds"),
    ("0s", "not 0 seconds"),
    ("25h", "not 90000 seconds"),
    ("1441m", "not 86460 seconds"),
    ("9" * 400, "not inf seconds"),
    ("9" * 400 + "h", "not inf seconds"),
]


@pytest.mark.parametrize("flag", ["--interval", "--resync"])
@pytest.mark.parametrize(
    ("text", "message"), ABSURD_DURATIONS, ids=[t[:12] for t, _ in ABSURD_DURATIONS]
)
def test_non_finite_and_absurd_durations_are_refused_at_start_from_the_command_line(
    flag: str, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["run", "--simulate", "dgx-h100", "--dry-run", "--once", f"{flag}={text}"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert f"{flag[2:]} ({flag})" in err
    assert message in err
    assert len(err) < 200


CONFIG_DURATIONS = [
    ("interval: .nan", "not nan seconds"),
    ("interval: .inf", "not inf seconds"),
    ("resync: -.inf", "not -inf seconds"),
    ("interval: 1e309", "is not a duration"),
    ("interval: 1.0e+309", "not inf seconds"),
    ("resync: " + "9" * 400, "an integer of 400 digits: at most 64"),
    ("resync: -1", "not -1 seconds"),
    ("interval: 0", "not 0 seconds"),
    ("interval: 86401", "not 86401 seconds"),
    ("resync: 30h", "not 108000 seconds"),
]


@pytest.mark.parametrize(
    ("line", "message"), CONFIG_DURATIONS, ids=[t[:20] for t, _ in CONFIG_DURATIONS]
)
def test_non_finite_and_absurd_durations_are_refused_at_start_from_the_settings_file(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(line + "\n")
    status = main(["run", "--simulate", "dgx-h100", "--dry-run", "--once", "--config", str(path)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert str(path) in err
    assert message in err


@pytest.mark.parametrize("variable", ["TOPO_REPORTER_INTERVAL", "TOPO_REPORTER_RESYNC"])
def test_a_non_finite_duration_in_the_environment_names_the_variable(variable: str) -> None:
    with pytest.raises(ConfigError, match=f"from {variable}"):
        resolve(flags("--node", "n"), {variable: "nan"})


@pytest.mark.parametrize(("text", "seconds"), [("1s", 1.0), ("24h", 86400.0), ("1", 1.0)])
def test_the_duration_bounds_themselves_are_accepted(text: str, seconds: float) -> None:
    s = resolve(flags("--node", "n", "--interval", text, "--resync", text), {})
    assert (s.interval_s, s.resync_s) == (seconds, seconds)


@pytest.mark.parametrize("field", ["interval_s", "resync_s"])
@pytest.mark.parametrize("seconds", [math.nan, math.inf, 0.0, -1.0, 1e9])
def test_settings_built_in_code_are_checked_the_same(field: str, seconds: float) -> None:
    with pytest.raises(ConfigError, match="from 1s to 24h"):
        Settings(node="n", **{field: seconds}).validate()  # type: ignore[arg-type]


def test_run_nrt_without_availability_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["run", "--simulate", "dgx-h100", "--dry-run", "--once", "--nrt"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert "--nrt needs --availability" in err


def test_the_stated_topology_manager_policy_from_flags_and_the_environment() -> None:
    assert resolve(flags("--node", "n"), {}).topology_manager_policy is None
    stated = resolve(
        flags("--node", "n", "--topology-manager-policy", "single-numa-node"),
        {"TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE": "pod"},
    )
    assert (stated.topology_manager_policy, stated.topology_manager_scope) == (
        "single-numa-node",
        "pod",
    )
    chart = resolve(flags("--node", "n"), {"TOPO_REPORTER_TOPOLOGY_MANAGER_POLICY": "restricted"})
    assert (chart.topology_manager_policy, chart.topology_manager_scope) == (
        "restricted",
        "container",
    )
