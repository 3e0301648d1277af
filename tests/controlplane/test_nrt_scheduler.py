"""scheduler-plugins' NodeResourceTopologyMatch, for real, on the NodeResourceTopology objects the
agent publishes: kube-scheduler 1.34.9 (tests/controlplane/plugins: the plugin's latest release,
`sigs.k8s.io/scheduler-plugins` v0.34.7, builds only against 1.34) with the plugin registered as
scheduler-plugins' own build registers it, against the harness's 1.37 apiserver, configured with the
stanza of docs/scheduling.md (filter, score, and the reserve cache with `cacheResyncPeriodSeconds`),
binds pods on Nodes of simulated DGX H100s whose objects `topo-reporter run --availability --nrt`
wrote with simulated allocations. Each Node is its own group, so each pod is judged against one
Node.

The scheduler's own count agrees with no allocation (no pod holds the simulated GPUs; allocatable is
8 and the pods' CPUs fit the Node), so every refusal here is the plugin's, from our object: the
zones' free GPUs and CPUs and the kubelet's policy and scope, from its config file or as the user
states it (`--topology-manager-policy`). No kubelet runs: a bound pod never starts."""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from kubernetes import client as k8s

from parsers.kubelet import KubeletPolicies
from reporter.collect.podresources import PodResourcesError
from reporter.publish.nrt import NrtOutput, NrtSink
from reporter.schema import nrt
from reporter.settings import WITHDRAW_AFTER
from tests.agent.test_availability import INTERVAL_S, FakeSource, wire_live
from tests.cli.test_run import CLI, env
from tests.controlplane.test_nrt import MEMORY, Store
from tests.support.agent_support import API_CLIENTS, FAST, PREFIX, topology
from tests.support.controlplane_fixtures import (
    NODE_CAPACITY,
    RealApiServer,
    start_harness,
    stop_process,
)
from tests.support.controlplane_fixtures import unique as unique_name

pytestmark = pytest.mark.controlplane

GPU = "nvidia.com/gpu"
PROFILE = "dgx-h100"  # GPUs 0-3 on NUMA node 0, 4-7 on node 1; 112 CPUs per NUMA node
ZONE_CPUS = 112
GROUP_LABEL = "e2e.topo-reporter.io/nrt-group"
WAIT_S = 60.0
DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


def docs_nrt_configuration() -> dict[str, Any]:
    """The KubeSchedulerConfiguration for NodeResourceTopologyMatch that the docs show."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    (config,) = [
        d
        for d in (yaml.safe_load(b) for b in blocks)
        if isinstance(d, dict)
        and d.get("kind") == "KubeSchedulerConfiguration"
        and "NodeResourceTopologyMatch" in str(d.get("profiles"))
    ]
    assert isinstance(config, dict)
    return config


# name: (used GPUs, kubelet config or None, extra agent flags, extra allocatable)
NODES: dict[str, tuple[tuple[int, ...], str | None, tuple[str, ...], dict[str, str]]] = {
    "upper-used": ((4, 5, 6, 7), "single-numa-node", (), {}),
    "split": ((0, 4), "single-numa-node", (), {}),
    # The policy stated, no kubelet config readable: the object carries what the user says.
    "split-pod-scope": (
        (0, 4),
        None,
        ("--topology-manager-policy", "single-numa-node", "--topology-manager-scope", "pod"),
        {},
    ),
    "split-best-effort": ((0, 4), "best-effort", (), {}),
    "cpus": ((), "single-numa-node", (), {"cpu": str(2 * ZONE_CPUS)}),
    "reserve": ((4, 5, 6, 7), "single-numa-node", (), {}),
    # Every GPU taken, then PodResources reads fail (issue 19.2): the agent withdraws the object.
    "withdrawn": (tuple(range(8)), "single-numa-node", (), {}),
}


class NrtCluster:
    """GPU Nodes published by the agent with --nrt, and the scheduler with the plugin."""

    def __init__(self, server: RealApiServer, store: Store, work: Path, scheduler: Path) -> None:
        self.server = server
        self.scheduler = scheduler
        self.core = server.core()
        self.store = store
        self.work = work
        self.run = unique_name("nrt")
        self.scheduler_name = f"topo-aware-{self.run}"
        self.namespace = self.run
        self.nodes: dict[str, str] = {}
        self._scheduler: subprocess.Popen[bytes] | None = None
        self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=self.namespace)))
        self.core.create_namespaced_service_account(
            self.namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
        )

    def add_nodes(self) -> None:
        """Every Node of NODES, Ready, then the agent on all of them at once."""
        agents = []
        for short, (used, policy, flags, allocatable) in NODES.items():
            name = f"{short}-{self.run}"
            self.nodes[short] = name
            self.core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {"kubernetes.io/hostname": name, GROUP_LABEL: name},
                    },
                }
            )
            resources = {**NODE_CAPACITY, GPU: "8", **allocatable}
            self.core.patch_node_status(
                name,
                {
                    "status": {
                        "capacity": resources,
                        "allocatable": resources,
                        "conditions": [
                            {"type": "Ready", "status": "True", "reason": "KubeletReady"}
                        ],
                    }
                },
            )
            self.core.patch_node(name, {"spec": {"taints": None}})
            kubelet = self.work / f"{short}-kubelet.yaml"
            if policy is not None:
                kubelet.write_text(
                    f"kind: KubeletConfiguration\ntopologyManagerPolicy: {policy}\n"
                    "topologyManagerScope: container\n"
                )
            agents.append(self._agent(name, used, kubelet, flags))
        for proc in agents:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode(errors="replace")[-3000:]

    def _agent(
        self, node: str, used: tuple[int, ...], kubelet: Path, flags: tuple[str, ...]
    ) -> subprocess.Popen[bytes]:
        """`run --once --availability --nrt` with `used` GPUs allocated (simulated)."""
        return subprocess.Popen(
            [
                *CLI,
                "run",
                "--once",
                "--simulate",
                PROFILE,
                "--node",
                node,
                "--listen",
                "",
                "--availability",
                "--nrt",
                "--simulate-used",
                ",".join(map(str, used)),
                "--kubelet-config",
                str(kubelet),
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env(KUBECONFIG=str(self.server.kubeconfig), TOPO_REPORTER_LOG_FORMAT="json"),
        )

    def start(self) -> None:
        config = docs_nrt_configuration()
        (profile,) = config["profiles"]
        profile["schedulerName"] = self.scheduler_name
        config["leaderElection"] = {"leaderElect": False}
        config["clientConnection"] = {"kubeconfig": str(self.server.kubeconfig)}
        path = self.work / "scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        self._scheduler = start_harness(
            self.scheduler, ["--config", str(path)], self.work / "scheduler.log"
        )

    def zone_gpus(self, short: str) -> dict[str, str]:
        """Available GPUs per zone in the node's object, as the agent wrote it."""
        held = self.store.get(self.nodes[short])
        assert held is not None
        return {
            z["name"]: next(r["available"] for r in z["resources"] if r["name"] == nrt.GPU_RESOURCE)
            for z in held["zones"]
        }

    def create_pod(
        self, name: str, short: str, gpus: tuple[int, ...] = (1,), cpu: str = "1"
    ) -> str:
        """A Guaranteed pod, one container per entry of `gpus`, for the Node `short` alone."""
        containers = [
            k8s.V1Container(
                name=f"c{i}",
                image="registry.k8s.io/pause:3.10",
                resources=k8s.V1ResourceRequirements(
                    limits={"cpu": cpu, "memory": "1Gi", **({GPU: str(n)} if n else {})},
                    requests={"cpu": cpu, "memory": "1Gi", **({GPU: str(n)} if n else {})},
                ),
            )
            for i, n in enumerate(gpus)
        ]
        self.core.create_namespaced_pod(
            self.namespace,
            k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(name=name),
                spec=k8s.V1PodSpec(
                    scheduler_name=self.scheduler_name,
                    node_selector={GROUP_LABEL: self.nodes[short]},
                    automount_service_account_token=False,
                    containers=containers,
                ),
            ),
        )
        return name

    def wait_bound(self, pod: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.core.read_namespaced_pod(pod, self.namespace)
            if found.spec.node_name:
                return str(found.spec.node_name)
            self._alive()
            assert time.monotonic() < deadline, (
                f"{pod} not bound: {found.status.conditions}\n{self.log()}"
            )
            time.sleep(0.1)

    def wait_unschedulable(self, pod: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            verdict = self.judged(pod)
            assert verdict is None or not verdict[0], f"{pod} was bound to {verdict}"
            if verdict is not None:
                return verdict[1]
            self._alive()
            assert time.monotonic() < deadline, f"{pod} never judged: {self.log()}"
            time.sleep(0.1)

    def judged(self, pod: str) -> tuple[bool, str] | None:
        """(True, node) once bound, (False, reason) once found unschedulable, else None."""
        found = self.core.read_namespaced_pod(pod, self.namespace)
        if found.spec.node_name:
            return True, str(found.spec.node_name)
        for condition in found.status.conditions or ():
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return False, str(condition.message)
        return None

    def first_verdict(self, name: str, short: str, bound: bool) -> str:
        """Fresh one-GPU pods for `short`, one after another, until one is bound (`bound`) or
        refused: the node or the reason. A pod refused before the plugin's cache took a new
        object waits for the next cluster event, so each try is a new pod."""
        deadline = time.monotonic() + WAIT_S
        for attempt in itertools.count():
            pod = self.create_pod(f"{name}-{attempt}", short)
            while (verdict := self.judged(pod)) is None:
                self._alive()
                assert time.monotonic() < deadline, f"{pod} never judged: {self.log()}"
                time.sleep(0.1)
            if verdict[0] == bound:
                return verdict[1]
            self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)
            wanted = "bound" if bound else "refused"
            assert time.monotonic() < deadline, (
                f"no pod {wanted} in {WAIT_S:.0f} s: {verdict}\n{self.log()}"
            )
            time.sleep(0.5)
        raise AssertionError("unreachable")

    def _alive(self) -> None:
        assert self._scheduler is not None
        assert self._scheduler.poll() is None, f"the scheduler exited: {self.log()}"

    def log(self) -> str:
        path = self.work / "scheduler.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        if self._scheduler is not None:
            stop_process(self._scheduler)
        with contextlib.suppress(k8s.ApiException):
            for pod in self.core.list_namespaced_pod(self.namespace).items:
                self.core.delete_namespaced_pod(
                    pod.metadata.name, self.namespace, grace_period_seconds=0
                )
        for node in self.nodes.values():
            self.store.delete(node)
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_node(node)
        with contextlib.suppress(k8s.ApiException):
            self.core.delete_namespace(self.namespace)
            self.core.replace_namespace_finalize(
                self.namespace,
                k8s.V1Namespace(
                    metadata=k8s.V1ObjectMeta(name=self.namespace), spec=k8s.V1NamespaceSpec()
                ),
            )


@pytest.fixture(scope="module")
def cluster(
    real_apiserver: RealApiServer,
    real_nrt_crd: str,
    plugins_bin: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NrtCluster]:
    made = NrtCluster(
        real_apiserver, Store(real_apiserver), tmp_path_factory.mktemp("nrt-sched"), plugins_bin
    )
    try:
        made.add_nodes()
        made.start()
        yield made
    finally:
        made.close()


def test_the_agents_objects_carry_the_allocations_and_the_policies(cluster: NrtCluster) -> None:
    assert cluster.zone_gpus("upper-used") == {"node-0": "4", "node-1": "0"}
    assert cluster.zone_gpus("split") == {"node-0": "3", "node-1": "3"}
    held = cluster.store.get(cluster.nodes["split-pod-scope"])
    assert held is not None
    attributes = {a["name"]: a["value"] for a in held["attributes"]}
    assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == (
        "single-numa-node",
        "pod",
    )


def test_four_gpus_fit_one_numa_node_with_four_free_and_not_three_plus_three(
    cluster: NrtCluster,
) -> None:
    cluster.create_pod("four-on-upper-used", "upper-used", (4,))
    cluster.create_pod("four-on-split", "split", (4,))
    assert cluster.wait_bound("four-on-upper-used") == cluster.nodes["upper-used"]
    assert "cannot align container" in cluster.wait_unschedulable("four-on-split")


def test_two_containers_of_two_gpus_fit_three_plus_three_under_container_scope_only(
    cluster: NrtCluster,
) -> None:
    cluster.create_pod("pair-of-pairs", "split", (2, 2))
    cluster.create_pod("pair-of-pairs-pod-scope", "split-pod-scope", (2, 2))
    assert cluster.wait_bound("pair-of-pairs") == cluster.nodes["split"]
    assert "cannot align pod" in cluster.wait_unschedulable("pair-of-pairs-pod-scope")


def test_a_pod_asking_more_cpus_than_a_zone_has_is_refused(cluster: NrtCluster) -> None:
    cluster.create_pod("a-zone-and-one", "cpus", (0,), cpu=str(ZONE_CPUS + 1))
    assert "cannot align container" in cluster.wait_unschedulable("a-zone-and-one")
    # The whole zone, which the Node also has: it fits.
    cluster.create_pod("a-zone", "cpus", (0,), cpu=str(ZONE_CPUS))
    assert cluster.wait_bound("a-zone") == cluster.nodes["cpus"]


def test_under_best_effort_nothing_is_filtered(cluster: NrtCluster) -> None:
    cluster.create_pod("four-best-effort", "split-best-effort", (4,))
    assert cluster.wait_bound("four-best-effort") == cluster.nodes["split-best-effort"]


def test_the_reserve_cache_shows_the_first_pods_gpus_taken_before_the_next_nrt_write(
    cluster: NrtCluster,
) -> None:
    cluster.create_pod("first", "reserve", (4,))
    assert cluster.wait_bound("first") == cluster.nodes["reserve"]
    cluster.create_pod("second", "reserve", (4,))
    assert "cannot align container" in cluster.wait_unschedulable("second")
    # The object still says four GPUs are free on node-0 (no kubelet told the agent otherwise),
    # and the scheduler counts 4 of 8 still allocatable: only the reservation refused `second`.
    assert cluster.zone_gpus("reserve") == {"node-0": "4", "node-1": "0"}


def test_a_withdrawn_object_stops_filtering_and_the_next_good_read_filters_again(
    cluster: NrtCluster,
) -> None:
    """Issue 19.2 for NodeResourceTopologyMatch: the object said 0 GPUs free, then PodResources
    reads failed. The reserve cache of the docs' stanza never forgets a deleted object, so the
    agent withdraws by replacing its object with one that names no Topology Manager policy,
    which the plugin reads as `none` (no filter); its cache takes the change at its next resync
    (an attribute change, watched). The next good read publishes the policy again."""
    node = cluster.nodes["withdrawn"]
    refused = cluster.create_pod("before-withdrawal", "withdrawn")
    assert "cannot align container" in cluster.wait_unschedulable(refused)
    # The agent of that node, now in-process: every GPU still taken at its first read.
    client = API_CLIENTS["lean"]
    output = NrtOutput(
        NrtSink(
            client(cluster.server.kubeconfig, (2.0, 2.0)),
            stop=threading.Event(),
            backoff=FAST,
            log=structlog.get_logger(),
        ),
        node=node,
        memory=lambda: MEMORY,
        prefix=PREFIX,
        policies=lambda: KubeletPolicies("single-numa-node", "container"),
        log=structlog.get_logger(),
    )
    w = wire_live(
        cluster.server.kubeconfig,
        client,
        source=FakeSource(used=set(range(8))),
        outputs=(output,),
        node=node,
    )
    assert w.agent.step()
    assert cluster.zone_gpus("withdrawn") == {"node-0": "0", "node-1": "0"}
    assert w.source is not None
    w.source.error = PodResourcesError("kubelet.sock: connection refused", reason="unavailable")
    for _ in range(WITHDRAW_AFTER):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())
    assert cluster.first_verdict("after-withdrawal", "withdrawn", bound=True) == node
    # Reads recover, every GPU still taken: the policy is back, and so is the filter.
    w.source.error = None
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    reason = cluster.first_verdict("after-recovery", "withdrawn", bound=False)
    assert "cannot align container" in reason
