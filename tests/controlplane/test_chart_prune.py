"""`helm uninstall` leaves nothing of ours behind: the chart's pre-delete hook, for real.

The Helm SDK (helm-python-sdk, in-process) installs the chart on the real kube-apiserver and
uninstalls it; the real agent wrote every kind of object first (tests/controlplane/test_prune.py's
`cluster`: labels, annotations, the fabric taint, DeviceTaintRules, the NodeResourceTopology, the
heartbeat Lease, a NodeFeature) beside what others own. On uninstall Helm makes the hook's
ServiceAccount and rights, then its Job; the real Job controller (kube-controller-manager) makes
the Job's pod; tests/support/hook_kubelet.py, a double of the kubelet, runs that pod's own command
and args with a token bound to the pod, and reports it done; Helm waits for the Job, deletes the
hooks, then the release. After it: nothing under the prefix, no taint, rule, object or Lease of
ours; every foreign key and object as it was. The prune policy is the real apiserver's CEL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from reporter.schema import dra
from tests.controlplane.test_chart import manifest_objects, on_server, release_secrets
from tests.controlplane.test_prune import (
    FOREIGN_ANNOTATIONS,
    FOREIGN_LABELS,
    GPU_TAINT,
    NOTHING,
    NRT,
    PREFIX,
    RULES,
    Cluster,
    cluster,
    earlier_left,
    ours_on_the_cluster,
)
from tests.support.controlplane_fixtures import RealApiServer, unique
from tests.support.helm_chart import chart
from tests.support.hook_kubelet import HookKubelet

pytestmark = pytest.mark.controlplane

__all__ = ["cluster"]  # the fixture, used by name below

POLICY_TIMEOUT_S = 60.0
VALUES: dict[str, Any] = {
    "admissionPolicy": {"enabled": True},
    "availability": {"enabled": True},
    "nrt": {"enabled": True},
    "dra": {"deviceTaints": True},
    "fabric": {"taintUnhealthy": True},
}
"""Every writer of the agent on, as the objects the agents wrote (the `cluster` fixture) need."""


@pytest.fixture
def helm_config(real_apiserver: RealApiServer, cluster: Cluster) -> Iterator[helm.Config]:
    config = helm.Config(kubeconfig_path=real_apiserver.kubeconfig, namespace=cluster.namespace)
    try:
        yield config
    finally:
        config.close()


def prune_identity(server: RealApiServer, user: str) -> k8s.ApiClient:
    """The admin impersonating the prune Job's service account, in system:masters: RBAC lets
    everything through, so what is denied is denied by the admission policy alone."""
    api = k8s_config.new_client_from_config(config_file=str(server.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", "system:masters")
    return api


def denied(call: Any) -> str | None:
    """The policy's message when `call` (a dry run) is denied by it, None when admitted."""
    try:
        call()
    except k8s.ApiException as e:
        refusal = (e.status, str(e.body))
    else:
        return None
    status, body = refusal
    assert status == 403, body
    assert "ValidatingAdmissionPolicy" in body, body
    return body


def wait_for_policy(core: k8s.CoreV1Api, node: str) -> None:
    """A new policy is enforced once the apiserver's informer has it: probe until denied."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while (
        denied(lambda: core.patch_node(node, {"metadata": {"labels": {"new": "x"}}}, dry_run="All"))
        is None
    ):
        assert time.monotonic() < deadline, f"policy not enforced within {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.1)


def install(helm_config: helm.Config, cluster: Cluster) -> tuple[str, dict[str, Any]]:
    release = unique("tr")
    installed = helm_config.install(chart(), release, VALUES, namespace=cluster.namespace)
    assert (installed["revision"], installed["status"]) == (1, "deployed")
    return release, installed


def test_uninstall_runs_the_prune_hook_and_leaves_nothing_of_ours(
    real_apiserver: RealApiServer,
    real_controller_manager: Path,
    cluster: Cluster,
    helm_config: helm.Config,
    tmp_path: Path,
) -> None:
    before = ours_on_the_cluster(cluster)
    assert len(before["rules"]) == 4, before
    assert before["taints"] == [f"{PREFIX}/fabric-health"], before
    assert before["nrt"], before
    assert before["lease"], before
    assert before["nodefeature"], before
    release, installed = install(helm_config, cluster)
    fullname = f"{release}-topo-reporter"
    # The hooks as Helm stored them with the release: what it will run on uninstall.
    hooks = [yaml.safe_load(h["manifest"]) for h in helm_config.get_all(release)["hooks"]]
    (job,) = [h for h in hooks if h["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    wait_for_policy(
        k8s.CoreV1Api(
            prune_identity(
                real_apiserver, f"system:serviceaccount:{cluster.namespace}:{fullname}-prune"
            )
        ),
        cluster.tray,
    )

    with HookKubelet(
        real_apiserver, cluster.namespace, job["metadata"]["name"], tmp_path
    ) as kubelet:
        helm_config.uninstall(release, timeout=120)

    # The Job's own command ran, as the Job controller's pod said, once, successfully.
    (ran,) = kubelet.ran
    assert ran.argv == (*container["command"], *container["args"])
    assert ran.argv == ("topo-reporter", "prune", "--prefix", PREFIX)
    assert ran.returncode == 0, ran.stderr
    assert f"removed node {cluster.tray}: labels {PREFIX}/count" in ran.stdout
    assert ours_on_the_cluster(cluster) == NOTHING
    for name in (cluster.tray, cluster.nfd_node, cluster.other):
        node = cluster.node(name)
        assert not [
            k
            for k in (*node.metadata.labels, *node.metadata.annotations)
            if k.startswith(PREFIX) and k not in FOREIGN_LABELS
        ]
        assert {k: node.metadata.labels[k] for k in FOREIGN_LABELS} == FOREIGN_LABELS
        assert node.metadata.annotations == FOREIGN_ANNOTATIONS
        assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [tuple(GPU_TAINT.values())]
    assert cluster.other in cluster.names(*NRT)
    assert f"{dra.NAME_PREFIX}.{cluster.tray}.gpu-9" in cluster.names(*RULES)
    assert cluster.other in cluster.leases()
    # Ours under another prefix stays; an earlier version's (no prefix label) is said and stays.
    assert earlier_left(cluster)
    assert f"left NodeResourceTopology {cluster.unlabelled}: " in ran.stdout
    # The release and its hooks are gone.
    assert on_server(real_apiserver, cluster.namespace, manifest_objects(installed)) == []
    assert on_server(real_apiserver, cluster.namespace, hooks) == []
    assert release_secrets(real_apiserver, cluster.namespace, release) == []


def policy_cases(c: Cluster, api: k8s.ApiClient) -> list[tuple[str, bool, Any]]:
    """(what the prune identity asks, whether the policy admits it, the dry-run call)."""
    core = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    leases = k8s.CoordinationV1Api(api)
    ours_taint = {"key": f"{PREFIX}/fabric-health", "value": "unhealthy", "effect": "NoSchedule"}

    def node(patch: dict[str, Any]) -> Any:
        return lambda: core.patch_node(c.tray, patch, dry_run="All")

    def delete(group: str, version: str, plural: str, name: str, ns: str | None = None) -> Any:
        if ns is None:
            return lambda: custom.delete_cluster_custom_object(
                group, version, plural, name, dry_run="All"
            )
        return lambda: custom.delete_namespaced_custom_object(
            group, version, ns, plural, name, dry_run="All"
        )

    rule = f"{dra.NAME_PREFIX}.{c.tray}.gpu-0"
    foreign_rule = f"{dra.NAME_PREFIX}.{c.tray}.gpu-9"
    nfd = ("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
    return [
        ("remove an owned label", True, node({"metadata": {"labels": {f"{PREFIX}/count": None}}})),
        ("remove the fabric taint", True, node({"spec": {"taints": [GPU_TAINT]}})),
        (
            "add a label under the prefix",
            False,
            node({"metadata": {"labels": {f"{PREFIX}/x": "1"}}}),
        ),
        ("change an owned label", False, node({"metadata": {"labels": {f"{PREFIX}/count": "9"}}})),
        ("remove a foreign label", False, node({"metadata": {"labels": {"team": None}}})),
        (
            "remove a foreign annotation",
            False,
            node({"metadata": {"annotations": {"other.io/note": None}}}),
        ),
        ("remove a foreign taint", False, node({"spec": {"taints": [ours_taint]}})),
        (
            "add a taint",
            False,
            node({"spec": {"taints": [GPU_TAINT, ours_taint, {**GPU_TAINT, "key": "x.io/y"}]}}),
        ),
        ("cordon the node", False, node({"spec": {"unschedulable": True}})),
        ("delete a node", False, lambda: core.delete_node(c.other, dry_run="All")),
        ("delete our NodeResourceTopology", True, delete(*NRT, c.tray)),
        ("delete another producer's", False, delete(*NRT, c.other)),
        # Issue 41: ours, but another prefix's (the current install's, for prune of an old one).
        ("delete our NodeResourceTopology of another prefix", False, delete(*NRT, c.old_prefixed)),
        ("delete our NodeResourceTopology of no prefix", False, delete(*NRT, c.unlabelled)),
        ("delete our DeviceTaintRule", True, delete(*RULES, rule)),
        ("delete a rule with our labels in another pool", False, delete(*RULES, foreign_rule)),
        (
            "delete our heartbeat Lease",
            True,
            lambda: leases.delete_namespaced_lease(c.tray, c.namespace, dry_run="All"),
        ),
        (
            "delete another Lease",
            False,
            lambda: leases.delete_namespaced_lease(c.other, c.namespace, dry_run="All"),
        ),
        (
            "create a Lease",
            False,
            lambda: leases.create_namespaced_lease(
                c.namespace,
                k8s.V1Lease(metadata=k8s.V1ObjectMeta(name=unique("l"))),
                dry_run="All",
            ),
        ),
        ("delete our NodeFeature", True, delete(*nfd, f"{c.nfd_node}-topo-reporter", c.namespace)),
        ("delete nfd-worker's", False, delete(*nfd, f"{c.other}-nfd-worker", c.namespace)),
        (
            "delete our NodeFeature of another prefix",
            False,
            delete(*nfd, f"{c.old_prefixed}-topo-reporter", c.namespace),
        ),
        (
            "delete our NodeFeature of no prefix",
            False,
            delete(*nfd, f"{c.unlabelled}-topo-reporter", c.namespace),
        ),
    ]


def test_the_prune_policy_admits_only_removing_ours(
    real_apiserver: RealApiServer,
    real_controller_manager: Path,
    cluster: Cluster,
    helm_config: helm.Config,
    tmp_path: Path,
) -> None:
    release, _ = install(helm_config, cluster)
    fullname = f"{release}-topo-reporter"
    user = f"system:serviceaccount:{cluster.namespace}:{fullname}-prune"
    api = prune_identity(real_apiserver, user)
    try:
        wait_for_policy(k8s.CoreV1Api(api), cluster.tray)
        judged = {what: denied(call) is None for what, _, call in policy_cases(cluster, api)}
    finally:
        api.close()
    assert judged == {what: admit for what, admit, _ in policy_cases(cluster, api)}

    with HookKubelet(real_apiserver, cluster.namespace, f"{fullname}-prune", tmp_path) as kubelet:
        helm_config.uninstall(release, timeout=120)
    assert [r.returncode for r in kubelet.ran] == [0]
