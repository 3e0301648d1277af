"""`topo-reporter run` as a user runs it: a process, a simulated machine, the double as cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.kube_double import ApiServerDouble, Fault

NODE = "gpu-node-1"
CLI = [sys.executable, "-m", "reporter.cli"]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_REPORTER_")}
    base.pop("KUBECONFIG", None)
    base.pop("NODE_NAME", None)
    return {**base, **extra}


def test_the_readme_first_screen_command_prints_the_patch_without_gpu_or_cluster() -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG="/nonexistent"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    patch = json.loads(result.stdout)
    assert patch["metadata"]["labels"]["gpu.topology.io/count"] == "8"
    assert patch["metadata"]["labels"]["gpu.topology.io/interconnect"] == "nvswitch"
    assert "gpu.topology.io/matrix" in patch["metadata"]["annotations"]
    assert "resourceVersion" not in patch["metadata"]


def test_a_dry_run_without_a_node_name_logs_this_hosts_node_name_on_every_line() -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--dry-run", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG="/nonexistent"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert lines
    assert {line["node"] for line in lines} == {socket.gethostname().lower()}


def test_once_publishes_through_a_kubeconfig_and_exits_zero(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=str(kubeconfig), NODE_NAME=NODE, TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert apiserver.labels(NODE)["gpu.topology.io/count"] == "8"
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert lines, "the agent logs what it did"
    assert all(line["node"] == NODE for line in lines)
    assert "agent-token" not in result.stderr


def test_events_about_the_node_go_to_default_whatever_the_pods_namespace(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    """The chart sets POD_NAMESPACE to the release's; the apiserver takes Node Events in default."""
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(
            KUBECONFIG=str(kubeconfig),
            NODE_NAME=NODE,
            POD_NAMESPACE="gpu-system",
            TOPO_REPORTER_LOG_FORMAT="json",
            TOPO_REPORTER_KUBELET_CONFIG="/nonexistent/kubelet/config.yaml",
        ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "event_failed" not in result.stderr
    assert apiserver.list_events("gpu-system", "") == []
    # The topology published, and the kubelet config this machine does not have.
    assert sorted(
        (e["reason"], e["involvedObject"]["name"]) for e in apiserver.list_events("default", "")
    ) == [("GPUTopologyChanged", NODE), ("KubeletPolicyUnknown", NODE)]


def test_once_exits_non_zero_with_one_line_when_the_api_refuses(
    apiserver: ApiServerDouble, kubeconfig_with_token: Callable[[str], Path]
) -> None:
    make = kubeconfig_with_token
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--node", NODE],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=str(make("wrong-token")), TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 1
    refused = [json.loads(x) for x in result.stderr.splitlines() if "node_read_refused" in x]
    assert "rejected the credentials (401)" in refused[0]["error"]


def test_a_bad_setting_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--interval", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "interval" in result.stderr


def test_sigterm_mid_retry_stops_the_agent_at_once(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    # Every PATCH answers 503 with Retry-After: 120; only an interrupted wait can exit promptly.
    apiserver.plan(*[Fault(503, "PATCH", retry_after="120") for _ in range(10)])
    with subprocess.Popen(
        [*CLI, "run", "--simulate", "dgx-h100", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(KUBECONFIG=str(kubeconfig), NODE_NAME=NODE, TOPO_REPORTER_LOG_FORMAT="json"),
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if '"api_retry"' in line:
                break
        proc.send_signal(signal.SIGTERM)
        # Far shorter than the 120 s the server asked for: the wait was interrupted.
        status = proc.wait(timeout=10)
        rest = proc.stderr.read()
    assert status == 0, rest
    events = [json.loads(x)["event"] for x in rest.splitlines()]
    assert "signal" in events
    assert "stopped" in events
