"""Issue 43 item 5: the consumers of the network tiers, each running its own code on the real
control plane, on 64 Nodes of marin#6950's shape (tests/support/network_fabric.py: 15 leaf groups
of 1 to 11 nodes under 4 spine groups under 2 core groups), each labelled as the agent labels a
DGX H100 with its three tiers, made by the agent's own projection (`tier_labels`).

- Kueue v0.19.2 (its controller manager) with the Topology, ResourceFlavor and Job of
  docs/network.md, the real Job controller and kube-scheduler: a 4-pod job required in one leaf
  group lands in one, trial after trial, each trial with its own seeded set of free nodes; where no
  group has room it waits, unsplit. The preferred annotation is measured, not asserted.
- Volcano v1.15.1's label discovery with the docs' ConfigMap builds the fabric's tree.
- KEP-5732 pod groups on kube-scheduler 1.37.2 with the docs' PodGroup stay in one leaf group.
- KAI's Topology CRD (tests/fixtures/kai/, KAI's own file) accepts the docs' KAI Topologies: a
  schema check only, KAI's scheduler is not run.

Which nodes are free in a trial is the pods' required node affinity (`kubernetes.io/hostname In
<free nodes>`), which Kueue's topology assignment and the kube-scheduler both honour: it is part
of the job, so no trial waits on a scheduler's cache catching up with a change to the Nodes.
No kubelet runs: a bound pod never starts, and the schedulers still count its GPUs. Everything
waits by polling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from reporter.schema import keys
from reporter.schema.labels import labels
from tests.controlplane.test_racks import Jobs
from tests.support.consumer_fixtures import (
    GPU,
    HOSTNAME,
    HYPERNODE_CRD,
    VOLCANO_MODULE,
    VOLCANO_VERSION,
    RackScheduler,
    RealKueue,
    discover_hypernodes,
    members,
    poll,
)
from tests.support.controlplane_fixtures import (
    RealApiServer,
    create_node,
    go_module_dir,
    install_crds,
    unique,
)
from tests.support.leaf_groups import GPUS, PREFIX, dgx_h100
from tests.support.network_fabric import MARIN, Fabric, free_nodes

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "network.md"
KAI_CRD = ROOT / "tests" / "fixtures" / "kai" / "kai.scheduler_topologies.yaml"
FABRIC_LABEL = "e2e.topo-reporter.io/fabric"
"""Set by the test on its Nodes (not by the agent): what keeps the consumers to them."""
TIER_KEYS = [keys.key(PREFIX, name) for name in reversed(keys.NETWORK_TIERS)]
"""Our network-tier keys, coarse to fine, the order docs/network.md lists them in."""
TIER_0 = TIER_KEYS[-1]
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODS = 4
"""Pods per job, each a whole node: 7 of the 15 leaf groups have room for it when all is free."""
TRIALS = 50
BIND_EVERY = 5
"""Every 5th trial also waits for the pods to be bound (10 of the 50)."""


def docs_objects() -> dict[tuple[str, str, str], dict[str, Any]]:
    """The Kubernetes objects of docs/network.md's yaml blocks, by API group, kind and name."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for block in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and "kind" in doc:
                group = doc["apiVersion"].rpartition("/")[0]
                key = (group, doc["kind"], doc["metadata"]["name"])
                assert key not in found, f"docs/network.md shows {key} twice"
                found[key] = doc
    return found


def levels(topology: dict[str, Any]) -> list[str]:
    return [level["nodeLabel"] for level in topology["spec"]["levels"]]


NETWORK_LEVELS = [*TIER_KEYS, HOSTNAME]
NVLINK_LEVELS = [
    *TIER_KEYS,
    keys.key(PREFIX, keys.NVLINK_DOMAIN),
    keys.key(PREFIX, keys.NVLINK_PARTITION),
    HOSTNAME,
]


@dataclasses.dataclass(frozen=True)
class FabricNodes:
    fabric: Fabric
    core: k8s.CoreV1Api


@pytest.fixture(scope="module")
def fabric_nodes(real_apiserver: RealApiServer) -> Iterator[FabricNodes]:
    """marin#6950's 64 nodes, Ready with 8 GPUs each, labelled as the agent labels a DGX H100
    with its three network tiers; deleted after the module."""
    fabric = dataclasses.replace(MARIN, name=unique("ib"))
    core = real_apiserver.core()
    topology = dgx_h100()
    try:
        for node in fabric.nodes:
            create_node(
                core,
                name=node,
                labels={
                    **labels(topology, PREFIX, node),
                    **fabric.labels(node),
                    FABRIC_LABEL: fabric.name,
                },
                ready=True,
                allocatable={GPU: str(GPUS)},
            )
        yield FabricNodes(fabric, core)
    finally:
        for node in fabric.nodes:
            with contextlib.suppress(k8s.ApiException):
                core.delete_node(node)


def test_the_fabric_labels_are_the_three_tiers_and_nest(fabric_nodes: FabricNodes) -> None:
    fabric = fabric_nodes.fabric
    stored = {
        n.metadata.name: n.metadata.labels
        for n in fabric_nodes.core.list_node(label_selector=f"{FABRIC_LABEL}={fabric.name}").items
    }
    assert set(stored) == set(fabric.nodes)
    for node, node_labels in stored.items():
        assert [node_labels[k] for k in TIER_KEYS] == list(reversed(fabric.tiers(node)))
    # Nesting, counted from the Nodes: every value has one parent.
    for child, parent in zip(TIER_KEYS[1:], TIER_KEYS[:-1], strict=True):
        parents: dict[str, set[str]] = {}
        for node_labels in stored.values():
            parents.setdefault(node_labels[child], set()).add(node_labels[parent])
        assert all(len(p) == 1 for p in parents.values()), parents
    assert Counter(stored[n][TIER_0] for n in stored) == Counter(
        {fabric.leaf(g): size for g, size in enumerate(fabric.leaf_group_sizes)}
    )


# --- Kueue ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ib_queue(real_kueue: RealKueue, fabric_nodes: FabricNodes) -> Iterator[str]:
    """The docs' Topology and ResourceFlavor (the flavor's nodeLabels with the test's own label
    added, so no other test's Nodes are counted), a ClusterQueue with GPUs to spare on it."""
    docs = docs_objects()
    topology = docs[("kueue.x-k8s.io", "Topology", "ib-network")]
    flavor = docs[("kueue.x-k8s.io", "ResourceFlavor", "ib-gpus")]
    assert levels(topology) == NETWORK_LEVELS
    assert flavor["spec"]["topologyName"] == topology["metadata"]["name"]
    flavor = {
        **flavor,
        "spec": {
            **flavor["spec"],
            "nodeLabels": {**flavor["spec"]["nodeLabels"], FABRIC_LABEL: fabric_nodes.fabric.name},
        },
    }
    name = unique("ib")
    queue = {
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
                            "resources": [{"name": GPU, "nominalQuota": 10000}],
                        }
                    ],
                }
            ],
        },
    }
    made = [
        ("topologies", real_kueue.create("topologies", topology)),
        ("resourceflavors", real_kueue.create("resourceflavors", flavor)),
        ("clusterqueues", real_kueue.create("clusterqueues", queue)),
    ]
    try:
        yield name
    finally:
        for plural, body in reversed(made):
            with contextlib.suppress(k8s.ApiException):
                real_kueue.api.delete_cluster_custom_object(
                    "kueue.x-k8s.io", "v1beta2", plural, body["metadata"]["name"]
                )


@pytest.fixture
def ib_local_queue(real_kueue: RealKueue, ib_queue: str, real_namespace: str) -> str:
    return real_kueue.local_queue("gpus", ib_queue, real_namespace)


def hostname_in(nodes: frozenset[str]) -> dict[str, Any]:
    """Required node affinity to these nodes: the trial's free nodes."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": sorted(nodes)}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def whole_node_pod_spec(scheduler: str, free: frozenset[str]) -> dict[str, Any]:
    return {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        # No kubelet: a deleted pod must go at once, not wait for one.
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "affinity": hostname_in(free),
        "containers": [
            {
                "name": "train",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {GPU: str(GPUS)}},
            }
        ],
    }


def docs_job(name: str, queue: str, scheduler: str, free: frozenset[str], annotation: str) -> Any:
    """The docs' Job (4 pods of 8 GPUs, one leaf group required), renamed, its pods kept to the
    `free` nodes; `annotation` PREFERRED asks for the leaf group as a preference instead."""
    job = docs_objects()[("batch", "Job", "allreduce")]
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {REQUIRED: TIER_0}
    assert job["spec"]["parallelism"] == PODS
    assert template["spec"]["containers"][0]["resources"]["limits"] == {GPU: GPUS}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            **job["spec"],
            "template": {
                "metadata": {"annotations": {annotation: TIER_0}},
                "spec": whole_node_pod_spec(scheduler, free),
            },
        },
    }


def assigned_nodes(workload: dict[str, Any]) -> Counter[str]:
    """Pods per node of the Workload's admission: Kueue's topology assignment, decoded as its
    v1beta2 API documents it (slices of domains, each level's values universal or a prefix and
    suffix around a root per domain, pod counts universal or per domain)."""
    ((podset,),) = [workload["status"]["admission"]["podSetAssignments"]]
    assignment = podset["topologyAssignment"]
    assert assignment["levels"][-1] == HOSTNAME, assignment
    out: Counter[str] = Counter()
    for piece in assignment["slices"]:
        values = piece["valuesPerLevel"][-1]
        counts = piece["podCounts"]
        for i in range(piece["domainCount"]):
            if "universal" in values:
                node = values["universal"]
            else:
                each = values["individual"]
                node = each.get("prefix", "") + each["roots"][i] + each.get("suffix", "")
            out[node] += counts["universal"] if "universal" in counts else counts["individual"][i]
    return out


class FabricJobs(Jobs):
    """The docs' Jobs in one test's namespace; each trial's job is deleted, with its Workload and
    pods gone, before the next one is made."""

    def run(self, job: dict[str, Any]) -> None:
        self.batch.create_namespaced_job(self.namespace, job)
        self.made.append(job["metadata"]["name"])

    def admitted(self, name: str) -> Counter[str]:
        """Pods per node of the job's Workload once Kueue has admitted it."""

        def check() -> dict[str, Any] | None:
            wl = self.workload(name)
            return wl if wl and (wl.get("status") or {}).get("admission") else None

        workload: dict[str, Any] = poll(f"job {name} admitted", check, log=self.kueue.log)
        return assigned_nodes(workload)

    def finish(self, name: str) -> None:
        # The Workload is deleted here, not left to the garbage collector: its first collection
        # of a Workload waits for the collector to rediscover the resources (Kueue's CRDs came
        # after it started), up to 30 s.
        workload = self.workload(name)
        self.delete(name)
        if workload is not None:
            with contextlib.suppress(k8s.ApiException):
                self.kueue.api.delete_namespaced_custom_object(
                    "kueue.x-k8s.io",
                    "v1beta2",
                    self.namespace,
                    "workloads",
                    workload["metadata"]["name"],
                )
        poll(f"job {name}'s Workload gone", lambda: self.workload(name) is None)
        self.made.remove(name)


@pytest.fixture
def fabric_jobs(
    real_apiserver: RealApiServer, real_namespace: str, real_kueue: RealKueue
) -> Iterator[FabricJobs]:
    made = FabricJobs(real_apiserver, real_namespace, real_kueue)
    try:
        yield made
    finally:
        made.close()


def test_kueue_keeps_a_required_job_in_one_leaf_group_every_time(
    fabric_nodes: FabricNodes,
    rack_scheduler: RackScheduler,
    ib_local_queue: str,
    fabric_jobs: FabricJobs,
) -> None:
    fabric = fabric_nodes.fabric
    placed, bound, tightest, waited, roomy_counts = 0, 0, 0, 0, Counter[int]()
    started = time.monotonic()
    for seed in range(TRIALS):
        free = free_nodes(fabric, seed, PODS)
        roomy = fabric.roomy_leaf_groups(free, PODS)
        roomy_counts[len(roomy)] += 1
        name = f"required-{seed}"
        fabric_jobs.run(docs_job(name, ib_local_queue, rack_scheduler.name, free, REQUIRED))
        if roomy:
            assignment = fabric_jobs.admitted(name)
            assert set(assignment.values()) == {1}, (seed, assignment)
            assert len(assignment) == PODS, (seed, assignment)
            assert set(assignment) <= free, (seed, assignment)
            groups = {fabric.leaf_group_of(n) for n in assignment}
            assert len(groups) == 1, (seed, assignment)
            assert groups <= roomy
            (group,) = groups
            room = Counter(fabric.leaf_group_of(n) for n in free)
            tightest += room[group] == min(room[g] for g in roomy)
            if seed % BIND_EVERY == 0:
                # The pods land where Kueue put them: Kueue's ungater gives each pod its node,
                # the kube-scheduler binds it (a second's batching in Kueue: every trial would
                # double the file's time).
                assert Counter(fabric_jobs.bound(name, PODS)) == assignment, seed
                bound += 1
            placed += 1
        else:
            # No group has 4 free nodes (though the fabric has more than 4): Kueue waits.
            assert len(free) >= PODS, seed
            message = fabric_jobs.pending(name)
            assert "topology" in message.lower() or "fit" in message.lower(), message
            assert fabric_jobs.pods(name) == []
            waited += 1
        fabric_jobs.finish(name)
    elapsed = time.monotonic() - started
    # The seeds give trials with every roomy group free, with one or a few, and with none.
    assert roomy_counts[0] >= 1
    assert roomy_counts[7] >= 1
    assert any(0 < k < 7 for k in roomy_counts), roomy_counts
    print(
        f"required network-tier-0: {placed} of {placed} placed jobs in one leaf group "
        f"({bound} followed to their pods' binding; {tightest} in the roomy group with the "
        "fewest free nodes), "
        f"{waited} waited (no roomy group); roomy groups per trial {sorted(roomy_counts.items())};"
        f" {TRIALS} trials in {elapsed:.1f} s"
    )


def test_kueue_preferred_placement_is_measured(
    fabric_nodes: FabricNodes,
    rack_scheduler: RackScheduler,
    ib_local_queue: str,
    fabric_jobs: FabricJobs,
) -> None:
    fabric = fabric_nodes.fabric
    whole, whole_when_roomy, roomy_trials, spines = 0, 0, 0, Counter[int]()
    for seed in range(TRIALS):
        free = free_nodes(fabric, seed, PODS)
        roomy = fabric.roomy_leaf_groups(free, PODS)
        name = f"preferred-{seed}"
        fabric_jobs.run(docs_job(name, ib_local_queue, rack_scheduler.name, free, PREFERRED))
        # A preference never makes a job wait where the free nodes can hold it.
        assignment = fabric_jobs.admitted(name)
        nodes = list(assignment.elements())
        assert set(nodes) <= free, (seed, nodes)
        assert len(set(nodes)) == PODS, (seed, nodes)
        one = len({fabric.leaf_group_of(n) for n in nodes}) == 1
        whole += one
        roomy_trials += bool(roomy)
        whole_when_roomy += one and bool(roomy)
        spines[len({fabric.tiers(n)[1] for n in nodes})] += 1
        fabric_jobs.finish(name)
    print(
        f"preferred network-tier-0: {whole} of {TRIALS} jobs in one leaf group; "
        f"{whole_when_roomy} of {roomy_trials} where a group had room; "
        f"spine groups spanned per job {sorted(spines.items())}"
    )


def test_kueue_accepts_the_nvlink_under_the_network_topology(real_kueue: RealKueue) -> None:
    topology = docs_objects()[("kueue.x-k8s.io", "Topology", "ib-nvlink")]
    assert levels(topology) == NVLINK_LEVELS
    real_kueue.api.create_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "topologies", topology, dry_run="All"
    )


# --- Volcano --------------------------------------------------------------------------------------


def test_volcano_builds_the_fabrics_tree_from_the_tier_labels(
    consumers_bin: Path, real_apiserver: RealApiServer, fabric_nodes: FabricNodes, tmp_path: Path
) -> None:
    fabric = fabric_nodes.fabric
    crd = yaml.safe_load(
        (go_module_dir(VOLCANO_MODULE, VOLCANO_VERSION) / HYPERNODE_CRD).read_text()
    )
    install_crds(real_apiserver, [crd])
    core = fabric_nodes.core
    configmap = docs_objects()[("", "ConfigMap", "volcano-controller-configmap")]
    conf = yaml.safe_load(configmap["data"]["volcano-controller.conf"])
    (source,) = conf["networkTopologyDiscovery"]
    assert [x["nodeLabel"] for x in source["config"]["networkTopologyTypes"]["ib"]] == (
        NETWORK_LEVELS
    )
    namespace = configmap["metadata"]["namespace"]
    with contextlib.suppress(k8s.ApiException):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    with contextlib.suppress(k8s.ApiException):
        core.delete_namespaced_config_map(configmap["metadata"]["name"], namespace)
    core.create_namespaced_config_map(namespace, configmap)

    ours = set(fabric.nodes)
    try:
        batch = discover_hypernodes(
            consumers_bin, real_apiserver.kubeconfig, tmp_path, ours, "fabric"
        )
    finally:
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_config_map(configmap["metadata"]["name"], namespace)

    # Each tier's HyperNodes, by the label value Volcano put on them; the tree they make, with
    # each HyperNode's members named by their own label values.
    by_name = {h["metadata"]["name"]: h for h in batch}
    ours_by_tier: dict[int, dict[str, dict[str, Any]]] = {1: {}, 2: {}, 3: {}}
    mine = set(ours)
    for tier, key in ((1, TIER_KEYS[2]), (2, TIER_KEYS[1]), (3, TIER_KEYS[0])):
        for h in batch:
            if h["spec"]["tier"] == tier and members(h) <= mine and members(h):
                assert h["spec"]["tierName"] == key
                value = h["metadata"]["labels"][key]
                assert value not in ours_by_tier[tier], f"two tier-{tier} HyperNodes for {value}"
                ours_by_tier[tier][value] = h
        mine = {h["metadata"]["name"] for h in ours_by_tier[tier].values()}

    def value_of(name: str, tier: int, key: str) -> str:
        hypernode = by_name[name]
        assert hypernode["spec"]["tier"] == tier
        return str(hypernode["metadata"]["labels"][key])

    tree = {
        core_value: {
            value_of(spine, 2, TIER_KEYS[1]): {
                value_of(leaf, 1, TIER_KEYS[2]): members(by_name[leaf])
                for leaf in members(by_name[spine])
            }
            for spine in members(hypernode)
        }
        for core_value, hypernode in ours_by_tier[3].items()
    }
    assert tree == fabric.tree()
    # Nested: each HyperNode is a member of exactly one HyperNode of the tier above.
    for tier in (1, 2):
        names = Counter(m for h in ours_by_tier[tier + 1].values() for m in members(h))
        assert names == Counter({h["metadata"]["name"]: 1 for h in ours_by_tier[tier].values()})
    # What Volcano's controller would write is what Volcano's CRD accepts.
    custom = k8s.CustomObjectsApi(real_apiserver.api())
    for tier_nodes in ours_by_tier.values():
        for hypernode in tier_nodes.values():
            body = {
                **hypernode,
                "apiVersion": "topology.volcano.sh/v1alpha1",
                "kind": "HyperNode",
            }
            body.pop("status", None)
            custom.create_cluster_custom_object(
                "topology.volcano.sh", "v1alpha1", "hypernodes", body, dry_run="All"
            )


# --- KEP-5732 pod groups ------------------------------------------------------------------------

GROUP, VERSION, PLURAL = "scheduling.k8s.io", "v1beta1", "podgroups"
GANG_TRIALS = 20
"""Gangs placed one after another, each with its seed's free nodes where those fit one."""


class Gangs:
    """PodGroups of one test's namespace, their pods of 8 GPUs each."""

    def __init__(self, server: RealApiServer, namespace: str, scheduler: RackScheduler) -> None:
        self.api = k8s.CustomObjectsApi(server.api())
        self.core = server.core()
        self.namespace = namespace
        self.scheduler = scheduler
        self.made: list[tuple[str, list[str]]] = []

    def create(self, free: frozenset[str]) -> tuple[str, list[str]]:
        """The docs' PodGroup, renamed, and its PODS pods kept to the `free` nodes."""
        group = docs_objects()[("scheduling.k8s.io", "PodGroup", "allreduce")]
        assert group["spec"]["schedulingConstraints"]["topology"] == [{"key": TIER_0}]
        assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == PODS
        name = unique("gang")
        body = {**group, "metadata": {"name": name}}
        self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        pods = [f"{name}-{i}" for i in range(PODS)]
        self.made.append((name, pods))
        for pod in pods:
            spec = whole_node_pod_spec(self.scheduler.name, free)
            spec["schedulingGroup"] = {"podGroupName": name}
            self.core.create_namespaced_pod(
                self.namespace,
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod}, "spec": spec},
            )
        return name, pods

    def node_of(self, pod: str) -> str:
        node: str = poll(
            f"pod {pod} bound",
            lambda: self.core.read_namespaced_pod(pod, self.namespace).spec.node_name,
            log=self.scheduler.log,
        )
        return node

    def unschedulable(self, name: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            group = self.api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
            for c in (group.get("status") or {}).get("conditions") or []:
                if c["type"] == "PodGroupInitiallyScheduled":
                    return dict(c)
            return None

        condition: dict[str, Any] = poll(f"group {name} tried", check, log=self.scheduler.log)
        return condition

    def delete(self, name: str, pods: list[str]) -> None:
        for pod in pods:
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)

        def gone() -> bool:
            listed = {p.metadata.name for p in self.core.list_namespaced_pod(self.namespace).items}
            return not listed & set(pods)

        poll(f"the pods of group {name} gone", gone)
        with contextlib.suppress(k8s.ApiException):
            self.api.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        self.made.remove((name, pods))

    def close(self) -> None:
        for name, pods in list(self.made):
            self.delete(name, pods)


@pytest.fixture
def gangs(
    real_apiserver: RealApiServer, real_namespace: str, rack_scheduler: RackScheduler
) -> Iterator[Gangs]:
    made = Gangs(real_apiserver, real_namespace, rack_scheduler)
    try:
        yield made
    finally:
        made.close()


def test_a_pod_group_on_network_tier_0_lands_in_one_leaf_group(
    fabric_nodes: FabricNodes, gangs: Gangs
) -> None:
    fabric = fabric_nodes.fabric
    placed = []
    for seed in range(GANG_TRIALS):
        free = free_nodes(fabric, seed, PODS)
        roomy = fabric.roomy_leaf_groups(free, PODS)
        if not roomy:
            continue  # the next test's case: seeds 1 and 2
        name, pods = gangs.create(free)
        nodes = [gangs.node_of(pod) for pod in pods]
        assert len(set(nodes)) == PODS, (seed, nodes)
        assert set(nodes) <= free, (seed, nodes)
        (group,) = {fabric.leaf_group_of(n) for n in nodes}
        assert group in roomy, (seed, group)
        placed.append(len(roomy))
        gangs.delete(name, pods)
    assert len(placed) >= GANG_TRIALS - 2
    assert min(placed) == 1  # trials where a single leaf group has room
    print(f"pod groups: {len(placed)} of {len(placed)} in one leaf group (roomy groups {placed})")


def test_a_pod_group_no_leaf_group_can_hold_waits_unbound(
    fabric_nodes: FabricNodes, gangs: Gangs
) -> None:
    fabric = fabric_nodes.fabric
    free = free_nodes(fabric, 1, PODS)
    assert not fabric.roomy_leaf_groups(free, PODS)
    assert len(free) >= PODS
    name, pods = gangs.create(free)
    condition = gangs.unschedulable(name)
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    for pod in pods:
        assert gangs.core.read_namespaced_pod(pod, gangs.namespace).spec.node_name is None


# --- KAI ------------------------------------------------------------------------------------------

KAI_GROUP, KAI_VERSION, KAI_PLURAL = "kai.scheduler", "v1alpha1", "topologies"


@pytest.fixture(scope="module")
def kai_crd(real_apiserver: RealApiServer) -> k8s.CustomObjectsApi:
    (crd,) = [d for d in yaml.safe_load_all(KAI_CRD.read_text()) if d]
    install_crds(real_apiserver, [crd])
    return k8s.CustomObjectsApi(real_apiserver.api())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("ib-network", NETWORK_LEVELS), ("ib-nvlink", NVLINK_LEVELS)],
    ids=["network only", "NVLink under the network"],
)
def test_kais_crd_accepts_the_docs_topologies(
    kai_crd: k8s.CustomObjectsApi, name: str, expected: list[str]
) -> None:
    topology = docs_objects()[(KAI_GROUP, "Topology", name)]
    assert topology["apiVersion"] == f"{KAI_GROUP}/{KAI_VERSION}"
    assert levels(topology) == expected
    kai_crd.create_cluster_custom_object(
        KAI_GROUP, KAI_VERSION, KAI_PLURAL, topology, dry_run="All"
    )


def test_kais_crd_refuses_a_topology_with_the_hostname_above_a_tier(
    kai_crd: k8s.CustomObjectsApi,
) -> None:
    bad = {
        "apiVersion": f"{KAI_GROUP}/{KAI_VERSION}",
        "kind": "Topology",
        "metadata": {"name": unique("bad")},
        "spec": {"levels": [{"nodeLabel": HOSTNAME}, {"nodeLabel": TIER_0}]},
    }
    with pytest.raises(k8s.ApiException) as refused:
        kai_crd.create_cluster_custom_object(KAI_GROUP, KAI_VERSION, KAI_PLURAL, bad, dry_run="All")
    assert refused.value.status == 422
    assert (
        "kubernetes.io/hostname label can only be used at the lowest level"
        in json.loads(refused.value.body)["message"]
    )
