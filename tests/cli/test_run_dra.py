"""`run --dra-device-taints` from the outside (issue 22's Interface): a dry run prints each
DeviceTaintRule the agent would create, as a JSON object of kind `DeviceTaintRule`, for a simulated
machine whose profile takes NVLinks down (`gpus[].links_down`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_run import CLI, env

PROFILES = Path(__file__).resolve().parents[2] / "reporter/collect/simulate/profiles"


def h100(tmp: Path, links_down: dict[int, int]) -> Path:
    data = yaml.safe_load((PROFILES / "dgx-h100.yaml").read_text(encoding="utf-8"))
    data["gpus"] = [{"index": i, "links_down": k} for i, k in links_down.items()]
    path = tmp / "h100.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def documents(text: str) -> list[Any]:
    """Every JSON document printed, one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        doc, at = decoder.raw_decode(text, at)
        found.append(doc)
    return found


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_dry_run_prints_each_device_taint_rule(tmp_path: Path, how: str) -> None:
    profile = h100(tmp_path, {1: 2, 5: 18})
    flag = ["--dra-device-taints"] if how == "flag" else []
    extra = {"TOPO_REPORTER_DRA_DEVICE_TAINTS": "true"} if how == "environment" else {}
    result = subprocess.run(
        [*CLI, "run", "--simulate", str(profile), "--once", "--dry-run", "--node", "dgx-07", *flag],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG="/nonexistent", **extra),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rules = [d for d in documents(result.stdout) if d.get("kind") == "DeviceTaintRule"]
    assert [
        (r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["value"]) for r in rules
    ] == [("gpu-1", "nvlink-degraded"), ("gpu-5", "nvlink-down")]
    for rule in rules:
        assert rule["apiVersion"] == "resource.k8s.io/v1alpha3"
        assert rule["spec"]["deviceSelector"]["driver"] == "gpu.nvidia.com"
        assert rule["spec"]["deviceSelector"]["pool"] == "dgx-07"
        assert rule["spec"]["taint"]["key"] == "gpu.topology.io/gpu-unhealthy"
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "topo-reporter",
            "gpu.topology.io/node": "dgx-07",
        }
    patch = next(d for d in documents(result.stdout) if "kind" not in d)
    assert patch["metadata"]["labels"]["gpu.topology.io/nvlink-health"] == "down"


def test_a_healthy_machine_or_the_rules_off_print_no_rule(tmp_path: Path) -> None:
    for argv in (
        ["--simulate", "dgx-h100", "--dra-device-taints"],
        ["--simulate", str(h100(tmp_path, {1: 2}))],
    ):
        result = subprocess.run(
            [*CLI, "run", *argv, "--once", "--dry-run", "--node", "dgx-07"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(KUBECONFIG="/nonexistent"),
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert not [d for d in documents(result.stdout) if d.get("kind") == "DeviceTaintRule"]


def test_a_node_name_that_cannot_label_the_rules_is_one_line() -> None:
    result = subprocess.run(
        [
            *CLI,
            "run",
            "--simulate",
            "dgx-h100",
            "--once",
            "--dry-run",
            "--dra-device-taints",
            "--node",
            "n" * 64,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG="/nonexistent"),
        check=False,
    )
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--dra-device-taints" in result.stderr
