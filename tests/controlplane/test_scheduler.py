"""Issue 13 item 6, end to end: the real kube-scheduler, configured with the
KubeSchedulerConfiguration stanza of docs/scheduling.md, calls `topo-reporter extender` (its own
process, watching the real kube-apiserver) and binds GPU pods.

The Nodes are built from the simulated profiles: Ready, `nvidia.com/gpu` in capacity and
allocatable, and the topology and availability published by the real agent (`topo-reporter run
--once --simulate PROFILE --availability`), for a chosen set of used GPUs: `--simulate-used`, or
what the agent reads from the kubelet's own PodResources server (the harness). No kubelet
runs, so a bound pod never starts; the scheduler still counts its GPUs, and the tests plan
allocatable for that. Everything waits on polling deadlines, never on timing; every process is
stopped at the end.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from reporter.availability import node_score
from reporter.collect import build_scanner
from reporter.collect.podresources import AllocationView, PodResourcesReader
from reporter.schema.availability import decode_availability
from reporter.schema.model import Topology
from tests.cli.test_run import CLI, env
from tests.collect.test_podresources_kubelet import KubeletPodResources, converge
from tests.support.controlplane_fixtures import (
    NODE_CAPACITY,
    RealApiServer,
    start_harness,
    stop_process,
    unique,
)
from tests.support.fault_proxy import FaultProxy, Lag
from tests.support.kube_double.tls import Certificate, make_certificate
from tests.support.podresources_double import devices_state, pod_state

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
WAIT_S = 60.0
"""Generous: the scheduler, the extender and the agents share two loaded cores in CI."""
PROBE_GPUS = 257
"""More GPUs than any node has: the extender's filter answer to it names every node's free count."""
GROUP_LABEL = "e2e.topo-reporter.io/group"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


def docs_scheduler_configuration() -> dict[str, Any]:
    """The KubeSchedulerConfiguration with our extender that the docs tell users to write (the one
    yaml block with both; another configures scheduler-plugins for NodeResourceTopology)."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    docs = [yaml.safe_load(block) for block in blocks]
    (config,) = [
        d
        for d in docs
        if isinstance(d, dict)
        and d.get("kind") == "KubeSchedulerConfiguration"
        and d.get("extenders")
    ]
    assert isinstance(config, dict)
    return config


def scheduler_configuration(url: str, scheduler_name: str) -> dict[str, Any]:
    """The docs' stanza, pointed at this test's extender, under a profile name of its own."""
    config = docs_scheduler_configuration()
    (extender,) = config["extenders"]
    assert extender["filterVerb"] == "filter"
    assert extender["prioritizeVerb"] == "prioritize"
    assert extender["preemptVerb"] == "preempt"
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is True
    assert [r["name"] for r in extender["managedResources"]] == [GPU]
    extender["urlPrefix"] = url
    # Two busy shared cores: what is under test is the answer, not how fast it comes.
    extender["httpTimeout"] = "30s"
    (profile,) = config["profiles"]
    profile["schedulerName"] = scheduler_name
    # One scheduler per test: nothing to elect (the harness turns it off too).
    config["leaderElection"] = {"leaderElect": False}
    return config


def gpu_pod(
    name: str,
    gpus: int,
    *,
    scheduler: str,
    group: str,
    node: str | None = None,
    priority: str | None = None,
) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            scheduler_name=scheduler,
            node_name=node,
            priority_class_name=priority,
            node_selector={GROUP_LABEL: group},
            automount_service_account_token=False,
            containers=[
                k8s.V1Container(
                    name="train",
                    image="registry.k8s.io/pause:3.10",
                    resources=k8s.V1ResourceRequirements(limits={GPU: str(gpus)}),
                )
            ],
        ),
    )


def probe_args(names: Iterable[str]) -> bytes:
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: PROBE_GPUS}}}]}}
    return json.dumps({"Pod": pod, "NodeNames": list(names)}).encode()


class Cluster:
    """A group of GPU Nodes, the extender and the scheduler, on the real apiserver; `close`
    stops the processes and deletes what it made."""

    def __init__(
        self,
        server: RealApiServer,
        work: Path,
        tls: Certificate | None = None,
        extender_kubeconfig: Path | None = None,
    ) -> None:
        self.server = server
        self.tls = tls
        """The extender's certificate and key: it serves HTTPS, the scheduler verifies it."""
        self.extender_kubeconfig = extender_kubeconfig or server.kubeconfig
        """Where the extender reaches the API server (the fault proxy, for a test of its own)."""
        self.core = server.core()
        self.work = work
        self.group = unique("g")
        self.scheduler_name = f"gpu-scheduler-{self.group}"
        self.namespace = unique("e2e")
        self.nodes: dict[str, str] = {}
        """Short name (as the test says it) to Node name (unique in the run)."""
        self.availability: dict[str, str] = {}
        """Node name to the availability annotation last published."""
        self.priority_classes: list[str] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self.extender: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=self.namespace)))
        # What the serviceaccount controller would add at once: pods name it by default.
        self.core.create_namespaced_service_account(
            self.namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
        )

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_node(
        self,
        short: str,
        profile: str,
        used: Iterable[int],
        *,
        occupied: bool = False,
        priority: str | None = None,
        pod_resources: Path | None = None,
    ) -> str:
        """A Ready GPU Node of `profile` with `used` GPUs taken, as the agent publishes it.

        `occupied`: a pod (bound directly, as if the scheduler had placed it) holds the used GPUs,
        so the scheduler's own count agrees with the agent's; otherwise only the agent knows.
        `priority`: that pod's PriorityClass.
        `pod_resources`: the agent reads the used GPUs from this PodResources socket (the caller
        has seen it say `used`), not from `--simulate-used`.
        """
        name = f"{short}-{unique('n').split('-', 1)[1]}"
        self.core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, GROUP_LABEL: self.group},
                },
            }
        )
        self.nodes[short] = name
        resources = {**NODE_CAPACITY, GPU: str(GPUS_PER_NODE)}
        self.core.patch_node_status(
            name,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                }
            },
        )
        # What the node lifecycle controller does for a Ready node: the not-ready taint goes.
        self.core.patch_node(name, {"spec": {"taints": None}})
        taken = sorted(set(used))
        self.publish_availability(name, profile, taken, pod_resources)
        if occupied and taken:
            self.core.create_namespaced_pod(
                self.namespace,
                gpu_pod(
                    f"holds-{short}",
                    len(taken),
                    scheduler=self.scheduler_name,
                    group=self.group,
                    node=name,
                    priority=priority,
                ),
            )
        return name

    def add_priority_classes(self, **values: int) -> dict[str, str]:
        """PriorityClasses by short name (`high=1000`), named uniquely for this run; `close`
        deletes them."""
        scheduling = k8s.SchedulingV1Api(self.server.api())
        names = {}
        for short, value in values.items():
            name = f"{short}-{self.group}"
            scheduling.create_priority_class(
                k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name=name), value=value)
            )
            self.priority_classes.append(name)
            names[short] = name
        return names

    def publish_availability(
        self, node: str, profile: str, used: Iterable[int], pod_resources: Path | None = None
    ) -> None:
        """The agent, once, with availability on: the node's topology, and its free GPUs with
        `used` taken (from `--simulate-used`, or from the PodResources socket, which says so)."""
        taken = sorted(set(used))
        source = (
            ["--simulate-used", ",".join(map(str, taken))]
            if pod_resources is None
            else ["--pod-resources-socket", str(pod_resources)]
        )
        run_agent(self.server, node, profile, "--availability", *source)
        meta = self.core.read_node(node).metadata
        text = (meta.annotations or {})[f"{PREFIX}/availability"]
        free = [g.index for g in simulated(profile).gpus if g.index not in taken]
        assert decode_availability(text).free == tuple(free), text
        self.availability[node] = text

    def start(self) -> None:
        """The extender, then (once it sees every node as published) the scheduler: both list
        the Nodes as they are now, so neither starts with a partial view."""
        log = self.work / "extender.log"
        self.extender = start_harness(
            Path(sys.executable),
            [
                "-m",
                "reporter.cli",
                "extender",
                "--listen",
                "127.0.0.1:0",
                "--kubeconfig",
                str(self.extender_kubeconfig),
                "--log-format",
                "json",
                *(
                    ()
                    if self.tls is None
                    else (
                        "--tls-cert-file",
                        str(self.tls.cert),
                        "--tls-key-file",
                        str(self.tls.key),
                    )
                ),
            ],
            log,
        )
        self._processes.append(self.extender)
        scheme = "http" if self.tls is None else "https"
        self.url = f"{scheme}://{self._serving_address(log)}"
        self.wait_for_the_extender()
        config = self.work / "scheduler.yaml"
        stanza = scheduler_configuration(self.url, self.scheduler_name)
        if self.tls is not None:
            # As docs/scheduling.md says under TLS: HTTPS, the certificate checked against its CA.
            stanza["extenders"][0].update(
                enableHTTPS=True, tlsConfig={"caFile": str(self.tls.cert)}
            )
        config.write_text(yaml.safe_dump(stanza))
        self._processes.append(
            start_harness(
                self.server.binary,
                ["scheduler", "--config", str(config), "--kubeconfig", str(self.server.kubeconfig)],
                self.work / "scheduler.log",
            )
        )

    def _serving_address(self, log: Path) -> str:
        deadline = time.monotonic() + WAIT_S
        while True:
            for line in log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict) and event.get("event") == "serving":
                        return str(event["address"])
            self._alive()
            assert time.monotonic() < deadline, f"the extender never served: {self.logs()}"
            time.sleep(0.1)

    def wait_for_the_extender(self) -> None:
        """Until the extender's view of every node is the availability last published.

        Its filter answer to a pod of more GPUs than any node has names each node's free count
        (a node it has not read yet is never filtered)."""
        want = {
            node: f"topo-reporter: {len(decode_availability(text).free)} free {GPU}, "
            f"the pod needs {PROBE_GPUS}"
            for node, text in self.availability.items()
        }
        deadline = time.monotonic() + WAIT_S
        seen: Any = None
        while True:
            self._alive()
            connection = self._connection()
            try:
                connection.request("POST", "/filter", probe_args(want))
                response = connection.getresponse()
                seen = json.loads(response.read()) if response.status == 200 else None
            except OSError:
                seen = None  # not listening yet
            finally:
                connection.close()
            if seen is not None and seen["FailedNodes"] == want:
                return
            assert time.monotonic() < deadline, f"the extender sees {seen}, not {want}"
            time.sleep(0.1)

    def create_pod(self, name: str, gpus: int) -> str:
        self.core.create_namespaced_pod(
            self.namespace, gpu_pod(name, gpus, scheduler=self.scheduler_name, group=self.group)
        )
        return name

    def wait_bound(self, pod: str) -> str:
        """The node the scheduler binds `pod` to."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.core.read_namespaced_pod(pod, self.namespace)
            if found.spec.node_name:
                return str(found.spec.node_name)
            self._alive()
            assert time.monotonic() < deadline, (
                f"{pod} not bound: {found.status.conditions}\n{self.logs()}"
            )
            time.sleep(0.1)

    def schedule(self, pod: str, gpus: int) -> str:
        return self.wait_bound(self.create_pod(pod, gpus))

    def wait_unschedulable(self, pod: str) -> str:
        """The scheduler's message once it has found no node for `pod`."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.core.read_namespaced_pod(pod, self.namespace)
            assert not found.spec.node_name, f"{pod} was bound to {found.spec.node_name}"
            for condition in found.status.conditions or ():
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return str(condition.message)
            self._alive()
            assert time.monotonic() < deadline, f"{pod} never judged: {self.logs()}"
            time.sleep(0.1)

    def extender_calls(self, verb: str) -> float:
        """The calls of `verb` the extender answered, from its /metrics."""
        return self.extender_metric(
            f'topo_reporter_extender_requests_total{{result="ok",verb="{verb}"}}'
        )

    def extender_metric(self, sample: str) -> float:
        """The value of one sample (name and labels) of the extender's /metrics."""
        connection = self._connection()
        try:
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        line = f"{sample} "
        return sum(float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line))

    def _connection(self) -> http.client.HTTPConnection:
        """A connection to the extender, over TLS (verifying its certificate) when it serves it."""
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        if self.tls is None:
            return http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
        context = ssl.create_default_context(cafile=str(self.tls.cert))
        return http.client.HTTPSConnection(host, int(port), timeout=WAIT_S, context=context)

    def kill_extender(self) -> None:
        assert self.extender is not None
        self.extender.kill()
        self.extender.wait(timeout=WAIT_S)

    def _alive(self) -> None:
        for proc in self._processes:
            if proc is not self.extender or proc.returncode is None:
                assert proc.poll() is None, f"{proc.args[1]} exited: {self.logs()}"

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted(self.work.glob("*.log"))
        )

    def close(self) -> None:
        for proc in reversed(self._processes):
            stop_process(proc)
        with contextlib.suppress(k8s.ApiException):
            for pod in self.core.list_namespaced_pod(self.namespace).items:
                # No kubelet confirms a graceful delete: a bound pod goes only when forced.
                self.core.delete_namespaced_pod(
                    pod.metadata.name, self.namespace, grace_period_seconds=0
                )
        for node in self.nodes.values():
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_node(node)
        for name in self.priority_classes:
            with contextlib.suppress(k8s.ApiException):
                k8s.SchedulingV1Api(self.server.api()).delete_priority_class(name)
        with contextlib.suppress(k8s.ApiException):
            self.core.delete_namespace(self.namespace)
            # No namespace controller runs to finish the delete: finalize as it would.
            self.core.replace_namespace_finalize(
                self.namespace,
                k8s.V1Namespace(
                    metadata=k8s.V1ObjectMeta(name=self.namespace), spec=k8s.V1NamespaceSpec()
                ),
            )


def simulated(profile: str) -> Topology:
    """The machine `topo-reporter run --simulate PROFILE` scans."""
    topology = build_scanner("auto", Path("/nonexistent"), profile).scan().topology
    assert topology is not None
    return topology


def held(reader: PodResourcesReader, topology: Topology, want: Iterable[int]) -> frozenset[int]:
    """The GPUs the kubelet says are held, once it says `want` (it rereads its state file on its
    own time)."""
    wanted = frozenset(want)
    view: AllocationView = converge(
        lambda: reader.allocated(topology), lambda v: v.allocated == wanted
    )
    return view.allocated


def run_agent(server: RealApiServer, node: str, profile: str, *args: str) -> None:
    """The real agent, once: it publishes the node's topology labels and annotations."""
    result = subprocess.run(
        [*CLI, "run", "--once", "--simulate", profile, "--node", node, "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(server.kubeconfig), TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


PLACEMENT: Mapping[str, tuple[str, tuple[int, ...]]] = {
    # short name: (profile, used GPUs)
    "pcie-free": ("pcie-8x", ()),  # 8 free, no NVLink between any two
    "h100-free": ("dgx-h100", ()),  # 8 free on NVSwitch
    "h100-half": ("dgx-h100", (0, 1, 2, 3)),  # 4 free: one NUMA node, an island of exactly 4
    "a100-pair": ("dgx-a100", (2, 3, 4, 5, 6, 7)),  # 2 free: one NVLink pair, one NUMA node
}


@pytest.fixture(scope="module")
def placement(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Four nodes whose used GPUs are held by pods, so the scheduler's count agrees: count-only
    scoring (LeastAllocated) prefers the emptiest nodes, the extender the best free set."""
    with Cluster(real_apiserver, tmp_path_factory.mktemp("placement")) as cluster:
        for short, (profile, used) in PLACEMENT.items():
            cluster.add_node(short, profile, used, occupied=True)
        cluster.start()
        yield cluster


@pytest.mark.parametrize(
    ("gpus", "best"),
    [(2, "a100-pair"), (4, "h100-half"), (8, "h100-free")],
    ids=[
        "2 GPUs: the NVLink pair that is exactly big enough",
        "4 GPUs: the 4-GPU island on one NUMA node, not a cut of a whole free NVSwitch node",
        "8 GPUs: the free NVSwitch node, not the free PCIe node",
    ],
)
def test_a_pod_lands_on_the_node_with_the_best_free_connected_set(
    placement: Cluster, gpus: int, best: str
) -> None:
    scores = {
        short: node_score(decode_availability(placement.availability[node]), gpus)
        for short, node in placement.nodes.items()
    }
    # The design: one node ranks first, and it is not the node with the most free GPUs.
    assert sorted(scores.values())[-2] < scores[best], scores
    assert best != "pcie-free"

    calls = placement.extender_calls("prioritize")
    assert placement.schedule(f"train-{gpus}", gpus) == placement.nodes[best]
    assert placement.extender_calls("prioritize") > calls  # the scheduler asked it


def test_with_the_extender_down_pods_are_still_scheduled(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    with Cluster(real_apiserver, tmp_path) as cluster:
        # The agent says 2 free; the scheduler, which sees no pod there, counts 8: only the
        # extender stands between a 4-GPU pod and this node.
        node = cluster.add_node("h100", "dgx-h100", range(6))
        cluster.start()
        cluster.create_pod("while-up", 4)
        assert f"topo-reporter: 2 free {GPU}, the pod needs 4" in cluster.wait_unschedulable(
            "while-up"
        )

        cluster.kill_extender()
        assert cluster.schedule("while-down", 4) == node


def test_the_scheduler_calls_the_extender_over_https(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    # Issue 19, item 7: kube-scheduler's enableHTTPS and tlsConfig.caFile against the extender's
    # --tls-cert-file. Only the extender can refuse this pod (the scheduler counts 8 free GPUs):
    # its reason in the scheduler's message means the call went over TLS and was answered.
    certificate = make_certificate(tmp_path)
    with Cluster(real_apiserver, tmp_path, tls=certificate) as cluster:
        node = cluster.add_node("h100", "dgx-h100", range(6))
        cluster.start()
        cluster.create_pod("over-https", 4)
        assert f"topo-reporter: 2 free {GPU}, the pod needs 4" in cluster.wait_unschedulable(
            "over-https"
        )
        assert cluster.extender_calls("filter") >= 1
        assert cluster.schedule("fits", 2) == node


def test_a_state_change_from_pod_resources_reaches_the_next_scheduling_decision(
    real_apiserver: RealApiServer, controlplane_bin: Path, tmp_path: Path
) -> None:
    # Node A's allocations come from the kubelet's own PodResources server (the harness), read
    # by the agent's PodResourcesReader; node B's are simulated.
    topology = simulated("dgx-h100")
    ids = [str(g.uuid) for g in topology.gpus]
    socket_dir = Path(tempfile.mkdtemp(prefix="e2e-k-", dir="/tmp"))  # a unix socket path is short
    kubelet = KubeletPodResources(
        controlplane_bin, socket_dir / "kubelet.sock", socket_dir / "state.json"
    )
    holder = pod_state("holder", GPU, ids[:4])
    kubelet.write({"devices": devices_state(GPU, ids), "pods": [holder]})
    kubelet.start()
    try:
        with (
            Cluster(real_apiserver, tmp_path) as cluster,
            PodResourcesReader(kubelet.socket) as reader,
        ):
            # Both have 4 free; the scheduler counts 8 free on each (no pod holds the others).
            a = cluster.add_node(
                "h100-a",
                "dgx-h100",
                held(reader, topology, range(4)),  # 4-7 free
                pod_resources=kubelet.socket,
            )
            b = cluster.add_node("h100-b", "dgx-h100", (0, 1, 6, 7))  # free 2-5: two NUMA nodes
            cluster.start()
            assert cluster.schedule("first", 4) == a

            # The kubelet starts `first` on GPUs 4-7. The scheduler still counts 4 free on A,
            # and A's old best set would still win; the agent's next read says none is free.
            kubelet.write(
                {
                    "devices": devices_state(GPU, ids),
                    "pods": [holder, pod_state("first", GPU, ids[4:], cluster.namespace)],
                }
            )
            cluster.publish_availability(
                a, "dgx-h100", held(reader, topology, range(8)), kubelet.socket
            )
            cluster.wait_for_the_extender()
            assert cluster.schedule("second", 4) == b
    finally:
        kubelet.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_pod_of_4_is_held_for_a_connected_set_until_a_node_frees_one(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    # The PCIe node has 8 free GPUs and no NVLink; the NVSwitch node, which could give a
    # connected 4-set, is busy: a pod holds 6 of its GPUs, so the scheduler itself counts 2 free.
    with Cluster(real_apiserver, tmp_path) as cluster:
        pcie = cluster.add_node("pcie", "pcie-8x", ())
        h100 = cluster.add_node("h100", "dgx-h100", range(6), occupied=True)
        cluster.start()

        # A pod that says never to hold it takes the first 4 free GPUs of the PCIe node at once.
        impatient = gpu_pod("impatient", 4, scheduler=cluster.scheduler_name, group=cluster.group)
        impatient.metadata.annotations = {f"{PREFIX}/connected-wait": "0"}
        cluster.core.create_namespaced_pod(cluster.namespace, impatient)
        assert cluster.wait_bound("impatient") == pcie

        cluster.create_pod("patient", 4)
        message = cluster.wait_unschedulable("patient")
        assert (
            f"topo-reporter: no NVLink-connected set of 4 {GPU} free here; holding the pod for "
            "one up to 2h (waited "
        ) in message, message
        holds = cluster.extender_metric("topo_reporter_extender_holds_total")
        assert holds >= 1

        # The agent says the NVSwitch node is free while the scheduler still counts its pod: the
        # Node update requeues the pod (the extender rejected it), and it is held again.
        cluster.publish_availability(h100, "dgx-h100", ())
        deadline = time.monotonic() + WAIT_S
        while cluster.extender_metric("topo_reporter_extender_holds_total") == holds:
            assert time.monotonic() < deadline, "the Node update did not requeue the held pod"
            time.sleep(0.1)
        cluster.wait_for_the_extender()

        # Its pod ends: the NVSwitch node is a candidate with a connected 4-set, and gets it.
        cluster.core.delete_namespaced_pod("holds-h100", cluster.namespace, grace_period_seconds=0)
        assert cluster.wait_bound("patient") == h100


def preemption_cluster(cluster: Cluster, nvswitch_holder: str) -> dict[str, str]:
    """Issue 28, item 1's cluster: PriorityClasses high and low; `pcie2` with 4 free GPUs that
    are not connected (a high pod holds the others); `pcie` with 2 free and 6 held by a low pod;
    an NVSwitch node with 2 free and 6 held by a pod of `nvswitch_holder` (high or low): capable,
    so the extender holds a high pod of 4. Returns the PriorityClass names."""
    classes = cluster.add_priority_classes(high=1000, low=100)
    cluster.add_node("pcie2", "pcie-8x", range(4), occupied=True, priority=classes["high"])
    cluster.add_node("pcie", "pcie-8x", range(6), occupied=True, priority=classes["low"])
    cluster.add_node("h100", "dgx-h100", range(6), occupied=True, priority=classes[nvswitch_holder])
    cluster.start()
    return classes


def create_high_pod(cluster: Cluster, classes: Mapping[str, str], name: str) -> None:
    pod = gpu_pod(
        name, 4, scheduler=cluster.scheduler_name, group=cluster.group, priority=classes["high"]
    )
    cluster.core.create_namespaced_pod(cluster.namespace, pod)


def evicted(cluster: Cluster, pod: str) -> bool:
    """Whether preemption took `pod`: the scheduler deletes a victim (no kubelet ends it, so it
    stays, with its deletion time set)."""
    found = cluster.core.read_namespaced_pod(pod, cluster.namespace)
    return found.metadata.deletion_timestamp is not None


def test_a_held_pod_evicts_nothing_on_nodes_that_cannot_give_it_a_connected_set(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    # Issue 28, item 1, on the real kube-scheduler with DefaultPreemption on (its default
    # profile). The NVSwitch node's pod is high: evicting it is not allowed, so no node can give
    # the held pod a connected set now, and no pod may be evicted for it.
    with Cluster(real_apiserver, tmp_path) as cluster:
        classes = preemption_cluster(cluster, nvswitch_holder="high")
        create_high_pod(cluster, classes, "patient")
        message = cluster.wait_unschedulable("patient")
        assert "holding the pod for one up to 2h" in message, message

        # Preemption ran and asked the extender, twice: each time the scheduler offered the low
        # pod on `pcie`, whose eviction frees 8 GPUs that are never connected.
        deadline = time.monotonic() + WAIT_S
        while cluster.extender_calls("preempt") < 2:
            assert time.monotonic() < deadline, f"preemption never asked: {cluster.logs()}"
            assert not evicted(cluster, "holds-pcie"), "a victim on a PCIe node"
            time.sleep(0.1)
        assert cluster.extender_metric("topo_reporter_extender_preemption_vetoed_nodes_total") >= 2
        assert not evicted(cluster, "holds-pcie")
        found = cluster.core.read_namespaced_pod("patient", cluster.namespace)
        assert not found.spec.node_name
        assert not found.status.nominated_node_name


def test_a_held_pod_evicts_where_that_gives_it_a_connected_set_and_lands_there(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    # The rule for a pod preemption could serve connected: the same cluster, but the NVSwitch
    # node's pod is low. Evicting it frees 8 connected GPUs; the low pod on `pcie` is spared.
    with Cluster(real_apiserver, tmp_path) as cluster:
        classes = preemption_cluster(cluster, nvswitch_holder="low")
        h100 = cluster.nodes["h100"]
        create_high_pod(cluster, classes, "patient")
        deadline = time.monotonic() + WAIT_S
        while not evicted(cluster, "holds-h100"):
            assert time.monotonic() < deadline, f"no victim on the NVSwitch node: {cluster.logs()}"
            time.sleep(0.1)
        found = cluster.core.read_namespaced_pod("patient", cluster.namespace)
        assert found.status.nominated_node_name == h100
        assert not evicted(cluster, "holds-pcie")

        # The victim ends (forced: no kubelet) and the agent says its GPUs are free: the held
        # pod takes a connected set there.
        cluster.core.delete_namespaced_pod("holds-h100", cluster.namespace, grace_period_seconds=0)
        cluster.publish_availability(h100, "dgx-h100", ())
        assert cluster.wait_bound("patient") == h100
        assert not evicted(cluster, "holds-pcie")


def test_a_held_pod_lands_though_the_extenders_watch_brings_the_freed_node_late(
    real_apiserver: RealApiServer, tmp_path: Path
) -> None:
    # Issue 41, item 9: the test above, with the extender's Node watch through the fault proxy,
    # each piece of its stream relayed a minute late: the scheduler's retry on the agent's update
    # always reaches the extender before its watch has it. Before the fix the retry read the old
    # availability (2 free), held the pod again, and nothing retried it for 5 minutes: "patient
    # not bound". Now the retry reads the node it disagrees on from the API server and passes.
    (tmp_path / "proxy").mkdir()
    with FaultProxy(real_apiserver.kubeconfig, tmp_path / "proxy") as proxy:
        proxy.inject("GET", "/api/v1/nodes", Lag(WAIT_S), times=1_000, query="watch=")
        kubeconfig = proxy.kubeconfig(tmp_path / "proxy.kubeconfig")
        with Cluster(real_apiserver, tmp_path, extender_kubeconfig=kubeconfig) as cluster:
            classes = preemption_cluster(cluster, nvswitch_holder="low")
            h100 = cluster.nodes["h100"]
            create_high_pod(cluster, classes, "patient")
            deadline = time.monotonic() + WAIT_S
            while not evicted(cluster, "holds-h100"):
                assert time.monotonic() < deadline, f"no victim: {cluster.logs()}"
                time.sleep(0.1)

            cluster.core.delete_namespaced_pod(
                "holds-h100", cluster.namespace, grace_period_seconds=0
            )
            cluster.publish_availability(h100, "dgx-h100", ())
            assert cluster.wait_bound("patient") == h100
            stale = 'topo_reporter_extender_fresh_node_reads_total{result="stale"}'
            assert cluster.extender_metric(stale) >= 1
            assert not evicted(cluster, "holds-pcie")


FABRIC_TAINT = {"key": f"{PREFIX}/fabric-health", "value": "unhealthy", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "change",
    [{"spec": {"unschedulable": True}}, {"spec": {"taints": [FABRIC_TAINT]}}],
    ids=["the NVSwitch node is cordoned", "the NVSwitch node is tainted fabric-health=unhealthy"],
)
def test_a_pod_is_not_held_for_a_node_it_cannot_use(
    real_apiserver: RealApiServer, tmp_path: Path, change: dict[str, Any]
) -> None:
    # Issue 28, item 10: the test above, with the only node that could give a connected set
    # closed to the pod. Nothing is worth waiting for: the pod takes the PCIe node at once.
    with Cluster(real_apiserver, tmp_path) as cluster:
        pcie = cluster.add_node("pcie", "pcie-8x", ())
        h100 = cluster.add_node("h100", "dgx-h100", range(6), occupied=True)
        cluster.core.patch_node(h100, change)
        cluster.start()
        assert cluster.schedule("unheld", 4) == pcie
        assert cluster.extender_metric("topo_reporter_extender_holds_total") == 0
