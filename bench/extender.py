"""Latency of the scheduler extender: one filter plus one prioritize call per scheduling cycle.

Method. The API server double (HTTPS on loopback, in this process) holds N Nodes, each with an
availability annotation computed by the agent's own code (`compute_availability`) for a random
simulated machine (DGX A100, DGX H100, DGX-1, PCIe 8x) with a random free set. `topo-reporter
extender` runs as its own process, as in its Deployment, lists and watches them, and is called
once ready (/readyz) over one keep-alive connection, as kube-scheduler's client does. A cycle is
a filter call then a prioritize call on the nodes filter kept, for a pod asking for k GPUs (k drawn
from 1, 2, 4, 8) created as the benchmark started, so that filter weighs holding it for an
NVLink-connected set; its time runs from sending the filter request to reading the prioritize answer
(the first request body is encoded beforehand; the filter answer is decoded and the second body
encoded inside the span, as a scheduler must; the prioritize answer is read, not decoded: Python
decoding 5,000 entries would time the benchmark's client, not the extender). Beside the wall-clock
percentiles: the extender's own time answering (the sum of its request-duration histogram, per
cycle) and the CPU time its process used per cycle (/proc), which a busy machine inflates less.
Two forms: `NodeNames` (nodeCacheCapable: true) and, for
comparison, the whole `Nodes` list (as the double serves them, about 3 KB each) that a scheduler
without nodeCacheCapable sends, with fewer cycles (cycles x 100 / N, at least 20). The
target is p99 <= 50 ms at 5,000 nodes with nodeCacheCapable. The extender's resident memory is
read from /proc once it is ready (idle, its cache full) and at the end (its peak, VmHWM). With
`--checkout DIR` the extender runs from another checkout (the code before a change), the
benchmark and the API server double from this one.

    python bench/extender.py [--cycles 300] [--sizes 100,1000,5000] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from reporter.collect import build_scanner
from reporter.free_sets import compute_availability
from reporter.schema.availability import encode_availability
from reporter.schema.model import Topology
from tests.support.kube_double import ApiServerDouble, make_certificate, write_kubeconfig

KEY = "gpu.topology.io/availability"
PROFILES = ("dgx-a100", "dgx-h100", "dgx-1-v100", "pcie-8x")


def machines() -> dict[str, Topology]:
    found = {}
    for name in PROFILES:
        topology = build_scanner("auto", Path("/nonexistent"), name).scan().topology
        assert topology is not None
        found[name] = topology
    return found


CREATED = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
"""Every pod was created as the benchmark started: within the extender's hold limit, so that a
pod of k >= 2 GPUs is weighed for a hold on every filter call (held when no candidate gives a
connected set)."""


def pod(k: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "creationTimestamp": CREATED},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": k}}}]},
    }


def start_extender(
    kubeconfig: Path, checkout: Path | None
) -> tuple[subprocess.Popen[str], str, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "reporter.cli", "extender", "--listen", "127.0.0.1:0"],
        cwd=checkout,  # `-m` puts the working directory first on sys.path
        stderr=subprocess.PIPE,
        text=True,
        env={"KUBECONFIG": str(kubeconfig), "TOPO_REPORTER_LOG_FORMAT": "json", "PATH": ""},
    )
    assert process.stderr is not None
    for line in process.stderr:
        event = json.loads(line)
        if event["event"] == "serving":
            host, port = event["address"].rsplit(":", 1)
            return process, host, int(port)
    raise RuntimeError("the extender did not start")


def server_seconds(connection: http.client.HTTPConnection) -> float:
    """Total seconds the extender spent answering (its own request-duration histogram)."""
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("topo_reporter_extender_request_duration_seconds_sum")
    )


def memory_mib(pid: int) -> tuple[float, float]:
    """Resident memory of a process now and at its peak (VmRSS, VmHWM), MiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FORMS = {"NodeNames": "names (nodeCacheCapable)", "Nodes": "whole Nodes"}


def too_large(connection: http.client.HTTPConnection, args: dict[str, Any]) -> str:
    """The body's size in KiB when the extender refuses it as too large (413), else ''."""
    body = json.dumps(args).encode()
    try:
        connection.request("POST", "/filter", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status != 413:
            return ""
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered 413 and closed while the body was still being sent
    connection.close()  # the extender closes a connection whose body it did not read
    return f"{len(body) / 1024:.0f}"


def call(connection: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, data
    return data


def measure(
    n: int,
    cycles: int,
    topologies: dict[str, Topology],
    rng: random.Random,
    checkout: Path | None,
) -> list[Any]:
    with tempfile.TemporaryDirectory() as scratch:
        certificate = make_certificate(Path(scratch))
        double = ApiServerDouble(certificate=certificate)
        annotations = {}
        for name, topology in topologies.items():
            for _ in range(8):
                free = rng.sample(range(len(topology.gpus)), rng.randint(0, len(topology.gpus)))
                annotations.setdefault(name, []).append(
                    encode_availability(compute_availability(topology, free))
                )
        for i in range(n):
            profile = rng.choice(PROFILES)
            double.add_node(f"gpu-{i:05d}", annotations={KEY: rng.choice(annotations[profile])})
        with double:
            kubeconfig = write_kubeconfig(
                Path(scratch) / "kubeconfig", double.url, "admin-token", ca_cert=certificate.cert
            )
            process, host, port = start_extender(kubeconfig, checkout)
            try:
                connection = http.client.HTTPConnection(host, port, timeout=30)
                deadline = time.monotonic() + 120
                while True:
                    connection.request("GET", "/readyz")
                    if connection.getresponse().read() == b"ok\n":
                        break
                    assert time.monotonic() < deadline, "the extender never got ready"
                    time.sleep(0.05)
                idle_rss = memory_mib(process.pid)[0]
                names = sorted(double.nodes)
                whole = double.list_nodes()
                rows = []
                for form in ("NodeNames", "Nodes"):
                    refused = too_large(
                        connection, {"Pod": pod(1), form: names if form == "NodeNames" else whole}
                    )
                    if refused:
                        rows.append([n, FORMS[form], refused, *["413"] * 5, f"{idle_rss:.0f}", ""])
                        continue
                    times = []
                    # Whole Nodes cost about a second a call at 5,000: fewer cycles show it.
                    count = cycles if form == "NodeNames" else max(20, cycles * 100 // n)
                    served, used = 0.0, 0.0
                    for cycle in range(count + 5):
                        if cycle == 5:  # after the warm-up
                            served, used = server_seconds(connection), cpu_seconds(process.pid)
                        k = rng.choice((1, 2, 4, 8))
                        args: dict[str, Any] = {"Pod": pod(k)}
                        args[form] = names if form == "NodeNames" else whole
                        body = json.dumps(args).encode()
                        start = time.perf_counter()
                        kept = json.loads(call(connection, "/filter", body))
                        args[form] = kept[form]
                        second = json.dumps(args).encode()
                        # The second body is encoded inside the timed span: a scheduler does too.
                        call(connection, "/prioritize", second)
                        times.append(time.perf_counter() - start)
                    served = server_seconds(connection) - served
                    used = cpu_seconds(process.pid) - used
                    times = times[5:]  # warm-up
                    quantiles = statistics.quantiles(times, n=100, method="inclusive")
                    rows.append(
                        [
                            n,
                            FORMS[form],
                            f"{len(body) / 1024:.0f}",
                            f"{statistics.median(times) * 1000:.1f}",
                            f"{quantiles[98] * 1000:.1f}",
                            f"{max(times) * 1000:.1f}",
                            f"{served / len(times) * 1000:.1f}",
                            f"{used / len(times) * 1000:.1f}",
                            f"{idle_rss:.0f}",
                            f"{memory_mib(process.pid)[1]:.0f}",
                        ]
                    )
                connection.close()
            finally:
                process.terminate()
                process.wait(10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--checkout", type=Path, help="run the extender from this checkout")
    args = parser.parse_args()
    quiet_logs()
    rng = random.Random(13)
    topologies = machines()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        rows.extend(measure(n, args.cycles, topologies, rng, args.checkout))
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Load average at the end (1 / 5 / 15 min, {os.cpu_count()} CPUs): {load}\n")
    print(
        table(
            [
                "nodes",
                "request form",
                "filter body KiB",
                "p50 ms",
                "p99 ms",
                "max ms",
                "server ms/cycle",
                "CPU ms/cycle",
                "idle RSS MiB",
                "peak RSS MiB",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
