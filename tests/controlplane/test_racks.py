"""Issue 21 item 6: the schedulers that group nodes by NVLink partition, each running its own
code on the real control plane, on Nodes the agent published from simulated GB200 NVL72 racks
(tests/support/consumer_fixtures.py: racks 0 and 1 both on clique 17044, rack 2 split in two
partitions; 4 trays each).

- Kueue v0.19.2 (its controller manager, webhooks and certificate management), with the real
  kube-controller-manager's Job controller and the real kube-scheduler, from the Topology and
  ResourceFlavor docs/scheduling.md shows: a job in one partition, never across the two racks on
  one clique ID; one that fits no partition waits; a tray whose fabric turns unhealthy, tainted by
  the agent (`--taint-unhealthy-fabric`), is left out until it heals.
- Volcano v1.15.1's network topology discovery (its label discoverer, from the ConfigMap the docs
  show) finding one tier-1 HyperNode per partition and one tier-2 per rack.
- Pod affinity and anti-affinity on the partition label with the real kube-scheduler.
- YuniKorn v1.8.0 (its k8shim and core): node affinity on the availability label, and a gang
  (task group) with pod affinity on the partition label.
No kubelet runs: a bound pod never starts, and the schedulers still count its GPUs. Everything
waits by polling, never by sleeping a fixed time.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.cli.test_run import CLI, env
from tests.support.consumer_fixtures import (
    DOMAIN,
    GPU,
    HOSTNAME,
    HYPERNODE_CRD,
    PARTITION,
    PREFIX,
    RACKS_LABEL,
    TRAYS,
    VOLCANO_MODULE,
    VOLCANO_VERSION,
    YUNIKORN,
    RackCluster,
    RackScheduler,
    RealKueue,
    discover_hypernodes,
    members,
    poll,
    profile_with,
)
from tests.support.controlplane_fixtures import (
    RealApiServer,
    go_module_dir,
    install_crds,
    unique,
)

pytestmark = pytest.mark.controlplane

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"
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


def doctor_all(cluster: RackCluster) -> str:
    """`topo-reporter doctor --all` against the cluster, as an operator runs it: its stdout."""
    result = subprocess.run(
        [*CLI, "doctor", "--all", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.stdout


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
    return real_kueue.local_queue("gpus", kueue_queue, real_namespace)


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

    # The doctor names the pending group and each partition's room, from the agents' availability
    # (the three bound trays' GPUs in use): no partition has room for five pods of 4 GPUs.
    try:
        for rack_node in rack_cluster.nodes:
            name = rack_cluster.names[rack_node.name]
            rack_cluster.publish(rack_node, used=(0, 1, 2, 3) if name in nodes else ())
        shown = doctor_all(rack_cluster)
        workload = jobs.workload("five")
        assert workload is not None
        subject = f"workload {jobs.namespace}/{workload['metadata']['name']}: 1 finding"
        assert subject in shown, shown
        (line,) = [x for x in shown.splitlines() if "pod-group-exceeds-partitions: PodSet" in x]
        assert "needs 5 pods of 4 nvidia.com/gpu in one NVLink partition" in line, line
        assert "the roomiest partition has room for 4 now" in line, line
        shared = {rack_cluster.partition_of(n) for n in rack_cluster.labels}
        (other,) = {p for p in shared if p.endswith(".17044")} - {partition}
        assert f"evidence: {other}: room for 4 pods, 4 of 4 nodes wholly free" in shown, shown
        assert f"evidence: {partition}: room for 1 pods, 1 of 4 nodes wholly free" in shown
    finally:
        for rack_node in rack_cluster.nodes:
            rack_cluster.publish(rack_node)


def test_kueue_leaves_a_node_whose_fabric_is_unhealthy_and_tainted(
    rack_cluster: RackCluster,
    rack_scheduler: RackScheduler,
    local_queue: str,
    jobs: Jobs,
    tmp_path: Path,
) -> None:
    hurt = [rack_cluster.rack_node(0, 0), rack_cluster.rack_node(1, 0)]
    rack_cluster.taint_fabric = True
    try:
        for node in hurt:
            labels = rack_cluster.publish(node, profile_with(node, tmp_path, health="unhealthy"))
            assert labels[f"{PREFIX}/fabric-health"] == "unhealthy"
        # Four pods fit racks 0 and 1 only, and each has one tray tainted: Kueue waits.
        jobs.submit("four", TRAYS, local_queue, rack_scheduler.name)
        message = jobs.pending("four")
        assert "taint" in message, message
        assert jobs.pods("four") == []
        # Rack 1's tray heals: the agent takes its taint off and Kueue places the job there.
        rack_cluster.publish(hurt[1])
        nodes = jobs.bound("four", TRAYS)
        assert set(nodes) == {rack_cluster.node(1, tray) for tray in range(TRAYS)}
    finally:
        for node in hurt:
            rack_cluster.publish(node)
        rack_cluster.taint_fabric = False
    assert not rack_cluster.core.read_node(rack_cluster.node(0, 0)).spec.taints


# --- Volcano ------------------------------------------------------------------------------------


def test_volcano_discovers_one_hypernode_per_partition_and_one_per_rack(
    consumers_bin: Path,
    real_apiserver: RealApiServer,
    rack_cluster: RackCluster,
    tmp_path: Path,
) -> None:
    crd = yaml.safe_load(
        (go_module_dir(VOLCANO_MODULE, VOLCANO_VERSION) / HYPERNODE_CRD).read_text()
    )
    install_crds(real_apiserver, [crd])
    core = real_apiserver.core()
    configmap = docs_objects()["ConfigMap"]
    namespace = configmap["metadata"]["namespace"]
    with contextlib.suppress(k8s.ApiException):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    with contextlib.suppress(k8s.ApiException):
        core.delete_namespaced_config_map(configmap["metadata"]["name"], namespace)
    core.create_namespaced_config_map(namespace, configmap)

    ours = set(rack_cluster.labels)
    values = rack_cluster.labels.values()
    partitions = {p: rack_cluster.members(PARTITION, p) for p in {v[PARTITION] for v in values}}
    domains = {d: rack_cluster.members(DOMAIN, d) for d in {v[DOMAIN] for v in values}}
    assert len(partitions) == 4  # racks 0 and 1 (same clique ID, two partitions) and rack 2's two
    assert len(domains) == 3

    batch = discover_hypernodes(consumers_bin, real_apiserver.kubeconfig, tmp_path, ours, "racks")

    by_name = {h["metadata"]["name"]: h for h in batch}
    tier1 = {
        h["metadata"]["name"]: h for h in batch if h["spec"]["tier"] == 1 and members(h) & ours
    }
    # Tier 1: one HyperNode per partition, exactly its nodes, labelled with the partition.
    assert len(tier1) == len(partitions)
    for name, hypernode in tier1.items():
        partition = hypernode["metadata"]["labels"][PARTITION]
        assert members(hypernode) == partitions[partition], name
        assert all(m["type"] == "Node" for m in hypernode["spec"]["members"])
        assert hypernode["spec"]["tierName"] == PARTITION
    # Tier 2: one HyperNode per rack, exactly the HyperNodes of its partitions; the two racks that
    # share clique ID 17044 stay two racks of one partition each.
    tier2 = [h for h in batch if h["spec"]["tier"] == 2 and members(h) & set(tier1)]
    assert len(tier2) == len(domains)
    for hypernode in tier2:
        domain = hypernode["metadata"]["labels"][DOMAIN]
        expected = {n for n, h in tier1.items() if members(h) <= domains[domain]}
        assert members(hypernode) == expected
        assert all(m["type"] == "HyperNode" for m in hypernode["spec"]["members"])
        assert {n for m in members(hypernode) for n in members(by_name[m])} == domains[domain]
    # What Volcano's controller would write is what Volcano's CRD accepts.
    custom = k8s.CustomObjectsApi(real_apiserver.api())
    for hypernode in [*tier1.values(), *tier2]:
        body = {**hypernode, "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode"}
        body.pop("status", None)
        custom.create_cluster_custom_object("topology.volcano.sh", "v1alpha1", "hypernodes", body)
        custom.delete_cluster_custom_object(
            "topology.volcano.sh", "v1alpha1", "hypernodes", body["metadata"]["name"]
        )


# --- Pod affinity with the kube-scheduler -------------------------------------------------------


class Pods:
    """GPU pods of one test's namespace on the rack nodes, deleted at the end."""

    def __init__(self, server: RealApiServer, namespace: str, cluster: RackCluster) -> None:
        self.core = server.core()
        self.namespace = namespace
        self.cluster = cluster
        self.made: list[str] = []

    def create(self, name: str, scheduler: str, **spec: Any) -> None:
        labels = spec.pop("labels", {})
        annotations = spec.pop("metadata_annotations", {})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {
                "schedulerName": scheduler,
                "nodeSelector": {RACKS_LABEL: self.cluster.id},
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "train",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {GPU: "4"}},
                    }
                ],
                **spec,
            },
        }
        self.core.create_namespaced_pod(self.namespace, pod)
        self.made.append(name)

    def node_of(self, name: str, log: Path) -> str:
        """The node the pod was bound to."""
        node: str = poll(
            f"pod {name} bound",
            lambda: self.core.read_namespaced_pod(name, self.namespace).spec.node_name,
            log=log,
        )
        return node

    def unschedulable(self, name: str, log: Path) -> str:
        """The scheduler's message once it found no node for the pod."""

        def check() -> str | None:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            assert pod.spec.node_name is None, f"{name} was bound to {pod.spec.node_name}"
            for c in pod.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.message:
                    return str(c.message)
            return None

        message: str = poll(f"pod {name} found unschedulable", check, log=log)
        return message

    def close(self) -> None:
        for name in self.made:
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)


@pytest.fixture
def pods(
    real_apiserver: RealApiServer, real_namespace: str, rack_cluster: RackCluster
) -> Iterator[Pods]:
    made = Pods(real_apiserver, real_namespace, rack_cluster)
    try:
        yield made
    finally:
        made.close()


def two_racks(cluster: RackCluster) -> dict[str, Any]:
    """Node affinity to racks 0 and 1, the two that both report clique 17044."""
    domains = sorted({cluster.domain_of(cluster.node(rack, 0)) for rack in (0, 1)})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": DOMAIN, "operator": "In", "values": domains}]}
                ]
            }
        }
    }


def docs_pod_affinity(job: str, kind: str = "podAffinity") -> dict[str, Any]:
    """The docs' pod affinity block, for pods labelled `job: <job>`; `podAntiAffinity` spreads."""
    block = next(
        yaml.safe_load(b)
        for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
        if b.startswith("affinity:\n  podAffinity:")
    )
    (term,) = block["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == PARTITION
    term = {**term, "labelSelector": {"matchLabels": {"job": job}}}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_pod_affinity_on_the_partition_keeps_a_job_in_one_partition_of_one_rack(
    rack_cluster: RackCluster, rack_scheduler: RackScheduler, pods: Pods
) -> None:
    job = unique("train")
    affinity = {**two_racks(rack_cluster), **docs_pod_affinity(job)}
    # A full partition's worth: four pods, racks 0 and 1 offering 8 free nodes on "17044".
    nodes = []
    for i in range(TRAYS):
        pods.create(f"{job}-{i}", rack_scheduler.name, labels={"job": job}, affinity=affinity)
        nodes.append(pods.node_of(f"{job}-{i}", rack_scheduler.log))
    assert len({rack_cluster.partition_of(n) for n in nodes}) == 1, nodes
    assert len(set(nodes)) == TRAYS
    # A fifth pod fits nowhere in that partition: it waits, though the other rack is free.
    pods.create(f"{job}-{TRAYS}", rack_scheduler.name, labels={"job": job}, affinity=affinity)
    message = pods.unschedulable(f"{job}-{TRAYS}", rack_scheduler.log)
    assert "affinity" in message, message


def test_pod_anti_affinity_on_the_partition_puts_each_pod_in_its_own_partition(
    rack_cluster: RackCluster, rack_scheduler: RackScheduler, pods: Pods
) -> None:
    job = unique("spread")
    affinity = docs_pod_affinity(job, "podAntiAffinity")
    partitions = {labels[PARTITION] for labels in rack_cluster.labels.values()}
    nodes = []
    for i in range(len(partitions)):
        pods.create(f"{job}-{i}", rack_scheduler.name, labels={"job": job}, affinity=affinity)
        nodes.append(pods.node_of(f"{job}-{i}", rack_scheduler.log))
    assert {rack_cluster.partition_of(n) for n in nodes} == partitions
    pods.create(f"{job}-x", rack_scheduler.name, labels={"job": job}, affinity=affinity)
    assert "anti-affinity" in pods.unschedulable(f"{job}-x", rack_scheduler.log)


# --- YuniKorn -----------------------------------------------------------------------------------

APP_ID = "yunikorn.apache.org/app-id"
TASK_GROUP = "yunikorn.apache.org/task-group-name"
TASK_GROUPS = "yunikorn.apache.org/task-groups"
SCHEDULING_POLICY = "yunikorn.apache.org/schedulingPolicyParameters"


def docs_node_affinity() -> dict[str, Any]:
    """The docs' node affinity on the availability label (YuniKorn section)."""
    block = next(
        yaml.safe_load(b)
        for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
        if b.startswith("affinity:\n  nodeAffinity:")
    )
    affinity: dict[str, Any] = block["affinity"]
    return affinity


def test_yunikorn_places_a_pod_by_the_free_nvlink_label(
    rack_cluster: RackCluster, real_yunikorn: Path, pods: Pods
) -> None:
    # Two nodes of rack 2 publish availability: GPUs 0 and 1 taken on one (2 connected free),
    # none on the other (4). The others publish none, so the label is absent there.
    taken, free = rack_cluster.rack_node(2, 0), rack_cluster.rack_node(2, 1)
    try:
        assert rack_cluster.publish(taken, used=(0, 1))[f"{PREFIX}/gpu-free-nvlink-max"] == "2"
        assert rack_cluster.publish(free, used=())[f"{PREFIX}/gpu-free-nvlink-max"] == "4"
        name = unique("yk")
        pods.create(
            name,
            YUNIKORN,
            labels={APP_ID: name},
            affinity={"nodeAffinity": docs_node_affinity()["nodeAffinity"]},
        )
        assert pods.node_of(name, real_yunikorn) == rack_cluster.names[free.name]
    finally:
        for node in (taken, free):
            rack_cluster.publish(node)  # availability off: the agent takes its keys off


def test_a_yunikorn_gang_with_partition_affinity_lands_in_one_partition(
    rack_cluster: RackCluster, real_yunikorn: Path, pods: Pods
) -> None:
    # Two of rack 0's trays run a CPU-only pod that YuniKorn placed. Its default node order
    # (`fair`: least CPU and memory allocated first) then reads r00-n00, r00-n02, then rack 1's
    # trays: a gang placed by that order alone spans the two racks that share clique 17044. The
    # pods' affinity on the partition keeps all four with the first.
    for tray in (1, 3):
        name = unique("cpu")
        pods.create(
            name,
            YUNIKORN,
            labels={APP_ID: name},
            nodeSelector={HOSTNAME: rack_cluster.node(0, tray)},
            containers=[
                {
                    "name": "cpu",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "2"}},
                }
            ],
        )
        assert pods.node_of(name, real_yunikorn) == rack_cluster.node(0, tray)
    app = unique("gang")
    affinity = {**two_racks(rack_cluster), **docs_pod_affinity(app)}
    term = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    term["labelSelector"] = {"matchLabels": {APP_ID: app}}
    group = {
        "name": "workers",
        "minMember": TRAYS,
        "minResource": {GPU: "4"},
        "nodeSelector": {RACKS_LABEL: rack_cluster.id},
        "affinity": affinity,
    }
    annotations = {
        TASK_GROUP: "workers",
        TASK_GROUPS: json.dumps([group]),
        SCHEDULING_POLICY: "placeholderTimeoutInSeconds=120 gangSchedulingStyle=Hard",
    }
    names = [f"{app}-{i}" for i in range(TRAYS)]
    for name in names:
        pods.create(
            name,
            YUNIKORN,
            labels={APP_ID: app},
            metadata_annotations=annotations,
            affinity=affinity,
        )
    nodes = [pods.node_of(name, real_yunikorn) for name in names]
    assert len(set(nodes)) == TRAYS
    assert len({rack_cluster.partition_of(n) for n in nodes}) == 1, nodes
