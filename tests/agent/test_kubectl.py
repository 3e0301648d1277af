"""What an operator sees: the real kubectl against the double after the agent published."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from parsers.kubelet import KubeletPolicies
from reporter.collect.kubelet import KubeletReading
from reporter.schema.matrix import describe_matrix
from tests.support.agent_support import (
    NODE,
    PREFIX,
    FakeScanner,
    WireAgent,
    ok,
    topology,
    wire_agent,
)
from tests.support.describe_machines import machines
from tests.support.kube_double import ApiServerDouble
from tests.support.kubectl_support import describe_node, described_annotations, kubectl

WIDEST = [
    "profile dgx-h100",
    "profile dgx-a100",
    "profile dgx-2",
    "profile gb200-nvl",
    "fixture 27-8gpu-nv18-12nic-numa-off-all-node",
    "generated 16 GPUs 12 NICs",
]
"""The machines with the most columns: 8 GPUs with 8 and 12 NICs, 16 GPUs, Grace NUMA IDs."""

CUT_BY_DESIGN = {f"{PREFIX}/topology", f"{PREFIX}/owned"}
"""One-line JSON and a key list: for programs, which read the whole value, not for describe."""


@pytest.mark.parametrize("machine", WIDEST)
def test_kubectl_describe_node_shows_every_line_of_our_annotations_whole(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    admin_kubeconfig: Path,
    machine: str,
) -> None:
    published = machines()[machine]
    policies = KubeletPolicies("single-numa-node", "container", "static")
    # One API client is enough: what kubectl shows does not depend on which one wrote it.
    wire_agent(
        kubeconfig, FakeScanner([ok(published)]), kubelet=lambda: KubeletReading(policies)
    ).agent.step()
    shown = described_annotations(describe_node(admin_kubeconfig, NODE))
    ours = {k: v for k, v in shown.items() if k.startswith(f"{PREFIX}/")}
    assert set(ours) >= {*CUT_BY_DESIGN, f"{PREFIX}/matrix"}
    cut = {k for k, lines in ours.items() if any(line.endswith("...") for line in lines)}
    assert cut == CUT_BY_DESIGN  # and the topology line shows what a cut looks like
    assert ours[f"{PREFIX}/matrix"] == describe_matrix(published).splitlines()


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
