"""What held pods cost everyone else: scheduling latency of ordinary pods beside 0, 10 and 100
pods the extender holds for an NVLink-connected set (issue 28).

Why. kube-scheduler requeues a pod an extender rejected on every Node update (the pseudo plugin
`Extender` takes every event, docs/scheduling.md), and every availability change an agent
publishes is a Node update: each one sends every held pod through a scheduling cycle again (the
extender's filter, then preemption and its preempt call), ahead of or beside the pods that could
run now.

Method. The real control plane of the tests (kube-apiserver and kube-scheduler from
tests/controlplane, with docs/scheduling.md's configuration, preemptVerb included) and
`topo-reporter extender` as its own process; four PCIe nodes with 8 free GPUs and one DGX H100
whose 6 GPUs a pod holds (so a pod of 4 is held: no candidate is connected, the DGX could be).
For each count H of held pods: H pods of 4 GPUs, created and seen unschedulable; then, while a
thread changes one node's annotation every `--tick` seconds (an agent's availability change,
as the cluster's agents would write them), `--pods` ordinary pods of 1 GPU created one at a time,
each timed from its create call to the moment the API server shows it bound (polled every 10 ms).
Beside the latencies, the extender's filter and preempt calls during the run. The ordinary pods
are deleted between runs; the held pods stay held throughout (they never bind).

    python bench/held_pods.py [--held 0,10,100] [--pods 20] [--tick 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from tests.controlplane.test_scheduler import Cluster
from tests.support.controlplane_fixtures import (
    build_harness,
    running_apiserver,
)

POLL_S = 0.01


def ticking(cluster: Cluster, node: str, every_s: float, stop: threading.Event) -> None:
    """Change one node's annotation every `every_s`: a Node update, as an agent's write is."""
    tick = 0
    while not stop.wait(every_s):
        tick += 1
        cluster.core.patch_node(
            node, {"metadata": {"annotations": {"bench.topo-reporter.io/tick": str(tick)}}}
        )


def bound_after(cluster: Cluster, pod: str) -> float:
    """Seconds from creating a 1-GPU pod to seeing it bound."""
    started = time.monotonic()
    cluster.create_pod(pod, 1)
    while not cluster.core.read_namespaced_pod(pod, cluster.namespace).spec.node_name:
        if time.monotonic() - started > 300:
            raise SystemExit(f"{pod} not bound after 300 s:\n{cluster.logs()}")
        time.sleep(POLL_S)
    return time.monotonic() - started


def measure(cluster: Cluster, held: int, pods: int, tick_s: float) -> list[str]:
    for i in range(held):
        cluster.create_pod(f"held-{held}-{i}", 4)
    for i in range(held):
        cluster.wait_unschedulable(f"held-{held}-{i}")
    filters, preempts = cluster.extender_calls("filter"), cluster.extender_calls("preempt")
    stop = threading.Event()
    thread = threading.Thread(
        target=ticking, args=(cluster, cluster.nodes["pcie-0"], tick_s, stop), daemon=True
    )
    thread.start()
    try:
        latencies = [bound_after(cluster, f"ordinary-{held}-{i}") for i in range(pods)]
    finally:
        stop.set()
        thread.join()
    filters = cluster.extender_calls("filter") - filters
    preempts = cluster.extender_calls("preempt") - preempts
    for i in range(pods):
        cluster.core.delete_namespaced_pod(
            f"ordinary-{held}-{i}", cluster.namespace, grace_period_seconds=0
        )
    ms = sorted(x * 1000 for x in latencies)
    return [
        str(held),
        str(pods),
        f"{statistics.median(ms):.0f}",
        f"{ms[max(0, round(0.9 * len(ms)) - 1)]:.0f}",
        f"{ms[-1]:.0f}",
        f"{filters / pods:.1f}",
        f"{preempts / pods:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", default="0,10,100")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--tick", type=float, default=0.5)
    args = parser.parse_args()
    quiet_logs()
    binary = build_harness()
    with tempfile.TemporaryDirectory(prefix="held-pods-") as tmp:
        work = Path(tmp)
        with running_apiserver(binary, work) as server:
            rows = []
            # One cluster per count: the held pods of one run never meet the next run's.
            for held in (int(h) for h in args.held.split(",")):
                (work / f"held-{held}").mkdir()
                with Cluster(server, work / f"held-{held}") as cluster:
                    for i in range(4):
                        cluster.add_node(f"pcie-{i}", "pcie-8x", ())
                    cluster.add_node("h100", "dgx-h100", range(6), occupied=True)
                    cluster.start()
                    rows.append(measure(cluster, held, args.pods, args.tick))
                    print(rows[-1], flush=True)
    print(
        table(
            [
                "held pods",
                "ordinary pods",
                "p50 ms",
                "p90 ms",
                "max ms",
                "filter calls / pod",
                "preempt calls / pod",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
