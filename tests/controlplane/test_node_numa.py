"""The Topology Manager of a real kubelet beside what `doctor` predicts (`numa-alignment-limit`).

This host has one NUMA node; the simulated dgx-h100's GPUs sit on NUMA nodes 0 and 1 (4 each), as
the device plugin double reports them. With `single-numa-node`, and with `restricted` (which
admits only a preferred hint, and a set across two NUMA nodes is not one), the kubelet can align
only the 4
GPUs of one NUMA node (1.37's device manager counts the NUMA nodes its devices name): that is
exactly the limit `doctor` predicts for the machine (4 GPUs per pod), so a pod of 5 is rejected
with `TopologyAffinityError` and one of 4 admitted. What cannot be shown here is which 4 it
aligns: the device manager groups the free devices by the host's NUMA nodes when it picks, and
this host has no NUMA node 1 (a run handed out three GPUs of node 0 and one of node 1).

Its own module: one node at a time (the node owns 10.96.0.1)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from typing import Any

import helm_python as helm
import pytest
from kubernetes import client as k8s

from reporter.collect.simulate.machine import load_machine
from tests.support.helm_chart import chart
from tests.support.image_support import built_image
from tests.support.node_harness import (  # noqa: F401  # the node_cluster fixture
    NodeCluster,
    image_archive,
    node_cluster,
    topo_reporter,
    wait_until,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

MACHINE = "dgx-h100"
NAMESPACE = "gpu-system"
POLICIES = ("single-numa-node", "restricted")
"""The policies that reject what they cannot align (parsers.kubelet.KubeletPolicies.aligns_numa)."""


def _pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "localhost/controlplane/pause:3.10",
        "imagePullPolicy": "Never",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [container]},
    }


@pytest.mark.parametrize("policy", POLICIES)
def test_an_aligning_policy_admits_what_doctor_predicts(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
    policy: str,
) -> None:
    machine = load_machine(MACHINE)
    devices = [{"id": g.uuid, "numa": min(g.memory_affinity or {0})} for g in machine.gpus]
    work = tmp_path_factory.mktemp("numa-node")
    archive = image_archive(built_image(), work)
    core = node_cluster.core()
    # A node, and pods, of each policy's own: the module's apiserver outlives each node.
    five, four = f"five-{policy}", f"four-{policy}"
    with node_cluster.node(
        work, f"numa-{policy}", devices=devices, images=[archive], policy=policy
    ) as node:
        core.patch_node(node.name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
        if not core.list_namespace(field_selector=f"metadata.name={NAMESPACE}").items:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        config = helm.Config(kubeconfig_path=node_cluster.server.kubeconfig, namespace=NAMESPACE)
        try:
            values = {
                "image": {"repository": "localhost/topo-reporter", "pullPolicy": "Never"},
                "runtimeClassName": "",
                "agent": {"simulate": MACHINE},
            }
            config.install(chart(), "tr", values, namespace=NAMESPACE)
            labels = wait_until(
                "the agent's labels",
                lambda: (core.read_node(node.name).metadata.labels or {}).get(
                    "gpu.topology.io/topology-manager-policy"
                ),
                timeout_s=120,
                log=lambda: node.namespace_logs(NAMESPACE),
            )
            assert labels == policy
            done = subprocess.run(
                [topo_reporter(), "doctor", "--node", node.name, "--format", "json",
                 "--kubeconfig", str(node_cluster.server.kubeconfig)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            findings = {
                f["code"]: f for n in json.loads(done.stdout)["nodes"] for f in n["findings"]
            }
            limit = findings["numa-alignment-limit"]
            assert "at most 4 GPUs per pod" in limit["summary"], limit

            core.create_namespaced_pod("default", _pod(five, node.name, 5))
            rejected = wait_until(
                "the pod of 5 rejected by the kubelet",
                lambda: (
                    (p := core.read_namespaced_pod(five, "default")).status.phase == "Failed" and p
                ),
                log=node.log_tail,
            )
            assert rejected.status.reason == "TopologyAffinityError"
            core.create_namespaced_pod("default", _pod(four, node.name, 4))
            wait_until(
                "the pod of 4 Running",
                lambda: core.read_namespaced_pod(four, "default").status.phase == "Running",
                log=node.log_tail,
            )
            # Which 4 it hands out is not checked: the device manager groups devices by the
            # host's NUMA nodes, and NUMA node 1 is not one here (its choice mixed the nodes).
            allocated = [e["devices"] for e in node.events() if e.get("call") == "Allocate"]
            assert [len(a) for a in allocated] == [4]
            config.uninstall("tr", timeout=180)
        finally:
            config.close()
            for name in (five, four):
                with contextlib.suppress(k8s.ApiException):
                    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
