"""The chart as a user installs it, on a real node (tests/support/node_harness.py): the image that
image/build.sh builds, imported into the node's containerd; `helm install` (Helm SDK) of the chart
with the agent on a simulated machine whose GPUs the device plugin double advertises; the kubelet's
own probes, config file, PodResources socket and Job runs. No fake stands where the kubelet does.

One node for the module (its apiserver, controllers and scheduler are the module's own)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from kubernetes import client as k8s
from kubernetes import watch

from parsers.cpulist import format_cpulist
from reporter.collect.simulate.machine import load_machine
from reporter.schema.keys import GPU_FREE, GPU_SETS, TOPOLOGY_MANAGER_POLICY
from tests.support.helm_chart import chart
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

MACHINE = "dgx-h100"
PREFIX = "gpu.topology.io"
NAMESPACE = "gpu-system"
POLICY = "best-effort"
"""The kubelet's Topology Manager policy: `best-effort` admits whatever the GPUs' NUMA nodes (this
host has one NUMA node; the simulated machine two)."""
LABEL_TIMEOUT_S = 120.0
"""The agent's first scan and publish follow its start by a second or two; the pod's start
(image already imported) by a few more."""


def _devices() -> list[dict[str, Any]]:
    """The simulated machine's GPUs as the device plugin double advertises them."""
    machine = load_machine(MACHINE)
    return [
        {"id": g.uuid, "numa": min(g.memory_affinity) if g.memory_affinity else 0}
        for g in machine.gpus
    ]


@pytest.fixture(scope="module")
def chart_node(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNode]:
    """The node, with the project's image imported and the labels GPU feature discovery would
    set (the chart's DaemonSet selects nvidia.com/gpu.present=true)."""
    work = tmp_path_factory.mktemp("chart-node")
    archive = image_archive(built_image(), work)
    with node_cluster.node(
        work, "chart-node", devices=_devices(), images=[archive], policy=POLICY
    ) as node:
        node_cluster.core().patch_node(
            node.name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}
        )
        node_cluster.core().create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE))
        )
        yield node


def _values() -> dict[str, Any]:
    return {
        "image": {"repository": "localhost/topo-reporter", "pullPolicy": "Never"},
        "runtimeClassName": "",
        "agent": {"simulate": MACHINE, "interval": "10s"},
        "availability": {"enabled": True},
    }


def _labels(cluster: NodeCluster, node: str) -> dict[str, str]:
    got: dict[str, str] = cluster.core().read_node(node).metadata.labels or {}
    return got


def _ours(cluster: NodeCluster, node: str) -> list[str]:
    meta = cluster.core().read_node(node).metadata
    keys = [*(meta.labels or {}), *(meta.annotations or {})]
    return sorted(k for k in keys if k.startswith(PREFIX + "/"))


def _agent_pod(cluster: NodeCluster) -> k8s.V1Pod | None:
    pods = (
        cluster.core()
        .list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=topo-reporter")
        .items
    )
    agents = [p for p in pods if not (p.metadata.labels or {}).get("job-name")]
    return agents[0] if len(agents) == 1 else None


def _ready_agent(cluster: NodeCluster) -> k8s.V1Pod | None:
    """The agent's pod once Running and Ready, else None."""
    pod = _agent_pod(cluster)
    if pod is None or pod.status.phase != "Running":
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())
    return pod if ready else None


def _started_containers(node: RealNode, pod_prefix: str, container: str) -> list[str]:
    """The IDs of `container` containers that containerd started in pods named `pod_prefix`...,
    read from its log (CRI RunPodSandbox, CreateContainer, StartContainer)."""
    log = (node.root / "logs" / "containerd.log").read_text(errors="replace")
    sandboxes = re.findall(
        rf"RunPodSandbox for &PodSandboxMetadata{{Name:{re.escape(pod_prefix)}[^,]*,.*?"
        r'returns sandbox id \\"([0-9a-f]+)\\"',
        log,
    )
    created = [
        found
        for sandbox in sandboxes
        for found in re.findall(
            rf'CreateContainer within sandbox \\"{sandbox}\\" for '
            rf"&ContainerMetadata{{Name:{re.escape(container)},.*?"
            r'returns container id \\"([0-9a-f]+)\\"',
            log,
        )
    ]
    return [c for c in created if f'StartContainer for \\"{c}\\" returns successfully' in log]


def _install_until_all_free(config: helm.Config, cluster: NodeCluster, node: RealNode) -> None:
    """The chart installed with `_values()`, once the agent has published all 8 GPUs free."""
    config.install(chart(), "tr", _values(), namespace=NAMESPACE)
    wait_until(
        "the first availability",
        lambda: _labels(cluster, node.name).get(f"{PREFIX}/{GPU_FREE}") == "8",
        timeout_s=LABEL_TIMEOUT_S,
        log=node.log_tail,
    )


def test_install_ready_through_the_kubelets_probes_then_uninstall_prunes(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    chart_node: RealNode,
    record_property: Any,
) -> None:
    config = helm.Config(kubeconfig_path=node_cluster.server.kubeconfig, namespace=NAMESPACE)
    try:
        started = time.monotonic()
        installed = config.install(chart(), "tr", _values(), namespace=NAMESPACE)
        assert (installed["revision"], installed["status"]) == (1, "deployed")
        policy_key = f"{PREFIX}/{TOPOLOGY_MANAGER_POLICY}"
        labels = wait_until(
            "the agent's labels on the Node",
            lambda: (got := _labels(node_cluster, chart_node.name)).get(f"{PREFIX}/count") and got,
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        record_property("install_to_labels_s", round(time.monotonic() - started, 2))
        assert labels[f"{PREFIX}/count"] == str(len(_devices()))
        # The kubelet's config file, read through the chart's hostPath mount: its policy.
        assert labels[policy_key] == POLICY
        pod = wait_until(
            "the agent's pod Ready (the kubelet's readiness probe on /readyz)",
            lambda: _ready_agent(node_cluster),
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        assert pod.spec.node_name == chart_node.name
        (status,) = pod.status.container_statuses
        assert (status.ready, status.restart_count) == (True, 0)

        # helm uninstall runs the pre-delete prune hook: a real Job, its pod run by this kubelet.
        config.uninstall("tr", timeout=180)
        assert _ours(node_cluster, chart_node.name) == []
        jobs = k8s.BatchV1Api(node_cluster.server.api()).list_namespaced_job(NAMESPACE).items
        assert jobs == []
        # The Job's pod and its log go once the hook succeeds (helm deletes the Job, the
        # garbage collector its pod): containerd's own log keeps that the container ran here.
        assert _started_containers(chart_node, "tr-topo-reporter-prune-", "prune"), (
            "containerd started no prune container of the Job's pod"
        )
        wait_until(
            "the agent's pod deleted (garbage collector)",
            lambda: (
                _agent_pod(node_cluster) is None
                and not node_cluster.core().list_namespaced_pod(NAMESPACE).items
            ),
            log=chart_node.log_tail,
        )
    finally:
        config.close()


def _annotations(cluster: NodeCluster, node: str) -> dict[str, str]:
    got: dict[str, str] = cluster.core().read_node(node).metadata.annotations or {}
    return got


def _gpu_pod(cluster: NodeCluster, node: RealNode, name: str, gpus: int) -> list[int]:
    """A pod holding `gpus` GPUs, Running; the simulated machine's indices of the GPUs the
    kubelet's device manager gave it (NVIDIA_VISIBLE_DEVICES, which the plugin set in Allocate)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/controlplane/pause:3.10",
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }
    cluster.core().create_namespaced_pod("default", pod)
    wait_until(
        f"pod {name} Running",
        lambda: cluster.core().read_namespaced_pod(name, "default").status.phase == "Running",
        log=node.log_tail,
    )
    # One pod at a time: the last Allocate is this pod's.
    allocated = [e["devices"] for e in node.events() if e.get("call") == "Allocate"][-1]
    assert len(allocated) == gpus
    index = {d["id"]: i for i, d in enumerate(_devices())}
    return sorted(index[i] for i in allocated)


def _doctor(cluster: NodeCluster, node: str) -> list[str]:
    done = subprocess.run(
        [topo_reporter(), "doctor", "--node", node, "--format", "json",
         "--kubeconfig", str(cluster.server.kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    return sorted(f["code"] for n in report["nodes"] for f in n["findings"])


def test_gpu_pods_show_in_availability_and_the_doctor_sees_the_plugins_failures(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    chart_node: RealNode,
    record_property: Any,
) -> None:
    config = helm.Config(kubeconfig_path=node_cluster.server.kubeconfig, namespace=NAMESPACE)
    free_key, sets_key = f"{PREFIX}/{GPU_FREE}", f"{PREFIX}/{GPU_SETS}"
    try:
        _install_until_all_free(config, node_cluster, chart_node)
        started = time.monotonic()
        two = _gpu_pod(node_cluster, chart_node, "holds-two", 2)
        wait_until(
            "availability: 6 free, holds-two's GPUs named",
            lambda: (
                _labels(node_cluster, chart_node.name).get(free_key) == "6"
                and f"default/holds-two/main={format_cpulist(two)}"
                in _annotations(node_cluster, chart_node.name).get(sets_key, "")
            ),
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        record_property("gpu_pod_to_availability_s", round(time.monotonic() - started, 2))
        four = _gpu_pod(node_cluster, chart_node, "holds-four", 4)
        assert not set(two) & set(four)
        wait_until(
            "availability: 2 free, both sets named",
            lambda: (
                _labels(node_cluster, chart_node.name).get(free_key) == "2"
                and _annotations(node_cluster, chart_node.name).get(sets_key)
                == f"1;default/holds-four/main={format_cpulist(four)};"
                f"default/holds-two/main={format_cpulist(two)}"
            ),
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        node_cluster.core().delete_namespaced_pod("holds-two", "default")
        wait_until(
            "availability: 4 free once holds-two is gone",
            lambda: _labels(node_cluster, chart_node.name).get(free_key) == "4",
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        node_cluster.core().delete_namespaced_pod("holds-four", "default")
        assert _doctor(node_cluster, chart_node.name) == []

        devices = _devices()
        for fault, undo, code in (
            (f"unhealthy {devices[3]['id']}", f"healthy {devices[3]['id']}", "gpus-unallocatable"),
            # The kubelet keeps nvidia.com/gpu at 0 (not absent) after its plugin goes.
            ("crash", "start", "gpus-unallocatable"),
            ("stop", "start", "gpus-unallocatable"),
        ):
            chart_node.control(fault)
            wait_until(
                f"doctor: {code} after {fault}",
                lambda code=code: code in _doctor(node_cluster, chart_node.name),
                timeout_s=LABEL_TIMEOUT_S,
                log=chart_node.log_tail,
            )
            chart_node.control(undo)
            wait_until(
                f"doctor: clear after {undo}",
                lambda: _doctor(node_cluster, chart_node.name) == [],
                timeout_s=LABEL_TIMEOUT_S,
                log=chart_node.log_tail,
            )
        config.uninstall("tr", timeout=180)
    finally:
        config.close()


def _metrics(pod: k8s.V1Pod) -> dict[str, float]:
    """The agent's /metrics, from the host over the pods' bridge (the kubelet's probes' path)."""
    url = f"http://{pod.status.pod_ip}:8080/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_helm_upgrade_rolls_the_agent_without_a_node_write(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    chart_node: RealNode,
) -> None:
    config = helm.Config(kubeconfig_path=node_cluster.server.kubeconfig, namespace=NAMESPACE)
    try:
        _install_until_all_free(config, node_cluster, chart_node)
        old = wait_until("the agent Ready", lambda: _ready_agent(node_cluster))
        node = node_cluster.core().read_node(chart_node.name)
        before, version = _ours_values(node), node.metadata.resource_version
        values = _values()
        values["agent"]["logLevel"] = "debug"
        upgraded = config.upgrade(chart(), "tr", values, namespace=NAMESPACE)
        assert upgraded["revision"] == 2
        new = wait_until(
            "the rolled agent Ready, the old one gone",
            lambda: (
                (p := _ready_agent(node_cluster)) is not None
                and p.metadata.uid != old.metadata.uid
                and p
            ),
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        # The new agent has read and published at least once, and found nothing to write.
        samples = wait_until(
            "the new agent's first publish and availability read",
            lambda: (
                (m := _metrics(new)).get(UNCHANGED_AVAILABILITY, 0) >= 1
                and m.get(UNCHANGED_PUBLISH, 0) >= 1
                and m
            ),
            timeout_s=LABEL_TIMEOUT_S,
        )
        assert samples.get(WRITTEN_AVAILABILITY, 0) == 0
        assert samples.get(WRITTEN_PUBLISH, 0) == 0
        changes = [
            e
            for e in _node_changes(node_cluster, chart_node.name, version)
            if _ours_values(e) != before
        ]
        assert changes == []
        config.uninstall("tr", timeout=180)
    finally:
        config.close()


UNCHANGED_AVAILABILITY = 'topo_reporter_availability_writes_total{result="unchanged"}'
WRITTEN_AVAILABILITY = 'topo_reporter_availability_writes_total{result="written"}'
UNCHANGED_PUBLISH = 'topo_reporter_publishes_total{result="unchanged"}'
WRITTEN_PUBLISH = 'topo_reporter_publishes_total{result="written"}'


def _ours_values(node: Any) -> dict[str, str]:
    meta = node.metadata
    keys = {**(meta.labels or {}), **(meta.annotations or {})}
    return {k: v for k, v in keys.items() if k.startswith(PREFIX + "/")}


def _node_changes(cluster: NodeCluster, node: str, since: str) -> list[Any]:
    """Every version of the Node written after resource version `since` (a watch from there,
    ended as soon as it has replayed up to now)."""
    now = cluster.core().read_node(node).metadata.resource_version
    if now == since:
        return []
    seen = []
    stream = watch.Watch()
    for event in stream.stream(
        cluster.core().list_node,
        field_selector=f"metadata.name={node}",
        resource_version=since,
        timeout_seconds=30,
    ):
        seen.append(event["object"])
        if int(event["object"].metadata.resource_version) >= int(now):
            stream.stop()
    return seen


FAILED_READS = "topo_reporter_podresources_reads_total"
WITHDRAW_AFTER = 2
"""The chart's `availability.withdrawAfter`: failed PodResources reads in a row before the
availability keys leave the Node (docs/agent.md)."""


def test_a_kubelet_restart_is_ridden_out(
    node_cluster: NodeCluster,  # noqa: F811  # the fixture imported above
    chart_node: RealNode,
) -> None:
    config = helm.Config(kubeconfig_path=node_cluster.server.kubeconfig, namespace=NAMESPACE)
    free_key = f"{PREFIX}/{GPU_FREE}"
    try:
        _install_until_all_free(config, node_cluster, chart_node)
        agent = wait_until("the agent Ready", lambda: _ready_agent(node_cluster))
        version = node_cluster.core().read_node(chart_node.name).metadata.resource_version
        registered = sum(1 for e in chart_node.events() if e.get("event") == "registered")
        ok_before = _metrics(agent).get(f'{FAILED_READS}{{result="ok"}}', 0)

        chart_node.restart_kubelet()
        # The plugin double sees the kubelet's socket made anew and registers again, as NVIDIA's.
        wait_until(
            "the device plugin registered with the new kubelet",
            lambda: (
                sum(1 for e in chart_node.events() if e.get("event") == "registered") > registered
            ),
            log=chart_node.log_tail,
        )
        wait_until(
            "the agent reading PodResources from the new kubelet",
            lambda: _metrics(agent).get(f'{FAILED_READS}{{result="ok"}}', 0) > ok_before + 1,
            timeout_s=LABEL_TIMEOUT_S,
            log=chart_node.log_tail,
        )
        samples = _metrics(agent)
        failed = sum(
            v for k, v in samples.items() if k.startswith(FAILED_READS) and 'result="ok"' not in k
        )
        versions = _node_changes(node_cluster, chart_node.name, version)
        lacked = [v for v in versions if free_key not in _ours_values(v)]
        # Withdrawn only after the documented failures: never, unless reads failed that often.
        assert not lacked or failed >= WITHDRAW_AFTER, (failed, len(lacked))
        assert _labels(node_cluster, chart_node.name).get(free_key) == "8"
        assert samples["topo_reporter_availability_withdrawn"] == 0
        pod = _ready_agent(node_cluster)
        assert pod is not None
        assert pod.metadata.uid == agent.metadata.uid
        assert pod.status.container_statuses[0].restart_count == 0
        config.uninstall("tr", timeout=180)
    finally:
        config.close()
