"""What one fresh read of a Node costs the extender (issue 41, item 9): the read a filter call about
to hold its pod makes of a node the scheduler passed but the cache says has too few free GPUs.

Method. A real kube-apiserver on embedded etcd (the tests' harness, tests/controlplane) holds N
Nodes, each with the availability annotation the agent's code computes for a DGX H100 with two
GPUs free. The reads go through the extender's own path: `NodeWatch.read_node` over the lean
client (`RestApiClient`) with the production timeouts (`reporter.extender.fresh.READ_TIMEOUT_S`),
one pooled keep-alive connection, as the extender's calls reuse it; READS reads of nodes drawn at
random, one after another, each timed from the call to its decoded NodeAnnotation. Percentiles in
ms, and how many failed (timed out).

    python bench/fresh_read.py [--nodes 1000,5000] [--reads 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from reporter.collect import build_scanner
from reporter.errors import PublishError
from reporter.extender.fresh import READ_TIMEOUT_S
from reporter.free_sets import compute_availability
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.publish.watch import NodeWatch
from reporter.schema.availability import encode_availability
from tests.support.controlplane_fixtures import build_harness, create_node, running_apiserver

KEY = "gpu.topology.io/availability"


def measure(nodes: int, reads: int, work: Path, rng: random.Random) -> list[str]:
    topology = build_scanner("auto", Path("/nonexistent"), "dgx-h100").scan().topology
    assert topology is not None
    text = encode_availability(compute_availability(topology, (6, 7)))
    with running_apiserver(build_harness(), work) as server:
        core = server.core()
        names = [f"bench-{i:05d}" for i in range(nodes)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: create_node(core, name=n, annotations={KEY: text}), names))
        config = load_rest_config(str(server.kubeconfig))
        client = NodeWatch(RestApiClient(config, request_timeout_s=READ_TIMEOUT_S))
        client.read_node(KEY, names[0])  # the connection, as a running extender has it
        times, failed = [], 0
        for name in rng.choices(names, k=reads):
            started = time.perf_counter()
            try:
                found = client.read_node(KEY, name)
            except PublishError:
                failed += 1
                continue
            times.append((time.perf_counter() - started) * 1000)
            assert found is not None
            assert found.value == text
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return [
        str(nodes),
        str(reads),
        f"{statistics.median(times):.1f}",
        f"{cuts[98]:.1f}",
        f"{max(times):.1f}",
        str(failed),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--reads", type=int, default=300)
    args = parser.parse_args()
    quiet_logs()
    rng = random.Random(41)
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        with tempfile.TemporaryDirectory() as work:
            rows.append(measure(n, args.reads, Path(work), rng))
    print(table(["nodes", "reads", "p50 ms", "p99 ms", "max ms", "failed"], rows))


if __name__ == "__main__":
    main()
