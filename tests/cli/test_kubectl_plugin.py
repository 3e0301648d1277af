"""`kubectl gpu-topology`: the real kubectl runs the installed plugin from PATH on the double."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from parsers.kubelet import KubeletPolicies
from reporter.collect.kubelet import KubeletReading
from reporter.free_sets import compute_availability
from reporter.kubectl_plugin import build_parser
from reporter.placement_quality import HeldSet, encode_held_sets
from reporter.schema import keys
from reporter.schema.availability import encode_availability
from reporter.schema.codec import encode, to_document
from reporter.schema.matrix import describe_matrix
from reporter.schema.model import NvlinkHealth, Topology
from reporter.schema.pictures import to_dot, to_mermaid
from reporter.settings import ReaderSettings, declared, help_text
from tests.support.agent_support import NODE, PREFIX, FakeScanner, ok, wire_agent
from tests.support.describe_machines import machines
from tests.support.hostile_text import (
    ESCAPES,
    agents_event,
    controls,
    foreign_event,
    hostile_message,
)
from tests.support.kube_double import ApiServerDouble, write_kubeconfig
from tests.support.kube_double.tls import Certificate
from tests.support.kubectl_support import kubectl
from tests.support.leaf_groups import GPUS, SPINE, leaf_cluster

AGENT = {"app.kubernetes.io/name": "topo-reporter"}
Plugin = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def plugin(tmp_path: Path) -> Plugin:
    """Runs `kubectl gpu-topology ARGS` as an operator would: the plugin found on PATH, no
    kubeconfig but the one passed (a fresh HOME, KUBECONFIG only when given)."""
    home = tmp_path / "home"
    home.mkdir()

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HOME")}
        # The console script sits beside the Python that installed the package.
        path = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")])
        return subprocess.run(
            [kubectl(), "gpu-topology", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**base, "PATH": path, "HOME": str(home), **env},
            check=False,
        )

    return run


@pytest.fixture
def published(apiserver: ApiServerDouble, kubeconfig: Path) -> ApiServerDouble:
    """NODE as the agent published a simulated DGX H100 on it, with its agent pod Ready."""
    policies = KubeletPolicies("best-effort", "container", "static")
    scanner = FakeScanner([ok(machines()["profile dgx-h100"])])
    wire_agent(kubeconfig, scanner, kubelet=lambda: KubeletReading(policies)).agent.step()
    apiserver.add_pod("gpu-system", f"topo-reporter-{NODE}", node=NODE, labels=AGENT)
    return apiserver


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kubectl gpu-topology: error: ")
    return lines[0]


def test_the_plugins_kubeconfig_is_the_commands_own_setting() -> None:
    """One declaration, one help text: `--kubeconfig` here is `doctor`'s, KUBECONFIG included."""
    ((field, declaration),) = declared(ReaderSettings)
    page = "".join(build_parser().format_help().split())
    assert "".join(help_text(field.default, declaration).split()) in page
    assert page.count("--kubeconfig") == 2  # the usage line and the help line


def test_kubectl_lists_the_installed_plugin(plugin: Plugin) -> None:
    result = plugin("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl gpu-topology [-h]")


def test_a_node_shows_its_matrix_islands_and_the_doctors_findings(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    result = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    topology = machines()["profile dgx-h100"]
    matrix = describe_matrix(topology).rstrip("\n")
    gpus = "".join(f"  GPU{i}   gpu-{i}        unknown   ok 18/18\n" for i in range(8))
    assert result.stdout == (
        f"Node: {NODE}\n{matrix}\n\nNVLink islands: GPU0-7 (8 GPUs)\n"
        "Free GPUs: unknown: the agent does not publish availability on this node\n"
        "\nGPUs:\n  GPU    DRA DEVICE   STATE     NVLINK\n"
        f"{gpus}"
        f"\nnode {NODE}: no findings\n"
    )


def test_free_gpus_come_from_the_availability_annotation(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    free = compute_availability(machines()["profile dgx-h100"], [0, 1, 2, 3, 6])
    key = f"{PREFIX}/{keys.AVAILABILITY}"
    published.edit_node(NODE, {"metadata": {"annotations": {key: encode_availability(free)}}})
    shown = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert "Free GPUs: GPU0-3,6 (5; up to 5 of them NVLink-connected)\n" in shown.stdout
    listed = plugin("--kubeconfig", str(admin_kubeconfig)).stdout.splitlines()
    assert listed[1].split() == [NODE, "8", "nvswitch", "8", "5"]
    doc = json.loads(plugin(NODE, "--format", "json", "--kubeconfig", str(admin_kubeconfig)).stdout)
    assert doc["free"] == [0, 1, 2, 3, 6]
    published.edit_node(NODE, {"metadata": {"annotations": {key: "1;0-3;garbage"}}})
    damaged = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert damaged.returncode == 0, damaged.stderr
    assert f"Free GPUs: unknown: the {key} annotation is damaged (" in damaged.stdout


def test_an_availability_value_int_refuses_is_damaged_in_the_list_and_the_node(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    # Issue 19: 4,301 zeros, one past int()'s digit limit, crashed both views.
    key = f"{PREFIX}/{keys.AVAILABILITY}"
    poison = "1;" + "0" * 4301 + ";0.1.1.0.1"
    published.edit_node(NODE, {"metadata": {"annotations": {key: poison}}})
    listed = plugin("--kubeconfig", str(admin_kubeconfig))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split() == [NODE, "8", "nvswitch", "8", "<unknown>"]
    shown = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert shown.returncode == 0, shown.stderr
    assert f"Free GPUs: unknown: the {key} annotation is damaged (" in shown.stdout
    assert "a number of 4301 digits" in shown.stdout


def test_a_node_with_a_finding_shows_it_with_evidence_and_fix(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    published.edit_node(NODE, {"status": {"allocatable": {"nvidia.com/gpu": None}}})
    result = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    assert f"node {NODE}: 1 finding\n  ERROR device-plugin-missing:" in result.stdout
    assert "    fix: " in result.stdout


def test_without_a_node_one_line_per_gpu_node_from_kubeconfig_env(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    published.add_node("gpu-node-2")  # GPUs, no agent yet
    published.add_node("cpu-node-1")
    published.edit_node("cpu-node-1", {"status": {"capacity": {"nvidia.com/gpu": None}}})
    result = plugin(KUBECONFIG=str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["NAME", "GPUS", "INTERCONNECT", "NVLINK-ISLAND", "FREE"],
        [NODE, "8", "nvswitch", "8", "<unknown>"],
        ["gpu-node-2", "8", "<none>", "<none>", "<unknown>"],
    ]
    listed = json.loads(plugin("--format", "json", KUBECONFIG=str(admin_kubeconfig)).stdout)
    assert listed[0] == {
        "node": NODE,
        "gpus": "8",
        "interconnect": "nvswitch",
        "nvlink_island": "8",
        "free": "<unknown>",
    }


def test_partitions_count_each_partitions_nodes_and_whole_free_ones(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    topology = machines()["profile dgx-h100"]
    whole = encode_availability(compute_availability(topology, range(8)))
    part = encode_availability(compute_availability(topology, [0, 1, 2, 3]))
    partition = f"{PREFIX}/nvlink-partition"
    count = f"{PREFIX}/count"
    for name, value, where in [
        ("r1-a", whole, "c1.1"),
        ("r1-b", part, "c1.1"),
        ("r2-a", whole, "c2.1"),
    ]:
        published.add_node(
            name,
            labels={partition: where, count: "8"},
            annotations={f"{PREFIX}/{keys.AVAILABILITY}": value},
        )
    result = plugin("--partitions", KUBECONFIG=str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # NODE, the agent's simulated DGX H100, is a partition of its own (`node-NODE`), which is
    # not listed (issue 41, item 5): one per node outside a multi-node fabric.
    assert [line.split() for line in lines[:3]] == [
        ["PARTITION", "NODES", "WHOLE-FREE"],
        ["c1.1", "2", "1"],
        ["c2.1", "1", "1"],
    ]
    # Two nodes with 8 connected GPUs free, one more with 4.
    assert lines[3] == (
        "Nodes that can host an NVLink-connected set now: 2 GPUs: 3, 4 GPUs: 3, 8 GPUs: 2"
    )
    as_json = plugin("--partitions", "--format", "json", KUBECONFIG=str(admin_kubeconfig))
    found = json.loads(as_json.stdout)
    assert found["partitions"][0] == {"partition": "c1.1", "nodes": 2, "free_nodes": 1}
    assert found["connected_capable_nodes"] == {"2": 3, "4": 3, "8": 2}
    refused = plugin("--partitions", NODE, KUBECONFIG=str(admin_kubeconfig))
    assert refused.returncode == 2
    assert "--partitions counts every node" in refused.stderr


def test_network_counts_each_leaf_groups_nodes_and_whole_free_ones_as_counted_from_scratch(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    # marin#6950's 64 H100 nodes in 15 leaf groups, beside NODE, which carries no tier.
    cluster = leaf_cluster(2)
    for node in cluster.nodes:
        meta = node["metadata"]
        published.add_node(meta["name"], labels=meta["labels"], annotations=meta["annotations"])
    members = Tally(cluster.group.values())
    whole = Tally(g for n, g in cluster.group.items() if cluster.free[n] == GPUS)
    want = [
        *[["0", g, str(members[g]), str(whole[g])] for g in sorted(members)],
        ["1", SPINE, "64", str(sum(whole.values()))],
    ]
    result = plugin("--network", KUBECONFIG=str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines == [["TIER", "GROUP", "NODES", "WHOLE-FREE"], *want]
    # The leaf groups that can take a gang of 8 whole nodes now, by the plugin and from scratch.
    assert {r[1] for r in lines[1:] if r[0] == "0" and int(r[3]) >= 8} == {
        g for g in members if whole[g] >= 8
    }
    as_json = plugin("--network", "--format", "json", KUBECONFIG=str(admin_kubeconfig))
    assert json.loads(as_json.stdout) == [
        {"tier": int(t), "group": g, "nodes": int(n), "free_nodes": int(f)} for t, g, n, f in want
    ]


@pytest.mark.parametrize(
    "args",
    [("--network", NODE), ("--network", "--partitions"), ("--network", "--format", "dot")],
    ids=["a node", "partitions too", "a picture"],
)
def test_network_with_a_node_partitions_or_a_picture_is_bad_usage(
    plugin: Plugin, args: tuple[str, ...]
) -> None:
    refused = plugin(*args)
    assert refused.returncode == 2
    assert "--network counts every node" in refused.stderr


def test_network_without_tier_labels_says_so(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    result = plugin("--network", KUBECONFIG=str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("No node carries a network-tier-<N> label")


@pytest.mark.parametrize(
    ("fmt", "draw"), [("dot", to_dot), ("mermaid", to_mermaid)], ids=["dot", "mermaid"]
)
def test_a_node_as_a_picture(
    published: ApiServerDouble,
    admin_kubeconfig: Path,
    plugin: Plugin,
    fmt: str,
    draw: Callable[[Topology], str],
) -> None:
    result = plugin(NODE, "--format", fmt, "--kubeconfig", str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    assert result.stdout == draw(machines()["profile dgx-h100"])


def test_a_node_as_json_for_scripts(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    result = plugin(NODE, "--format", "json", "--kubeconfig", str(admin_kubeconfig))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["node"] == NODE
    assert doc["topology"] == to_document(machines()["profile dgx-h100"])
    assert doc["islands"] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert doc["free"] is None
    assert doc["findings"] == []


def test_context_picks_the_cluster_and_namespace_where_the_agent_is_looked_for(
    published: ApiServerDouble,
    apiserver_certificate: Certificate,
    tmp_path: Path,
    plugin: Plugin,
) -> None:
    # Current context: a cluster that is down; --context names the one that answers.
    down = write_kubeconfig(tmp_path / "down", "https://127.0.0.1:9", "admin-token", ca_cert=None)
    up = write_kubeconfig(
        tmp_path / "up",
        published.url,
        "admin-token",
        ca_cert=apiserver_certificate.cert,
        context="up",
    )
    merged = yaml.safe_load(down.read_text())
    for part in ("clusters", "users", "contexts"):
        merged[part] += yaml.safe_load(up.read_text())[part]
    (tmp_path / "merged").write_text(yaml.safe_dump(merged))
    published.clear_requests()
    result = plugin(
        NODE, "--context", "up", "-n", "gpu-system", "--kubeconfig", str(tmp_path / "merged")
    )
    assert result.returncode == 0, result.stderr
    assert "no findings" in result.stdout
    assert published.reads("/api/v1/namespaces/gpu-system/pods")
    missing = one_line_error(
        plugin(NODE, "--context", "nope", "--kubeconfig", str(tmp_path / "merged"))
    )
    assert "with context 'nope'" in missing


def test_errors_are_one_line_and_a_non_zero_exit(
    published: ApiServerDouble,
    admin_kubeconfig: Path,
    kubeconfig_with_token: Callable[[str], Path],
    tmp_path: Path,
    plugin: Plugin,
) -> None:
    no_config = one_line_error(plugin(NODE))
    assert "cannot load Kubernetes credentials" in no_config
    assert "KUBECONFIG" in no_config
    missing = one_line_error(plugin("gpu-node-9", "--kubeconfig", str(admin_kubeconfig)))
    assert missing.endswith("node gpu-node-9 not found: `kubectl get nodes` lists the node names")
    published.tokens["viewer-token"] = {"get pods", "list pods"}
    forbidden = one_line_error(
        plugin(NODE, "--kubeconfig", str(kubeconfig_with_token("viewer-token")))
    )
    assert "forbidden (403): `kubectl gpu-topology` needs get and list on `nodes`" in forbidden
    down = write_kubeconfig(tmp_path / "down", "https://127.0.0.1:9", "admin-token", ca_cert=None)
    unreachable = one_line_error(plugin("--kubeconfig", str(down)))
    assert "cannot connect to the API server at https://127.0.0.1:9" in unreachable


def test_a_picture_needs_a_node_and_a_node_without_topology_exits_one(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    usage = plugin("--format", "dot", "--kubeconfig", str(admin_kubeconfig))
    assert usage.returncode == 2
    assert "--format dot draws one node: name it" in usage.stderr
    published.add_node("gpu-node-2")
    bare = plugin("gpu-node-2", "--kubeconfig", str(admin_kubeconfig))
    assert bare.returncode == 1
    assert "No readable gpu.topology.io/topology annotation" in bare.stdout
    assert "node gpu-node-2: 1 finding" in bare.stdout
    drawing = one_line_error(
        plugin("gpu-node-2", "--format", "dot", "--kubeconfig", str(admin_kubeconfig))
    )
    assert "has no readable gpu.topology.io/topology annotation to draw" in drawing


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_an_event_written_in_another_namespace_neither_speaks_for_the_agent_nor_drives_the_terminal(
    escape: str, published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    published.create_event("team-a", foreign_event("team-a", NODE, hostile_message(escape)))
    result = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert (result.returncode, controls(result.stdout)) == (0, []), result.stderr
    assert result.stdout.endswith(f"\nnode {NODE}: no findings\n")


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_the_agents_own_event_is_shown_without_control_sequences(
    escape: str, published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    published.create_event("default", agents_event(NODE, hostile_message(escape)))
    result = plugin(NODE, "-n", "gpu-system", "--kubeconfig", str(admin_kubeconfig))
    assert (result.returncode, controls(result.stdout)) == (0, []), result.stderr
    assert (
        "    evidence: nvml: NVML did not load (Driver Not Loaded); keeping the last topology\n"
    ) in result.stdout


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
def test_the_node_list_shows_no_control_sequences(
    escape: str, published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    # The double keeps any capacity text (a real API server checks quantities): whatever a field
    # holds, the output path strips it.
    published.add_node("gpu-node-2")
    published.edit_node("gpu-node-2", {"status": {"capacity": {"nvidia.com/gpu": f"8{escape}"}}})
    result = plugin("--kubeconfig", str(admin_kubeconfig))
    assert (result.returncode, controls(result.stdout)) == (0, []), result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["gpu-node-2", "8", "<none>", "<none>", "<unknown>"] in rows


def test_a_dra_node_shows_the_gpus_claims_hold_and_each_gpus_nvlinks(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    """Issue 22: which GPUs DRA claims hold (the `allocation` annotation) and each GPU's link
    health (the topology's per-GPU NVLinks), beside the free GPUs."""
    base = machines()["profile dgx-h100"]
    gpus = list(base.gpus)
    gpus[1] = replace(gpus[1], nvlink=NvlinkHealth(18, down=(0, 1)))
    gpus[3] = replace(gpus[3], lost=True)
    topology = replace(base, gpus=tuple(gpus))
    free = compute_availability(topology, [2, 4, 5, 6, 7])
    published.edit_node(
        NODE,
        {
            "metadata": {
                "annotations": {
                    f"{PREFIX}/topology": encode(topology),
                    f"{PREFIX}/{keys.AVAILABILITY}": encode_availability(free),
                    f"{PREFIX}/allocation": "1;dra;0-1",
                }
            }
        },
    )
    shown = plugin(NODE, "--kubeconfig", str(admin_kubeconfig)).stdout
    assert "Held by DRA claims: GPU0-1 (availability counts dra)\n" in shown
    assert (
        "  GPU0   gpu-0        claimed   ok 18/18\n"
        "  GPU1   gpu-1        claimed   degraded 16/18 (down: 0-1)\n"
        "  GPU2   gpu-2        free      ok 18/18\n"
        "  GPU3   gpu-3        lost      ok 18/18\n"
    ) in shown
    doc = json.loads(plugin(NODE, "--format", "json", "--kubeconfig", str(admin_kubeconfig)).stdout)
    assert doc["claimed"] == [0, 1]
    assert doc["counted"] == ["dra"]
    assert doc["gpus"][1] == {
        "gpu": 1,
        "device": "gpu-1",
        "state": "claimed",
        "nvlink": {"state": "degraded", "active": 16, "count": 18, "down": [0, 1]},
    }


def test_a_node_shows_each_pods_gpu_set_and_its_quality(
    published: ApiServerDouble, admin_kubeconfig: Path, plugin: Plugin
) -> None:
    """Issue 31: which container holds which set (the `gpu-sets` annotation), judged on the
    node's topology: a DGX-1's hybrid cube mesh has NVLink-connected sets and sets that are not."""
    topology = machines()["profile dgx-1-v100"]
    free = compute_availability(topology, [7])
    sets = encode_held_sets(
        [HeldSet("ml", "train", "main", (0, 1, 2, 3)), HeldSet("ml", "eval", "c", (4, 5, 6))]
    )
    published.edit_node(
        NODE,
        {
            "metadata": {
                "annotations": {
                    f"{PREFIX}/topology": encode(topology),
                    f"{PREFIX}/{keys.AVAILABILITY}": encode_availability(free),
                    f"{PREFIX}/gpu-sets": sets,
                }
            }
        },
    )
    shown = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert shown.returncode == 0, shown.stderr
    # Every pair of 0-3 and of 4-6 is NVLink-joined, the weakest by one link (the matrix above).
    assert (
        "Pod GPU sets (containers holding 2 or more GPUs):\n"
        "  POD        CONTAINER   GPUS     CONNECTED   WORST   NUMA\n"
        "  ml/eval    c           GPU4-6   yes         NV1     one\n"
        "  ml/train   main        GPU0-3   yes         NV1     one\n"
    ) in shown.stdout
    doc = json.loads(plugin(NODE, "--format", "json", "--kubeconfig", str(admin_kubeconfig)).stdout)
    assert doc["pod_sets"][1] == {
        "namespace": "ml",
        "pod": "train",
        "container": "main",
        "gpus": [0, 1, 2, 3],
        "connected": True,
        "worst": "NV1",
        "numa": "one",
    }
    unconnected = encode_held_sets([HeldSet("ml", "wide", "main", (0, 5))])
    published.edit_node(NODE, {"metadata": {"annotations": {f"{PREFIX}/gpu-sets": unconnected}}})
    shown = plugin(NODE, "--kubeconfig", str(admin_kubeconfig)).stdout
    assert "  ml/wide   main        GPU0,5   no          SYS     several\n" in shown
    published.edit_node(NODE, {"metadata": {"annotations": {f"{PREFIX}/gpu-sets": "1;x"}}})
    damaged = plugin(NODE, "--kubeconfig", str(admin_kubeconfig))
    assert damaged.returncode == 0, damaged.stderr
    assert f"Pod GPU sets: unknown: the {PREFIX}/gpu-sets annotation is damaged (" in damaged.stdout
