"""`topo-reporter` as a user runs it, against the real kube-apiserver: both sinks (the NodeFeature
one against NFD's own CRD schema), `doctor --all`, and what kubectl shows afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from reporter.publish import nodefeature as nf
from tests.agent.test_kubectl import kubectl
from tests.cli.test_run import CLI, env
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer
from tests.support.hostile_text import (
    ESCAPES,
    agents_event,
    controls,
    foreign_event,
    hostile_message,
)

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"


def run_agent(server: RealApiServer, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=str(server.kubeconfig), NODE_NAME=node, TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )


def kubectl_out(server: RealApiServer, *args: str) -> str:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(server.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def node_features(server: RealApiServer) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(server.api())


def get_node_feature(server: RealApiServer, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = node_features(server).get_namespaced_custom_object(
        nf.GROUP, "v1alpha1", namespace, "nodefeatures", name
    )
    return obj


def test_kubectl_version_reports_the_pinned_release(real_apiserver: RealApiServer) -> None:
    version = json.loads(kubectl_out(real_apiserver, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.37.2"
    assert (version["serverVersion"]["major"], version["serverVersion"]["minor"]) == ("1", "37")


def test_the_node_sink_publishes_and_kubectl_describe_node_reads_it(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory
) -> None:
    node = real_node_factory(labels={"nvidia.com/gpu.present": "true"})
    result = run_agent(real_apiserver, node)
    assert result.returncode == 0, result.stderr
    out = kubectl_out(real_apiserver, "describe", "node", node)
    assert f"{PREFIX}/count=8" in out
    assert f"{PREFIX}/interconnect=nvswitch" in out
    assert f"{PREFIX}/matrix:" in out
    # The matrix is shown line by line, as nvidia-smi prints it, not as one escaped string.
    (gpu3,) = [line.split() for line in out.splitlines() if line.strip().startswith("GPU3 ")]
    assert gpu3[:9] == ["GPU3", "NV18", "NV18", "NV18", "X", "NV18", "NV18", "NV18", "NV18"]
    assert "8x NVIDIA H100 80GB HBM3, NVSwitch NV18" in out
    assert "GPUTopologyChanged" in out  # the Event, found by kubectl through the Node's uid
    assert "nvidia.com/gpu.present=true" in out


def test_the_nodefeature_sink_passes_nfds_real_crd_and_rewrites_nothing_unchanged(
    real_apiserver: RealApiServer,
    real_nfd_crds: list[str],
    real_namespace: str,
    real_node_factory: NodeFactory,
) -> None:
    node = real_node_factory()
    name = nf.object_name(node)
    # nfd-worker's own object for the same node, which the agent must leave alone.
    worker = {
        "apiVersion": f"{nf.GROUP}/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": node, "labels": {nf.NODE_NAME_LABEL: node}},
        "spec": {"labels": {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}},
    }
    node_features(real_apiserver).create_namespaced_custom_object(
        nf.GROUP, "v1alpha1", real_namespace, "nodefeatures", worker
    )
    args = ("--sink", "nodefeature", "--namespace", real_namespace)
    first = run_agent(real_apiserver, node, *args)
    assert first.returncode == 0, first.stderr
    obj = get_node_feature(real_apiserver, real_namespace, name)
    assert obj["metadata"]["labels"][nf.NODE_NAME_LABEL] == node
    assert obj["spec"]["labels"][f"{PREFIX}/count"] == "8"
    gpus = obj["spec"]["features"]["instances"]["gputopology.gpu"]["elements"]
    assert len(gpus) == 8
    version = obj["metadata"]["resourceVersion"]

    again = run_agent(real_apiserver, node, *args)
    assert again.returncode == 0, again.stderr
    assert get_node_feature(real_apiserver, real_namespace, name)["metadata"][
        "resourceVersion"
    ] == (version)
    theirs = get_node_feature(real_apiserver, real_namespace, node)
    assert theirs["spec"] == worker["spec"]

    listed = kubectl_out(real_apiserver, "get", "nodefeatures", "-n", real_namespace, "-o", "name")
    assert sorted(listed.split()) == sorted(
        f"nodefeature.nfd.k8s-sigs.io/{n}" for n in (node, name)
    )
    described = kubectl_out(real_apiserver, "describe", "node", node)
    assert f"{PREFIX}/count" not in described  # nfd-master labels the Node, not the agent


def test_the_nodefeature_sinks_event_reaches_kubectl_describe_node(
    real_apiserver: RealApiServer,
    real_nfd_crds: list[str],
    real_namespace: str,
    real_node_factory: NodeFactory,
) -> None:
    """The real server takes Events about a Node only in `default`, where the agent posts them."""
    node = real_node_factory()
    result = run_agent(real_apiserver, node, "--sink", "nodefeature", "--namespace", real_namespace)
    assert result.returncode == 0, result.stderr
    assert "event_failed" not in result.stderr
    assert "GPUTopologyChanged" in kubectl_out(real_apiserver, "describe", "node", node)


def test_nfds_schema_refuses_what_the_agent_never_sends(
    real_apiserver: RealApiServer, real_nfd_crds: list[str], real_namespace: str
) -> None:
    """The CRD really is enforced here: a number where NFD wants a string is a 422."""
    bad = {
        "apiVersion": f"{nf.GROUP}/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": "bad"},
        "spec": {"features": {"attributes": {"gputopology.gpu": {"elements": {"count": 8}}}}},
    }
    with pytest.raises(k8s.ApiException) as refused:
        node_features(real_apiserver).create_namespaced_custom_object(
            nf.GROUP, "v1alpha1", real_namespace, "nodefeatures", bad
        )
    assert refused.value.status == 422
    assert "spec.features.attributes.gputopology.gpu.elements.count" in str(refused.value.body)


def doctor(server: RealApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "doctor", "--kubeconfig", str(server.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
        check=False,
    )


def test_doctor_reads_the_real_nodes_pods_and_selectors(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    tmp_path: Path,
) -> None:
    node = real_node_factory(ready=True, allocatable={"nvidia.com/gpu": "8"})
    # A kubelet config the agent reads, as on a real node: its policies are published.
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text("kind: KubeletConfiguration\n")
    assert run_agent(real_apiserver, node, "--kubelet-config", str(kubelet)).returncode == 0
    missing = doctor(real_apiserver, "--all")
    assert missing.returncode == 0, missing.stderr
    assert f"WARNING agent-not-ready: 1 ({node})" in missing.stdout
    assert f"no topo-reporter pod runs on {node}" in missing.stdout

    # The agent's pod on that node, Ready: found by the real label and field selectors.
    core = real_apiserver.core()
    agent = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="agent", labels={"app.kubernetes.io/name": "topo-reporter"}),
        spec=k8s.V1PodSpec(
            node_name=node,
            containers=[k8s.V1Container(name="agent", image="registry.k8s.io/pause:3.10")],
        ),
    )
    core.create_namespaced_pod(real_namespace, agent)
    core.patch_namespaced_pod_status(
        "agent",
        real_namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    healthy = doctor(real_apiserver, "--node", node)
    assert healthy.returncode == 0, healthy.stderr
    assert "no findings" in healthy.stdout, healthy.stdout
    assert doctor(real_apiserver, "--all").stdout.startswith("1 nodes, 1 without findings")


def test_events_others_write_about_a_node_neither_speak_for_the_agent_nor_drive_the_terminal(
    real_apiserver: RealApiServer, real_namespace: str, real_node_factory: NodeFactory
) -> None:
    """The real kube-apiserver takes an Event about a Node in any namespace the involvedObject
    repeats: one there, claiming to be the agent's, changes nothing; the agent's own Events in
    `default` are read, and what they carry reaches the terminal without control sequences."""
    node = real_node_factory(ready=True, allocatable={"nvidia.com/gpu": "8"})
    assert run_agent(real_apiserver, node).returncode == 0
    core = real_apiserver.core()
    attack = "".join(ESCAPES.values())
    core.create_namespaced_event(real_namespace, foreign_event(real_namespace, node, attack))
    plugin_env = env(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))

    def shown() -> list[subprocess.CompletedProcess[str]]:
        return [
            doctor(real_apiserver, "--node", node),
            doctor(real_apiserver, "--all"),
            subprocess.run(
                [kubectl(), "gpu-topology", node, "--kubeconfig", str(real_apiserver.kubeconfig)],
                capture_output=True,
                text=True,
                timeout=60,
                env=plugin_env,
                check=False,
            ),
        ]

    for result in shown():
        assert controls(result.stdout) == [], result.args
        assert "agent-degraded" not in result.stdout, result.stdout
    core.create_namespaced_event("default", agents_event(node, hostile_message(attack)))
    for result in shown():
        assert controls(result.stdout) == [], result.args
        assert "agent-degraded" in result.stdout, result.stdout
