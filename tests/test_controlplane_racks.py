"""Issue 21 item 6: the schedulers that group nodes by NVLink partition, each running its own
code on the real control plane, on Nodes the agent published from simulated GB200 NVL72 racks
(tests/consumer_fixtures.py: racks 0 and 1 both on clique 17044, rack 2 split in two partitions;
4 trays each).

- Kueue v0.17.0 (its controller manager, webhooks and certificate management), with the real
  kube-controller-manager's Job controller and the real kube-scheduler, from the Topology and
  ResourceFlavor docs/scheduling.md shows.
No kubelet runs: a bound pod never starts, and the schedulers still count its GPUs. Everything
waits by polling, never by sleeping a fixed time.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.consumer_fixtures import (
    GPU,
    PARTITION,
    RackCluster,
    RackScheduler,
    RealKueue,
    poll,
)
from tests.controlplane_fixtures import RealApiServer, unique

pytestmark = pytest.mark.controlplane

DOCS = Path(__file__).resolve().parent.parent / "docs" / "scheduling.md"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"


def docs_objects() -> dict[str, dict[str, Any]]:
    """The Kubernetes objects of the docs' yaml blocks, by kind (the first of each kind)."""
    found: dict[str, dict[str, Any]] = {}
    for block in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and "kind" in doc:
                found.setdefault(doc["kind"], doc)
    return found


# --- Kueue ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kueue_queue(real_kueue: RealKueue, rack_cluster: RackCluster) -> str:
    """The docs' Topology and ResourceFlavor, a ClusterQueue with GPUs to spare on that flavor;
    the ClusterQueue's name (each test adds its LocalQueue)."""
    docs = docs_objects()
    topology, flavor = docs["Topology"], docs["ResourceFlavor"]
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == [
        "gpu.topology.io/nvlink-domain",
        "gpu.topology.io/nvlink-partition",
        "kubernetes.io/hostname",
    ]
    assert flavor["spec"]["topologyName"] == topology["metadata"]["name"]
    # The docs select rack nodes by a label the agent writes on every node of the racks.
    ((label, value),) = flavor["spec"]["nodeLabels"].items()
    assert all(labels[label] == value for labels in rack_cluster.labels.values())
    real_kueue.create("topologies", topology)
    real_kueue.create("resourceflavors", flavor)
    name = unique("gpus")
    real_kueue.create(
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [GPU],
                        "flavors": [
                            {
                                "name": flavor["metadata"]["name"],
                                "resources": [{"name": GPU, "nominalQuota": 1000}],
                            }
                        ],
                    }
                ],
            },
        },
    )
    return name


@pytest.fixture
def local_queue(real_kueue: RealKueue, kueue_queue: str, real_namespace: str) -> str:
    name = "gpus"
    real_kueue.create(
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": kueue_queue},
        },
        real_namespace,
    )
    return name


def gpu_job(name: str, pods: int, queue: str, scheduler: str) -> dict[str, Any]:
    """N pods x 4 GPUs, asking Kueue for one NVLink partition, as the docs' Job does."""
    docs_job = docs_objects()["Job"]
    annotations = docs_job["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {REQUIRED: PARTITION}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {"annotations": dict(annotations)},
                "spec": {
                    "schedulerName": scheduler,
                    "restartPolicy": "Never",
                    # No kubelet: a deleted pod must go at once, not wait for one.
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {GPU: "4"}},
                        }
                    ],
                },
            },
        },
    }


class Jobs:
    """Jobs of one test's namespace, and where their pods were bound."""

    def __init__(self, server: RealApiServer, namespace: str, kueue: RealKueue) -> None:
        self.batch = k8s.BatchV1Api(server.api())
        self.core = server.core()
        self.namespace = namespace
        self.kueue = kueue
        self.made: list[str] = []

    def submit(self, name: str, pods: int, queue: str, scheduler: str) -> None:
        self.batch.create_namespaced_job(self.namespace, gpu_job(name, pods, queue, scheduler))
        self.made.append(name)

    def pods(self, job: str) -> list[k8s.V1Pod]:
        found = self.core.list_namespaced_pod(self.namespace, label_selector=f"job-name={job}")
        return list(found.items)

    def bound(self, job: str, pods: int) -> list[str]:
        """The nodes the job's pods were bound to, once all `pods` are."""

        def check() -> list[str] | None:
            nodes = [p.spec.node_name for p in self.pods(job)]
            return nodes if len(nodes) == pods and all(nodes) else None

        found: list[str] = poll(f"{pods} pods of job {job} bound", check, log=self.kueue.log)
        return found

    def workload(self, job: str) -> dict[str, Any] | None:
        for wl in self.kueue.workloads(self.namespace):
            owners = wl["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "Job" and o["name"] == job for o in owners):
                return wl
        return None

    def pending(self, job: str) -> str:
        """The message of the job's Workload once Kueue has tried and failed to admit it."""

        def check() -> str | None:
            wl = self.workload(job)
            for c in ((wl or {}).get("status") or {}).get("conditions") or []:
                if c["type"] == "QuotaReserved" and c["status"] == "False" and c.get("message"):
                    return str(c["message"])
            return None

        message: str = poll(f"job {job} tried and left pending", check, log=self.kueue.log)
        return message

    def delete(self, job: str) -> None:
        with contextlib.suppress(k8s.ApiException):
            self.batch.delete_namespaced_job(job, self.namespace, propagation_policy="Background")
        poll(f"job {job}'s pods gone", lambda: not self.pods(job))

    def close(self) -> None:
        for job in self.made:
            self.delete(job)


@pytest.fixture
def jobs(
    real_apiserver: RealApiServer, real_namespace: str, real_kueue: RealKueue
) -> Iterator[Jobs]:
    made = Jobs(real_apiserver, real_namespace, real_kueue)
    try:
        yield made
    finally:
        made.close()


def test_kueue_places_a_job_in_one_partition_and_never_splits_one_that_fits_none(
    rack_cluster: RackCluster, rack_scheduler: RackScheduler, local_queue: str, jobs: Jobs
) -> None:
    jobs.submit("three", 3, local_queue, rack_scheduler.name)
    nodes = jobs.bound("three", 3)
    partitions = {rack_cluster.partition_of(n) for n in nodes}
    assert len(partitions) == 1, nodes
    (partition,) = partitions
    # Racks 0 and 1 have 4 nodes each on clique 17044; rack 2's partitions have 2.
    assert partition.endswith(".17044")
    assert len({rack_cluster.domain_of(n) for n in nodes}) == 1

    # Five pods fit no partition (4 nodes at most), though racks 0 and 1 together have 5 free
    # nodes on "clique 17044": Kueue waits instead of splitting the job across the two racks.
    free = len(rack_cluster.labels) - 3
    assert free >= 5
    jobs.submit("five", 5, local_queue, rack_scheduler.name)
    message = jobs.pending("five")
    assert "topology" in message.lower() or "fit" in message.lower(), message
    assert jobs.pods("five") == []
