"""One held /filter call at 2,000 nodes worth waiting for, by the pod's placement (issue 41,
item 3): what the hold check costs when it judges the pod's placement against every such node.

Method. In one process per checkout (this one, and with `--before DIR` a checkout of the code
before the change: `git archive <commit> | tar -x -C DIR`), an extender (`ExtenderServer`, not
listening) over a Node cache of one PCIe node with 8 free GPUs (the call's candidate: 4 free, not
connected) and N busy DGX A100 nodes with 2 free (each could give 4 connected GPUs once its pods
end: worth waiting for), each with 10 labels and the taint `nvidia.com/gpu:NoSchedule`. A pod of
4 GPUs created a minute ago, so the extender holds it, with each placement below: the check
judges every busy node where none admits the pod. Timed: `ExtenderServer.handle` of the whole
call (reading the body included), the median and the slowest of `--repeat` calls.

    python bench/hold_check.py [--nodes 2000] [--repeat 5] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from reporter.extender.eligibility import MAX_PLACEMENT_CHECKS
from reporter.schema.availability import encode_availability
from tests.extender.test_eligibility import affinity, expr, repro_affinity
from tests.extender.test_protocol import availability, pod

CHILD = """
import json, statistics, sys, time
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics, ExtenderServer
from reporter.publish.watch import NodeAnnotation
from reporter.serve.httpserver import Request
setup = json.loads(sys.stdin.readline())
taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
nodes = [NodeAnnotation("pcie", setup["pcie"])]
for i in range(setup["nodes"]):
    labels = {f"example.com/label-{j}": "x" for j in range(8)}
    labels |= {"zone": "a", "kubernetes.io/hostname": f"dgx-{i:05d}"}
    node = {"metadata": {"labels": labels}, "spec": {"taints": [taint]}}
    nodes.append(NodeAnnotation(f"dgx-{i:05d}", setup["busy"], node))
cache = NodeCache("gpu.topology.io")
cache.replace(nodes)
server = ExtenderServer(
    ("127.0.0.1", 0), cache=cache, metrics=ExtenderMetrics(cache), connected_wait_s=7200.0
)
for case in setup["cases"]:
    raw = case["body"].encode()
    times, held = [], None
    for _ in range(setup["repeat"]):
        started = time.perf_counter()
        answer = server.handle(Request("POST", "/filter", raw))
        times.append(time.perf_counter() - started)
        held = json.loads(answer.body)["NodeNames"] == []
    print(json.dumps([statistics.median(times), max(times), held]), flush=True)
server.stop()
"""


def placements() -> dict[str, dict[str, Any]]:
    """The pod's spec beside its GPUs, by what it asks."""
    worst_term = {
        "matchExpressions": [expr("zone", "Exists")] * (MAX_PLACEMENT_CHECKS - 2)
        + [expr("zone", "DoesNotExist")]
    }
    return {
        "the repro: 34 terms of 1,000 expressions (1.4 MB), none admits": repro_affinity(),
        f"1 term of {MAX_PLACEMENT_CHECKS - 1} expressions (the budget), none admits": {
            "affinity": affinity(worst_term)
        },
        f"{MAX_PLACEMENT_CHECKS} tolerations, none of the nodes' taint": {
            "tolerations": [
                {"key": f"other-{i}", "operator": "Exists"} for i in range(MAX_PLACEMENT_CHECKS)
            ]
        },
        "1 expression, none admits (zone In b)": {
            "affinity": affinity({"matchExpressions": [expr("zone", "In", "b")]}),
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
        "the taint tolerated, no affinity: the first node admits": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        },
    }


def bodies() -> list[tuple[str, str]]:
    created = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for name, extra in placements().items():
        spec = pod(4)
        spec["metadata"] |= {"uid": "held", "creationTimestamp": created}
        spec["spec"] |= extra
        out.append((name, json.dumps({"Pod": spec, "NodeNames": ["pcie"]})))
    return out


def measure(checkout: Path, nodes: int, repeat: int) -> list[list[Any]]:
    cases = bodies()
    setup = {
        "pcie": encode_availability(availability("pcie-8x", tuple(range(8)))),
        "busy": encode_availability(availability("dgx-a100", (5, 6))),
        "nodes": nodes,
        "repeat": repeat,
        "cases": [{"body": raw} for _, raw in cases],
    }
    env = {**os.environ, "PYTHONPATH": str(checkout), "TOPO_REPORTER_LOG_LEVEL": "error"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(setup) + "\n",
        cwd=checkout,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return [
        [name, *json.loads(line)]
        for (name, _), line in zip(cases, done.stdout.splitlines(), strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    args = parser.parse_args()
    quiet_logs()
    here = Path(__file__).resolve().parent.parent
    runs = [("after", here)] + ([("before", args.before)] if args.before else [])
    rows = []
    for label, checkout in runs:
        for name, median, slowest, held in measure(checkout, args.nodes, args.repeat):
            rows.append((label, name, f"{median * 1000:.1f}", f"{slowest * 1000:.1f}", held))
    print(f"{args.nodes} nodes worth waiting for; load average {os.getloadavg()}")
    print(table(("code", "placement", "median ms", "slowest ms", "held"), rows))


if __name__ == "__main__":
    main()
