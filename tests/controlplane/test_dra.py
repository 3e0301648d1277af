"""Issue 22 item 3 on the real control plane: the agent's DeviceTaintRules, obeyed by the real
kube-scheduler's DRA allocator.

The shared kube-apiserver (1.37) serves DeviceTaintRules as GA, resource.k8s.io/v1, and the
scheduler heeds them by default. Each Node gets a ResourceSlice shaped like the one NVIDIA's DRA
driver publishes (`gpu.nvidia.com`, a pool named after the node, devices `gpu-<minor>` with the
driver's attributes; created by the test: no driver runs) and NVIDIA's DeviceClass. The real agent
(`run --once --dra-device-taints` on a simulated machine whose GPUs lost NVLinks) writes the rules;
the scheduler is started after them, so that its first list holds them, and every wait is a polling
deadline. No kubelet runs: a bound pod never starts, which the allocation does not need.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from reporter import kubectl_plugin
from reporter.extender.cache import node_rank
from reporter.free_sets import compute_availability
from reporter.schema import dra, keys
from reporter.schema.availability import decode_availability, encode_availability
from reporter.schema.codec import encode
from tests.cli.test_run import CLI, env
from tests.collect.test_podresources_kubelet import KubeletPodResources
from tests.controlplane.test_scheduler import WAIT_S, simulated
from tests.support.controlplane_fixtures import (
    RULES_VERSION,
    SCHEDULER_FEATURE_GATES,
    NodeFactory,
    RealApiServer,
    start_harness,
    stop_process,
    unique,
)
from tests.support.podresources_double import claim_pod_state, claim_state

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
GROUP = "resource.k8s.io"
RULES = RULES_VERSION
DRA_API = "v1"
GPUS = 4
DEVICE_CLASS = "gpu.nvidia.com"
# NVIDIA's DeviceClass for whole GPUs (its chart's `gpu.nvidia.com` class).
DEVICE_CLASS_SELECTOR = (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
)


PROFILES = Path(__file__).resolve().parents[2] / "reporter/collect/simulate/profiles"


def profile(tmp: Path, degraded: list[int]) -> Path:
    """A 4-GPU NVSwitch tray (the shipped gb200-nvl profile) whose `degraded` GPUs lost two
    NVLinks each (the profile's `gpus[].links_down`)."""
    data = yaml.safe_load((PROFILES / "gb200-nvl.yaml").read_text(encoding="utf-8"))
    data["gpus"] = [{"index": i, "links_down": 2} for i in degraded]
    path = tmp / f"tray-{'-'.join(map(str, degraded)) or 'ok'}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def nvidia_slice(node: str) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver publishes for a 4-GPU node (attributes as its
    deviceinfo.go sets them for a full GPU)."""
    devices = [
        {
            "name": dra.gpu_device(minor),
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-4a1d1c1e-0000-4000-8000-00000000000{minor}"},
                "productName": {"string": "NVIDIA GB200"},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": "Blackwell"},
                "cudaComputeCapability": {"version": "10.0.0"},
                "driverVersion": {"version": "580.105.8"},
                "cudaDriverVersion": {"version": "13.0.0"},
                "resource.kubernetes.io/pciBusID": {"string": f"0008:0{minor}:00.0"},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0008:0{minor}"},
            },
            "capacity": {"memory": {"value": "189471Mi"}},
        }
        for minor in range(GPUS)
    ]
    return {
        "apiVersion": f"{GROUP}/{DRA_API}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-{unique('s').split('-')[1]}"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class Dra:
    """The admin's view of resource.k8s.io, and cleanup of what the test made."""

    def __init__(self, server: RealApiServer) -> None:
        self.api = k8s.CustomObjectsApi(server.api())
        self.made: list[tuple[str, str, str | None, str]] = []
        self.nodes: list[str] = []
        """Nodes whose DeviceTaintRules the agent wrote: deleted with the rest."""

    def create(
        self, version: str, plural: str, body: dict[str, Any], namespace: str | None = None
    ) -> None:
        if namespace is None:
            self.api.create_cluster_custom_object(GROUP, version, plural, body)
        else:
            self.api.create_namespaced_custom_object(GROUP, version, namespace, plural, body)
        self.made.append((version, plural, namespace, body["metadata"]["name"]))

    def rules(self, node: str) -> list[dict[str, Any]]:
        selector = dra.owned_selector(node, PREFIX)
        found = self.api.list_cluster_custom_object(
            GROUP, RULES, "devicetaintrules", label_selector=selector
        )
        return list(found["items"])

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.api.get_namespaced_custom_object(
            GROUP, DRA_API, namespace, "resourceclaims", name
        )
        return found

    def close(self) -> None:
        for version, plural, namespace, name in reversed(self.made):
            with contextlib.suppress(k8s.ApiException):
                if namespace is None:
                    self.api.delete_cluster_custom_object(GROUP, version, plural, name)
                else:
                    self.api.delete_namespaced_custom_object(
                        GROUP, version, namespace, plural, name
                    )
        for node in self.nodes:
            for rule in self.rules(node):
                with contextlib.suppress(k8s.ApiException):
                    self.api.delete_cluster_custom_object(
                        GROUP, RULES, "devicetaintrules", rule["metadata"]["name"]
                    )


@pytest.fixture
def dra_api(real_apiserver: RealApiServer) -> Iterator[Dra]:
    made = Dra(real_apiserver)
    yield made
    made.close()


def run_agent(
    server: RealApiServer, node: str, machine: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [
            *CLI,
            "run",
            "--once",
            "--simulate",
            str(machine),
            "--node",
            node,
            "--listen",
            "",
            "--dra-device-taints",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(server.kubeconfig), TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def claim_pod(name: str, claim: str, *, node: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def one_gpu_claim(name: str, tolerate: str | None = None) -> dict[str, Any]:
    """A claim for one GPU of NVIDIA's class; `tolerate`: a taint key its request tolerates."""
    exactly: dict[str, Any] = {
        "deviceClassName": DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    if tolerate is not None:
        exactly["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": f"{GROUP}/{DRA_API}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def wait(what: str, check: Callable[[], Any], logs: Callable[[], str]) -> Any:
    """The first true answer of `check`, polled until WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: never\n{logs()}"
        time.sleep(0.1)


def logs_of(work: Path) -> Callable[[], str]:
    return lambda: "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(work.glob("*.log"))
    )


def test_the_real_scheduler_allocates_around_the_agents_rules_and_leaves_a_pod_pending(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    dra_api: Dra,
    tmp_path: Path,
) -> None:
    core = real_apiserver.core()
    with contextlib.suppress(k8s.ApiException):  # one class for the whole run, as NVIDIA's chart
        dra_api.api.create_cluster_custom_object(
            GROUP,
            DRA_API,
            "deviceclasses",
            {
                "apiVersion": f"{GROUP}/{DRA_API}",
                "kind": "DeviceClass",
                "metadata": {"name": DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression": DEVICE_CLASS_SELECTOR}}]},
            },
        )
    one, all_gone = real_node_factory(ready=True), real_node_factory(ready=True)
    dra_api.nodes += [one, all_gone]
    for node in (one, all_gone):
        dra_api.create(DRA_API, "resourceslices", nvidia_slice(node))

    # The agent: GPU 1 of the first node lost NVLinks; every GPU of the second did.
    run_agent(real_apiserver, one, profile(tmp_path, [1]))
    run_agent(real_apiserver, all_gone, profile(tmp_path, list(range(GPUS))))
    (rule,) = dra_api.rules(one)
    assert rule["spec"]["deviceSelector"] == {"driver": dra.DRIVER, "pool": one, "device": "gpu-1"}
    assert rule["spec"]["taint"]["key"] == f"{PREFIX}/{keys.DEVICE_TAINT}"
    assert rule["spec"]["taint"]["value"] == dra.REASON_NVLINK_DEGRADED
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert sorted(r["spec"]["deviceSelector"]["device"] for r in dra_api.rules(all_gone)) == [
        dra.gpu_device(m) for m in range(GPUS)
    ]
    # Health unchanged: a second run writes nothing (the rule is the same object).
    run_agent(real_apiserver, one, profile(tmp_path, [1]))
    (again,) = dra_api.rules(one)
    assert again["metadata"]["resourceVersion"] == rule["metadata"]["resourceVersion"]

    scheduler = f"dra-{unique('s')}"
    config = tmp_path / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": scheduler}],
            }
        )
    )
    proc = start_harness(
        real_apiserver.binary,
        [
            "scheduler",
            "--config",
            str(config),
            "--kubeconfig",
            str(real_apiserver.kubeconfig),
            "--",
            SCHEDULER_FEATURE_GATES,
        ],
        tmp_path / "scheduler.log",
    )
    logs = logs_of(tmp_path)
    try:
        # Two one-GPU claims on the first node: the allocator takes devices in the slice's order
        # and skips gpu-1, which the agent's rule taints.
        devices = []
        for name in ("first", "second"):
            dra_api.create(DRA_API, "resourceclaims", one_gpu_claim(name), real_namespace)
            core.create_namespaced_pod(
                real_namespace, claim_pod(name, name, node=one, scheduler=scheduler)
            )
            bound = wait(
                f"pod {name} bound",
                lambda n=name: core.read_namespaced_pod(n, real_namespace).spec.node_name,
                logs,
            )
            assert bound == one
            claim = dra_api.claim(real_namespace, name)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"]) == (dra.DRIVER, one)
            devices.append(result["device"])
        assert devices == ["gpu-0", "gpu-2"]

        # Every GPU of the second node tainted: the pod stays Pending.
        dra_api.create(DRA_API, "resourceclaims", one_gpu_claim("third"), real_namespace)
        core.create_namespaced_pod(
            real_namespace, claim_pod("third", "third", node=all_gone, scheduler=scheduler)
        )

        def unschedulable() -> str | None:
            pod = core.read_namespaced_pod("third", real_namespace)
            assert not pod.spec.node_name, f"third was bound to {pod.spec.node_name}"
            for condition in pod.status.conditions or ():
                if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                    return str(condition.message)
            return None

        message = wait("pod third judged", unschedulable, logs)
        assert "cannot allocate all claims" in message, message
        assert "allocation" not in (dra_api.claim(real_namespace, "third").get("status") or {})
        # The reason does not name the taint, and no newer release would: the DRA plugin answers
        # every allocation that fails "cannot allocate all claims"
        # (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go of
        # k8s.io/kubernetes v1.34.9, v1.35.4, v1.36.3, v1.37.2 and v1.38.0-beta.0, the newest of
        # each minor the Go module proxy serves), and the structured allocator skips a device
        # whose taint the request does not tolerate without a word
        # (k8s.io/dynamic-resource-allocation structured/internal/*/allocator_*.go:
        # `allTaintsTolerated` in v0.34.9, `taintPreventsAllocation` in v0.35.10, v0.36.6,
        # v0.37.2 and v0.38.0-beta.0, "not this device" and nothing else). Nor do the pod's
        # FailedScheduling Events (the same message) or the claim's status (empty) say more.
        events = core.list_namespaced_event(
            real_namespace, field_selector="involvedObject.name=third,reason=FailedScheduling"
        ).items
        assert events
        for event in events:
            assert "cannot allocate all claims" in event.message, event.message
            assert keys.DEVICE_TAINT not in event.message
        # That the taint is the cause: the same claim tolerating it gets a GPU of that node.
        dra_api.create(
            DRA_API,
            "resourceclaims",
            one_gpu_claim("tolerant", tolerate=f"{PREFIX}/{keys.DEVICE_TAINT}"),
            real_namespace,
        )
        core.create_namespaced_pod(
            real_namespace, claim_pod("tolerant", "tolerant", node=all_gone, scheduler=scheduler)
        )
        bound = wait(
            "pod tolerant bound",
            lambda: core.read_namespaced_pod("tolerant", real_namespace).spec.node_name,
            logs,
        )
        assert bound == all_gone
        (result,) = dra_api.claim(real_namespace, "tolerant")["status"]["allocation"]["devices"][
            "results"
        ]
        assert result["pool"] == all_gone
    finally:
        stop_process(proc)
        with contextlib.suppress(k8s.ApiException):
            for pod in core.list_namespaced_pod(real_namespace).items:
                core.delete_namespaced_pod(
                    pod.metadata.name, real_namespace, grace_period_seconds=0
                )


def test_a_dra_node_publishes_claimed_gpus_as_taken_for_the_extender_and_the_plugin(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    controlplane_bin: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 22's "done when": on a simulated DRA node (no device plugin; the kubelet's own
    PodResources server reports two claims), the agent's availability, the extender's rank and
    `kubectl gpu-topology` all count the claimed GPUs as taken."""
    node = real_node_factory()
    topology = simulated("dgx-h100")
    minors = [g.minor for g in topology.gpus]
    directory = Path(tempfile.mkdtemp(prefix="podres-dra-", dir="/tmp"))
    kubelet = KubeletPodResources(
        controlplane_bin, directory / "kubelet.sock", directory / "state.json"
    )
    kubelet.write(
        {
            "devices": [],
            "pods": [
                claim_pod_state("train", [claim_state("gpus", [f"gpu-{minors[0]}"], node)]),
                claim_pod_state(
                    "infer",
                    [
                        claim_state("one", [f"gpu-{minors[1]}"], node),
                        claim_state("stray", ["gpu-99", "gpu--1"], node),
                    ],
                ),
            ],
        }
    )
    kubelet.start()
    try:
        publish(
            real_apiserver, node, "--availability", "--pod-resources-socket", str(kubelet.socket)
        )
    finally:
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    annotations = real_apiserver.core().read_node(node).metadata.annotations
    assert decode_availability(annotations[f"{PREFIX}/availability"]).free == tuple(range(2, 8))
    assert annotations[f"{PREFIX}/allocation"] == "1;dra;0-1"
    whole = real_apiserver.api().sanitize_for_serialization(real_apiserver.core().read_node(node))
    rank = node_rank(whole, f"{PREFIX}/availability")
    assert rank is not None
    assert rank.free == 6

    capsys.readouterr()  # what came before: the scan's debug lines
    assert (
        kubectl_plugin.main(
            [node, "--kubeconfig", str(real_apiserver.kubeconfig), "--format", "json"]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["claimed"] == [0, 1]
    assert shown["counted"] == ["dra"]
    assert [g["state"] for g in shown["gpus"]] == ["claimed"] * 2 + ["free"] * 6
    assert [g["device"] for g in shown["gpus"]] == [f"gpu-{m}" for m in minors]


def publish(server: RealApiServer, node: str, *args: str) -> None:
    """The real agent, once, on the simulated DGX H100."""
    result = subprocess.run(
        [*CLI, "run", "--once", "--simulate", "dgx-h100", "--node", node, "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(server.kubeconfig), TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "podresources_unknown_devices" in result.stderr


def test_the_doctor_names_a_claim_on_a_lost_gpu_and_slices_availability_does_not_count(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    dra_api: Dra,
) -> None:
    """The doctor reads the real server's ResourceSlices and ResourceClaims (resource.k8s.io/v1):
    a claim allocated GPU 2's device, which the topology says is lost, and availability published
    without counting DRA on a node that NVIDIA's driver publishes."""
    topology = simulated("gb200-nvl")
    gpus = list(topology.gpus)
    gpus[2] = replace(gpus[2], lost=True)
    lost = replace(topology, gpus=tuple(gpus))
    node = real_node_factory(
        annotations={
            f"{PREFIX}/topology": encode(lost),
            f"{PREFIX}/availability": encode_availability(compute_availability(lost, [0, 1, 3])),
        }
    )
    dra_api.create(DRA_API, "resourceslices", nvidia_slice(node))
    dra_api.create(DRA_API, "resourceclaims", one_gpu_claim("held"), real_namespace)
    minor = lost.gpus[2].minor
    dra_api.api.patch_namespaced_custom_object_status(
        GROUP,
        DRA_API,
        real_namespace,
        "resourceclaims",
        "held",
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": dra.DRIVER,
                                "pool": node,
                                "device": dra.gpu_device(int(minor or 0)),
                            }
                        ]
                    }
                }
            }
        },
    )
    result = subprocess.run(
        [*CLI, "doctor", "--node", node, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(KUBECONFIG=str(real_apiserver.kubeconfig)),
        check=False,
    )
    assert result.returncode == 1, result.stderr
    (report,) = json.loads(result.stdout)["nodes"]
    found = {f["code"]: f for f in report["findings"]}
    assert found["dra-claims-on-lost-gpus"]["evidence"] == [
        f"ResourceClaim {real_namespace}/held holds gpu-{minor} (GPU2, lost)"
    ]
    assert "dra-not-counted" in found
    assert "device-plugin-missing" not in found
