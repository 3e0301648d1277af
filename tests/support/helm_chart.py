"""Render charts/topo-reporter with the real Helm SDK, once per values combination per session.

Helm v4's Go SDK runs in-process through helm-python-sdk's bundled C library: no helm binary, no
cluster. Its public `Chart.render` cannot set the cluster's API versions, which the `auto` value of
`admissionPolicy.enabled` reads (`.Capabilities.APIVersions`); the C call under it, `helm_render`,
takes `api_versions` and `kube_version` in its options, so this module calls that. It never
installs anything and never contacts a cluster.
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "topo-reporter"
RELEASE = "tr"
NAMESPACE = "gpu-system"
FULLNAME = "tr-topo-reporter"
NODE_POLICY = f"{FULLNAME}-own-node"
"""The admission policy (and its binding) confining the agents to their own Node."""
# The discovery entry Helm's .Capabilities holds when a cluster serves the policy API.
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
KUBE_1_30 = "1.30"


HOOK = "helm.sh/hook"


def is_hook(obj: dict[str, Any]) -> bool:
    """Whether Helm runs `obj` as a hook (not part of the release's manifest)."""
    return HOOK in ((obj.get("metadata") or {}).get("annotations") or {})


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects one `helm template` produces, and its NOTES.txt.

    `objects` are what the release installs (Helm's manifest); `hooks` are what Helm makes only
    when a hook runs (the pre-delete prune Job and its rights), as Helm keeps them apart."""

    objects: tuple[dict[str, Any], ...]
    notes: str
    hooks: tuple[dict[str, Any], ...] = ()

    def everything(self) -> tuple[dict[str, Any], ...]:
        """The release's objects and its hooks."""
        return (*self.objects, *self.hooks)

    def hook(self, kind: str) -> dict[str, Any]:
        """The single hook object of `kind`; fails the test when there is not exactly one."""
        found = [o for o in self.hooks if o["kind"] == kind]
        assert len(found) == 1, f"expected one {kind} hook, rendered {len(found)}"
        return found[0]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every rendered object of `kind`."""
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        """The single rendered object of `kind`; fails the test when there is not exactly one."""
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
        return found[0]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        """The rendered object of `kind` called `name`; fails the test when there is none."""
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, rendered {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        """The kinds rendered."""
        return {o["kind"] for o in self.objects}


@functools.cache
def chart() -> helm.Chart:
    """The chart, loaded once per session."""
    return helm.Chart.load(CHART_DIR)


def pyproject_version() -> str:
    """The package version, from pyproject.toml."""
    with (REPO / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def render(
    values: dict[str, Any] | None = None,
    *,
    api_versions: tuple[str, ...] = (),
    kube_version: str = KUBE_1_30,
) -> Rendered:
    """Render the chart as `helm template tr -n gpu-system` would against such a cluster."""
    return _render(json.dumps(values or {}, sort_keys=True), api_versions, kube_version)


@functools.cache
def _render(values_json: str, api_versions: tuple[str, ...], kube_version: str) -> Rendered:
    options = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "is_install": True,
        "api_versions": list(api_versions),
        "kube_version": f"v{kube_version}.0",
    }
    # The public Chart.render takes no api_versions; this is the call it wraps.
    payload = _native.call_string("helm_render", chart()._raw(), values_json, json.dumps(options))
    files: dict[str, str] = json.loads(payload)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(_documents(text))
    return Rendered(
        tuple(o for o in objects if not is_hook(o)),
        notes,
        tuple(o for o in objects if is_hook(o)),
    )


def _documents(text: str) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(text):
        if document is not None:
            yield document


def container(rendered: Rendered) -> dict[str, Any]:
    """The agent container of the rendered DaemonSet."""
    containers = rendered.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env(rendered: Rendered) -> dict[str, Any]:
    """The agent container's environment: name -> value, or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(rendered)["env"]}


# Every option on: each optional object and each extra value set to something.
SCHEDULER_PEER: dict[str, Any] = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"component": "gpu-scheduler"}},
}
"""The second scheduler's pods, as a user names them in extender.networkPolicy.from."""
EXTENDER_ALONE: dict[str, Any] = {
    "extender": {"enabled": True, "networkPolicy": {"enabled": True, "from": [SCHEDULER_PEER]}}
}
"""The extender turned on as the docs say: its NetworkPolicy names the scheduler."""
ALL_ON: dict[str, Any] = {
    "image": {"repository": "registry.example.com/infra/topo-reporter", "tag": "0.1.0-rc1"},
    "imagePullSecrets": [{"name": "registry-cred"}],
    "agent": {
        "prefix": "topo.example.com",
        "interval": "90s",
        "resync": "10m",
        "backend": "nvml",
        "port": 9400,
        "logFormat": "console",
        "logLevel": "debug",
        "simulate": "dgx-h100",
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "kubeletConfig": {"enabled": True, "hostPath": "/etc/kubernetes/kubelet.yaml"},
    "runtimeClassName": "nvidia-cdi",
    "nodeSelector": {"node-role.example.com/gpu": "true"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ],
    "commonLabels": {"team": "platform"},
    "commonAnnotations": {"owner": "platform@example.com"},
    "podLabels": {"tier": "node-agent"},
    "podAnnotations": {"example.com/scrape": "true"},
    "serviceAccount": {"create": True, "name": "topo", "annotations": {"note": "agent"}},
    "admissionPolicy": {"enabled": True},
    "metrics": {
        "service": {"enabled": True, "annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
    },
    "extender": {
        "enabled": True,
        "replicas": 3,
        "port": 9888,
        "resource": "nvidia.com/gpu",
        "logLevel": "debug",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "maxRequestBytes": 4194304,
        "connectedWait": "30m",
        "tls": {"enabled": True, "secretName": "extender-tls"},
        "networkPolicy": {
            "enabled": True,
            "from": [SCHEDULER_PEER, {"ipBlock": {"cidr": "10.0.0.0/24"}}],
        },
    },
}
