"""The agent's fabric taint (`fabric.taintUnhealthy`), on the real kube-apiserver with the
identity a DaemonSet pod really has: the chart's RBAC and ValidatingAdmissionPolicy rendered with
the taint on, a Pod of the chart's ServiceAccount bound to node A, and a TokenRequest token for it
(the `authentication.kubernetes.io/node-name` claim). The apiserver evaluates the policy's CEL.

The agent itself, `run --once --taint-unhealthy-fabric` on a simulated rack node, taints node A
while the fabric is unhealthy or degraded and untaints it when healthy, with the GPU operator's
taint left in place; the same token cannot taint node B, nor set any other taint or spec field.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from reporter.collect.simulate.racks import rack_nodes, write_profiles
from tests.agent.test_kubectl import kubectl
from tests.cli.test_run import CLI, env
from tests.controlplane.test_identity import pod_token
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer
from tests.support.helm_chart import NAMESPACE, NODE_POLICY, VAP_API, render
from tests.support.kube_double import write_kubeconfig

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
TAINT = f"{PREFIX}/fabric-health"
POLICY_TIMEOUT_S = 60.0
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_SPEC_FIELDS_COMPARED = {
    "podCIDR",
    "podCIDRs",
    "providerID",
    "unschedulable",
    "configSource",
    "externalID",
    "podPreemptionPolicy",
}
"""What the policy compares field by field; `taints` is judged on its own."""


@dataclass
class Agent:
    """The chart's ServiceAccount, its pod on node A, a kubeconfig with the pod's token."""

    node_a: str
    node_b: str
    kubeconfig: Path
    api: k8s.ApiClient


def _apply(server: RealApiServer, manifest: str, *verb: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(server.kubeconfig), *verb, "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def taint_chart(real_apiserver: RealApiServer) -> Iterator[dict[str, Any]]:
    """The chart's objects for `sink=node` with the admission policy and the taint on; the
    rendered policy."""
    values = {"admissionPolicy": {"enabled": True}, "fabric": {"taintUnhealthy": True}}
    rendered = render(values, api_versions=(VAP_API,))
    core = real_apiserver.core()
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    except k8s.ApiException as e:
        if e.status != 409:
            raise
    manifest = yaml.safe_dump_all(rendered.objects)
    applied = _apply(real_apiserver, manifest, "apply")
    assert applied.returncode == 0, applied.stderr
    yield rendered.named("ValidatingAdmissionPolicy", NODE_POLICY)
    _apply(real_apiserver, manifest, "delete", "--ignore-not-found", "--wait=false")


@pytest.fixture
def agent(
    real_apiserver: RealApiServer,
    taint_chart: dict[str, Any],
    real_node_factory: NodeFactory,
    tmp_path: Path,
) -> Iterator[Agent]:
    node_a = real_node_factory(labels={"team": "ml"})
    node_b = real_node_factory(labels={"team": "ml"})
    core = real_apiserver.core()
    for node in (node_a, node_b):
        # The GPU operator's taint, which nothing of ours may touch; the apiserver's not-ready
        # taint goes, as the node lifecycle controller would take it off.
        core.patch_node(node, {"spec": {"taints": [GPU_TAINT]}})
    pod = f"topo-reporter-{node_a}"
    token = pod_token(real_apiserver, node_a, pod)
    admin = yaml.safe_load(real_apiserver.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    kubeconfig = write_kubeconfig(
        tmp_path / "agent.kubeconfig", cluster["server"], token, ca_cert=ca
    )
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    wait_for_taint_policy(api, node_a)
    try:
        yield Agent(node_a, node_b, kubeconfig, api)
    finally:
        api.close()
        core.delete_namespaced_pod(pod, NAMESPACE)


def wait_for_taint_policy(api: k8s.ApiClient, node_a: str) -> None:
    """The taint-on policy is enforced once a dry run of the agent setting its own taint on its
    own Node passes admission (the policy without the taint denies it) and one setting a foreign
    taint is denied."""
    core = k8s.CoreV1Api(api)
    own = {"spec": {"taints": [GPU_TAINT, {"key": TAINT, "value": "x", "effect": "NoSchedule"}]}}
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        try:
            core.patch_node(node_a, own, dry_run="All")
            return
        except k8s.ApiException as e:
            if not (e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body)):
                raise
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def rack_profile(tmp_path: Path, health: str) -> Path:
    """A GB200 NVL72 compute tray whose fabric reports `health`."""
    (node,) = rack_nodes(1, trays=1)
    node.profile["fabric"]["health"] = health
    (path,) = write_profiles([node], tmp_path / health)
    return path


def run_agent(agent: Agent, node: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--simulate", str(profile), "--once", "--listen", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(
            KUBECONFIG=str(agent.kubeconfig),
            NODE_NAME=node,
            TOPO_REPORTER_LOG_FORMAT="json",
            TOPO_REPORTER_TAINT_UNHEALTHY_FABRIC="true",
        ),
        check=False,
    )


def taints(server: RealApiServer, node: str) -> list[dict[str, Any]]:
    found = server.core().read_node(node).spec.taints or []
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in found]


def test_the_agent_taints_its_own_node_while_the_fabric_is_hurt_and_untaints_it(
    real_apiserver: RealApiServer, agent: Agent, tmp_path: Path
) -> None:
    steps = [
        ("unhealthy", [GPU_TAINT, {"key": TAINT, "value": "unhealthy", "effect": "NoSchedule"}]),
        (
            "limited-capacity",
            [GPU_TAINT, {"key": TAINT, "value": "degraded", "effect": "NoSchedule"}],
        ),
        ("healthy", [GPU_TAINT]),
    ]
    for health, expected in steps:
        ran = run_agent(agent, agent.node_a, rack_profile(tmp_path, health))
        assert ran.returncode == 0, ran.stderr
        assert taints(real_apiserver, agent.node_a) == expected, health
    labels = real_apiserver.core().read_node(agent.node_a).metadata.labels
    assert labels[f"{PREFIX}/fabric-health"] == "healthy"
    assert labels["team"] == "ml"

    other = run_agent(agent, agent.node_b, rack_profile(tmp_path, "unhealthy"))
    assert other.returncode == 1
    assert "may change only the Node its pod runs on" in other.stderr
    assert taints(real_apiserver, agent.node_b) == [GPU_TAINT]


def _denials(prefix: str) -> list[tuple[str, str, Any]]:
    """(what, content type, body) for each taint or spec change the policy must refuse."""
    own = {"key": f"{prefix}/fabric-health", "value": "unhealthy", "effect": "NoSchedule"}
    foreign = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    cases: list[tuple[str, str, Any]] = []
    for content_type in (MERGE, STRATEGIC):
        cases += [
            ("add a foreign taint", content_type, {"spec": {"taints": [GPU_TAINT, foreign]}}),
            ("remove the GPU taint", content_type, {"spec": {"taints": [own]}}),
            (
                "its own key as NoExecute",
                content_type,
                {"spec": {"taints": [GPU_TAINT, {**own, "effect": "NoExecute"}]}},
            ),
            (
                "cordon with its taint",
                content_type,
                {"spec": {"taints": [GPU_TAINT, own], "unschedulable": True}},
            ),
            ("change the podCIDR", content_type, {"spec": {"podCIDR": "10.9.0.0/24"}}),
        ]
    cases += [
        (
            "add a foreign taint",
            JSON_PATCH,
            [{"op": "add", "path": "/spec/taints/-", "value": foreign}],
        ),
        ("remove the GPU taint", JSON_PATCH, [{"op": "remove", "path": "/spec/taints/0"}]),
        (
            "its own key as NoExecute",
            JSON_PATCH,
            [{"op": "add", "path": "/spec/taints/-", "value": {**own, "effect": "NoExecute"}}],
        ),
        ("cordon", JSON_PATCH, [{"op": "add", "path": "/spec/unschedulable", "value": True}]),
    ]
    return cases


def test_the_token_may_set_only_its_own_taint_on_its_own_node_in_every_patch_type(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    core = k8s.CoreV1Api(agent.api)
    own = {"key": TAINT, "value": "unhealthy", "effect": "NoSchedule"}
    allowed = 0
    # Allowed: its own taint added, changed and removed, on its own Node, in each patch type.
    for content_type, body in (
        (MERGE, {"spec": {"taints": [GPU_TAINT, own]}}),
        (STRATEGIC, {"spec": {"taints": [GPU_TAINT, {**own, "value": "degraded"}]}}),
        (JSON_PATCH, [{"op": "remove", "path": "/spec/taints/1"}]),
        (JSON_PATCH, [{"op": "add", "path": "/spec/taints/-", "value": own}]),
        (MERGE, {"spec": {"taints": [GPU_TAINT]}}),
    ):
        core.patch_node(agent.node_a, body, _content_type=content_type)
        allowed += 1
    assert taints(real_apiserver, agent.node_a) == [GPU_TAINT]
    refused: list[str] = []
    denied = 0
    for what, content_type, body in _denials(PREFIX):
        try:
            core.patch_node(agent.node_a, body, _content_type=content_type)
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                denied += 1
                continue
            refused.append(f"{what} ({content_type}): {e.status} {e.body}")
            continue
        refused.append(f"{what} ({content_type}): admitted")
    # Its own taint on the other node: the node-name claim says no.
    with pytest.raises(k8s.ApiException) as other:
        core.patch_node(agent.node_b, {"spec": {"taints": [GPU_TAINT, own]}})
    assert other.value.status == 403
    assert "only the Node its pod runs on" in str(other.value.body)
    denied += 1
    assert refused == []
    after = real_apiserver.core().read_node(agent.node_a)
    assert taints(real_apiserver, agent.node_a) == [GPU_TAINT]
    assert not after.spec.unschedulable
    assert taints(real_apiserver, agent.node_b) == [GPU_TAINT]
    print(f"taint matrix: allowed as expected {allowed}, denied as expected {denied}")
    assert (allowed, denied) == (5, 14 + 1)


def test_the_policy_compares_every_field_of_the_servers_node_spec(
    real_apiserver: RealApiServer, taint_chart: dict[str, Any]
) -> None:
    """A field the apiserver's NodeSpec gains in a later release must be added to the policy's
    list, or the agent could change it: its OpenAPI says which fields there are."""
    raw = subprocess.run(
        [
            kubectl(),
            "--kubeconfig",
            str(real_apiserver.kubeconfig),
            "get",
            "--raw",
            "/openapi/v3/api/v1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    document = json.loads(raw.stdout)
    fields = set(document["components"]["schemas"]["io.k8s.api.core.v1.NodeSpec"]["properties"])
    assert fields == NODE_SPEC_FIELDS_COMPARED | {"taints"}
    (spec_rule,) = [
        v["expression"]
        for v in taint_chart["spec"]["validations"]
        if "object.spec.podCIDR" in v["expression"]
    ]
    for name in NODE_SPEC_FIELDS_COMPARED:
        assert f"object.spec.{name} == oldObject.spec.{name}" in spec_rule
