"""Footprint of `topo-reporter run` on a simulated DGX H100: RSS, CPU, time to first publish.

Method. The agent runs as its own process, as in the DaemonSet, with `--simulate dgx-h100`:
(a) `--dry-run` (publishes to stdout), (b) against the API server double (HTTPS on loopback) with
a plain token kubeconfig, which `run` serves with its lean client (reporter.publish.rest), (c) the
same with the token from an exec plugin, which only the official `kubernetes` client runs. Time
to first publish: from just before the process is spawned to the first line on stdout (dry-run)
or to the moment the double holds the annotation (polled every 5 ms). RSS: psutil, sampled every
50 ms for WINDOW seconds with `--interval 1s` (60x the default pace); peak is the largest sample,
steady the median of the last half. CPU seconds per hour: CPU used between the first publish and
the end of the window, divided by the scans made, times the 60 scans an hour holds at the default
interval. Import time: `python -X importtime` of the CLI.

    python bench/footprint.py

With `--availability`, the same measure of `run --availability --availability-interval 1s` (one
scan and one availability tick a second): (a) `--dry-run --simulate-used 0,1`, (b) against the API
server double with the lean client, reading the free GPUs from the PodResources double
(tests/support/podresources_double.py: a real gRPC server on a unix socket, GPUs 0 and 1 held by a
pod), first publish being the moment the double holds the availability annotation, and (c) the same
on a DRA node: no device plugin offers a GPU, two ResourceClaims of NVIDIA's DRA driver hold GPUs 0
and 1 (`dynamic_resources` in List), which the agent counts with its default `--dra-drivers`.

    python bench/footprint.py --availability

With `--serve`, the agent serves /healthz, /readyz and /metrics on 127.0.0.1 (`--listen`), as in
the DaemonSet, instead of not serving at all (`--listen ''`); with `--checkout DIR`, the agent
runs from another checkout (the code before a change): these two compare HTTP servers.

    python bench/footprint.py --serve [--checkout DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from reporter.collect import build_scanner
from reporter.schema import keys
from tests.support.kube_double import ApiServerDouble, make_certificate, write_kubeconfig
from tests.support.podresources_double import (
    PodResourcesDouble,
    claim_pod_state,
    claim_state,
    devices_state,
    pod_state,
)

WINDOW_S = 20.0
AGENT = [sys.executable, "-m", "reporter.cli", "run", "--simulate", "dgx-h100", "--listen", ""]
CHECKOUT: Path | None = None
"""Where the agent's code comes from when not this checkout (`--checkout`)."""


def measure(argv: list[str], first_publish: object, env: dict[str, str]) -> list[object]:
    start = time.perf_counter()
    process = subprocess.Popen(
        [*argv, "--interval", "1s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=CHECKOUT,  # `-m` puts the working directory first on sys.path
    )
    watched = psutil.Process(process.pid)
    samples: list[float] = []
    try:
        published = first_publish(process)  # type: ignore[operator]
        first_s = time.perf_counter() - start
        cpu_at_publish = sum(watched.cpu_times()[:2])
        end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < end:
            samples.append(watched.memory_info().rss / 2**20)
            time.sleep(0.05)
        cpu_window = sum(watched.cpu_times()[:2]) - cpu_at_publish
    finally:
        process.terminate()
        process.wait(5)
    assert published
    per_scan = cpu_window / WINDOW_S  # one scan a second
    return [
        f"{first_s:.2f}",
        f"{max(samples):.1f}",
        f"{statistics.median(samples[len(samples) // 2 :]):.1f}",
        f"{cpu_at_publish:.2f}",
        f"{per_scan * 1000:.1f}",
        f"{per_scan * 60:.1f}",
    ]


def import_profile(env: dict[str, str]) -> list[list[object]]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import reporter.cli"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    cumulative: dict[str, int] = {}
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
        if match and len(match.group(2)) <= 5:  # top-level packages and their direct imports
            cumulative[match.group(3)] = max(cumulative.get(match.group(3), 0), int(match.group(1)))
    total = cumulative.get("reporter.cli", 1)
    names = [
        "kubernetes",
        "reporter.publish.kube",
        "reporter.publish.rest",
        "urllib3",
        "structlog",
        "jsonschema",
        "yaml",
        "prometheus_client",
        "tenacity",
        "reporter.collect",
        "reporter.cli",
    ]
    return [
        [n, f"{cumulative.get(n, 0) / 1000:.0f}", f"{100 * cumulative.get(n, 0) / total:.0f}%"]
        for n in names
        if n in cumulative
    ]


HEADERS = [
    "mode",
    "first publish s",
    "peak RSS MiB",
    "steady RSS MiB",
    "CPU s to first publish",
    "CPU ms/scan",
    "CPU s/hour (60 s interval)",
]
LIVE = ["--availability", "--availability-interval", "1s"]


def first_line(process: subprocess.Popen[bytes]) -> bool:
    assert process.stdout is not None
    return bool(process.stdout.readline())


def main_availability(env: dict[str, str]) -> None:
    quiet_logs(logging.ERROR)
    rows = []
    argv = [*AGENT, "--dry-run", *LIVE, "--simulate-used", "0,1"]
    rows.append(["dry-run, --availability --simulate-used 0,1", *measure(argv, first_line, env)])
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    ids = [g.uuid for g in scan.topology.gpus if g.uuid is not None]
    plugin = {
        "devices": devices_state("nvidia.com/gpu", ids),
        "pods": [pod_state("train", "nvidia.com/gpu", ids[:2])],
    }
    minors = [g.minor for g in scan.topology.gpus[:2]]
    claims = {
        "devices": [],
        "pods": [
            claim_pod_state(f"train-{m}", [claim_state(f"gpu-{m}", [f"gpu-{m}"], "gpu-live")])
            for m in minors
        ],
    }
    for label, state in (("PodResources double", plugin), ("DRA claims, no device plugin", claims)):
        rows.append(_against_the_double(label, state, env))
    print(table(HEADERS, rows))


def _against_the_double(label: str, state: dict[str, Any], env: dict[str, str]) -> list[object]:
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir="/tmp") as short:
        certificate = make_certificate(Path(tmp))
        socket = Path(short) / "kubelet.sock"
        with ApiServerDouble(certificate=certificate) as double, PodResourcesDouble(socket, state):
            key = keys.key(keys.DEFAULT_PREFIX, keys.AVAILABILITY)
            double.add_node("gpu-live")

            def annotated(_: subprocess.Popen[bytes]) -> bool:
                deadline = time.perf_counter() + 30
                while key not in double.annotations("gpu-live"):
                    if time.perf_counter() > deadline:
                        return False
                    time.sleep(0.005)
                return True

            kubeconfig = write_kubeconfig(
                Path(tmp) / "kubeconfig", double.url, "agent-token", ca_cert=certificate.cert
            )
            argv = [*AGENT, "--node", "gpu-live", "--kubeconfig", str(kubeconfig), *LIVE]
            argv += ["--pod-resources-socket", str(socket)]
            mode = f"API double, lean client, --availability, {label}"
            return [mode, *measure(argv, annotated, env)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--availability", action="store_true", help="run --availability's modes")
    parser.add_argument("--serve", action="store_true", help="serve /healthz and /metrics")
    parser.add_argument("--checkout", type=Path, help="run the agent from this checkout")
    args = parser.parse_args()
    global CHECKOUT  # noqa: PLW0603  # one run, one checkout: set once, before any measure
    CHECKOUT = args.checkout
    if args.serve:
        AGENT[-1] = "127.0.0.1:0"
    code = args.checkout or Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(code)}
    if args.availability:
        main_availability(env)
        return
    rows = []

    rows.append(["dry-run", *measure([*AGENT, "--dry-run"], first_line, env)])
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        double = ApiServerDouble(certificate=certificate)
        with double:
            key = keys.key(keys.DEFAULT_PREFIX, keys.TOPOLOGY)

            def annotated(_: subprocess.Popen[bytes]) -> bool:
                deadline = time.perf_counter() + 30
                while key not in double.annotations(f"gpu-{len(rows)}"):
                    if time.perf_counter() > deadline:
                        return False
                    time.sleep(0.005)
                return True

            for mode, exec_plugin in (
                ("API double, lean client (token kubeconfig)", False),
                ("API double, official client (exec-plugin kubeconfig)", True),
            ):
                kubeconfig = write_kubeconfig(
                    Path(tmp) / f"kubeconfig-{exec_plugin}",
                    double.url,
                    "agent-token",
                    ca_cert=certificate.cert,
                    exec_plugin=exec_plugin,
                )
                node = f"gpu-{len(rows)}"
                double.add_node(node)
                argv = [*AGENT, "--node", node, "--kubeconfig", str(kubeconfig)]
                rows.append([mode, *measure(argv, annotated, env)])
    print(table(HEADERS, rows))
    print("\nImport time of `reporter.cli` (cumulative, ms):\n")
    print(table(["module", "ms", "share"], import_profile(env)))


if __name__ == "__main__":
    main()
