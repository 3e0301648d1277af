"""A real Prometheus (v0.314.0, built in tests/controlplane/prometheus/) on loopback scraping the
real agent and the real extender (issue 31, item 5). The agent runs `run --availability` on a
simulated DGX H100 whose GPU 1 has 4 NVLinks down, its PodResources served by the kubelet's own
server code (a pod holding GPUs 0-3); the extender watches the API server double. Every metric
the chart's alert rules read returns series with the labels they expect, and
TopoReporterNvlinksDown fires in Prometheus (its `for` shortened to 2 s for the run; promtool's
unit tests check the 5 minutes)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from reporter.collect.simulate.machine import load_machine
from reporter.free_sets import compute_availability
from reporter.schema.availability import encode_availability
from tests.agent.test_placement_quality import kubelet  # noqa: F401  # the fixture
from tests.chart.test_dashboard import dashboard, expressions
from tests.chart.test_prometheus_rules import rule_object
from tests.cli.test_run import CLI, env
from tests.collect.test_podresources import GPU
from tests.collect.test_podresources_kubelet import KubeletPodResources
from tests.support.agent_support import topology
from tests.support.kube_double import ApiServerDouble, write_kubeconfig
from tests.support.kube_double.tls import Certificate
from tests.support.podresources_double import devices_state

pytestmark = pytest.mark.controlplane

PROFILES = Path(__file__).resolve().parents[2] / "reporter/collect/simulate/profiles"
# Bounds on waiting for processes on a loaded two-core machine: never a timing claim.
WAIT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(proc: subprocess.Popen[str]) -> str:
    """The address a process logs in its `serving` event (JSON logs on stderr)."""
    stream: IO[str] | None = proc.stderr
    assert stream is not None
    for line in stream:
        if line.startswith("{") and json.loads(line).get("event") == "serving":
            return str(json.loads(line)["address"])
    pytest.fail(f"{proc.args[:4]} exited without serving (status {proc.wait()})")


def query(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())["data"]


def parsed(port: int, expr: str) -> list[Any]:
    """The instant result of `expr`; a query Prometheus cannot parse fails the test at once."""
    try:
        result: list[Any] = query(port, "/api/v1/query", query=expr)["result"]
    except urllib.error.HTTPError as e:
        pytest.fail(f"Prometheus refused {expr!r}: {e.read().decode(errors='replace')}")
    return result


def poll(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    pytest.fail(f"{what}; last: {last}")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_prometheus_scrapes_the_agent_and_the_extender_and_the_nvlink_alert_fires(
    prometheus_bin: Path,
    kubelet: KubeletPodResources,  # noqa: F811
    apiserver: ApiServerDouble,
    apiserver_certificate: Certificate,
    processes: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    profile = yaml.safe_load((PROFILES / "dgx-h100.yaml").read_text(encoding="utf-8"))
    profile["gpus"] = [{"index": 1, "links_down": 4}]
    (tmp_path / "h100-down.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    machine = load_machine(str(tmp_path / "h100-down.yaml"))
    uuids = [g.uuid for g in machine.gpus]
    kubelet.write(
        {
            "devices": devices_state(GPU, uuids),
            "pods": [
                {
                    "namespace": "ml",
                    "name": "train",
                    "containers": [
                        {"name": "main", "devices": [{"resource": GPU, "ids": uuids[:4]}]}
                    ],
                }
            ],
        }
    )
    agent = subprocess.Popen(
        [
            *CLI, "run", "--simulate", str(tmp_path / "h100-down.yaml"), "--node", "gpu-node-1",
            "--dry-run", "--listen", "127.0.0.1:0", "--availability",
            "--pod-resources-socket", str(kubelet.socket), "--interval", "5s",
            "--availability-interval", "1s",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env(TOPO_REPORTER_LOG_FORMAT="json"),
    )  # fmt: skip
    processes.append(agent)
    agent_address = serving(agent)

    free = encode_availability(compute_availability(topology(), range(8)))
    apiserver.add_node(
        "gpu-node-1",
        labels={"gpu.topology.io/count": "8", "gpu.topology.io/nvlink-partition": "c1.7"},
        annotations={"gpu.topology.io/availability": free},
    )
    kubeconfig = write_kubeconfig(
        tmp_path / "extender.kubeconfig", apiserver.url, "extender-token",
        ca_cert=apiserver_certificate.cert,
    )  # fmt: skip
    extender = subprocess.Popen(
        [*CLI, "extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env(TOPO_REPORTER_LOG_FORMAT="json"),
    )  # fmt: skip
    processes.append(extender)
    extender_address = serving(extender)
    # One call that the extender refuses, so its requests counter has a series.
    bad = urllib.request.Request(f"http://{extender_address}/filter", data=b"{", method="POST")
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(bad, timeout=10)

    rule = rule_object()
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if r["alert"] == "TopoReporterNvlinksDown":
                r["for"] = "2s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            # The node label, as the chart's ServiceMonitor adds it from the pod's node name.
            {
                "job_name": "agent",
                "static_configs": [{"targets": [agent_address], "labels": {"node": "gpu-node-1"}}],
            },
            {"job_name": "extender", "static_configs": [{"targets": [extender_address]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prometheus = subprocess.Popen(
        [
            str(prometheus_bin), "--config.file=prometheus.yml",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    processes.append(prometheus)

    expected = {
        "topo_reporter_pod_gpu_sets": {"gpus", "connected"},
        "topo_reporter_free_connected_max": set(),
        "topo_reporter_last_publish_timestamp_seconds": set(),
        "topo_reporter_degraded": set(),
        "topo_reporter_gpus_lost": set(),
        "topo_reporter_nvlinks_down": set(),
        "topo_reporter_fabric_unhealthy": set(),
        "topo_reporter_partition_withheld": set(),
        "topo_reporter_podresources_consecutive_failures": set(),
        "topo_reporter_availability_withdrawn": set(),
        "topo_reporter_extender_requests_total": {"verb", "result"},
        "topo_reporter_extender_cache_synced": set(),
        "topo_reporter_extender_connected_capable_nodes": {"gpus"},
        "topo_reporter_extender_partition_free_nodes": {"partition"},
    }
    for name, labels in expected.items():
        result = poll(lambda name=name: query(port, "/api/v1/query", query=name)["result"], name)
        for series in result:
            assert labels <= set(series["metric"]) - {"__name__", "instance", "job"}, series
    sets = query(port, "/api/v1/query", query='topo_reporter_pod_gpu_sets{gpus="4"}')["result"]
    # GPUs 0-3 of an NVSwitch node: connected, one pod.
    assert {s["metric"]["connected"]: s["value"][1] for s in sets} == {"true": "1", "false": "0"}
    partitions = query(port, "/api/v1/query", query="topo_reporter_extender_partition_free_nodes")
    assert [(s["metric"]["partition"], s["value"][1]) for s in partitions["result"]] == [
        ("c1.7", "1")
    ]
    assert (
        query(port, "/api/v1/query", query="topo_reporter_nvlinks_down")["result"][0]["value"][1]
        == "4"
    )

    def firing() -> list[dict[str, Any]]:
        alerts = query(port, "/api/v1/alerts")["alerts"]
        return [
            a
            for a in alerts
            if a["labels"]["alertname"] == "TopoReporterNvlinksDown" and a["state"] == "firing"
        ]

    # Every query of the dashboard parses (a 400 is raised at once), and each of ours returns
    # series; DCGM exporter's parse, with no series here (no DCGM exporter runs).
    for expr in expressions(dashboard()):
        concrete = expr.replace("$__rate_interval", "1m")
        for variable in ("$node", "$gpu"):
            concrete = concrete.replace(variable, ".*")
        if "DCGM_" in concrete:
            assert parsed(port, concrete) == []
            continue
        poll(lambda concrete=concrete: parsed(port, concrete), f"no series for the panel's {expr}")

    (alert,) = poll(firing, "TopoReporterNvlinksDown never fired")
    assert alert["labels"]["instance"] == agent_address
    assert alert["annotations"]["summary"] == f"4 NVLink(s) down on {agent_address}"
