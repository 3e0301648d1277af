"""values.yaml documents every value; values.schema.json rejects bad values with a clear message.

The messages asserted here are what `helm install` prints: Helm validates the merged values
against the schema before it renders anything.
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import pytest

from tests.support.helm_chart import CHART_DIR, REPO, render

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):")


def documented_keys() -> dict[str, bool]:
    """Every mapping key path of values.yaml -> whether the comment block right above it is a
    `# --` description."""
    paths: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    comment_block: list[str] = []
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment_block.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match["key"]))
            described = bool(comment_block) and comment_block[0].startswith("# --")
            paths[".".join(k for _, k in stack)] = described
        comment_block = []
    return paths


def documented_values(schema: dict[str, Any], keys: dict[str, bool], prefix: str = "") -> list[str]:
    """The values a user sets, as the docs name them: a key described as a whole (`resources`),
    else each member of a group (`agent.prefix`, `agent.sink`, ...)."""
    paths: list[str] = []
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if "properties" in sub and not keys.get(path, False):
            paths.extend(documented_values(sub, keys, f"{path}."))
        else:
            paths.append(path)
    return paths


def chart_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def chart_page_section() -> str:
    text = (REPO / "docs" / "chart.md").read_text()
    return text.split("<!-- section:chart -->", 1)[1].split("<!-- /section:chart -->", 1)[0]


SETTINGS = documented_values(chart_schema(), documented_keys())


@pytest.mark.parametrize("path", SETTINGS)
def test_every_value_has_a_default_and_a_comment_in_values_yaml(path: str) -> None:
    keys = documented_keys()
    assert path in keys, f"{path} has no default in values.yaml"
    assert keys[path], f"{path} has no `# --` comment right above it in values.yaml"


@pytest.mark.parametrize("path", SETTINGS)
def test_every_value_is_documented_in_the_chart_page(path: str) -> None:
    assert f"`{path}`" in chart_page_section()


def test_defaults_satisfy_the_schema() -> None:
    chart = helm.Chart.load(CHART_DIR)
    chart.validate_schema(chart.values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"agnet": {"prefix": "x"}}, "additional properties 'agnet' not allowed"),
        ({"agent": {"sinc": "node"}}, "at '/agent': additional properties 'sinc' not allowed"),
        ({"agent": {"port": "8080"}}, "at '/agent/port': got string, want integer"),
        ({"agent": {"port": 70000}}, "at '/agent/port'"),
        (
            {"agent": {"sink": "configmap"}},
            "at '/agent/sink': value must be one of 'node', 'nodefeature'",
        ),
        ({"agent": {"backend": "nvidia-smi"}}, "at '/agent/backend': value must be one of"),
        ({"agent": {"prefix": 'gpu"io'}}, "at '/agent/prefix'"),
        ({"agent": {"prefix": "Example.COM"}}, "at '/agent/prefix'"),
        ({"agent": {"prefix": "kubernetes.io"}}, "at '/agent/prefix'"),
        ({"agent": {"prefix": "node.kubernetes.io"}}, "at '/agent/prefix'"),
        ({"agent": {"prefix": "k8s.io"}}, "at '/agent/prefix'"),
        ({"agent": {"prefix": "topology.k8s.io"}}, "at '/agent/prefix'"),
        ({"agent": {"interval": "1d"}}, "at '/agent/interval'"),
        ({"agent": {"interval": 60}}, "at '/agent/interval': got number, want string"),
        ({"extender": {"connectedWait": "2 hours"}}, "at '/extender/connectedWait'"),
        ({"extender": {"connectedWait": 0}}, "at '/extender/connectedWait': got number, want"),
        (
            {"admissionPolicy": {"enabled": "yes"}},
            "at '/admissionPolicy/enabled': value must be one of 'auto', true, false",
        ),
        (
            {"kubeletConfig": {"enabled": "true"}},
            "at '/kubeletConfig/enabled': got string, want boolean",
        ),
        (
            {"kubeletConfig": {"hostPath": "var/lib/kubelet/config.yaml"}},
            "at '/kubeletConfig/hostPath'",
        ),
        (
            {"kubeletConfig": {"topologyManagerPolicy": "numa"}},
            "at '/kubeletConfig/topologyManagerPolicy'",
        ),
        ({"tolerations": {"key": "nvidia.com/gpu"}}, "at '/tolerations': got object, want array"),
        ({"nodeSelector": {"gpu": True}}, "at '/nodeSelector/gpu': got boolean, want string"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        (
            {"metrics": {"serviceMonitor": {"enabled": "on"}}},
            "at '/metrics/serviceMonitor/enabled'",
        ),
        ({"nrt": {"enabled": "true"}}, "at '/nrt/enabled': got string, want boolean"),
        ({"nrt": {"enable": True}}, "at '/nrt': additional properties 'enable' not allowed"),
        (
            {"koordinator": {"hostPath": "var/run/koordlet/xpu-device-infos"}},
            "at '/koordinator/hostPath'",
        ),
    ],
    ids=[
        "a misspelt top-level key",
        "a misspelt agent key",
        "a port given as a string",
        "a port out of range",
        "an unknown sink",
        "an unknown backend",
        "a prefix that would break out of a CEL string",
        "a prefix that is not a lower-case DNS subdomain",
        "the reserved kubernetes.io prefix",
        "a subdomain of kubernetes.io",
        "the reserved k8s.io prefix",
        "a subdomain of k8s.io",
        "an interval in days",
        "an interval given as a number",
        "a hold limit in words",
        "a hold limit given as a number",
        "a policy switch that is neither auto nor a bool",
        "a boolean given as a string",
        "a relative kubelet config path",
        "a topology manager policy the kubelet does not know",
        "tolerations given as a map",
        "a node selector value that is not a string",
        "an unknown pull policy",
        "a service monitor switch that is not a bool",
        "an nrt switch given as a string",
        "a misspelt nrt key",
        "a relative koordlet directory",
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize("prefix", ["notkubernetes.io", "kubernetes.io.example.com", "k8s.example"])
def test_schema_takes_prefixes_that_only_look_like_reserved_ones(prefix: str) -> None:
    chart = helm.Chart.load(CHART_DIR)
    chart.validate_schema({**chart.values, "agent": {**chart.values["agent"], "prefix": prefix}})
