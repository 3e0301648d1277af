"""The extender's HTTP server against a burst, stalled clients and silent TLS (issue 28, 2 to 4).

Method. The extender runs in its own process over a Node cache of 5,000 nodes (filled directly:
no API server), with the chart's bounds (`reporter.extender.server.LIMITS`), from this checkout
and, with `--before DIR`, from a checkout of the code before the change (`git archive <commit> |
tar -x -C DIR`). Measured for each:

- burst: 200 `/prioritize` calls at once, each on a fresh connection (200 threads released
  together), with the names of 100 and of all 5,000 nodes: how many were answered 200, 503, or
  not at all;
- stalls: 2 connections that send a head with `Content-Length: 100` and no body, 600 that
  connect and send nothing (plain HTTP, the chart's default), and both; then, on fresh
  connections, 10 `/filter` and 10 `/healthz` calls, alternated, within the 10 s the bodies
  stall: how many were answered 200 (each within the 5 s of a probe's `timeoutSeconds`), and the
  slowest;
- TLS: 1,000 and 5,000 connections that connect and send nothing (no ClientHello), opened at
  once; the extender's resident memory (VmRSS, VmHWM) before, and after 5 s; then a verifying
  client's call.

Run with `nice` on the shared 2-core machine; the load is printed.

    python bench/extender_attacks.py [--before DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from bench.http_servers import AVAILABILITY, NODES

CHILD = """
import json, ssl, sys
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
nodes, text, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
cache = NodeCache("gpu.topology.io")
cache.replace([NodeAnnotation(f"gpu-{i:05d}", text) for i in range(nodes)])
tls = None
if cert:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
server = ExtenderServer(
    ("127.0.0.1", 0), cache=cache, metrics=ExtenderMetrics(cache), tls=tls
).start()
print(server.address[1], flush=True)
for line in sys.stdin:
    status = dict(l.split(":", 1) for l in open("/proc/self/status"))
    print(json.dumps({k: status[k].split()[0] for k in ("VmRSS", "VmHWM")}), flush=True)
"""
NAMES = [f"gpu-{i:05d}" for i in range(NODES)]
PROBE_TIMEOUT_S = 5.0


class Extender:
    def __init__(self, checkout: Path, tls: tuple[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(checkout), "TOPO_REPORTER_LOG_LEVEL": "error"}
        cert, key = tls or ("", "")
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(NODES), AVAILABILITY, cert, key],
            cwd=checkout,  # `-c` puts the working directory first on sys.path
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        self.address = ("127.0.0.1", int(self.process.stdout.readline()))

    def memory(self) -> tuple[int, int]:
        """VmRSS and VmHWM in MiB."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("status\n")
        self.process.stdin.flush()
        raw = json.loads(self.process.stdout.readline())
        return int(raw["VmRSS"]) // 1024, int(raw["VmHWM"]) // 1024

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def body(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": "d"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def call(
    address: tuple[str, int], method: str, path: str, payload: bytes | None = None
) -> tuple[str, float]:
    """The status (or the error) of one call on a fresh connection, and its seconds."""
    started = time.monotonic()
    connection = http.client.HTTPConnection(*address, timeout=PROBE_TIMEOUT_S)
    try:
        connection.request(method, path, payload)
        response = connection.getresponse()
        response.read()
        return str(response.status), time.monotonic() - started
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__, time.monotonic() - started
    finally:
        connection.close()


def burst(extender: Extender, names: int) -> dict[str, int]:
    payload = body(NAMES[:names])
    results: list[str] = []
    gate = threading.Barrier(200)

    def one() -> None:
        gate.wait()
        results.append(call(extender.address, "POST", "/prioritize", payload)[0])

    threads = [threading.Thread(target=one) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(Counter(results))


def stalls(extender: Extender, bodies: int, silent: int) -> dict[str, Any]:
    held = []
    for _ in range(bodies):
        sock = socket.create_connection(extender.address, timeout=10)
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        held.append(sock)
    for _ in range(silent):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(extender.address)
        held.append(sock)
    time.sleep(1)
    payload = body(NAMES[:100])
    # Alternated, so that both kinds of call are made while the bodies still stall (10 s).
    calls = [
        call(extender.address, *what)
        for _ in range(10)
        for what in (("POST", "/filter", payload), ("GET", "/healthz", None))
    ]
    for sock in held:
        sock.close()
    return {
        "filter 200": f"{sum(s == '200' for s, _ in calls[::2])}/10",
        "healthz 200": f"{sum(s == '200' for s, _ in calls[1::2])}/10",
        "slowest s": round(max(t for _, t in calls), 2),
    }


def silent_tls(checkout: Path, tls: tuple[str, str], count: int) -> dict[str, Any]:
    extender = Extender(checkout, tls)
    try:
        idle = extender.memory()
        held = []
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(extender.address)
            held.append(sock)
        time.sleep(5)
        under = extender.memory()
        context = ssl.create_default_context(cafile=tls[0])
        connection = http.client.HTTPSConnection(
            *extender.address, timeout=PROBE_TIMEOUT_S, context=context
        )
        try:
            connection.request("GET", "/healthz")
            status = str(connection.getresponse().status)
        except (OSError, http.client.HTTPException) as e:
            status = type(e).__name__
        finally:
            connection.close()
        for sock in held:
            sock.close()
        return {
            "idle RSS MiB": idle[0],
            "RSS MiB": under[0],
            "peak RSS MiB": under[1],
            "a real client": status,
        }
    finally:
        extender.close()


def certificate(directory: str) -> tuple[str, str]:
    cert, key = f"{directory}/tls.crt", f"{directory}/tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def measure(name: str, checkout: Path, tls: tuple[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"code": name}
    for names in (100, NODES):
        extender = Extender(checkout)
        try:
            row[f"burst, {names} names"] = burst(extender, names)
        finally:
            extender.close()
    for bodies, silent in ((2, 0), (0, 600), (2, 600)):
        extender = Extender(checkout)
        try:
            row[f"{bodies} stalled bodies, {silent} silent"] = stalls(extender, bodies, silent)
        finally:
            extender.close()
    for count in (1000, 5000):
        row[f"{count} silent TLS"] = silent_tls(checkout, tls, count)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 5,000 sockets, and the child's
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as directory:
        tls = certificate(directory)
        rows = [measure("after", here, tls)]
        if args.before is not None:
            rows.insert(0, measure("before", args.before, tls))
    keys = list(rows[0])
    print(table(["", *(r["code"] for r in rows)], [[k, *(r[k] for r in rows)] for k in keys[1:]]))
    print(f"\nLoad average at the end (1 / 5 / 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    main()
