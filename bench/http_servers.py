"""The extender's HTTP server: Python's http.server (before issue 19), uvicorn and waitress.

Method. Each variant runs in its own process and serves the extender's own answers from a Node
cache holding 5,000 nodes (filled directly: no API server, so only the server differs):

- `http.server`: the extender as it was (a thread per connection), from a checkout of the code
  before the change (`--before DIR`, e.g. `git worktree add /tmp/before <commit>`);
- `uvicorn`: the extender as it is (uvicorn on h11, with `reporter.serve.httpserver`'s bounds);
- `waitress`: the same answers (`ExtenderServer.handle`) served by waitress 3 through a WSGI
  adapter written here, with the equivalent bounds (2 threads, 128 connections, 10 s channel
  timeout checked every 2 s, backlog 1,024, 2 MiB bodies).

Measured for each: the resident memory idle; 300 scheduling cycles (filter then prioritize, node
names of all 5,000 nodes, over one keep-alive connection) as p50 and p99; 2,000 stalled
connections (opened, never a byte sent): threads and memory a second later, a normal call on the
kept-alive connection and on a new one, and 15 s later how many the server has closed; a burst of
200 simultaneous connections each asking /healthz; the peak memory of one 2 MiB and one 20 MiB body
of `{}` objects; the status of a `Content-Length` of `²`, of 5,000 digits, and of one beside
`Transfer-Encoding: chunked`. Run with `nice` on the shared 2-core machine; the load is printed.

    python bench/http_servers.py --before /tmp/before [--variants uvicorn,waitress,http.server]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table

NODES = 5000
AVAILABILITY = "1;0-3;0.1.1.0.4/120.1.1.0.4/360.1.1.0.4/720.1.1.0.4"

# The child: one server variant over a filled cache; it answers `rss` on stdin with its memory.
CHILD = """
import json, sys
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
variant, nodes, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cache = NodeCache("gpu.topology.io")
cache.replace([NodeAnnotation(f"gpu-{i:05d}", text) for i in range(nodes)])
metrics = ExtenderMetrics(cache)
if variant == "http.server":
    server = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=metrics).start()
    port = server.address[1]
elif variant == "uvicorn":
    server = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=metrics).start()
    port = server.address[1]
else:
    import threading
    from http import HTTPStatus
    import waitress
    from reporter.serve.httpserver import Request
    extender = ExtenderServer(("127.0.0.1", 0), cache=cache, metrics=metrics)

    def app(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        answer = extender.handle(Request(environ["REQUEST_METHOD"], environ["PATH_INFO"], body))
        start_response(
            f"{answer.status} {HTTPStatus(answer.status).phrase}",
            [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))],
        )
        return [answer.body]

    server = waitress.create_server(
        app, host="127.0.0.1", port=0, threads=2, connection_limit=128, channel_timeout=10,
        cleanup_interval=2, backlog=1024, max_request_body_size=2 * 1024 * 1024,
        inbuf_overflow=4 * 1024 * 1024,
    )
    port = server.effective_port
    threading.Thread(target=server.run, daemon=True).start()
print(port, flush=True)
for line in sys.stdin:
    status = dict(l.split(":", 1) for l in open("/proc/self/status"))
    print(json.dumps({k: status[k].split()[0] for k in ("VmRSS", "VmHWM", "Threads")}), flush=True)
"""


class Variant:
    def __init__(self, name: str, checkout: Path) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(checkout), "TOPO_REPORTER_LOG_LEVEL": "error"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, name, str(NODES), AVAILABILITY],
            cwd=checkout,  # `-c` puts the working directory first on sys.path
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM in MiB, and the thread count."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("status\n")
        self.process.stdin.flush()
        raw = json.loads(self.process.stdout.readline())
        return {
            "rss": int(raw["VmRSS"]) // 1024,
            "hwm": int(raw["VmHWM"]) // 1024,
            "threads": int(raw["Threads"]),
        }

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def post(connection: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, data[:200]
    return data


def args_for(names: list[str]) -> bytes:
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def cycles(variant: Variant, count: int) -> list[float]:
    names = [f"gpu-{i:05d}" for i in range(NODES)]
    body = args_for(names)
    connection = http.client.HTTPConnection("127.0.0.1", variant.port, timeout=60)
    times = []
    for _ in range(count + 5):
        start = time.perf_counter()
        kept = json.loads(post(connection, "/filter", body))["NodeNames"]
        post(connection, "/prioritize", args_for(kept))
        times.append(time.perf_counter() - start)
    connection.close()
    return times[5:]


def one_call(port: int, connection: http.client.HTTPConnection | None = None) -> str:
    """A filter call on 100 names: its time in ms, or why it failed."""
    fresh = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    start = time.perf_counter()
    try:
        post(connection, "/filter", args_for([f"gpu-{i:05d}" for i in range(100)]))
    except (OSError, http.client.HTTPException) as e:
        return f"failed: {type(e).__name__}"
    finally:
        if fresh:
            connection.close()
    return f"{(time.perf_counter() - start) * 1000:.1f} ms"


def closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def stalled(variant: Variant) -> dict[str, Any]:
    kept = http.client.HTTPConnection("127.0.0.1", variant.port, timeout=10)
    one_call(variant.port, kept)
    socks = []
    for _ in range(2000):
        try:
            socks.append(socket.create_connection(("127.0.0.1", variant.port), timeout=5))
        except OSError:
            break
    time.sleep(1)
    during = variant.status()
    result = {
        "opened": len(socks),
        "threads": during["threads"],
        "rss": during["rss"],
        "kept-alive call": one_call(variant.port, kept),
        "new-connection call": one_call(variant.port),
    }
    time.sleep(15)
    result["closed by the server after 16 s"] = sum(closed(s) for s in socks)
    result["rss after 16 s"] = variant.status()["rss"]
    for sock in socks:
        sock.close()
    kept.close()
    return result


def burst(variant: Variant) -> int:
    """Of 200 connections opened at once, each asking /healthz, how many got no answer."""
    socks = []
    for _ in range(200):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", variant.port))
        socks.append(sock)
    failed = 0
    for sock in socks:
        sock.setblocking(True)
        sock.settimeout(10)
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            failed += not sock.recv(4096).startswith(b"HTTP/1.1 200")
        except OSError:
            failed += 1
        sock.close()
    return failed


def body_peak(variant: Variant, mib: int) -> str:
    """Status and peak-memory growth of one body of `{}` objects, `mib` MiB."""
    unit = b"{}"
    items = b",".join([unit] * (mib * 1024 * 1024 // 3))
    body = b'{"Pod":{},"Nodes":{"items":[' + items + b"]}}"
    before = variant.status()["hwm"]
    with socket.create_connection(("127.0.0.1", variant.port), timeout=120) as sock:
        head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n")
        with contextlib.suppress(OSError):  # refused before the body was read
            sock.sendall(body)
        answer = read_all(sock)
    status = answer[9:12].decode() or "none"
    return f"{status}, +{variant.status()['hwm'] - before} MiB"


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):  # a reset ends the answer as well as a close does
        while chunk := sock.recv(65536):
            data += chunk
    return data


FRAMING = {
    "Content-Length: ²": "Content-Length: ²\r\n".encode(),
    "5,000-digit length": b"Content-Length: " + b"1" * 5000 + b"\r\n",
    "length and chunked": b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
}


def framing(variant: Variant) -> dict[str, str]:
    found = {}
    for name, header in FRAMING.items():
        raw = b"POST /filter HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n0\r\n\r\n"
        raw += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # a request smuggled behind it
        with socket.create_connection(("127.0.0.1", variant.port), timeout=5) as sock:
            sock.sendall(raw)
            answer = read_all(sock)
        statuses = [part[:3].decode() for part in answer.split(b"HTTP/1.1 ")[1:]]
        found[name] = " then ".join(statuses) or "no answer"
    return found


def measure(name: str, checkout: Path, count: int) -> dict[str, Any]:
    variant = Variant(name, checkout)
    try:
        idle = variant.status()
        times = cycles(variant, count)
        quantiles = statistics.quantiles(times, n=100, method="inclusive")
        return {
            "idle": idle,
            "p50": statistics.median(times) * 1000,
            "p99": quantiles[98] * 1000,
            "stalled": stalled(variant),
            "burst": burst(variant),
            "framing": framing(variant),
            "2 MiB": body_peak(variant, 2),
            "20 MiB": body_peak(variant, 20),
        }
    finally:
        variant.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before issue 19")
    parser.add_argument("--variants", default="http.server,uvicorn,waitress")
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    results = {}
    for name in args.variants.split(","):
        checkout = args.before if name == "http.server" else here
        if checkout is None:
            parser.error("http.server needs --before DIR")
        results[name] = measure(name, checkout, args.cycles)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Load average at the end (1 / 5 / 15 min, {os.cpu_count()} CPUs): {load}\n")
    rows = []
    for name, r in results.items():
        s = r["stalled"]
        rows.append(
            [
                name,
                r["idle"]["rss"],
                f"{r['p50']:.1f} / {r['p99']:.1f}",
                f"{s['threads']}, {s['rss']} MiB",
                s["kept-alive call"],
                s["new-connection call"],
                f"{s['closed by the server after 16 s']} of {s['opened']}",
                r["burst"],
                r["2 MiB"],
                r["20 MiB"],
            ]
        )
    print(
        table(
            [
                "server",
                "idle RSS MiB",
                "p50 / p99 ms (5,000 names)",
                "2,000 stalled: threads, RSS",
                "call, kept-alive",
                "call, new connection",
                "stalled closed",
                "burst of 200: failed",
                "2 MiB of {}: status, peak",
                "20 MiB of {}",
            ],
            rows,
        )
    )
    print()
    print(
        table(
            ["server", *FRAMING],
            [[name, *r["framing"].values()] for name, r in results.items()],
        )
    )


if __name__ == "__main__":
    main()
