"""`topo-reporter run --sink nodefeature` as a user runs it, and what kubectl shows afterwards."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reporter.publish import nodefeature as nf
from tests.cli.test_run import CLI, NODE, env
from tests.support.kube_double import ApiServerDouble, write_kubeconfig
from tests.support.kubectl_support import kubectl

NAMESPACE = "gpu-topology"
TOKEN = "nodefeature-agent-token"


@pytest.fixture
def nf_kubeconfig(apiserver: ApiServerDouble, apiserver_certificate: Any, tmp_path: Path) -> Path:
    apiserver.tokens[TOKEN] = frozenset(
        {f"{verb} nodefeatures" for verb in nf.RBAC_VERBS} | {"create events"}
    )
    return write_kubeconfig(
        tmp_path / "nf.kubeconfig", apiserver.url, TOKEN, ca_cert=apiserver_certificate.cert
    )


def run(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--sink", "nodefeature", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(**environ),
        check=False,
    )


def test_dry_run_prints_the_nodefeature_object_without_a_cluster() -> None:
    result = run("--dry-run", "--node", NODE, "--namespace", NAMESPACE, KUBECONFIG="/nonexistent")
    assert result.returncode == 0, result.stderr
    obj = json.loads(result.stdout)
    assert obj["kind"] == "NodeFeature"
    assert obj["metadata"]["name"] == f"{NODE}-topo-reporter"
    assert obj["metadata"]["namespace"] == NAMESPACE
    assert obj["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"] == NODE
    assert obj["spec"]["labels"]["gpu.topology.io/count"] == "8"
    gpus = obj["spec"]["features"]["instances"]["gputopology.gpu"]["elements"]
    assert len(gpus) == 8
    assert "resourceVersion" not in obj["metadata"]


def test_once_creates_the_object_with_only_the_namespaced_role(
    apiserver: ApiServerDouble, nf_kubeconfig: Path
) -> None:
    result = run(
        "--listen",
        "",
        KUBECONFIG=str(nf_kubeconfig),
        NODE_NAME=NODE,
        POD_NAMESPACE=NAMESPACE,
        TOPO_REPORTER_LOG_FORMAT="json",
    )
    assert result.returncode == 0, result.stderr
    obj = apiserver.nodefeatures.get(NAMESPACE, f"{NODE}-topo-reporter")
    assert obj is not None
    assert obj["spec"]["labels"]["gpu.topology.io/interconnect"] == "nvswitch"
    events = [json.loads(line)["event"] for line in result.stderr.splitlines()]
    assert "nodefeature_created" in events
    assert TOKEN not in result.stderr


def test_a_node_name_nfd_cannot_take_is_one_line_and_exit_2(nf_kubeconfig: Path) -> None:
    result = run("--node", "n" * 64, KUBECONFIG=str(nf_kubeconfig), POD_NAMESPACE=NAMESPACE)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "at most 63 characters; use --sink node" in line


def test_without_nfd_the_agent_exits_one_saying_to_install_it(
    apiserver: ApiServerDouble, nf_kubeconfig: Path
) -> None:
    apiserver.nodefeatures.installed = False
    result = run("--node", NODE, KUBECONFIG=str(nf_kubeconfig), TOPO_REPORTER_LOG_FORMAT="json")
    assert result.returncode == 1
    refused = [json.loads(x) for x in result.stderr.splitlines() if "refused" in x]
    assert "install Node Feature Discovery" in refused[0]["error"]


def test_kubectl_lists_the_object_and_describe_node_shows_the_event(
    apiserver: ApiServerDouble, nf_kubeconfig: Path, admin_kubeconfig: Path
) -> None:
    assert (
        run(
            "--node", NODE, "--namespace", NAMESPACE, "--listen", "", KUBECONFIG=str(nf_kubeconfig)
        ).returncode
        == 0
    )

    def kubectl_out(*args: str) -> str:
        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(admin_kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = kubectl_out("get", "nodefeatures", "-n", NAMESPACE, "-o", "name")
    assert listed.split() == [f"nodefeature.nfd.k8s-sigs.io/{NODE}-topo-reporter"]
    matrix = kubectl_out(
        "get",
        "nodefeature",
        "-n",
        NAMESPACE,
        f"{NODE}-topo-reporter",
        "-o",
        r"jsonpath={.spec.features.attributes.gputopology\.annotations.elements.matrix}",
    )
    assert matrix.startswith("8x NVIDIA H100 80GB HBM3, NVSwitch NV18")
    described = kubectl_out("describe", "node", NODE)
    assert "GPUTopologyChanged" in described
    assert "gpu.topology.io/count" not in described  # nfd-master labels the Node, not the agent
