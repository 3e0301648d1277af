"""/filter's latency while 16 clients loop on /metrics, at 15,000 nodes outside a multi-node
fabric (issue 41, item 5).

Method. The extender runs in its own process over a Node cache of N nodes (filled directly: no
API server), each carrying its own partition (`node-<name>`, a node outside a multi-node fabric)
and an availability of 4 free GPUs, with the chart's bounds, from this checkout and, with
`--before DIR`, from a checkout of the code before the change (`git archive <commit> | tar -x -C
DIR`). Measured for each, on loopback: `--calls` /filter calls (a pod of 1 GPU, 100 candidate
names) one after the other on one keep-alive connection, alone; then the same while another
process runs 16 threads, each looping GET /metrics on its own keep-alive connection; the
scrapes' count, median and size. Bounded: every call has a 10 s timeout, the scrapers stop when
the /filter calls end, and the whole run takes a minute or two.

    python bench/extender_metrics.py [--nodes 15000] [--calls 200] [--before DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from bench.http_servers import AVAILABILITY

TIMEOUT_S = 10.0
SCRAPERS = 16

EXTENDER = """
import sys
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
nodes, text = int(sys.argv[1]), sys.argv[2]
cache = NodeCache("gpu.topology.io")
names = [f"gpu-{i:05d}" for i in range(nodes)]
cache.replace([NodeAnnotation(n, text, {}, f"node-{n}", 8) for n in names])
server = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=ExtenderMetrics(cache)).start()
print(server.address[1], flush=True)
sys.stdin.read()
"""

SCRAPER = """
import http.client, json, statistics, sys, threading, time
port, clients, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
stop = threading.Event()
times, sizes, errors = [], [], []
def loop():
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    while not stop.is_set():
        started = time.perf_counter()
        try:
            connection.request("GET", "/metrics")
            size = len(connection.getresponse().read())
        except (OSError, http.client.HTTPException) as e:
            errors.append(type(e).__name__)
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            continue
        times.append(time.perf_counter() - started)
        sizes.append(size)
threads = [threading.Thread(target=loop) for _ in range(clients)]
for t in threads:
    t.start()
print("started", flush=True)
sys.stdin.readline()
stop.set()
for t in threads:
    t.join()
print(json.dumps({"scrapes": len(times), "median_s": statistics.median(times) if times else None,
                  "bytes": max(sizes, default=0), "errors": len(errors)}), flush=True)
"""


class Child:
    """A Python process running `code` from `checkout`, its stdin and stdout kept."""

    def __init__(self, checkout: Path, code: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(checkout), "TOPO_REPORTER_LOG_LEVEL": "error"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=checkout,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def say(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def filter_ms(port: int, calls: int) -> tuple[list[float], int]:
    """Milliseconds of each of `calls` /filter calls on one keep-alive connection (a call past
    the timeout counts as the timeout), and how many timed out."""
    pod = {
        "metadata": {"name": "p", "namespace": "d"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    raw = json.dumps({"Pod": pod, "NodeNames": [f"gpu-{i:05d}" for i in range(100)]}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    out, timeouts = [], 0
    try:
        for _ in range(calls):
            started = time.perf_counter()
            try:
                connection.request("POST", "/filter", raw)
                response = connection.getresponse()
                response.read()
            except TimeoutError:
                timeouts += 1
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            else:
                assert response.status == 200, response.status
            out.append((time.perf_counter() - started) * 1000)
    finally:
        connection.close()
    return out, timeouts


def measure(checkout: Path, nodes: int, calls: int) -> list[Any]:
    extender = Child(checkout, EXTENDER, str(nodes), AVAILABILITY)
    try:
        port = int(extender.line())
        alone, _ = filter_ms(port, calls)
        scrapers = Child(checkout, SCRAPER, str(port), str(SCRAPERS), str(TIMEOUT_S))
        try:
            assert scrapers.line().strip() == "started"
            time.sleep(1)  # every scraper past its first request
            loaded, timeouts = filter_ms(port, calls)
            scrapers.say("stop\n")
            scraped = json.loads(scrapers.line())
        finally:
            scrapers.close()
    finally:
        extender.close()
    return [
        f"{statistics.median(alone):.1f}",
        f"{statistics.median(loaded):.1f}",
        f"{max(loaded):.1f}",
        timeouts,
        scraped["scrapes"],
        f"{scraped['median_s'] * 1000:.1f}",
        f"{scraped['bytes'] / 1024:.0f}",
        scraped["errors"],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=15_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    runs = [("after", here)] + ([("before", args.before)] if args.before else [])
    rows = [[label, *measure(checkout, args.nodes, args.calls)] for label, checkout in runs]
    print(f"{args.nodes} nodes, {args.calls} /filter calls; load average {os.getloadavg()}")
    headers = (
        "code",
        "/filter p50 ms alone",
        f"/filter p50 ms, {SCRAPERS} scrapers",
        "/filter max ms",
        f"/filter over {TIMEOUT_S:g} s",
        "scrapes",
        "scrape p50 ms",
        "/metrics KiB",
        "scrape errors",
    )
    print(table(headers, rows))


if __name__ == "__main__":
    main()
