"""The identity a DaemonSet pod really has, on the real kube-apiserver: the chart's RBAC and
ValidatingAdmissionPolicy (rendered by the Helm SDK, applied with kubectl), a Pod of the chart's
ServiceAccount bound to node A (no kubelet: the Pod only has to exist with spec.nodeName), and a
token for that Pod from TokenRequest, which carries the `authentication.kubernetes.io/node-name`
claim the policy keys on. The policy's CEL is evaluated by the apiserver itself here."""

from __future__ import annotations

import base64
import contextlib
import copy
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from reporter.publish.client import DEGRADED_REASON, EventType, event_body
from reporter.publish.patch import NodeMetadata
from reporter.schema import dra
from tests.agent.test_kubectl import kubectl
from tests.cli.test_run import CLI, env
from tests.controlplane.test_dra import profile
from tests.support.controlplane_fixtures import RULES_VERSION, NodeFactory, RealApiServer
from tests.support.helm_chart import EXTENDER_ALONE, FULLNAME, NAMESPACE, VAP_API, render
from tests.support.kube_double import write_kubeconfig

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
POLICY_TIMEOUT_S = 60.0
CHART_VALUES = {
    "admissionPolicy": {"enabled": True},
    "availability": {"enabled": True},
    **EXTENDER_ALONE,
    "dra": {"deviceTaints": True},
}
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass
class Agent:
    """The chart's ServiceAccount, its pod on node A, a kubeconfig with the pod's token."""

    node_a: str
    node_b: str
    kubeconfig: Path
    api: k8s.ApiClient


@pytest.fixture(scope="module")
def chart_installed(real_apiserver: RealApiServer) -> Iterator[None]:
    """The chart's objects for `sink=node`, admission policy on, availability with its heartbeat
    and the extender on, applied to the real server."""
    rendered = render(CHART_VALUES, api_versions=(VAP_API,))
    kinds = {o["kind"] for o in rendered.objects}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    core = real_apiserver.core()
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    except k8s.ApiException as e:
        if e.status != 409:
            raise
    manifest = yaml.safe_dump_all(rendered.objects)
    admin = ["--kubeconfig", str(real_apiserver.kubeconfig)]
    applied = subprocess.run(
        [kubectl(), *admin, "apply", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    yield
    subprocess.run(
        [kubectl(), *admin, "delete", "--ignore-not-found", "--wait=false", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def pod_token(server: RealApiServer, node: str, pod: str) -> str:
    core = server.core()
    created = core.create_namespaced_pod(
        NAMESPACE,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=pod),
            spec=k8s.V1PodSpec(
                node_name=node,
                service_account_name=FULLNAME,
                automount_service_account_token=False,
                containers=[k8s.V1Container(name="agent", image="registry.k8s.io/pause:3.10")],
            ),
        ),
    )
    token = core.create_namespaced_service_account_token(
        FULLNAME,
        NAMESPACE,
        k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=k8s.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod, uid=created.metadata.uid
                ),
            )
        ),
    )
    return str(token.status.token)


@pytest.fixture
def agent(
    real_apiserver: RealApiServer,
    chart_installed: None,
    real_node_factory: NodeFactory,
    tmp_path: Path,
) -> Iterator[Agent]:
    node_a = real_node_factory(labels={"team": "ml"}, annotations={"other.io/note": "keep"})
    node_b = real_node_factory(labels={"team": "ml"}, annotations={"other.io/note": "keep"})
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
    wait_for_policy(api, node_b)
    try:
        yield Agent(node_a, node_b, kubeconfig, api)
    finally:
        api.close()
        real_apiserver.core().delete_namespaced_pod(pod, NAMESPACE)


def wait_for_policy(api: k8s.ApiClient, node_b: str) -> None:
    """The apiserver enforces a new policy once its informer has it: probe with a dry run (it
    passes admission, stores nothing) until the probe is denied."""
    core = k8s.CoreV1Api(api)
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        try:
            core.patch_node(
                node_b, {"metadata": {"labels": {f"{PREFIX}/count": "8"}}}, dry_run="All"
            )
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                return
            raise
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def run_agent(
    agent: Agent, node: str, *args: str, **environ: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(
            KUBECONFIG=str(agent.kubeconfig),
            NODE_NAME=node,
            TOPO_REPORTER_LOG_FORMAT="json",
            **environ,
        ),
        check=False,
    )


def test_the_pods_token_publishes_its_own_node_and_is_denied_on_another(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    own = run_agent(agent, agent.node_a)
    assert own.returncode == 0, own.stderr
    labels = real_apiserver.core().read_node(agent.node_a).metadata.labels
    assert labels[f"{PREFIX}/count"] == "8"
    assert labels["team"] == "ml"

    other = run_agent(agent, agent.node_b)
    assert other.returncode == 1
    assert "may change only the Node its pod runs on" in other.stderr
    assert f"{PREFIX}/count" not in (real_apiserver.core().read_node(agent.node_b).metadata.labels)


def _json_patch(op: str, path: str, value: Any = None) -> list[dict[str, Any]]:
    step: dict[str, Any] = {"op": op, "path": path}
    if op != "remove":
        step["value"] = value
    return [step]


def _denials(node: str) -> list[tuple[str, str, Any]]:
    """(what, content type, body) for each change the policy must refuse on the own Node."""
    label = "/metadata/labels/team"
    note = "/metadata/annotations/other.io~1note"
    taint = {"key": "x", "value": "y", "effect": "NoSchedule"}
    cases: list[tuple[str, str, Any]] = []
    for content_type in (MERGE, STRATEGIC):
        cases += [
            ("change a foreign label", content_type, {"metadata": {"labels": {"team": "x"}}}),
            ("delete a foreign label", content_type, {"metadata": {"labels": {"team": None}}}),
            (
                "change a foreign annotation",
                content_type,
                {"metadata": {"annotations": {"other.io/note": "x"}}},
            ),
            (
                "delete a foreign annotation",
                content_type,
                {"metadata": {"annotations": {"other.io/note": None}}},
            ),
            ("add a taint", content_type, {"spec": {"taints": [taint]}}),
            ("change spec", content_type, {"spec": {"unschedulable": True}}),
        ]
    cases += [
        ("change a foreign label", JSON_PATCH, _json_patch("replace", label, "x")),
        ("delete a foreign label", JSON_PATCH, _json_patch("remove", label)),
        ("change a foreign annotation", JSON_PATCH, _json_patch("replace", note, "x")),
        ("delete a foreign annotation", JSON_PATCH, _json_patch("remove", note)),
        ("add a taint", JSON_PATCH, _json_patch("add", "/spec/taints", [taint])),
        ("change spec", JSON_PATCH, _json_patch("add", "/spec/unschedulable", True)),
    ]
    return cases


def test_the_policy_denies_every_foreign_change_in_every_patch_type_and_rbac_the_rest(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    core = k8s.CoreV1Api(agent.api)
    before = real_apiserver.core().read_node(agent.node_a)
    allowed = denied = 0
    # What the policy lets through: a key under the prefix, on the own Node, in each patch type.
    for content_type, body in (
        (MERGE, {"metadata": {"labels": {f"{PREFIX}/count": "8"}}}),
        (STRATEGIC, {"metadata": {"annotations": {f"{PREFIX}/matrix": "m"}}}),
        (JSON_PATCH, _json_patch("add", f"/metadata/labels/{PREFIX.replace('/', '~1')}~1x", "1")),
    ):
        core.patch_node(agent.node_a, body, _content_type=content_type)
        allowed += 1
    refused: list[str] = []
    for what, content_type, body in _denials(agent.node_a):
        try:
            core.patch_node(agent.node_a, body, _content_type=content_type)
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                denied += 1
                continue
            refused.append(f"{what} ({content_type}): {e.status} {e.body}")
            continue
        refused.append(f"{what} ({content_type}): admitted")
    assert refused == []
    after = real_apiserver.core().read_node(agent.node_a)
    assert after.metadata.labels["team"] == before.metadata.labels["team"]
    assert after.metadata.annotations["other.io/note"] == "keep"
    assert after.spec.taints == before.spec.taints
    assert not after.spec.unschedulable

    # RBAC, not the policy: the chart grants nothing on Secrets or Pods.
    for call in (
        lambda: core.list_namespaced_secret(NAMESPACE),
        lambda: core.read_namespaced_secret("anything", NAMESPACE),
        core.list_pod_for_all_namespaces,
        lambda: core.list_namespaced_pod(NAMESPACE),
    ):
        with pytest.raises(k8s.ApiException) as forbidden:
            call()
        assert forbidden.value.status == 403
        assert "ValidatingAdmissionPolicy" not in str(forbidden.value.body)
        denied += 1
    print(f"identity matrix: allowed as expected {allowed}, denied as expected {denied}")
    assert (allowed, denied) == (3, 18 + 4)


# --- The heartbeat Lease: RBAC and the own-lease policy, as the apiserver enforces them ---------


def lease(name: str, holder: str) -> k8s.V1Lease:
    return k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name=name, labels={f"{PREFIX}/heartbeat": "availability"}),
        spec=k8s.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=40),
    )


def wait_for_lease_policy(leases: k8s.CoordinationV1Api, node_b: str) -> None:
    """As wait_for_policy, for the own-lease policy: a dry-run create of node B's Lease."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        try:
            leases.create_namespaced_lease(NAMESPACE, lease(node_b, node_b), dry_run="All")
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                return
            raise
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def test_the_pods_token_renews_only_its_own_nodes_lease_and_rbac_denies_the_rest(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    leases = k8s.CoordinationV1Api(agent.api)
    wait_for_lease_policy(leases, agent.node_b)
    # The real agent, with the pod's token: its heartbeat lands, owned by its Node.
    own = run_agent(
        agent,
        agent.node_a,
        "--availability",
        "--simulate-used",
        "0,1",
        "--heartbeat",
        POD_NAMESPACE=NAMESPACE,
    )
    assert own.returncode == 0, own.stderr
    admin = k8s.CoordinationV1Api(real_apiserver.api())
    stored = admin.read_namespaced_lease(agent.node_a, NAMESPACE)
    assert stored.spec.holder_identity == agent.node_a
    node_uid = real_apiserver.core().read_node(agent.node_a).metadata.uid
    assert [(o.kind, o.name, o.uid) for o in stored.metadata.owner_references] == [
        ("Node", agent.node_a, node_uid)
    ]
    # A renewal (update) of its own Lease is admitted, up to the chart's duration (40 s).
    stored.spec.lease_duration_seconds = 39
    stored = leases.replace_namespaced_lease(agent.node_a, NAMESPACE, stored)

    refused: list[str] = []
    denied = 0
    for what, call in (
        ("create another node's Lease", lambda: leases.create_namespaced_lease(
            NAMESPACE, lease(agent.node_b, agent.node_b))),
        ("create a Lease held by another node", lambda: leases.create_namespaced_lease(
            NAMESPACE, lease(f"{agent.node_a}-x", agent.node_b))),
        ("hand its own Lease to another node", lambda: leases.replace_namespaced_lease(
            agent.node_a, NAMESPACE, _held_by(leases, agent.node_a, agent.node_b))),
        ("make its own Lease vouch for a day", lambda: leases.replace_namespaced_lease(
            agent.node_a, NAMESPACE, _lasting(leases, agent.node_a, 86400))),
        ("make its own Lease vouch one second past the chart's duration",
         lambda: leases.replace_namespaced_lease(
            agent.node_a, NAMESPACE, _lasting(leases, agent.node_a, 41))),
    ):  # fmt: skip
        try:
            call()
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                denied += 1
                continue
            refused.append(f"{what}: {e.status} {e.body}")
            continue
        refused.append(f"{what}: admitted")
    assert refused == []
    # RBAC, not the policy: no list, watch, patch or delete; no Lease outside its namespace.
    for call in (
        lambda: leases.list_namespaced_lease(NAMESPACE),
        lambda: leases.patch_namespaced_lease(agent.node_a, NAMESPACE, {"spec": {}}),
        lambda: leases.delete_namespaced_lease(agent.node_a, NAMESPACE),
        lambda: leases.create_namespaced_lease("default", lease(agent.node_a, agent.node_a)),
        lambda: leases.read_namespaced_lease(agent.node_a, "kube-node-lease"),
    ):
        with pytest.raises(k8s.ApiException) as forbidden:
            call()
        assert forbidden.value.status == 403
        assert "ValidatingAdmissionPolicy" not in str(forbidden.value.body)
        denied += 1
    assert denied == 5 + 5
    assert admin.read_namespaced_lease(agent.node_a, NAMESPACE).spec.holder_identity == agent.node_a


def _lasting(leases: k8s.CoordinationV1Api, name: str, seconds: int) -> k8s.V1Lease:
    current = leases.read_namespaced_lease(name, NAMESPACE)
    current.spec.lease_duration_seconds = seconds
    return current


def _held_by(leases: k8s.CoordinationV1Api, name: str, holder: str) -> k8s.V1Lease:
    current = leases.read_namespaced_lease(name, NAMESPACE)
    current.spec.holder_identity = holder
    return current


def test_the_extenders_token_may_list_and_watch_leases_in_the_release_namespace_only(
    real_apiserver: RealApiServer, chart_installed: None
) -> None:
    extender = f"{FULLNAME}-extender"
    token = real_apiserver.core().create_namespaced_service_account_token(
        extender,
        NAMESPACE,
        k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[])),
    )
    configuration = k8s.Configuration()
    admin = real_apiserver.api().configuration
    configuration.host = admin.host
    configuration.ssl_ca_cert = admin.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token.status.token}"}
    with k8s.ApiClient(configuration) as api:
        leases = k8s.CoordinationV1Api(api)
        leases.list_namespaced_lease(NAMESPACE, label_selector=f"{PREFIX}/heartbeat=availability")
        leases.list_namespaced_lease(
            NAMESPACE, watch=True, timeout_seconds=1, _preload_content=False
        )
        for call in (
            lambda: leases.list_namespaced_lease("kube-node-lease"),
            lambda: leases.read_namespaced_lease("anything", NAMESPACE),
            lambda: leases.create_namespaced_lease(NAMESPACE, lease("x", "x")),
        ):
            with pytest.raises(k8s.ApiException) as forbidden:
                call()
            assert forbidden.value.status == 403


# --- DRA DeviceTaintRules (issue 22 item 3): the pool is the node, and only the own node ------

RULES = ("resource.k8s.io", RULES_VERSION, "devicetaintrules")


def taint_rule(name: str, pool: str | None) -> dict[str, Any]:
    selector = {"driver": "gpu.nvidia.com", "device": "gpu-0"}
    if pool is not None:
        selector["pool"] = pool
    return {
        "apiVersion": f"resource.k8s.io/{RULES_VERSION}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": f"{PREFIX}/gpu-unhealthy", "value": "lost", "effect": "NoSchedule"},
        },
    }


def wait_for_rule_policy(api: k8s.CustomObjectsApi, node_b: str) -> None:
    """As wait_for_policy, for the DeviceTaintRule policy: a dry-run create for node B's pool."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        try:
            api.create_cluster_custom_object(*RULES, taint_rule("probe", node_b), dry_run="All")
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                return
            raise
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def agent_rule(node: str, device: str = "gpu-0") -> dict[str, Any]:
    """The rule the agent on `node` writes for `device` (reporter.schema.dra.rule)."""
    return dra.rule(
        dra.DeviceTaint(0, device, dra.REASON_LOST), node=node, prefix=PREFIX, version=RULES_VERSION
    )


def changed_rule(rule: dict[str, Any], *path: str, value: Any) -> dict[str, Any]:
    """`rule` with the field at `path` set to `value` (dropped for None)."""
    rule = copy.deepcopy(rule)
    here = rule
    for part in path[:-1]:
        here = here[part]
    if value is None:
        here.pop(path[-1], None)
    else:
        here[path[-1]] = value
    return rule


def test_the_pods_token_taints_only_its_own_nodes_devices_as_the_agent_writes_them(
    real_apiserver: RealApiServer, agent: Agent, tmp_path: Path
) -> None:
    # Issue 28 items 5 to 8, each as the apiserver's own CEL decides it on the pod's token.
    rules = k8s.CustomObjectsApi(agent.api)
    admin = k8s.CustomObjectsApi(real_apiserver.api())
    wait_for_rule_policy(rules, agent.node_b)
    a, b = agent.node_a, agent.node_b
    foreign = f"foreign-{b}"
    admin.create_cluster_custom_object(*RULES, taint_rule(foreign, b))
    # An administrator's quarantines of node A's gpu-1, evicting its pods: one of their own
    # making, one that wears the agent's name and labels.
    quarantine = changed_rule(
        taint_rule(f"quarantine-{a}", a),
        "spec",
        "taint",
        value={"key": "example.com/quarantine", "effect": "NoExecute"},
    )
    disguised = changed_rule(agent_rule(a, "gpu-1"), "spec", "taint", "effect", value="NoExecute")
    for rule in (quarantine, disguised):
        admin.create_cluster_custom_object(*RULES, rule)
    own = agent_rule(a)
    squat = changed_rule(agent_rule(a), "metadata", "name", value=dra.rule_name(b, "gpu-0"))
    try:
        rules.create_cluster_custom_object(*RULES, own)
        refused: list[str] = []
        denied = 0
        for what, call in (
            ("create for another node's pool", lambda: rules.create_cluster_custom_object(
                *RULES, agent_rule(b, "gpu-1"))),
            ("create another node's rule name in its own pool (a squat)",
             lambda: rules.create_cluster_custom_object(*RULES, squat)),
            ("create a name of its own choosing", lambda: rules.create_cluster_custom_object(
                *RULES, changed_rule(agent_rule(a, "gpu-2"), "metadata", "name", value="x"))),
            ("create without a pool (every pool's gpu-2)",
             lambda: rules.create_cluster_custom_object(*RULES, changed_rule(
                 agent_rule(a, "gpu-2"), "spec", "deviceSelector", "pool", value=None))),
            ("create NoExecute", lambda: rules.create_cluster_custom_object(*RULES, changed_rule(
                agent_rule(a, "gpu-2"), "spec", "taint", "effect", value="NoExecute"))),
            ("create another taint key", lambda: rules.create_cluster_custom_object(
                *RULES, changed_rule(
                    agent_rule(a, "gpu-2"), "spec", "taint", "key", value="example.com/x"))),
            ("create without a driver (every driver's)",
             lambda: rules.create_cluster_custom_object(*RULES, changed_rule(
                 agent_rule(a, "gpu-2"), "spec", "deviceSelector", "driver", value=None))),
            ("create without a device (the whole pool)",
             lambda: rules.create_cluster_custom_object(*RULES, changed_rule(
                 agent_rule(a, "gpu-2"), "spec", "deviceSelector", "device", value=None))),
            ("delete another node's rule",
             lambda: rules.delete_cluster_custom_object(*RULES, foreign)),
            ("delete an administrator's NoExecute quarantine in its own pool",
             lambda: rules.delete_cluster_custom_object(*RULES, quarantine["metadata"]["name"])),
            ("delete a NoExecute quarantine under its own name and labels",
             lambda: rules.delete_cluster_custom_object(*RULES, disguised["metadata"]["name"])),
        ):  # fmt: skip
            try:
                call()
            except k8s.ApiException as e:
                if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                    denied += 1
                    continue
                refused.append(f"{what}: {e.status} {e.body}")
                continue
            refused.append(f"{what}: admitted")
        assert refused == []
        assert denied == 11
        # RBAC, not the policy: the chart grants list, create and delete, no update.
        with pytest.raises(k8s.ApiException) as forbidden:
            rules.patch_cluster_custom_object(
                *RULES, own["metadata"]["name"], {"metadata": {"labels": {"x": "y"}}}
            )
        assert forbidden.value.status == 403
        assert "ValidatingAdmissionPolicy" not in str(forbidden.value.body)
        rules.delete_cluster_custom_object(*RULES, own["metadata"]["name"])
        kept = {r["metadata"]["name"] for r in admin.list_cluster_custom_object(*RULES)["items"]}
        assert {foreign, quarantine["metadata"]["name"], disguised["metadata"]["name"]} <= kept
    finally:
        for name in (
            own["metadata"]["name"],
            foreign,
            quarantine["metadata"]["name"],
            disguised["metadata"]["name"],
        ):
            with contextlib.suppress(k8s.ApiException):
                admin.delete_cluster_custom_object(*RULES, name)


def test_the_agent_with_the_pods_token_writes_its_nodes_rule_and_not_anothers(
    real_apiserver: RealApiServer, agent: Agent, tmp_path: Path
) -> None:
    machine = profile(tmp_path, [1])
    admin = k8s.CustomObjectsApi(real_apiserver.api())
    wait_for_rule_policy(k8s.CustomObjectsApi(agent.api), agent.node_b)

    def agent_run(node: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *CLI,
                "run",
                "--simulate",
                str(machine),
                "--once",
                "--listen",
                "",
                "--dra-device-taints",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(
                KUBECONFIG=str(agent.kubeconfig), NODE_NAME=node, TOPO_REPORTER_LOG_FORMAT="json"
            ),
            check=False,
        )

    def rules_of(node: str) -> list[str]:
        found = admin.list_cluster_custom_object(
            *RULES, label_selector=dra.owned_selector(node, PREFIX)
        )
        return [r["spec"]["deviceSelector"]["device"] for r in found["items"]]

    try:
        own = agent_run(agent.node_a)
        assert own.returncode == 0, own.stderr
        assert rules_of(agent.node_a) == ["gpu-1"]
        other = agent_run(agent.node_b)
        assert other.returncode == 1
        assert "may write only DeviceTaintRules of the Node its pod runs on" in other.stderr
        assert rules_of(agent.node_b) == []
    finally:
        for node in (agent.node_a, agent.node_b):
            found = admin.list_cluster_custom_object(
                *RULES, label_selector=dra.owned_selector(node, PREFIX)
            )
            for rule in found["items"]:
                admin.delete_cluster_custom_object(*RULES, rule["metadata"]["name"])


def test_a_rule_someone_labelled_for_the_agents_node_does_not_stop_the_agents_rules(
    real_apiserver: RealApiServer, agent: Agent, tmp_path: Path
) -> None:
    # Anyone who may create DeviceTaintRules can put the agent's labels on one in another
    # node's pool. The agent took it for its own and deleted it; the policy refused the delete,
    # and the sink stopped before creating the agent's own rule, at every scan (redteam).
    machine = profile(tmp_path, [1])
    admin = k8s.CustomObjectsApi(real_apiserver.api())
    wait_for_rule_policy(k8s.CustomObjectsApi(agent.api), agent.node_b)
    planted = taint_rule(f"planted-{agent.node_a}", agent.node_b)
    planted["metadata"]["labels"] = {
        "app.kubernetes.io/managed-by": "topo-reporter",
        f"{PREFIX}/node": agent.node_a,
    }
    admin.create_cluster_custom_object(*RULES, planted)
    try:
        run = subprocess.run(
            [
                *CLI,
                "run",
                "--simulate",
                str(machine),
                "--once",
                "--listen",
                "",
                "--dra-device-taints",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(
                KUBECONFIG=str(agent.kubeconfig),
                NODE_NAME=agent.node_a,
                TOPO_REPORTER_LOG_FORMAT="json",
            ),
            check=False,
        )
        assert run.returncode == 0, run.stderr
        names = {r["metadata"]["name"] for r in admin.list_cluster_custom_object(*RULES)["items"]}
        assert {dra.rule_name(agent.node_a, "gpu-1"), planted["metadata"]["name"]} <= names
        assert "device_taint_rules_not_ours" in run.stdout + run.stderr
    finally:
        found = admin.list_cluster_custom_object(
            *RULES, label_selector=dra.owned_selector(agent.node_a, PREFIX)
        )
        for rule in found["items"]:
            admin.delete_cluster_custom_object(*RULES, rule["metadata"]["name"])


def test_a_rule_someone_else_holds_under_the_agents_name_is_told_on_the_node(
    real_apiserver: RealApiServer, agent: Agent, tmp_path: Path
) -> None:
    # Issue 28 item 5: no agent can squat another's rule name any more (the policy, above), but
    # whoever else may create rules can. The agent cannot mark its GPU then; it says so, in its
    # log and in a Warning Event on its Node, and goes on with its other work.
    machine = profile(tmp_path, [1])
    admin = k8s.CustomObjectsApi(real_apiserver.api())
    wait_for_rule_policy(k8s.CustomObjectsApi(agent.api), agent.node_b)
    squatted = taint_rule(dra.rule_name(agent.node_a, "gpu-1"), agent.node_b)
    admin.create_cluster_custom_object(*RULES, squatted)
    try:
        run = subprocess.run(
            [
                *CLI,
                "run",
                "--simulate",
                str(machine),
                "--once",
                "--listen",
                "",
                "--dra-device-taints",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(
                KUBECONFIG=str(agent.kubeconfig),
                NODE_NAME=agent.node_a,
                TOPO_REPORTER_LOG_FORMAT="json",
            ),
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert "device_taint_rule_blocked" in run.stdout + run.stderr
        events = real_apiserver.core().list_namespaced_event(
            "default",
            field_selector=f"involvedObject.kind=Node,involvedObject.name={agent.node_a}",
        )
        (blocked,) = [e for e in events.items if e.reason == "DeviceTaintRuleNameTaken"]
        assert blocked.type == "Warning"
        assert squatted["metadata"]["name"] in blocked.message
        assert blocked.reporting_instance == agent.node_a
        stored = admin.get_cluster_custom_object(*RULES, squatted["metadata"]["name"])
        assert stored["spec"]["deviceSelector"] == squatted["spec"]["deviceSelector"]
        labels = real_apiserver.core().read_node(agent.node_a).metadata.labels
        assert labels[f"{PREFIX}/count"] == "4"
    finally:
        admin.delete_cluster_custom_object(*RULES, squatted["metadata"]["name"])


# --- Events (issue 28 item 9): the agent's token speaks only about its own Node ----------------


def event_about(node: str, message: str, *, reporter: str | None = None) -> dict[str, Any]:
    """A GPUTopologyDegraded Event about `node` as the agent posts it (its own body builder),
    reported by `reporter` (default: the node itself)."""
    body = event_body(
        NodeMetadata(node), EventType.WARNING, DEGRADED_REASON, message, datetime.now(UTC)
    )
    if reporter is not None:
        body["reportingInstance"] = reporter
        body["source"]["host"] = reporter
    return body


def wait_for_event_policy(core: k8s.CoreV1Api, node_b: str) -> None:
    """As wait_for_policy, for the own-events policy: a dry-run Event about node B."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        try:
            core.create_namespaced_event("default", event_about(node_b, "probe"), dry_run="All")
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                return
            raise
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def test_the_pods_token_posts_events_only_about_its_own_node_and_the_doctor_shows_only_those(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    core = k8s.CoreV1Api(agent.api)
    wait_for_event_policy(core, agent.node_b)
    a, b = agent.node_a, agent.node_b
    # Both nodes carry a topology, so the doctor judges their agents: A's by A's own token, B's
    # by the admin (A's token may not).
    assert run_agent(agent, a).returncode == 0
    published = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=str(real_apiserver.kubeconfig), NODE_NAME=b),
        check=False,
    )
    assert published.returncode == 0, published.stderr
    core.create_namespaced_event("default", event_about(a, "nvml: own word"))
    refused: list[str] = []
    for what, body in (
        ("about another node", event_about(b, "nvml: forged about b")),
        ("about its node, reported by another", event_about(a, "nvml: forged", reporter=b)),
        ("about another node, reported by it", event_about(b, "nvml: forged", reporter=b)),
    ):
        try:
            core.create_namespaced_event("default", body)
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                continue
            refused.append(f"{what}: {e.status} {e.body}")
            continue
        refused.append(f"{what}: admitted")
    assert refused == []
    # What another node's agent could post before the policy (or where it is off), written here
    # by the admin: the doctor does not take it for node B's agent's word about B.
    admin = real_apiserver.core()
    admin.create_namespaced_event("default", event_about(b, "nvml: forged by a", reporter=a))
    shown = subprocess.run(
        [*CLI, "doctor", "--kubeconfig", str(real_apiserver.kubeconfig), "--node", b],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "forged" not in shown.stdout, shown.stdout
    assert "agent-degraded" not in shown.stdout
    own = subprocess.run(
        [*CLI, "doctor", "--kubeconfig", str(real_apiserver.kubeconfig), "--node", a],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "evidence: nvml: own word" in own.stdout, own.stdout


# --- managedFields (issue 28): the agent cannot hand foreign fields to another manager ---------

APPLY = "application/apply-patch+yaml"
OPERATOR = "gpu-operator"


def operator_apply(server: RealApiServer, node: str) -> None:
    """What a server-side-applying controller does on the node: its own label, and (someone's
    leftover) a key under our prefix, which the agent's next publish takes over."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {"example.com/operator": "on", f"{PREFIX}/count": "1"},
        },
    }
    server.core().patch_node(node, body, field_manager=OPERATOR, force=True, _content_type=APPLY)


def handed_over(server: RealApiServer, node: str, label: str) -> list[dict[str, Any]]:
    """The Node's managedFields with `label` taken from every manager and given to OPERATOR's
    applied set: its next apply, which omits the label, then deletes it."""
    entries = server.api().sanitize_for_serialization(
        server.core().read_node(node).metadata.managed_fields
    )
    for entry in entries:
        labels = entry.get("fieldsV1", {}).get("f:metadata", {}).get("f:labels", {})
        labels.pop(f"f:{label}", None)
        if entry["manager"] == OPERATOR and entry["operation"] == "Apply":
            labels[f"f:{label}"] = {}
    return list(entries)


def test_the_pods_token_cannot_hand_foreign_fields_to_another_manager(
    real_apiserver: RealApiServer, agent: Agent
) -> None:
    core = k8s.CoreV1Api(agent.api)
    a = agent.node_a
    operator_apply(real_apiserver, a)
    # The agent's ordinary publish takes our key over from the operator's applied set: admitted.
    assert run_agent(agent, a).returncode == 0
    entries = real_apiserver.core().read_node(a).metadata.managed_fields
    (applied,) = [e for e in entries if e.manager == OPERATOR]
    assert f"f:{PREFIX}/count" not in applied.fields_v1["f:metadata"]["f:labels"]
    refused: list[str] = []
    for content_type in (MERGE, STRATEGIC):
        body = {
            "metadata": {
                "managedFields": handed_over(real_apiserver, a, "team"),
                "labels": {f"{PREFIX}/count": "8"},
            }
        }
        try:
            core.patch_node(a, body, _content_type=content_type)
        except k8s.ApiException as e:
            if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                continue
            refused.append(f"{content_type}: {e.status} {e.body}")
            continue
        refused.append(f"{content_type}: admitted")
    # The operator applies again, as it does on every reconcile: `team` stays, since nobody
    # handed it to the operator.
    operator_apply(real_apiserver, a)
    assert real_apiserver.core().read_node(a).metadata.labels.get("team") == "ml"
    assert refused == []
