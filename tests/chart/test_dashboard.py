"""The chart's Grafana dashboard (issue 31, item 4): `metrics.dashboard.enabled=true` renders
exactly one ConfigMap labelled `grafana_dashboard: "1"` (real Helm SDK) holding the dashboard JSON,
which conforms to Grafana's own schema (tests/support/grafana_schema.py). Its queries run against
the real Prometheus in tests/controlplane/test_prometheus.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from tests.support.grafana_schema import check
from tests.support.helm_chart import render

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts/topo-reporter/dashboards/topo-reporter.json"
)
ON = {"metrics": {"dashboard": {"enabled": True}}}
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
"""The labels DCGM exporter puts on every GPU metric (internal/pkg/rendermetrics, its
gpuMetricsFormat; `Hostname` is the node's name, NODE_NAME in the GPU Operator's DaemonSet)."""


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


LABEL_VALUES = re.compile(r"label_values\((?P<selector>.+), (?P<label>\w+)\)")
"""Grafana's query-variable function: the values of a label over the series of a selector."""


def expressions(board: dict[str, Any]) -> list[str]:
    """Every Prometheus expression of the dashboard: the panels' targets, and the selectors of
    its query variables (`label_values(SELECTOR, LABEL)`)."""
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            call = LABEL_VALUES.fullmatch(variable["query"]["query"])
            assert call, variable["query"]
            found.append(call["selector"])
    return found


def test_off_by_default_and_exactly_one_labelled_config_map_when_on() -> None:
    assert not [
        o
        for o in render().of_kind("ConfigMap")
        if "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    (config_map,) = [
        o for o in render(ON).of_kind("ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "gpu-system"
    (text,) = config_map["data"].values()
    assert json.loads(text) == dashboard()


def test_namespace_labels_and_folder_annotation() -> None:
    values = {
        "commonAnnotations": {"team": "gpu"},
        "metrics": {
            "dashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"release": "kps"},
                "annotations": {"grafana_folder": "GPU"},
            }
        },
    }
    (config_map,) = [
        o
        for o in render(values).of_kind("ConfigMap")
        if "grafana_dashboard" in o["metadata"]["labels"]
    ]
    meta = config_map["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["release"] == "kps"
    assert meta["annotations"] == {"team": "gpu", "grafana_folder": "GPU"}


def test_the_dashboard_conforms_to_grafanas_schema() -> None:
    assert check(dashboard()) == ""


def test_the_schema_check_refuses_what_grafana_would_not_read() -> None:
    # Each a mistake the schema catches: a misspelled field, a value outside an enum, a missing
    # required field, a wrong type, a panel type with no known options.
    mistakes = []
    board = copy.deepcopy(dashboard())
    board["panels"][1]["gridPos"]["width"] = 3
    mistakes.append(board)
    board = copy.deepcopy(dashboard())
    board["panels"][1]["options"]["legend"]["displayMode"] = "pie"
    mistakes.append(board)
    board = copy.deepcopy(dashboard())
    del board["schemaVersion"]
    mistakes.append(board)
    board = copy.deepcopy(dashboard())
    board["panels"][1]["targets"][0]["expr"] = 42
    mistakes.append(board)
    board = copy.deepcopy(dashboard())
    board["panels"][1]["type"] = "piechart-plugin-nobody-has"
    mistakes.append(board)
    for board in mistakes:
        assert check(board) != ""


def test_panels_cover_what_operators_watch() -> None:
    text = " ".join(expressions(dashboard()))
    for metric in (
        "topo_reporter_pod_gpu_sets",
        "topo_reporter_extender_connected_capable_nodes",
        "topo_reporter_extender_partition_free_nodes",
        "topo_reporter_extender_held_pods",
        "topo_reporter_nvlinks_down",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_DEV_GPU_UTIL",
    ):
        assert metric in text, metric


def test_dcgm_queries_use_the_labels_dcgm_exporter_writes() -> None:
    for expr in expressions(dashboard()):
        if "DCGM_" not in expr:
            continue
        used = set(re.findall(r"([A-Za-z_]\w*)\s*=~?", expr)) | {
            label for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(", ")
        }
        assert used <= DCGM_LABELS, used - DCGM_LABELS
        assert 'Hostname=~"$node"' in expr


def test_the_extender_is_scraped_where_it_is_installed() -> None:
    on = {"metrics": {"serviceMonitor": {"enabled": True}}}
    assert len(render(on).of_kind("ServiceMonitor")) == 1
    peers = [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    both = {**on, "extender": {"enabled": True, "networkPolicy": {"from": peers}}}
    monitors = render(both).of_kind("ServiceMonitor")
    assert len(monitors) == 2
    (extender,) = [m for m in monitors if "extender" in m["metadata"]["name"]]
    (endpoint,) = extender["spec"]["endpoints"]
    assert endpoint["port"] == "http"
    assert "scheme" not in endpoint
