"""The Helm chart renders, lints and validates, and its objects carry the promised properties.

Security and scheduling properties are asserted on the rendered objects, not on template text:
what the API server would receive is what is checked.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from reporter.publish.client import NODE_EVENT_NAMESPACE
from reporter.publish.devicetaints import RBAC_VERBS as DEVICE_TAINT_RBAC_VERBS
from reporter.publish.lease import RBAC_VERBS as LEASE_RBAC_VERBS
from reporter.publish.lease import WATCH_RBAC_VERBS as LEASE_WATCH_RBAC_VERBS
from reporter.publish.nodefeature import RBAC_VERBS
from reporter.publish.nrt import RBAC_VERBS as NRT_RBAC_VERBS
from tests.support.helm_chart import (
    ALL_ON,
    CHART_DIR,
    EXTENDER_ALONE,
    FULLNAME,
    KUBE_1_30,
    NAMESPACE,
    NODE_POLICY,
    SCHEDULER_PEER,
    VAP_API,
    Rendered,
    container,
    env,
    pyproject_version,
    render,
)

NEWEST = kubernetes_validate.utils.latest_version()
# Kinds kubernetes-validate has no schema for: CRDs of other projects. Checked field by field (the
# PrometheusRule's rules by the real promtool, tests/chart/test_prometheus_rules.py).
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
SA_USER = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"


def chart_min_kube() -> str:
    """The oldest Kubernetes minor Chart.yaml's kubeVersion accepts (`>=1.25.0-0` -> `1.25`)."""
    with (CHART_DIR / "Chart.yaml").open() as f:
        constraint = str(yaml.safe_load(f)["kubeVersion"])
    assert constraint.startswith(">="), constraint
    return ".".join(constraint[2:].split(".")[:2])


NRT_KOORD: dict[str, Any] = {
    "availability": {"enabled": True},
    "nrt": {"enabled": True},
    "koordinator": {"enabled": True, "hostPath": "/var/run/koordlet/xpu-device-infos"},
}
# (values, the cluster's API versions, Kubernetes version): each rendered and validated.
RENDERS = {
    "defaults, cluster without the policy API, oldest supported": ({}, (), chart_min_kube()),
    "defaults, cluster with the policy API, 1.30": ({}, (VAP_API,), KUBE_1_30),
    "defaults, cluster with the policy API, newest": ({}, (VAP_API,), NEWEST),
    "every option on, 1.30": (ALL_ON, (VAP_API,), KUBE_1_30),
    "every option on, newest": (ALL_ON, (VAP_API,), NEWEST),
    "nodefeature sink, newest": ({"agent": {"sink": "nodefeature"}}, (VAP_API,), NEWEST),
    "availability on, newest": ({"availability": {"enabled": True}}, (VAP_API,), NEWEST),
    "availability and the extender on, heartbeats judged, oldest supported": (
        {"availability": {"enabled": True}, **EXTENDER_ALONE},
        (),
        chart_min_kube(),
    ),
    "nrt and koordinator on, newest": (NRT_KOORD, (VAP_API,), NEWEST),
    "nrt and koordinator on, oldest supported": (NRT_KOORD, (), chart_min_kube()),
    "extender alone, oldest supported": (EXTENDER_ALONE, (), chart_min_kube()),
    "extender alone, newest": (EXTENDER_ALONE, (), NEWEST),
}


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render(api_versions=(VAP_API,))


@pytest.fixture(scope="module")
def all_on() -> Rendered:
    return render(ALL_ON, api_versions=(VAP_API,))


@pytest.fixture(scope="module")
def nodefeature() -> Rendered:
    return render({"agent": {"sink": "nodefeature"}}, api_versions=(VAP_API,))


def test_app_version_is_the_package_version() -> None:
    assert helm.Chart.load(CHART_DIR).metadata["appVersion"] == pyproject_version()


def test_default_image_tag_is_the_package_version(default: Rendered) -> None:
    assert container(default)["image"] == f"topo-reporter:{pyproject_version()}"


@pytest.mark.parametrize(
    ("values", "kube"),
    [({}, KUBE_1_30), (ALL_ON, KUBE_1_30), ({}, NEWEST), ({**ALL_ON, **NRT_KOORD}, NEWEST)],
    ids=[
        "defaults lint clean",
        "every option on lints clean",
        "defaults lint clean on newest",
        "nrt and koordinator on lint clean",
    ],
)
def test_lint_reports_no_warning_or_error(values: dict[str, Any], kube: str) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{kube}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []
    assert report["errors"] == []


@pytest.mark.parametrize("case", RENDERS.keys())
def test_every_object_validates_against_the_kubernetes_schemas(case: str) -> None:
    values, apis, kube = RENDERS[case]
    rendered = render(values, api_versions=apis, kube_version=kube)
    checked = 0
    for obj in rendered.everything():
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, kube, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {kube}: {e.message}")
        checked += 1
    assert checked >= 4


def test_defaults_render_the_agent_its_identity_rbac_and_policy(default: Rendered) -> None:
    assert default.kinds() == {
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }


def test_every_option_on_adds_metrics_service_and_servicemonitor(all_on: Rendered) -> None:
    assert {"Service", "ServiceMonitor"} <= all_on.kinds()


# --- The admission policy switch --------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "cluster_serves_policy_api", "installed"),
    [
        ("auto", True, True),
        ("auto", False, False),
        (True, False, True),
        (False, True, False),
    ],
    ids=[
        "auto installs the policy where the cluster serves the API",
        "auto skips the policy where the cluster lacks the API",
        "true forces the policy",
        "false leaves it out",
    ],
)
def test_admission_policy_switch(
    mode: object, cluster_serves_policy_api: bool, installed: bool
) -> None:
    apis = (VAP_API,) if cluster_serves_policy_api else ()
    rendered = render({"admissionPolicy": {"enabled": mode}}, api_versions=apis)
    kinds = rendered.kinds()
    assert ("ValidatingAdmissionPolicy" in kinds) is installed
    assert ("ValidatingAdmissionPolicyBinding" in kinds) is installed


def test_policy_binding_denies_and_names_the_policy(default: Rendered) -> None:
    policy = default.named("ValidatingAdmissionPolicy", NODE_POLICY)
    binding = default.named("ValidatingAdmissionPolicyBinding", NODE_POLICY)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    # The API server rejects a validation message holding a line break.
    assert all("\n" not in v["message"] for v in policy["spec"]["validations"])
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]


@pytest.mark.parametrize(
    ("mode", "cluster_serves_policy_api", "installed"),
    [("auto", True, True), ("auto", False, False), (True, False, True), (False, True, False)],
    ids=["auto, with the API", "auto, without the API", "forced on", "forced off"],
)
@pytest.mark.parametrize("sink", ["node", "nodefeature"])
def test_the_own_events_policy_follows_the_admission_policy_switch_with_either_sink(
    mode: object, cluster_serves_policy_api: bool, installed: bool, sink: str
) -> None:
    apis = (VAP_API,) if cluster_serves_policy_api else ()
    values = {"admissionPolicy": {"enabled": mode}, "agent": {"sink": sink}}
    rendered = render(values, api_versions=apis)
    policies = [p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")]
    bindings = [
        b["spec"]["policyName"] for b in rendered.of_kind("ValidatingAdmissionPolicyBinding")
    ]
    assert (f"{FULLNAME}-own-events" in policies) is installed
    assert (f"{FULLNAME}-own-events" in bindings) is installed


def test_the_own_events_policy_covers_create_and_update_of_core_events(default: Rendered) -> None:
    policy = default.named("ValidatingAdmissionPolicy", f"{FULLNAME}-own-events")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"] == {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["events"],
            }
        ],
    }
    assert all("\n" not in v["message"] for v in policy["spec"]["validations"])
    binding = default.named("ValidatingAdmissionPolicyBinding", f"{FULLNAME}-own-events")
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_policy_matches_the_agents_own_service_account(all_on: Rendered) -> None:
    (condition,) = all_on.named("ValidatingAdmissionPolicy", NODE_POLICY)["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:topo"'
    )


def test_nodefeature_sink_has_no_node_rights_and_no_node_policy(nodefeature: Rendered) -> None:
    assert not {"ClusterRole", "ClusterRoleBinding"} & nodefeature.kinds()
    # The Event policy (that sink posts Events about its Node too) and the prune hook's: no Node
    # policy.
    policies = [p["metadata"]["name"] for p in nodefeature.of_kind("ValidatingAdmissionPolicy")]
    assert sorted(policies) == sorted([f"{FULLNAME}-own-events", f"{FULLNAME}-prune"])
    for role in nodefeature.of_kind("Role"):
        assert all("nodes" not in rule["resources"] for rule in role["rules"])


# --- RBAC --------------------------------------------------------------------------------------


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _named(rendered: Rendered, kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [o for o in rendered.of_kind(kind) if o["metadata"]["name"].endswith(suffix)]
    return found


def test_node_sink_clusterrole_holds_exactly_node_get_and_patch(default: Rendered) -> None:
    assert _rules(default.one("ClusterRole")) == {("", "nodes", "get"), ("", "nodes", "patch")}


@pytest.mark.parametrize("fixture", ["default", "nodefeature"], ids=["node sink", "nodefeature"])
def test_events_are_granted_only_in_default_where_node_events_go(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """Not a ClusterRole: the agent can post Events in `default` and nowhere else (issue 11)."""
    rendered: Rendered = request.getfixturevalue(fixture)
    role = _named(rendered, "Role", "-node-events")
    assert role["metadata"]["namespace"] == NODE_EVENT_NAMESPACE == "default"
    assert _rules(role) == {("", "events", "create")}
    binding = _named(rendered, "RoleBinding", "-node-events")
    assert binding["metadata"]["namespace"] == "default"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    granting_events = [
        r["metadata"].get("namespace")
        for kind in ("ClusterRole", "Role")
        for r in rendered.of_kind(kind)
        if any(resource == "events" for _, resource, _ in _rules(r))
    ]
    assert granting_events == ["default"]


def test_nodefeature_sink_role_is_namespaced_on_nodefeatures(nodefeature: Rendered) -> None:
    role = _named(nodefeature, "Role", FULLNAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    # Exactly the verbs the sink uses (tests/publish/test_nodefeature.py checks it uses these).
    assert _rules(role) == {("nfd.k8s-sigs.io", "nodefeatures", v) for v in RBAC_VERBS}


@pytest.mark.parametrize(
    "fixture", ["default", "all_on", "nodefeature"], ids=["defaults", "all on", "nodefeature"]
)
def test_no_rbac_wildcard(fixture: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(fixture)
    for kind in ("ClusterRole", "Role"):
        for role in [o for o in rendered.everything() if o["kind"] == kind]:
            for group, resource, verb in _rules(role):
                assert "*" not in (group, resource, verb)


@pytest.mark.parametrize(
    ("fixture", "binding_kind", "sa_name"),
    [("default", "ClusterRoleBinding", FULLNAME), ("nodefeature", "RoleBinding", FULLNAME)],
    ids=["node sink binds the ClusterRole", "nodefeature sink binds the Role"],
)
def test_binding_grants_the_role_to_the_agents_service_account(
    fixture: str, binding_kind: str, sa_name: str, request: pytest.FixtureRequest
) -> None:
    rendered: Rendered = request.getfixturevalue(fixture)
    binding = _named(rendered, binding_kind, FULLNAME)
    role_kind = binding_kind.removesuffix("Binding")
    assert binding["roleRef"]["name"] == _named(rendered, role_kind, FULLNAME)["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}
    ]
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    assert (
        pod["serviceAccountName"] == sa_name == rendered.one("ServiceAccount")["metadata"]["name"]
    )


def test_existing_service_account_is_used_when_the_chart_creates_none() -> None:
    rendered = render({"serviceAccount": {"create": False, "name": "gpu-agents"}})
    assert "ServiceAccount" not in rendered.kinds()
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-agents"
    assert rendered.one("ClusterRoleBinding")["subjects"][0]["name"] == "gpu-agents"


def test_rbac_create_false_renders_no_role() -> None:
    kinds = render({"rbac": {"create": False}}).kinds()
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & kinds


# --- The pod: security --------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["default", "all_on"], ids=["defaults", "all on"])
def test_container_is_locked_down(fixture: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(fixture)
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    sc = container(rendered)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_namespace, False)


@pytest.mark.parametrize("fixture", ["default", "all_on"], ids=["defaults", "all on"])
def test_every_host_path_is_mounted_read_only(fixture: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(fixture)
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    host_volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container(rendered)["volumeMounts"]}
    assert host_volumes
    for name in host_volumes:
        assert mounts[name].get("readOnly") is True, name
    assert host_volumes["host-sys"] == {"path": "/sys", "type": "Directory"}
    assert mounts["host-sys"]["mountPath"] == "/host/sys"
    assert env(rendered)["TOPO_REPORTER_SYSFS_ROOT"] == "/host/sys"


def test_kubelet_config_is_mounted_read_only_as_a_file(all_on: Rendered) -> None:
    pod = all_on.one("DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "kubelet-config")
    assert volume["hostPath"] == {"path": "/etc/kubernetes/kubelet.yaml", "type": "File"}
    mount = next(m for m in container(all_on)["volumeMounts"] if m["name"] == "kubelet-config")
    assert mount["readOnly"] is True
    assert env(all_on)["TOPO_REPORTER_KUBELET_CONFIG"] == mount["mountPath"]


def test_kubelet_config_disabled_mounts_nothing_and_sets_nothing() -> None:
    rendered = render({"kubeletConfig": {"enabled": False}})
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    assert all(v["name"] != "kubelet-config" for v in pod["volumes"])
    assert all(m["name"] != "kubelet-config" for m in container(rendered)["volumeMounts"])
    assert "TOPO_REPORTER_KUBELET_CONFIG" not in env(rendered)


def test_the_stated_topology_manager_policy_reaches_the_agent_only_when_set() -> None:
    assert "TOPO_REPORTER_TOPOLOGY_MANAGER_POLICY" not in env(render({}))
    stated = render(
        {
            "kubeletConfig": {
                "enabled": False,
                "topologyManagerPolicy": "single-numa-node",
                "topologyManagerScope": "pod",
            }
        }
    )
    assert env(stated)["TOPO_REPORTER_TOPOLOGY_MANAGER_POLICY"] == "single-numa-node"
    assert env(stated)["TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE"] == "pod"


def test_availability_mounts_the_pod_resources_directory_read_only_and_runs_as_root() -> None:
    rendered = render({"availability": {"enabled": True}})
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    # The directory, not the socket: the kubelet replaces the socket when it restarts.
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    mount = next(m for m in container(rendered)["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    sc = container(rendered)["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False


def test_availability_turns_the_agent_on_with_its_interval_and_the_mounted_socket() -> None:
    rendered = render({"availability": {"enabled": True, "interval": "30s"}})
    variables = env(rendered)
    assert variables["TOPO_REPORTER_AVAILABILITY"] == "true"
    assert variables["TOPO_REPORTER_AVAILABILITY_INTERVAL"] == "30s"
    assert variables["TOPO_REPORTER_ON_NODE_POLICY"] == "nvidia-besteffort"
    mount = next(m for m in container(rendered)["volumeMounts"] if m["name"] == "pod-resources")
    assert variables["TOPO_REPORTER_POD_RESOURCES_SOCKET"] == mount["mountPath"] + "/kubelet.sock"
    assert (
        env(render({"availability": {"enabled": True}}))["TOPO_REPORTER_AVAILABILITY_INTERVAL"]
        == "10s"
    )
    packing = {"availability": {"enabled": True, "onNodePolicy": "packing"}}
    assert env(render(packing))["TOPO_REPORTER_ON_NODE_POLICY"] == "packing"


def test_availability_off_sets_none_of_its_variables(default: Rendered) -> None:
    assert not {k for k in env(default) if "AVAILABILITY" in k or "POD_RESOURCES" in k}


def test_availability_with_the_nodefeature_sink_is_refused_in_one_line() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"availability\.enabled publishes on the Node"):
        render({"availability": {"enabled": True}, "agent": {"sink": "nodefeature"}})


@pytest.mark.parametrize(
    ("availability", "where"),
    [({"interval": "1d"}, "/availability/interval"), ({"intervall": "10s"}, "/availability")],
    ids=["an interval in days", "a misspelt key"],
)
def test_the_schema_checks_the_availability_values(
    availability: dict[str, str], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"at '{where}'"):
        render({"availability": availability})


def test_availability_off_mounts_no_pod_resources_and_stays_non_root(default: Rendered) -> None:
    pod = default.one("DaemonSet")["spec"]["template"]["spec"]
    assert all(v["name"] != "pod-resources" for v in pod["volumes"])
    assert all(m["name"] != "pod-resources" for m in container(default)["volumeMounts"])
    sc = container(default)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert "runAsUser" not in sc


def test_availability_reads_the_kubelet_root_the_values_name() -> None:
    rendered = render(
        {
            "availability": {
                "enabled": True,
                "podResourcesHostPath": "/var/lib/k0s/kubelet/pod-resources",
            }
        }
    )
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"


def test_nvml_comes_through_the_nvidia_runtime_without_privilege(default: Rendered) -> None:
    pod = default.one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert env(default)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(default)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_empty_runtime_class_uses_the_cluster_default() -> None:
    pod = render({"runtimeClassName": ""}).one("DaemonSet")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod


# --- The pod: scheduling --------------------------------------------------------------------------


def test_runs_only_on_nvidia_gpu_nodes_by_default(default: Rendered) -> None:
    pod = default.one("DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    required = {
        (e["key"], e["operator"], tuple(e["values"])) for t in terms for e in t["matchExpressions"]
    }
    assert required == {
        ("feature.node.kubernetes.io/pci-10de.present", "In", ("true",)),
        ("nvidia.com/gpu.present", "In", ("true",)),
    }


def test_tolerates_the_gpu_taint_and_whatever_is_configured(all_on: Rendered) -> None:
    tolerations = all_on.one("DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert ALL_ON["tolerations"][0] in tolerations


def test_node_critical_rolling_update_small_footprint(default: Rendered) -> None:
    ds = default.one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    resources = container(default)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert "memory" in resources["limits"]


def test_selector_labels_are_immutable_subset_of_pod_labels(all_on: Rendered) -> None:
    ds = all_on.one("DaemonSet")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "topo-reporter",
        "app.kubernetes.io/instance": "tr",
    }
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_standard_and_extra_labels_and_annotations_on_every_object(all_on: Rendered) -> None:
    for obj in all_on.everything():
        labels = obj["metadata"]["labels"]
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/version"] == pyproject_version(), where
        assert labels["team"] == "platform", where
        assert obj["metadata"]["annotations"]["owner"] == "platform@example.com", where


def test_pod_labels_annotations_and_pull_secrets(all_on: Rendered) -> None:
    pod = all_on.one("DaemonSet")["spec"]["template"]
    assert pod["metadata"]["labels"]["tier"] == "node-agent"
    assert pod["metadata"]["annotations"] == {"example.com/scrape": "true"}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-cred"}]
    assert pod["spec"]["nodeSelector"] == {"node-role.example.com/gpu": "true"}


# --- The agent's settings, probes and metrics --------------------------------------------------


def test_container_runs_topo_reporter_run(default: Rendered) -> None:
    c = container(default)
    assert [*c["command"], *c["args"]] == ["topo-reporter", "run"]


def test_default_values_map_onto_the_agent_settings_contract(default: Rendered) -> None:
    assert env(default) == {
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "TOPO_REPORTER_PREFIX": "gpu.topology.io",
        "TOPO_REPORTER_INTERVAL": "60s",
        "TOPO_REPORTER_RESYNC": "5m",
        "TOPO_REPORTER_BACKEND": "auto",
        "TOPO_REPORTER_SINK": "node",
        "TOPO_REPORTER_SYSFS_ROOT": "/host/sys",
        "TOPO_REPORTER_LISTEN": "0.0.0.0:8080",
        "TOPO_REPORTER_LOG_FORMAT": "json",
        "TOPO_REPORTER_LOG_LEVEL": "info",
        "TOPO_REPORTER_KUBELET_CONFIG": "/host/kubelet/config.yaml",
        "TOPO_REPORTER_NETWORK_LABEL_STYLE": "topo-reporter",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
    }


def test_every_agent_value_reaches_its_environment_variable(all_on: Rendered) -> None:
    assert (
        env(all_on).items()
        >= {
            "TOPO_REPORTER_PREFIX": "topo.example.com",
            "TOPO_REPORTER_INTERVAL": "90s",
            "TOPO_REPORTER_RESYNC": "10m",
            "TOPO_REPORTER_BACKEND": "nvml",
            "TOPO_REPORTER_LISTEN": "0.0.0.0:9400",
            "TOPO_REPORTER_LOG_FORMAT": "console",
            "TOPO_REPORTER_LOG_LEVEL": "debug",
            "TOPO_REPORTER_SIMULATE": "dgx-h100",
            "TZ": "UTC",
        }.items()
    )
    assert env(render({"agent": {"sink": "nodefeature"}}))["TOPO_REPORTER_SINK"] == "nodefeature"


def test_probes_hit_health_endpoints_on_the_listen_port(all_on: Rendered) -> None:
    c = container(all_on)
    assert c["ports"] == [{"name": "http", "containerPort": 9400, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_servicemonitor_scrapes_metrics_through_the_headless_service(all_on: Rendered) -> None:
    (service,) = [
        s for s in all_on.of_kind("Service") if s["metadata"]["name"].endswith("-metrics")
    ]
    # The agents' (the extender's has its own, tests/chart/test_dashboard.py).
    (monitor,) = [
        m
        for m in all_on.of_kind("ServiceMonitor")
        if not m["metadata"]["name"].endswith("-extender")
    ]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["port"] == 9400
    pod_labels = all_on.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "30s")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_servicemonitor_alone_brings_its_service() -> None:
    kinds = render({"metrics": {"serviceMonitor": {"enabled": True}}}).kinds()
    assert {"Service", "ServiceMonitor"} <= kinds


# --- NOTES.txt ----------------------------------------------------------------------------------


def test_notes_show_how_to_see_the_result(all_on: Rendered) -> None:
    assert "kubectl describe node" in all_on.notes
    assert "kubectl get nodes -L topo.example.com/count," in all_on.notes
    assert "validatingadmissionpolicy" in all_on.notes


def test_notes_of_the_nodefeature_sink_say_where_the_matrix_is(nodefeature: Rendered) -> None:
    assert "extraLabelNs" in nodefeature.notes
    assert "get nodefeature <node-name>-topo-reporter" in nodefeature.notes
    assert r"{.spec.features.attributes.gputopology\.annotations.elements.matrix}" in (
        nodefeature.notes
    )


def test_notes_warn_when_no_policy_guards_the_nodes() -> None:
    notes = render({"admissionPolicy": {"enabled": False}}).notes
    assert "No ValidatingAdmissionPolicy was installed" in notes


def test_simulated_machine_runs_anywhere_as_the_readme_shows() -> None:
    rendered = render(
        {
            "agent": {"simulate": "dgx-h100"},
            "runtimeClassName": "",
            "affinity": None,
            "kubeletConfig": {"enabled": False},
        }
    )
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    assert "affinity" not in pod
    assert "runtimeClassName" not in pod
    assert env(rendered)["TOPO_REPORTER_SIMULATE"] == "dgx-h100"


# --- The scheduler extender ---------------------------------------------------------------------


def test_the_extender_is_off_by_default(default: Rendered) -> None:
    assert "Deployment" not in default.kinds()
    assert "Service" not in default.kinds()


def test_the_extender_serves_on_its_port_behind_a_service(all_on: Rendered) -> None:
    deployment = all_on.one("Deployment")
    name = f"{FULLNAME}-extender"
    assert deployment["metadata"]["name"] == name
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["topo-reporter"]
    assert c["args"][:7] == [
        "extender",
        "--listen",
        "0.0.0.0:9888",
        "--max-request-bytes",
        "4194304",
        "--connected-wait",
        "30m",
    ]
    environment = {e["name"]: e["value"] for e in c["env"]}
    assert environment["TOPO_REPORTER_PREFIX"] == "topo.example.com"
    assert environment["TOPO_REPORTER_GPU_RESOURCE"] == "nvidia.com/gpu"
    assert environment["TOPO_REPORTER_LOG_LEVEL"] == "debug"
    assert c["ports"] == [{"name": "extender", "containerPort": 9888, "protocol": "TCP"}]
    (service,) = [s for s in all_on.of_kind("Service") if s["metadata"]["name"] == name]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"


def test_the_extender_serves_plain_http_by_default() -> None:
    rendered = render(EXTENDER_ALONE)
    pod = rendered.one("Deployment")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert c["args"] == [
        "extender",
        "--listen",
        "0.0.0.0:8888",
        "--max-request-bytes",
        "2097152",
        "--connected-wait",
        "2h",
    ]
    assert c["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "extender",
        "scheme": "HTTP",
    }
    assert c["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "extender",
        "scheme": "HTTP",
    }
    (service,) = [
        s for s in rendered.of_kind("Service") if s["metadata"]["name"].endswith("-extender")
    ]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8888, "targetPort": "extender", "protocol": "TCP"}
    ]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp"]


def test_with_tls_the_extender_serves_https_from_the_secrets_files(all_on: Rendered) -> None:
    pod = all_on.one("Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][7:] == [
        "--tls-cert-file",
        "/etc/topo-reporter/tls/tls.crt",
        "--tls-key-file",
        "/etc/topo-reporter/tls/tls.key",
    ]
    assert {"name": "tls", "mountPath": "/etc/topo-reporter/tls", "readOnly": True} in c[
        "volumeMounts"
    ]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"] == {"secretName": "extender-tls", "defaultMode": 0o440}
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 65532
    # The kubelet probes over HTTPS (it does not check the certificate).
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (service,) = [
        s for s in all_on.of_kind("Service") if s["metadata"]["name"].endswith("-extender")
    ]
    assert service["spec"]["ports"][0]["name"] == "https"


def test_tls_without_a_secret_fails_the_render_in_one_line() -> None:
    with pytest.raises(helm.HelmError) as failed:
        render(
            {"extender": {**EXTENDER_ALONE["extender"], "tls": {"enabled": True, "secretName": ""}}}
        )
    assert "extender.tls.enabled needs extender.tls.secretName" in str(failed.value)


def test_only_the_named_peers_may_reach_the_extenders_port(all_on: Rendered) -> None:
    policy = all_on.one("NetworkPolicy")
    assert policy["metadata"]["name"] == f"{FULLNAME}-extender"
    pod = all_on.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod.items()
    agent_pod = all_on.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert not spec["podSelector"]["matchLabels"].items() <= agent_pod.items()
    # Ingress only: the extender's own calls to the API server are not restricted.
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {
            "from": [SCHEDULER_PEER, {"ipBlock": {"cidr": "10.0.0.0/24"}}],
            "ports": [{"port": 9888, "protocol": "TCP"}],
        }
    ]


def test_a_network_policy_naming_no_one_fails_the_render_in_one_line() -> None:
    with pytest.raises(helm.HelmError) as failed:
        render({"extender": {"enabled": True}})
    assert "extender.networkPolicy.from is empty: name your scheduler's pods" in str(failed.value)
    off = render({"extender": {"enabled": True, "networkPolicy": {"enabled": False}}})
    assert "NetworkPolicy" not in off.kinds()
    assert "Deployment" in off.kinds()


def test_the_notes_give_the_extenders_address_and_say_who_may_call(all_on: Rendered) -> None:
    assert f"https://{FULLNAME}-extender.{NAMESPACE}.svc:9888" in all_on.notes
    assert "enableHTTPS: true" in all_on.notes
    assert "admits only the peers of extender.networkPolicy.from" in all_on.notes
    open_door = render({"extender": {"enabled": True, "networkPolicy": {"enabled": False}}})
    assert f"http://{FULLNAME}-extender.{NAMESPACE}.svc:8888" in open_door.notes
    assert "any pod can call it" in open_door.notes


def test_no_agent_selector_picks_an_extender_pod_nor_the_reverse(all_on: Rendered) -> None:
    extender_pod = all_on.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    agent_pod = all_on.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    agent_selector = all_on.one("DaemonSet")["spec"]["selector"]["matchLabels"]
    extender_selector = all_on.one("Deployment")["spec"]["selector"]["matchLabels"]
    assert not agent_selector.items() <= extender_pod.items()
    assert not extender_selector.items() <= agent_pod.items()
    for service in all_on.of_kind("Service"):
        selector = service["spec"]["selector"].items()
        assert (selector <= agent_pod.items()) != (selector <= extender_pod.items())


def test_the_extender_may_only_list_and_watch_nodes(all_on: Rendered) -> None:
    name = f"{FULLNAME}-extender"
    (role,) = [r for r in all_on.of_kind("ClusterRole") if r["metadata"]["name"] == name]
    assert _rules(role) == {("", "nodes", "list"), ("", "nodes", "watch")}
    (binding,) = [b for b in all_on.of_kind("ClusterRoleBinding") if b["metadata"]["name"] == name]
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    pod = all_on.one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name


def test_the_extender_container_is_locked_down(all_on: Rendered) -> None:
    pod = all_on.one("Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in pod["volumes"])


# --- DRA: the drivers availability counts, DeviceTaintRules -------------------------------------


def test_dra_drivers_go_with_availability_and_device_taints_are_off_by_default(
    default: Rendered,
) -> None:
    assert not {"TOPO_REPORTER_DRA_DRIVERS", "TOPO_REPORTER_DRA_DEVICE_TAINTS"} & set(env(default))
    assert all(
        not r["metadata"]["name"].endswith("-device-taints") for r in default.of_kind("ClusterRole")
    )
    on = env(render({"availability": {"enabled": True}}))
    assert on["TOPO_REPORTER_DRA_DRIVERS"] == "gpu.nvidia.com"
    none = env(render({"availability": {"enabled": True}, "dra": {"drivers": []}}))
    assert none["TOPO_REPORTER_DRA_DRIVERS"] == ""


def test_device_taints_turn_the_agent_on_and_grant_exactly_the_sinks_verbs() -> None:
    rendered = render({"dra": {"deviceTaints": True}}, api_versions=(VAP_API,))
    assert env(rendered)["TOPO_REPORTER_DRA_DEVICE_TAINTS"] == "true"
    role = _named(rendered, "ClusterRole", "-device-taints")
    assert _rules(role) == {
        ("resource.k8s.io", "devicetaintrules", v) for v in DEVICE_TAINT_RBAC_VERBS
    }
    binding = _named(rendered, "ClusterRoleBinding", "-device-taints")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    policy = _named(rendered, "ValidatingAdmissionPolicy", "-own-device-taints")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["devicetaintrules"],
        }
    ]
    assert all("\n" not in v["message"] for v in policy["spec"]["validations"])
    binding = _named(rendered, "ValidatingAdmissionPolicyBinding", "-own-device-taints")
    assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize(
    ("mode", "cluster_serves_policy_api", "installed"),
    [("auto", True, True), ("auto", False, False), (True, False, True), (False, True, False)],
    ids=["auto, with the API", "auto, without the API", "forced on", "forced off"],
)
def test_the_device_taint_policy_follows_the_admission_policy_switch(
    mode: object, cluster_serves_policy_api: bool, installed: bool
) -> None:
    apis = (VAP_API,) if cluster_serves_policy_api else ()
    values = {"dra": {"deviceTaints": True}, "admissionPolicy": {"enabled": mode}}
    rendered = render(values, api_versions=apis)
    policies = [p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")]
    assert (f"{FULLNAME}-own-device-taints" in policies) is installed


def test_a_dra_driver_name_that_is_not_one_fails_the_render() -> None:
    with pytest.raises(helm.HelmError):
        render({"dra": {"drivers": ["GPU.Nvidia.com"]}})


# --- NodeResourceTopology and Koordinator -------------------------------------------------------


def test_nrt_and_koordinator_are_off_by_default(default: Rendered) -> None:
    assert not {"TOPO_REPORTER_NRT", "TOPO_REPORTER_KOORDINATOR_DIR"} & set(env(default))
    assert all(not r["metadata"]["name"].endswith("-nrt") for r in default.of_kind("ClusterRole"))
    pod = default.one("DaemonSet")["spec"]["template"]["spec"]
    assert all(v["name"] != "koordlet-device-infos" for v in pod["volumes"])


def test_nrt_without_availability_fails_the_render_in_one_line() -> None:
    with pytest.raises(helm.HelmError) as failed:
        render({"nrt": {"enabled": True}})
    assert "nrt.enabled needs availability.enabled" in str(failed.value)


def test_nrt_turns_the_agent_on_and_grants_exactly_the_sinks_verbs() -> None:
    rendered = render(NRT_KOORD, api_versions=(VAP_API,))
    assert env(rendered)["TOPO_REPORTER_NRT"] == "true"
    assert env(rendered)["TOPO_REPORTER_AVAILABILITY"] == "true"
    role = _named(rendered, "ClusterRole", "-nrt")
    # Exactly the verbs the sink uses (tests/publish/test_nrt.py checks it uses these).
    assert _rules(role) == {
        ("topology.node.k8s.io", "noderesourcetopologies", v) for v in NRT_RBAC_VERBS
    }
    binding = _named(rendered, "ClusterRoleBinding", "-nrt")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]


@pytest.mark.parametrize(
    ("mode", "cluster_serves_policy_api", "installed"),
    [("auto", True, True), ("auto", False, False), (True, False, True), (False, True, False)],
    ids=["auto, with the API", "auto, without the API", "forced on", "forced off"],
)
def test_the_own_nrt_policy_follows_the_admission_policy_switch(
    mode: object, cluster_serves_policy_api: bool, installed: bool
) -> None:
    apis = (VAP_API,) if cluster_serves_policy_api else ()
    rendered = render({**NRT_KOORD, "admissionPolicy": {"enabled": mode}}, api_versions=apis)
    policies = [p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")]
    bindings = [
        b["spec"]["policyName"] for b in rendered.of_kind("ValidatingAdmissionPolicyBinding")
    ]
    assert (f"{FULLNAME}-own-nrt" in policies) is installed
    assert (f"{FULLNAME}-own-nrt" in bindings) is installed


def test_the_own_nrt_policy_covers_create_and_update_of_noderesourcetopologies() -> None:
    rendered = render(NRT_KOORD, api_versions=(VAP_API,))
    policy = _named(rendered, "ValidatingAdmissionPolicy", "-own-nrt")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["topology.node.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["noderesourcetopologies"],
        }
    ]
    assert all("\n" not in v["message"] for v in policy["spec"]["validations"])
    binding = _named(rendered, "ValidatingAdmissionPolicyBinding", "-own-nrt")
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_koordinator_mounts_koordlets_directory_writable_and_points_the_agent_at_it() -> None:
    rendered = render(
        {"koordinator": {"enabled": True, "hostPath": "/run/koordlet/xpu"}},
        api_versions=(VAP_API,),
    )
    pod = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "koordlet-device-infos")
    assert volume["hostPath"] == {"path": "/run/koordlet/xpu", "type": "DirectoryOrCreate"}
    mount = next(
        m for m in container(rendered)["volumeMounts"] if m["name"] == "koordlet-device-infos"
    )
    assert mount.get("readOnly") is not True
    assert env(rendered)["TOPO_REPORTER_KOORDINATOR_DIR"] == mount["mountPath"]
    sc = container(rendered)["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"], sc["capabilities"]) == (
        0,
        False,
        {"drop": ["ALL"]},
    )
    assert sc["readOnlyRootFilesystem"] is True
    # Writing the file takes no API right.
    assert "TOPO_REPORTER_NRT" not in env(rendered)


# --- The heartbeat Lease (availability.heartbeat) ------------------------------------------------

HEARTBEAT_ON: dict[str, Any] = {"availability": {"enabled": True}, **EXTENDER_ALONE}
HEARTBEAT_OFF: dict[str, Any] = {
    "availability": {"enabled": True, "heartbeat": {"enabled": False}},
    **EXTENDER_ALONE,
}


def test_availability_turns_the_heartbeat_and_the_withdrawal_on_by_default() -> None:
    rendered = render(HEARTBEAT_ON, api_versions=(VAP_API,))
    variables = env(rendered)
    assert variables["TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER"] == "2"
    assert variables["TOPO_REPORTER_HEARTBEAT"] == "true"
    assert variables["TOPO_REPORTER_HEARTBEAT_DURATION"] == "40s"
    # The Lease goes to the agent's own namespace, which POD_NAMESPACE names.
    assert variables["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    deployment = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    extender_env = {e["name"]: e.get("value") for e in deployment["env"]}
    assert extender_env["TOPO_REPORTER_HEARTBEAT_NAMESPACE"] == NAMESPACE


def test_the_heartbeat_values_reach_the_agent() -> None:
    values = {
        "availability": {"enabled": True, "withdrawAfter": 5, "heartbeat": {"duration": "2m"}}
    }
    variables = env(render(values))
    assert variables["TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER"] == "5"
    assert variables["TOPO_REPORTER_HEARTBEAT_DURATION"] == "2m"


def test_the_agent_may_get_create_and_update_leases_in_its_namespace_only() -> None:
    rendered = render(HEARTBEAT_ON, api_versions=(VAP_API,))
    role = _named(rendered, "Role", f"{FULLNAME}-heartbeat")
    assert role["metadata"]["namespace"] == NAMESPACE
    # Exactly the verbs the heartbeat uses (tests/agent/test_availability_freshness.py sees them
    # used).
    assert _rules(role) == {("coordination.k8s.io", "leases", v) for v in LEASE_RBAC_VERBS}
    binding = _named(rendered, "RoleBinding", f"{FULLNAME}-heartbeat")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    granting_leases = [
        (kind, r["metadata"].get("namespace"))
        for kind in ("ClusterRole", "Role")
        for r in rendered.of_kind(kind)
        if any(resource == "leases" for _, resource, _ in _rules(r))
    ]
    assert granting_leases == [("Role", NAMESPACE), ("Role", NAMESPACE)]


def test_the_extender_may_list_and_watch_leases_in_the_agents_namespace_only() -> None:
    rendered = render(HEARTBEAT_ON, api_versions=(VAP_API,))
    name = f"{FULLNAME}-extender"
    role = _named(rendered, "Role", f"{name}-heartbeats")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _rules(role) == {("coordination.k8s.io", "leases", v) for v in LEASE_WATCH_RBAC_VERBS}
    binding = _named(rendered, "RoleBinding", f"{name}-heartbeats")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


def test_the_heartbeat_off_renders_no_lease_right_no_policy_and_no_variable() -> None:
    rendered = render(HEARTBEAT_OFF, api_versions=(VAP_API,))
    assert not {"TOPO_REPORTER_HEARTBEAT", "TOPO_REPORTER_HEARTBEAT_DURATION"} & set(env(rendered))
    assert env(rendered)["TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER"] == "2"
    for kind in ("ClusterRole", "Role"):
        for role in rendered.of_kind(kind):
            assert all(resource != "leases" for _, resource, _ in _rules(role))
    policies = [p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")]
    assert f"{FULLNAME}-own-lease" not in policies
    deployment = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != "TOPO_REPORTER_HEARTBEAT_NAMESPACE" for e in deployment["env"])


@pytest.mark.parametrize(
    ("mode", "cluster_serves_policy_api", "installed"),
    [("auto", True, True), ("auto", False, False), (True, False, True), (False, True, False)],
    ids=["auto, with the API", "auto, without the API", "forced on", "forced off"],
)
def test_the_own_lease_policy_follows_the_admission_policy_switch(
    mode: object, cluster_serves_policy_api: bool, installed: bool
) -> None:
    apis = (VAP_API,) if cluster_serves_policy_api else ()
    rendered = render({**HEARTBEAT_ON, "admissionPolicy": {"enabled": mode}}, api_versions=apis)
    policies = [p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")]
    bindings = [
        b["spec"]["policyName"] for b in rendered.of_kind("ValidatingAdmissionPolicyBinding")
    ]
    assert (f"{FULLNAME}-own-lease" in policies) is installed
    assert (f"{FULLNAME}-own-lease" in bindings) is installed


def test_the_own_lease_policy_covers_create_and_update_of_leases() -> None:
    rendered = render(HEARTBEAT_ON, api_versions=(VAP_API,))
    policy = _named(rendered, "ValidatingAdmissionPolicy", "-own-lease")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["leases"],
        }
    ]
    assert all("\n" not in v["message"] for v in policy["spec"]["validations"])
    binding = _named(rendered, "ValidatingAdmissionPolicyBinding", "-own-lease")
    assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize(
    ("availability", "where"),
    [
        ({"withdrawAfter": 0}, "/availability/withdrawAfter"),
        ({"heartbeat": {"duration": "1d"}}, "/availability/heartbeat/duration"),
        ({"heartbeat": {"enable": True}}, "/availability/heartbeat"),
    ],
    ids=["withdrawing after no failure", "a duration in days", "a misspelt key"],
)
def test_the_schema_checks_the_heartbeat_values(availability: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"at '{where}'"):
        render({"availability": availability})
