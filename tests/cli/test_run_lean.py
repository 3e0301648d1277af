"""The agent without the `kubernetes` package: the client `run` picks, what each command loads.

A small wrapper runs `reporter.cli.main` in a fresh interpreter and records whether `kubernetes`
ended up in `sys.modules`: the lean client must serve a pod and a plain kubeconfig without it, and
a kubeconfig with an exec plugin must still work, through the official client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.test_run import NODE, env
from tests.support.kube_double import ApiServerDouble, Certificate, write_kubeconfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
NVIDIA_SMI = next(p for p in sorted((FIXTURES / "nvidia-smi").iterdir()) if p.suffix == ".txt")
WRAPPER = textwrap.dedent(
    """
    import sys
    from reporter.cli import main
    status = main(sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        f.write(str("kubernetes" in sys.modules))
    sys.exit(status)
    """
)


def run_cli(
    tmp_path: Path, *argv: str, **environ: str
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """The CLI's result, and whether it imported kubernetes."""
    loaded = tmp_path / "kubernetes-loaded"
    result = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(loaded), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TOPO_REPORTER_LOG_FORMAT="json", **environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result, loaded.read_text() == "True"


def api_client(result: subprocess.CompletedProcess[str]) -> str:
    (line,) = [e for e in map(json.loads, result.stderr.splitlines()) if e["event"] == "api_client"]
    return str(line["api_client"])


COMMANDS = [
    ("run --dry-run", ["run", "--simulate", "dgx-h100", "--once", "--dry-run"]),
    ("collect", ["collect", "--simulate", "dgx-h100"]),
    ("parse", ["parse", str(NVIDIA_SMI)]),
    ("best-set", ["best-set", "--gpus", "2", str(NVIDIA_SMI)]),
    ("profiles", ["profiles"]),
    ("dra-template --machine", ["dra-template", "--gpus", "2", "--machine", "dgx-h100"]),
]


@pytest.mark.parametrize("argv", [c[1] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_commands_that_need_no_cluster_do_not_load_kubernetes(
    tmp_path: Path, argv: list[str]
) -> None:
    _, loaded = run_cli(tmp_path, *argv, KUBECONFIG="/nonexistent")
    assert not loaded


def test_run_with_a_plain_kubeconfig_publishes_through_the_lean_client_without_kubernetes(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    result, loaded = run_cli(
        tmp_path,
        *["run", "--simulate", "dgx-h100", "--once", "--listen", ""],
        KUBECONFIG=str(kubeconfig),
        NODE_NAME=NODE,
    )
    assert apiserver.labels(NODE)["gpu.topology.io/count"] == "8"
    assert api_client(result) == "lean"
    assert not loaded


def test_an_exec_plugin_kubeconfig_falls_back_to_the_official_client(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    plugin = write_kubeconfig(
        tmp_path / "exec.kubeconfig",
        apiserver.url,
        "agent-token",
        ca_cert=apiserver_certificate.cert,
        exec_plugin=True,
    )
    result, loaded = run_cli(
        tmp_path,
        *["run", "--simulate", "dgx-h100", "--once", "--listen", ""],
        KUBECONFIG=str(plugin),
        NODE_NAME=NODE,
    )
    assert apiserver.labels(NODE)["gpu.topology.io/count"] == "8"
    assert api_client(result) == "official"
    assert loaded
