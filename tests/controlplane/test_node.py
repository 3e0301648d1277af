"""The node harness (`controlplane node`, tests/support/node_harness.py): the real kubelet v1.37.2
on containerd registers, runs pods on its CNI bridge that reach the apiserver through the
`kubernetes` Service, and leaves nothing behind; the double of NVIDIA's device plugin registers
nvidia.com/gpu through the kubelet's own Device Plugin API, answers GetPreferredAllocation with
`topo-reporter best-set`'s choice, and withdraws and restores GPUs as a real plugin's failures do.

Each test starts its own node (about 2 s) on the module's own apiserver, with the controllers a
DaemonSet needs; `running_node` checks the host afterwards (mounts, processes, cgroups, bridge,
addresses, sysctls, directories, iptables)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client as k8s

from reporter.collect.podresources_v1 import api_pb2, api_pb2_grpc
from tests.support.controlplane_fixtures import go_module_dir
from tests.support.image_support import built_image
from tests.support.node_harness import (  # noqa: F401  # the node_cluster fixture
    NodeCluster,
    RealNode,
    image_archive,
    node_cluster,
    topo_reporter,
    wait_until,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

HARNESS = Path(__file__).resolve().parent
TOPOLOGY = (
    HARNESS.parents[0] / "fixtures/nvidia-smi/01-dgx1-style-8x-v100-nv1-nv2-nic-gpu-numa-id.txt"
)
"""A DGX-1-style 8 × V100: NV1 and NV2 links, GPUs 0-3 on NUMA node 0, 4-7 on 1."""
GPUS = [
    {"id": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'node-harness/{i}')}", "numa": 0 if i < 4 else 1}
    for i in range(8)
]
"""The simulated machine's GPUs in index order, as nvidia-smi names them (GPU-<UUID>)."""
GPU = "nvidia.com/gpu"
PAUSE = "localhost/controlplane/pause:3.10"
ROOT_CA = "metadata.name=kube-root-ca.crt"
SA = "metadata.name=default"
STATUS_TIMEOUT_S = 60.0
"""The kubelet reports allocatable every nodeStatusUpdateFrequency (2 s here: its default of 10 s
made the plugin-failure tests wait most of a minute)."""


def _node(cluster: NodeCluster, name: str) -> k8s.V1Node:
    node: k8s.V1Node = cluster.core().read_node(name)
    return node


def _allocatable(cluster: NodeCluster, name: str) -> int:
    return int((_node(cluster, name).status.allocatable or {}).get(GPU, "0"))


def _pod(
    namespace: str, name: str, node: str, gpus: int, image: str = PAUSE, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def _phase(cluster: NodeCluster, namespace: str, name: str) -> str:
    return str(cluster.core().read_namespaced_pod(name, namespace).status.phase)


def _run(cluster: NodeCluster, node: RealNode, pod: dict[str, Any], phase: str = "Running") -> None:
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    cluster.core().create_namespaced_pod(namespace, pod)
    wait_until(
        f"pod {name} {phase}", lambda: _phase(cluster, namespace, name) == phase, log=node.log_tail
    )


def _pod_devices(node: RealNode) -> tuple[dict[str, list[str]], list[str]]:
    """The real kubelet's PodResources answer, over its socket: GPUs per pod, and allocatable."""
    socket = node.root / "kubelet" / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=30)
        allocatable = stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=30
        )
    pods = {
        p.name: sorted(
            i
            for c in p.containers
            for d in c.devices
            if d.resource_name == GPU
            for i in d.device_ids
        )
        for p in listed.pod_resources
    }
    free = sorted(i for d in allocatable.devices if d.resource_name == GPU for i in d.device_ids)
    return pods, free


def _best_set(gpus: int, available: list[str]) -> list[str]:
    """What `topo-reporter best-set` picks on the simulated machine, as device IDs."""
    index = {d["id"]: i for i, d in enumerate(GPUS)}
    chosen = subprocess.run(
        [topo_reporter(), "best-set", "--gpus", str(gpus), "--format", "json",
         "--available", ",".join(str(index[i]) for i in available), str(TOPOLOGY)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [str(GPUS[i]["id"]) for i in json.loads(chosen.stdout)["gpus"]]


def _links(ids: list[str]) -> set[str]:
    """The links between every pair of these GPUs, as the machine's `nvidia-smi topo -m` says."""
    rows = [
        line.split("\t")
        for line in TOPOLOGY.read_text().splitlines()
        if line.startswith("GPU") and "\t" in line
    ]
    index = [next(i for i, d in enumerate(GPUS) if d["id"] == gpu) for gpu in ids]
    return {rows[a][1 + b].strip() for a in index for b in index if a < b}


def _container_env(node: RealNode, namespace: str, pod: str) -> dict[str, str]:
    """The environment containerd gave the pod's container `main` (its OCI spec), read with ctr."""
    ctr = ["ctr", "-a", str(node.root / "containerd" / "containerd.sock"), "-n", "k8s.io"]
    listed = subprocess.run(
        [*ctr, "containers", "ls", "-q"], capture_output=True, text=True, timeout=30, check=True
    )
    found = []
    for container in listed.stdout.split():
        info = json.loads(
            subprocess.run(
                [*ctr, "containers", "info", container],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout
        )  # fmt: skip
        labels = info.get("Labels") or {}
        if (
            labels.get("io.kubernetes.pod.name") == pod
            and labels.get("io.kubernetes.pod.namespace") == namespace
            and labels.get("io.kubernetes.container.name") == "main"
        ):
            found.append(dict(e.split("=", 1) for e in info["Spec"]["process"]["env"]))
    assert len(found) == 1, found
    return found[0]


def test_the_pause_source_is_the_kubelet_modules_own() -> None:
    ours = (HARNESS / "pause" / "pause.c").read_bytes()
    upstream = go_module_dir("k8s.io/kubernetes", "v1.37.2") / "build/pause/linux/pause.c"
    assert ours == upstream.read_bytes()


def test_the_node_registers_runs_a_gpu_pod_and_leaves_nothing(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    with node_cluster.node(tmp_path, "real-node-a", devices=GPUS[:2]) as node:
        got = _node(node_cluster, node.name)
        info = got.status.node_info
        assert (info.kubelet_version, info.container_runtime_version.split("://")[0]) == (
            "v1.37.2",
            "containerd",
        )
        addresses = {a.type: a.address for a in got.status.addresses}
        assert addresses["InternalIP"].startswith("10.244."), addresses
        assert got.status.allocatable[GPU] == "2"
        config = yaml.safe_load(node.kubelet_config.read_text())
        assert (config["failCgroupV1"], config["makeIPTablesUtilChains"]) == (False, False)
        assert (node.root / "kubelet" / "pod-resources" / "kubelet.sock").is_socket()
        # nodelifecycle lifts the not-ready taint; serviceaccount and root-ca-cert-publisher make
        # what a projected token needs.
        wait_until(
            "no taints", lambda: not _node(node_cluster, node.name).spec.taints, log=node.log_tail
        )
        core = node_cluster.core()
        wait_until(
            "kube-root-ca.crt",
            lambda: core.list_namespaced_config_map("default", field_selector=ROOT_CA).items,
        )
        wait_until(
            "the default ServiceAccount",
            lambda: core.list_namespaced_service_account("default", field_selector=SA).items,
        )
        _run(node_cluster, node, _pod("default", "two-gpus", node.name, 2))
        pods, free = _pod_devices(node)
        assert pods["two-gpus"] == sorted(str(d["id"]) for d in GPUS[:2])
        assert free == sorted(str(d["id"]) for d in GPUS[:2])
        assert _container_env(node, "default", "two-gpus")["NVIDIA_VISIBLE_DEVICES"] in (
            f"{GPUS[0]['id']},{GPUS[1]['id']}", f"{GPUS[1]['id']},{GPUS[0]['id']}")  # fmt: skip
    assert not node_cluster.core().list_node(field_selector=f"metadata.name={node.name}").items


def test_a_pod_reaches_the_apiserver_through_the_kubernetes_service(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    image = built_image()
    archive = image_archive(image, tmp_path)
    script = (
        "import json, os, ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount/'\n"
        "ctx = ssl.create_default_context(cafile=sa + 'ca.crt')\n"
        "env = os.environ\n"
        "url = 'https://%s:%s/version'"
        " % (env['KUBERNETES_SERVICE_HOST'], env['KUBERNETES_SERVICE_PORT'])\n"
        "auth = {'Authorization': 'Bearer ' + open(sa + 'token').read()}\n"
        "got = urllib.request.urlopen(urllib.request.Request(url, headers=auth), context=ctx)\n"
        "routes = [l.split()[1] for l in open('/proc/net/route').read().splitlines()[1:]]\n"
        "print(json.dumps({'version': json.load(got)['gitVersion'], 'routes': routes}))\n"
    )
    with node_cluster.node(tmp_path, "real-node-b", images=[archive]) as node:
        command = ["/opt/topo-reporter/bin/python", "-c", script]
        pod = _pod(
            "default", "through-the-service", node.name, 0,
            image=image, restartPolicy="Never", container={"command": command},
        )  # fmt: skip
        _run(node_cluster, node, pod, phase="Succeeded")
        line = node.container_log("default", "through-the-service", "main").split(" F ", 1)[1]
        seen = json.loads(line)
    assert seen["version"] == "v1.37.2"
    # Its own /24 and the Service range (10.96.0.0 as /proc/net/route writes it); no default route.
    assert "0000600A" in seen["routes"]
    assert "00000000" not in seen["routes"]


def test_the_kubelet_takes_the_best_set_the_plugin_double_prefers(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    env = {
        "CONTROLPLANE_PREFERRED_ALLOCATION": json.dumps(
            [topo_reporter(), "best-set", str(TOPOLOGY)]
        )
    }
    every = [str(d["id"]) for d in GPUS]
    with node_cluster.node(tmp_path, "real-node-c", devices=GPUS, env=env) as node:
        _run(node_cluster, node, _pod("default", "first-two", node.name, 2))
        first = _best_set(2, every)
        asked = [e for e in node.events() if e.get("call") == "GetPreferredAllocation"]
        assert [(sorted(e["available"]), e["size"], e["preferred"]) for e in asked] == [
            (sorted(every), 2, first)
        ]
        pods, _ = _pod_devices(node)
        assert pods["first-two"] == sorted(first)
        # NVLink-connected, as free connected pairs existed: two NVLinks (NV2), the best.
        assert _links(first) == {"NV2"}
        # The kubelet hands Allocate its devices as a set: any order.
        visible = _container_env(node, "default", "first-two")["NVIDIA_VISIBLE_DEVICES"]
        assert sorted(visible.split(",")) == sorted(first)

        rest = [i for i in every if i not in first]
        _run(node_cluster, node, _pod("default", "then-four", node.name, 4))
        four = _best_set(4, rest)
        asked = [e for e in node.events() if e.get("call") == "GetPreferredAllocation"]
        assert (sorted(asked[-1]["available"]), asked[-1]["size"], asked[-1]["preferred"]) == (
            sorted(rest),
            4,
            four,
        )
        pods, _ = _pod_devices(node)
        assert pods["then-four"] == sorted(four)
        # Every pair of the four NVLink-joined: GPUs 4-7 were free, and are such a set.
        assert all(link.startswith("NV") for link in _links(four))

        # Deleting the pod frees its GPUs: the next pod of two is offered them again.
        node_cluster.core().delete_namespaced_pod("first-two", "default")
        wait_until(
            "first-two gone", lambda: "first-two" not in _pod_devices(node)[0], log=node.log_tail
        )
        _run(node_cluster, node, _pod("default", "two-again", node.name, 2))
        asked = [e for e in node.events() if e.get("call") == "GetPreferredAllocation"]
        assert sorted(asked[-1]["available"]) == sorted(set(every) - set(four))
        assert _pod_devices(node)[0]["two-again"] == sorted(
            _best_set(2, sorted(set(every) - set(four)))
        )


def test_the_plugin_double_fails_as_a_real_plugin_does(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    with node_cluster.node(tmp_path, "real-node-d", devices=GPUS[:4]) as node:
        socket = node.root / "kubelet" / "device-plugins" / "nvidia-gpu.sock"

        def allocatable(count: int, what: str) -> None:
            wait_until(f"{what}: allocatable {GPU} {count}",
                       lambda: _allocatable(node_cluster, node.name) == count,
                       timeout_s=STATUS_TIMEOUT_S, log=node.log_tail)  # fmt: skip

        node.control(f"unhealthy {GPUS[1]['id']}")
        allocatable(3, "one GPU unhealthy")
        node.control(f"healthy {GPUS[1]['id']}")
        allocatable(4, "healthy again")
        node.control("crash")
        assert socket.is_socket()  # left behind, as a crash leaves it
        allocatable(0, "the plugin crashed")
        node.control("start")
        allocatable(4, "restarted over its stale socket")
        node.control("stop")
        assert not socket.exists()
        allocatable(0, "the plugin stopped")
        node.control("start")
        allocatable(4, "started again")
        registered = [
            e for e in node.events() if e.get("event") in ("registered", "crashed", "stopped")
        ]
        assert [e["event"] for e in registered] == [
            "registered",
            "crashed",
            "registered",
            "stopped",
            "registered",
        ]
