"""The chart installed for real: the Helm SDK's install, upgrade and uninstall (helm-python-sdk,
in-process) against the real kube-apiserver, for each sink and admission-policy setting. What Helm
rendered exists as rendered; uninstall leaves nothing behind."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.agent.test_kubectl import kubectl
from tests.support.controlplane_fixtures import RealApiServer, unique
from tests.support.helm_chart import chart
from tests.support.hook_kubelet import HookKubelet

pytestmark = pytest.mark.controlplane

POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@pytest.fixture
def helm_config(real_apiserver: RealApiServer, real_namespace: str) -> Iterator[helm.Config]:
    config = helm.Config(kubeconfig_path=real_apiserver.kubeconfig, namespace=real_namespace)
    try:
        yield config
    finally:
        config.close()


def manifest_objects(release: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(release["manifest"]) if d]


def on_server(server: RealApiServer, namespace: str, objects: list[dict[str, Any]]) -> list[Any]:
    """Each object as the server holds it (kubectl get -f), or fails naming what is missing.

    Objects that name their own namespace (the Events Role in `default`) are asked for there.
    """
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_namespace.setdefault(obj.get("metadata", {}).get("namespace", namespace), []).append(obj)
    held: list[Any] = []
    for ns, group in sorted(by_namespace.items()):
        done = subprocess.run(
            [
                kubectl(),
                "--kubeconfig",
                str(server.kubeconfig),
                "-n",
                ns,
                "get",
                "--ignore-not-found",
                "-o",
                "yaml",
                "-f",
                "-",
            ],
            input=yaml.safe_dump_all(group),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        found = yaml.safe_load(done.stdout) if done.stdout.strip() else None
        if found is not None:
            held.extend(list(found["items"]) if found.get("kind") == "List" else [found])
    return held


def release_secrets(server: RealApiServer, namespace: str, release: str) -> list[Any]:
    """Helm's release records (storage driver `secret`)."""
    selector = f"owner=helm,name={release}"
    return list(server.core().list_namespaced_secret(namespace, label_selector=selector).items)


def identities(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


@pytest.mark.parametrize(
    ("sink", "policy", "policies"),
    [
        ("node", "auto", {"own-node", "own-events"}),
        ("node", True, {"own-node", "own-events"}),
        # No Node rights, so no Node policy; its Events still go through the Event policy.
        ("nodefeature", "auto", {"own-events"}),
    ],
    ids=["node-policy-auto", "node-policy-true", "nodefeature"],
)
def test_install_upgrade_uninstall_through_the_helm_sdk(
    real_apiserver: RealApiServer,
    real_controller_manager: Path,
    real_namespace: str,
    helm_config: helm.Config,
    sink: str,
    policy: Any,
    policies: set[str],
    tmp_path: Path,
) -> None:
    release = unique("tr")
    values: dict[str, Any] = {
        "agent": {"sink": sink},
        "admissionPolicy": {"enabled": policy},
    }
    installed = helm_config.install(chart(), release, values, namespace=real_namespace)
    assert (installed["revision"], installed["status"]) == (1, "deployed")
    assert len(release_secrets(real_apiserver, real_namespace, release)) == 1
    objects = manifest_objects(installed)
    kinds = {o["kind"] for o in objects}
    # `auto` asks the real server's discovery (Helm's .Capabilities): v1.34 serves the policy API.
    assert kinds >= POLICY_KINDS
    # The prune hook's policy whatever the sink: `auto` finds the API on this server.
    for kind in POLICY_KINDS:
        names = {o["metadata"]["name"] for o in objects if o["kind"] == kind}
        assert names == {f"{release}-topo-reporter-{p}" for p in policies | {"prune"}}
    assert {"DaemonSet", "ServiceAccount"} <= kinds
    held = on_server(real_apiserver, real_namespace, objects)
    assert identities(held) == identities(objects)
    for want in objects:
        (got,) = [h for h in held if (h["kind"], h["metadata"]["name"]) == identities([want]).pop()]
        assert got["metadata"].get("labels", {}) == want["metadata"].get("labels", {})
        if "rules" in want:
            assert got["rules"] == want["rules"]

    values["agent"]["interval"] = "90s"
    upgraded = helm_config.upgrade(chart(), release, values, namespace=real_namespace)
    assert (upgraded["revision"], upgraded["status"]) == (2, "deployed")
    (daemonset,) = [
        h
        for h in on_server(real_apiserver, real_namespace, manifest_objects(upgraded))
        if h["kind"] == "DaemonSet"
    ]
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert "90s" in [e.get("value") for e in agent["env"]]

    # Uninstall runs the pre-delete prune hook: its Job's pod is run by the kubelet double.
    job = f"{release}-topo-reporter-prune"
    with HookKubelet(real_apiserver, real_namespace, job, tmp_path) as kubelet:
        helm_config.uninstall(release, timeout=120)
    assert [r.returncode for r in kubelet.ran] == [0]
    assert on_server(real_apiserver, real_namespace, objects) == []
    assert release_secrets(real_apiserver, real_namespace, release) == []
