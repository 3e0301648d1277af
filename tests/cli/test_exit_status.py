"""One exit-status rule for every command (docs/cli.md, "Exit status"), run through the real entry
points: 0 success; 1 a failure the user did not cause by how they called us (the cluster out of
reach or its credentials not loading, no GPU, an input that does not read, a request the topology
cannot meet, doctor's error finding); 2 bad usage, a bad value from a flag, an environment
variable, a settings file or argparse alike. The line on stderr says why, and where a value came
from."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reporter import cli, kubectl_plugin
from tests.doctor.test_cli import dgx, publish
from tests.support.agent_support import FAST
from tests.support.kube_double import ApiServerDouble, write_kubeconfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
PASTE = str(FIXTURES / "nvidia-smi" / "03-dgx-a100-nv12-mlx5.txt")
ANNOTATION = str(FIXTURES / "schema" / "v1-dgx-h100.json")
RUN_ONCE = ["run", "--simulate", "dgx-h100", "--node", "gpu-node-1", "--once", "--listen", ""]
"""The agent for one scan and one publish, with no server: its status is the publish's."""


def a_node_without_its_device_plugin(api: ApiServerDouble) -> None:
    publish(api, "gpu-node-2", dgx(), allocatable=None)


def a_healthy_gpu_node(api: ApiServerDouble) -> None:
    publish(api, "gpu-node-2", dgx())


def nothing_more(api: ApiServerDouble) -> None:
    """The double as it starts: one node, which no agent published."""


@dataclass(frozen=True)
class Case:
    """One command in one situation, and what it must end in."""

    argv: Sequence[str]
    status: int
    said: str | None = None
    """Part of the error line, the last on stderr (`{tmp}` the test's folder)."""
    env: dict[str, str] = field(default_factory=dict)
    plugin: bool = False
    """Run `kubectl gpu-topology` (reporter.kubectl_plugin.main), not `topo-reporter`."""
    cluster: Callable[[ApiServerDouble], None] | None = None
    """The API server double set up so; `{admin}` in argv is its kubeconfig."""


MISSING = "{tmp}/missing.kubeconfig"
NO_CREDENTIALS = "cannot load Kubernetes credentials from {tmp}/missing.kubeconfig"
UNREACHABLE = "cannot connect to the API server at https://127.0.0.1:"

CASES: dict[str, Case] = {
    # 0: success.
    "parse: a real paste": Case(["parse", PASTE], 0),
    "render: an annotation": Case(["render", ANNOTATION], 0),
    "collect: a simulated machine": Case(["collect", "--simulate", "dgx-h100"], 0),
    "profiles: the list": Case(["profiles"], 0),
    "run: once, as a dry run": Case(["run", "--simulate", "dgx-h100", "--once", "--dry-run"], 0),
    "best-set: K the node has": Case(["best-set", "--gpus", "4", PASTE], 0),
    "dra-template: from machine profiles": Case(
        ["dra-template", "--gpus", "2", "--machine", "dgx-h100"], 0
    ),
    "doctor: no error finding": Case(
        ["doctor", "--node", "gpu-node-2", "--kubeconfig", "{admin}"], 0, cluster=a_healthy_gpu_node
    ),
    "plugin: the GPU nodes": Case(
        ["--kubeconfig", "{admin}"], 0, plugin=True, cluster=a_healthy_gpu_node
    ),
    # 1: the kubeconfig named by KUBECONFIG is not there.
    **{
        f"{name}: KUBECONFIG names no file": Case(argv, 1, said, env={"KUBECONFIG": MISSING})
        for name, argv, said in [
            ("run", RUN_ONCE, NO_CREDENTIALS),
            ("doctor", ["doctor", "--all"], NO_CREDENTIALS),
            ("prune", ["prune"], NO_CREDENTIALS),
            ("dra-template", ["dra-template", "--gpus", "2"], NO_CREDENTIALS),
            ("extender", ["extender", "--listen", "127.0.0.1:0"], NO_CREDENTIALS),
        ]
    },
    "plugin: KUBECONFIG names no file": Case(
        [], 1, NO_CREDENTIALS, env={"KUBECONFIG": MISSING}, plugin=True
    ),
    "doctor: --kubeconfig names no file": Case(
        ["doctor", "--all", "--kubeconfig", MISSING], 1, NO_CREDENTIALS
    ),
    "plugin: --kubeconfig names no file": Case(
        ["--kubeconfig", MISSING], 1, NO_CREDENTIALS, plugin=True
    ),
    # 1: the cluster's server does not answer (the extender serves on, not ready, and retries).
    **{
        f"{name}: the server is a closed port": Case(
            argv, 1, said, env={"KUBECONFIG": "{tmp}/closed.kubeconfig"}
        )
        for name, argv, said in [
            ("run", RUN_ONCE, None),  # the agent logs each failed write; its status says it
            ("doctor", ["doctor", "--all"], UNREACHABLE),
            ("prune", ["prune"], UNREACHABLE),
            ("dra-template", ["dra-template", "--gpus", "2"], UNREACHABLE),
        ]
    },
    "plugin: the server is a closed port": Case(
        [], 1, UNREACHABLE, env={"KUBECONFIG": "{tmp}/closed.kubeconfig"}, plugin=True
    ),
    # 1: no GPU, input that does not read, a request the machines cannot meet, an error finding.
    "collect: no GPU": Case(
        ["collect", "--backend", "sysfs", "--sysfs-root", "{tmp}/sys"], 1, "no NVIDIA GPU found"
    ),
    "parse: no such file": Case(["parse", "{tmp}/absent.txt"], 1, "absent.txt"),
    "render: not a topology": Case(["render", PASTE], 1, "topo-reporter: error: "),
    "best-set: more GPUs than the node has": Case(
        ["best-set", "--gpus", "9", PASTE], 1, "asked for 9 GPUs but only 8"
    ),
    "dra-template: K past the machines": Case(
        ["dra-template", "--gpus", "9", "--machine", "dgx-h100"], 1, "no machine given has 9 GPUs"
    ),
    "dra-template: no Node publishes a topology": Case(
        ["dra-template", "--gpus", "2", "--kubeconfig", "{admin}"],
        1,
        "no Node publishes a gpu.topology.io/topology annotation",
        cluster=nothing_more,
    ),
    "doctor: an error finding": Case(
        ["doctor", "--node", "gpu-node-2", "--kubeconfig", "{admin}"],
        1,
        cluster=a_node_without_its_device_plugin,
    ),
    "network: no compute NIC in sysfs": Case(
        ["network", "--lldp", "--sysfs-root", "{tmp}/sys"],
        1,
        "no RDMA NIC with an Ethernet link layer under {tmp}/sys/class/infiniband",
    ),
    "network: an interface this host has not": Case(
        ["network", "--lldp", "--interface", "absent0", "--lldpd-socket", "{tmp}/no.socket"],
        1,
        "no network interface 'absent0' here",
    ),
    "network: no switch heard on the loopback": Case(
        ["network", "--lldp", "--interface", "lo", "--wait", "0.2", "--lldpd-socket", "{tmp}/s"],
        1,
        # Where this runs as root the socket opens and hears nothing; elsewhere it may not open.
        "topo-reporter: error: ",
    ),
    "plugin: no such node": Case(
        ["gpu-node-9", "--kubeconfig", "{admin}"],
        1,
        "node gpu-node-9 not found",
        plugin=True,
        cluster=nothing_more,
    ),
    # 2: argparse's own errors.
    "collect: a --format it does not have": Case(
        ["collect", "--format", "jsn"], 2, "argument --format: invalid choice: 'jsn'"
    ),
    "best-set: no --gpus": Case(["best-set", PASTE], 2, "the following arguments are required"),
    "best-set: a --policy it does not have": Case(
        ["best-set", "--gpus", "2", "--policy", "worst", PASTE], 2, "invalid"
    ),
    "profiles: an argument": Case(["profiles", "extra"], 2, "unrecognized arguments: extra"),
    "doctor: neither --node nor --all": Case(["doctor"], 2, "one of the arguments"),
    "dra-template: --gpus that is no number": Case(
        ["dra-template", "--gpus", "four"], 2, "'four' is not a number of GPUs"
    ),
    "network: no discovery mode": Case(
        ["network"], 2, "one of the arguments --lldp --infiniband is required"
    ),
    "network: --wait 0": Case(
        ["network", "--lldp", "--wait", "0"], 2, "'0' is not a number of seconds above 0"
    ),
    "plugin: a picture of no node": Case(
        ["--format", "dot"], 2, "--format dot draws one node", plugin=True
    ),
    "plugin: --network with a node": Case(
        ["--network", "gpu-node-1"], 2, "--network counts every node", plugin=True
    ),
    # 2: a bad value, named with where it came from: a flag, a variable, a settings file.
    "collect: --backend foo": Case(
        ["collect", "--backend", "foo"], 2, "backend (--backend) 'foo' is not one of auto, nvml"
    ),
    "collect: TOPO_REPORTER_BACKEND=foo": Case(
        ["collect", "--simulate", "dgx-h100"],
        2,
        "backend (from TOPO_REPORTER_BACKEND) 'foo' is not one of",
        env={"TOPO_REPORTER_BACKEND": "foo"},
    ),
    "run: TOPO_REPORTER_SINK=x": Case(
        ["run", "--simulate", "dgx-h100", "--once", "--dry-run"],
        2,
        "sink (from TOPO_REPORTER_SINK) 'x' is not one of node, nodefeature",
        env={"TOPO_REPORTER_SINK": "x"},
    ),
    "run: a settings file's sink: x": Case(
        ["run", "--simulate", "dgx-h100", "--once", "--dry-run", "--config", "{tmp}/bad.yaml"],
        2,
        "sink (in {tmp}/bad.yaml) 'x' is not one of node, nodefeature",
    ),
    "run: --interval 0": Case(
        ["run", "--simulate", "dgx-h100", "--once", "--dry-run", "--interval", "0"],
        2,
        "interval (--interval) must be a duration from 1s to 24h",
    ),
    "prune: TOPO_REPORTER_LOG_LEVEL=loud": Case(
        ["prune"],
        2,
        "log-level (from TOPO_REPORTER_LOG_LEVEL) 'loud' is not one of",
        env={"TOPO_REPORTER_LOG_LEVEL": "loud"},
    ),
    "prune: a namespace that cannot be one": Case(
        ["prune", "--namespace", "Bad_NS"], 2, "--namespace 'Bad_NS' is not a namespace name"
    ),
    "extender: an address without a port": Case(
        ["extender", "--listen", "nowhere"], 2, "listen 'nowhere' is not host:port"
    ),
    "extender: TOPO_REPORTER_LOG_FORMAT=xml": Case(
        ["extender"],
        2,
        "log-format (from TOPO_REPORTER_LOG_FORMAT) 'xml' is not one of",
        env={"TOPO_REPORTER_LOG_FORMAT": "xml"},
    ),
    "dra-template: --gpus 0": Case(
        ["dra-template", "--gpus", "0", "--machine", "dgx-h100"], 2, "one GPU is connected"
    ),
    "dra-template: an unknown --machine": Case(
        ["dra-template", "--gpus", "2", "--machine", "dgx-h1000"], 2, "unknown simulated machine"
    ),
    "dra-template: TOPO_REPORTER_PREFIX that is no domain": Case(
        ["dra-template", "--gpus", "2", "--machine", "dgx-h100"],
        2,
        "prefix 'Bad_Prefix' is not a DNS subdomain",
        env={"TOPO_REPORTER_PREFIX": "Bad_Prefix"},
    ),
    "dra-template: --machine and --kubeconfig": Case(
        ["dra-template", "--gpus", "2", "--machine", "dgx-h100", "--kubeconfig", MISSING],
        2,
        "--machine and --kubeconfig both given",
    ),
}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound and not listening: a connection to it is refused, and no other
    process can take it while the test runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture
def situation(
    tmp_path: Path, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], str]:
    """A clean environment (no kubeconfig, no pod, no TOPO_REPORTER_*), the files the cases name
    in the test's folder, and the retries cut short: `{tmp}` in a case's text is that folder."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "NODE_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("TOPO_REPORTER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # The agent's and prune's retries, as short as the agent tests make them.
    monkeypatch.setattr("reporter.assembly.Backoff", lambda: FAST)
    monkeypatch.setattr("reporter.commands.prune.Backoff", lambda: FAST)
    write_kubeconfig(
        tmp_path / "closed.kubeconfig", f"https://127.0.0.1:{closed_port}", "token", ca_cert=None
    )
    (tmp_path / "bad.yaml").write_text("sink: x\n")
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    return lambda text: text.replace("{tmp}", str(tmp_path))


def exit_status(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> object:
    """The status `main` returns, or the one argparse exits with."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_command_exits_0_on_success_1_on_a_failure_2_on_bad_usage(
    case: Case,
    situation: Callable[[str], str],
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = [situation(a) for a in case.argv]
    if case.cluster is not None:
        case.cluster(request.getfixturevalue("apiserver"))
        admin = str(request.getfixturevalue("admin_kubeconfig"))
        argv = [admin if a == "{admin}" else a for a in argv]
    for name, value in case.env.items():
        monkeypatch.setenv(name, situation(value))
    status = exit_status(kubectl_plugin.main if case.plugin else cli.main, argv)
    err = capsys.readouterr().err
    assert status == case.status, err
    if case.said is not None:
        # The last line: argparse prints its usage above, prune its retries (log lines).
        last = err.splitlines()[-1]
        assert situation(case.said) in last, err
        assert last.startswith(("topo-reporter", "kubectl gpu-topology")), err
        assert ": error: " in last, err
