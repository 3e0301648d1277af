"""The chart's prune hook as the real Helm SDK renders it: a pre-delete Job running
`topo-reporter prune` under its own ServiceAccount, with hook-scoped rights that are exactly what
prune calls, and the policy confining that identity (tests/controlplane/test_chart_prune.py runs
it all on the real apiserver)."""

from __future__ import annotations

from typing import Any

import pytest

from reporter.publish.prune import NODE_RBAC_VERBS, OBJECT_RBAC_VERBS
from tests.support.helm_chart import ALL_ON, FULLNAME, NAMESPACE, VAP_API, Rendered, render

PRUNE = f"{FULLNAME}-prune"
HOOK_KINDS = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job"]


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render(api_versions=(VAP_API,))


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_hooks_are_the_prune_job_and_its_identity_all_pre_delete(default: Rendered) -> None:
    assert sorted(h["kind"] for h in default.hooks) == sorted(HOOK_KINDS)
    for hook in default.hooks:
        annotations = hook["metadata"]["annotations"]
        assert hook["metadata"]["name"] == PRUNE
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
        # The rights come before the Job and go with it, also when it fails.
        if hook["kind"] == "Job":
            assert annotations["helm.sh/hook-weight"] == "0"
            assert annotations["helm.sh/hook-delete-policy"].split(",")[-1] == "hook-succeeded"
        else:
            assert int(annotations["helm.sh/hook-weight"]) < 0
            assert "hook-failed" in annotations["helm.sh/hook-delete-policy"]


def test_the_job_runs_prune_on_the_agents_prefix_in_the_release_namespace() -> None:
    rendered = render(ALL_ON, api_versions=(VAP_API,))
    pod = rendered.hook("Job")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["topo-reporter"]
    assert container["args"] == ["prune", "--prefix", ALL_ON["agent"]["prefix"]]
    (namespace,) = [e for e in container["env"] if e["name"] == "POD_NAMESPACE"]
    assert namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert pod["serviceAccountName"] == PRUNE
    assert pod["restartPolicy"] == "Never"
    assert container["image"] == "registry.example.com/infra/topo-reporter:0.1.0-rc1"
    assert pod["imagePullSecrets"] == [{"name": "registry-cred"}]


def test_the_job_is_locked_down_and_no_agent_selector_picks_its_pod(default: Rendered) -> None:
    pod = default.hook("Job")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    selector = default.one("DaemonSet")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()


def test_the_rights_are_exactly_what_prune_calls(default: Rendered) -> None:
    cluster = _rules(default.hook("ClusterRole"))
    assert cluster == {("", "nodes", v) for v in NODE_RBAC_VERBS} | {
        (group, plural, v)
        for group, plural in (
            ("resource.k8s.io", "devicetaintrules"),
            ("topology.node.k8s.io", "noderesourcetopologies"),
        )
        for v in OBJECT_RBAC_VERBS
    }
    role = default.hook("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _rules(role) == {
        (group, plural, v)
        for group, plural in (
            ("coordination.k8s.io", "leases"),
            ("nfd.k8s-sigs.io", "nodefeatures"),
        )
        for v in OBJECT_RBAC_VERBS
    }
    for binding in (default.hook("ClusterRoleBinding"), default.hook("RoleBinding")):
        assert binding["roleRef"]["name"] == PRUNE
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": PRUNE, "namespace": NAMESPACE}
        ]


def test_the_policy_is_installed_with_the_release_and_matches_the_prune_identity(
    default: Rendered,
) -> None:
    policy = default.named("ValidatingAdmissionPolicy", PRUNE)
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{PRUNE}"'
    )
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = default.named("ValidatingAdmissionPolicyBinding", PRUNE)
    assert binding["spec"] == {"policyName": PRUNE, "validationActions": ["Deny"]}
    assert "helm.sh/hook" not in (policy["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("values", "hooks", "policy"),
    [
        ({"prune": {"enabled": False}}, [], False),
        ({"rbac": {"create": False}}, ["Job", "ServiceAccount"], True),
        ({"admissionPolicy": {"enabled": False}}, sorted(HOOK_KINDS), False),
    ],
    ids=["prune off renders nothing", "rbac off leaves the rights to the user", "policy off"],
)
def test_the_switches(values: dict[str, Any], hooks: list[str], policy: bool) -> None:
    rendered = render(values, api_versions=(VAP_API,))
    assert sorted(h["kind"] for h in rendered.hooks) == hooks
    names = {o["metadata"]["name"] for o in rendered.of_kind("ValidatingAdmissionPolicy")}
    assert (PRUNE in names) is policy
