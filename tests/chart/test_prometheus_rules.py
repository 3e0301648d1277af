"""The chart's alert rules (issue 31, item 3): `metrics.prometheusRule.enabled=true` renders exactly
one monitoring.coreos.com/v1 PrometheusRule (real Helm SDK), and the real promtool (Prometheus
v0.314.0, built from the Go module proxy in tests/controlplane/prometheus/) checks its rules and
runs tests/fixtures/prometheus/rules_test.yml: every alert fires when it should and stays silent
when it should not. Each alert's runbook anchor exists in docs/monitoring.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm_chart import render

FIXTURE = Path(__file__).parents[1] / "fixtures/prometheus/rules_test.yml"
MONITORING = Path(__file__).parents[2] / "docs/monitoring.md"
ON = {"metrics": {"prometheusRule": {"enabled": True}}}


def rule_object(values: dict[str, Any] = ON) -> dict[str, Any]:
    (rule,) = render(values).of_kind("PrometheusRule")
    return rule


def alerts(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def promtool(binary: Path, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], cwd=workdir, capture_output=True, text=True, timeout=120, check=False
    )


def write_rules(rule: dict[str, Any], workdir: Path) -> None:
    """The rule's groups as a rules file, without the static annotations (description,
    runbook_url: checked below as text): promtool compares every annotation of an alert, and
    the tests name the templated summary."""
    groups = []
    for group in rule["spec"]["groups"]:
        rules = [
            {**r, "annotations": {"summary": r["annotations"]["summary"]}} for r in group["rules"]
        ]
        groups.append({**group, "rules": rules})
    (workdir / "rules.yml").write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    shutil.copy(FIXTURE, workdir / "rules_test.yml")


def test_off_by_default_and_exactly_one_prometheus_rule_when_on() -> None:
    assert render().of_kind("PrometheusRule") == []
    rule = rule_object()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert [o["kind"] for o in render(ON).objects].count("PrometheusRule") == 1
    assert rule["metadata"]["namespace"] == "gpu-system"


def test_every_alert_has_a_runbook_in_the_docs_that_names_the_doctors_finding() -> None:
    docs = MONITORING.read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", docs, re.M)
    }
    for alert in alerts(rule_object()):
        url = alert["annotations"]["runbook_url"]
        assert url.endswith("docs/monitoring.md#" + alert["alert"].lower())
        assert alert["alert"].lower() in anchors, alert["alert"]
        section = docs.split(f"### {alert['alert']}\n", 1)[1].split("\n### ", 1)[0]
        assert "doctor" in section, alert["alert"]


def test_every_alert_has_a_unit_test_that_fires_and_one_that_stays_silent() -> None:
    tests = yaml.safe_load(FIXTURE.read_text(encoding="utf-8"))["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    names = {a["alert"] for a in alerts(rule_object())}
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == names
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == names


def test_promtool_checks_the_rules_and_their_unit_tests_pass(
    promtool_bin: Path, tmp_path: Path
) -> None:
    write_rules(rule_object(), tmp_path)
    checked = promtool(promtool_bin, tmp_path, "check", "rules", "rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts(rule_object()))} rules found" in checked.stdout
    tested = promtool(promtool_bin, tmp_path, "test", "rules", "rules_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@pytest.mark.parametrize(
    ("values", "alert"),
    [
        # A share threshold above the 75% the fixture feeds: the alert stays silent, its test fails.
        ({"unconnectedShare": 0.8}, "TopoReporterUnconnectedPlacements"),
        # A longer staleness: a has published 25 minutes ago, under the limit.
        ({"staleAfterSeconds": 1800}, "TopoReporterNotPublishing"),
    ],
)
def test_the_unit_tests_fail_on_rules_that_do_not_fire(
    promtool_bin: Path, tmp_path: Path, values: dict[str, Any], alert: str
) -> None:
    write_rules(rule_object({"metrics": {"prometheusRule": {"enabled": True, **values}}}), tmp_path)
    tested = promtool(promtool_bin, tmp_path, "test", "rules", "rules_test.yml")
    assert tested.returncode == 1
    assert f"alertname: {alert}" in tested.stdout + tested.stderr
