"""The chart on a real node (tests/support/node_harness.py): the kubelet v1.37.2 on containerd, the
device plugin double advertising a simulated dgx-h100's 8 GPUs, the image of image/build.sh.

Method. One node, one `helm install` (Helm SDK) with the chart's defaults except the image
(`pullPolicy: Never`), `runtimeClassName: ""`, `agent.simulate: dgx-h100` and availability on.
Seconds from the install's start until the Node carries `gpu.topology.io/count`; from creating a
pod of 2 `nvidia.com/gpu` until `gpu-free` reads 6. The agent's memory as the kubelet's cgroup
counts it (the container's cgroup v1 `memory.usage_in_bytes`, its working set = usage minus
`total_inactive_file`, and `memory.max_usage_in_bytes`), against the chart's limit. Then, at rest
(no pod changes) for MINUTES, the agent's API writes, from watches: Node updates that changed a
key under the prefix, and heartbeat Lease updates, scaled to a node-hour. Needs root and what
tests/prereqs.sh installs.

    python bench/real_node.py [--minutes 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import helm_python as helm
from kubernetes import client as k8s
from kubernetes import watch

from reporter.collect.simulate.machine import load_machine
from tests.support.controlplane_fixtures import build_harness
from tests.support.helm_chart import chart
from tests.support.image_support import built_image
from tests.support.node_harness import image_archive, running_cluster, running_node

PREFIX = "gpu.topology.io/"
NAMESPACE = "gpu-system"
LIMIT_MIB = 192


def poll(check: Any, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.1)
    return got


def ours(meta: Any) -> dict[str, str]:
    keys = {**(meta.labels or {}), **(meta.annotations or {})}
    return {k: v for k, v in keys.items() if k.startswith(PREFIX)}


def memory(node_name: str, pod: Any) -> dict[str, float]:
    """The agent container's memory cgroup (cgroup v1, the node's cgroupRoot), in MiB."""
    (status,) = pod.status.container_statuses
    container = status.container_id.split("://", 1)[1]
    root = Path("/sys/fs/cgroup/memory") / f"controlplane-node-{node_name}"
    (cgroup,) = list(root.glob(f"kubepods/*/pod{pod.metadata.uid}/{container}"))
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    mib = 1024.0 * 1024.0
    return {
        "usage": usage / mib,
        "working_set": (usage - int(stat["total_inactive_file"])) / mib,
        "max_usage": int((cgroup / "memory.max_usage_in_bytes").read_text()) / mib,
    }


def gpu_pod(node: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "localhost/controlplane/pause:3.10",
        "imagePullPolicy": "Never",
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "two", "namespace": "default"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [container]},
    }


def ready_agent(core: k8s.CoreV1Api) -> Any:
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        statuses = pod.status.container_statuses or []
        if statuses and statuses[0].ready:
            return pod
    return None


def count_writes(
    core: k8s.CoreV1Api, coord: k8s.CoordinationV1Api, node: str, seconds: float
) -> tuple[int, int]:
    """Node updates that changed a key of ours, and Lease updates in the release namespace."""
    counts = {"node": 0, "lease": 0}
    last = ours(core.read_node(node).metadata)

    def nodes() -> None:
        nonlocal last
        w = watch.Watch()
        rv = core.read_node(node).metadata.resource_version
        for event in w.stream(core.list_node, field_selector=f"metadata.name={node}",
                              resource_version=rv, timeout_seconds=int(seconds)):  # fmt: skip
            now = ours(event["object"].metadata)
            if now != last:
                counts["node"] += 1
                last = now

    def leases() -> None:
        w = watch.Watch()
        rv = coord.list_namespaced_lease(NAMESPACE).metadata.resource_version
        for event in w.stream(coord.list_namespaced_lease, NAMESPACE, resource_version=rv,
                              timeout_seconds=int(seconds)):  # fmt: skip
            if event["type"] == "MODIFIED":
                counts["lease"] += 1

    threads = [threading.Thread(target=nodes), threading.Thread(target=leases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts["node"], counts["lease"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    args = parser.parse_args()
    machine = load_machine("dgx-h100")
    devices = [{"id": g.uuid, "numa": min(g.memory_affinity or {0})} for g in machine.gpus]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive = image_archive(built_image(), work)
        (work / "cluster").mkdir()
        with running_cluster(build_harness(), work / "cluster") as cluster:
            kubeconfig = cluster.server.kubeconfig
            with running_node(
                cluster.binary, kubeconfig, work / "node", "bench-node", devices=devices,
                images=[archive],
            ) as node:  # fmt: skip
                core = cluster.core()
                core.patch_node(
                    node.name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}
                )
                core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
                config = helm.Config(kubeconfig_path=cluster.server.kubeconfig, namespace=NAMESPACE)
                values = {
                    "image": {"repository": "localhost/topo-reporter", "pullPolicy": "Never"},
                    "runtimeClassName": "",
                    "agent": {"simulate": "dgx-h100"},
                    "availability": {"enabled": True},
                }
                started = time.monotonic()
                config.install(chart(), "tr", values, namespace=NAMESPACE)
                poll(lambda: ours(core.read_node(node.name).metadata).get(PREFIX + "count"))
                labels_s = time.monotonic() - started
                poll(
                    lambda: ours(core.read_node(node.name).metadata).get(PREFIX + "gpu-free") == "8"
                )
                started = time.monotonic()
                core.create_namespaced_pod("default", gpu_pod(node.name))
                poll(
                    lambda: ours(core.read_node(node.name).metadata).get(PREFIX + "gpu-free") == "6"
                )
                availability_s = time.monotonic() - started
                agent = poll(lambda: ready_agent(core))
                before = memory(node.name, agent)
                seconds = args.minutes * 60
                node_writes, lease_writes = count_writes(
                    core, k8s.CoordinationV1Api(cluster.server.api()), node.name, seconds
                )
                after = memory(node.name, agent)
                config.uninstall("tr", timeout=180)
                config.close()
    per_hour = 3600 / seconds
    print(f"helm install -> labels on the Node: {labels_s:.1f} s")
    print(f"GPU pod created -> availability shows it (gpu-free 6): {availability_s:.1f} s")
    for name, m in (("after the GPU pod", before), (f"after {args.minutes:g} min at rest", after)):
        print(
            f"agent memory {name}: usage {m['usage']:.1f} MiB, "
            f"working set {m['working_set']:.1f} MiB, max {m['max_usage']:.1f} MiB "
            f"(limit {LIMIT_MIB} MiB)"
        )
    print(
        f"at rest {args.minutes:g} min: {node_writes} Node writes, {lease_writes} Lease renewals "
        f"= {node_writes * per_hour:.0f} + {lease_writes * per_hour:.0f} per node-hour"
    )


if __name__ == "__main__":
    main()
