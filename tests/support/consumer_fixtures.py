"""The schedulers and controllers that consume topo-reporter's labels, run from their own code on
the real control plane, and the simulated NVL72 racks they schedule onto.

- `real_controller_manager`: kube-controller-manager (the harness) with its Job controller.
- `real_kueue`: Kueue's controller manager (the consumers module's `kueue` tool), installed as
  Kueue's own manifests install it: its CRDs with their conversion webhooks, its webhooks for Jobs
  and its own objects, its internal certificate management (a Secret, CA bundles injected into
  those webhooks), all from Kueue's Go module. Kustomize's substitutions (namespace
  `kueue-system`, the `kueue-` name prefix) are done here; the webhook Service is an ExternalName
  pointing at localhost, where the process serves, because nothing here routes a ClusterIP; and
  the fixture writes the certificate Secret into the process's certificate directory, as the
  kubelet does for the Secret volume of Kueue's pod.
- `rack_scheduler`: one kube-scheduler for the consumers' pods, under its own scheduler name.
- `rack_cluster`: simulated GB200 NVL72 racks (reporter.collect.simulate.racks) as Nodes, Ready
  with 4 GPUs each, their labels published by the agent itself (`build_agent`, as `run --once`
  builds it, through its lean client). Two racks share a clique ID, one is split in two
  partitions.
Every process is session-scoped and stopped at the end; every wait polls.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from reporter.assembly import build_agent
from reporter.collect.simulate.racks import RackNode, rack_nodes, write_profiles
from reporter.settings import Settings
from tests.support.controlplane_fixtures import (
    NODE_CAPACITY,
    SCHEDULER_FEATURE_GATES,
    RealApiServer,
    go_module_dir,
    install_crds,
    start_harness,
    stop_process,
    unique,
)

PREFIX = "gpu.topology.io"
GPU = "nvidia.com/gpu"
DOMAIN = f"{PREFIX}/nvlink-domain"
PARTITION = f"{PREFIX}/nvlink-partition"
HOSTNAME = "kubernetes.io/hostname"
RACKS_LABEL = "e2e.topo-reporter.io/racks"
"""Set by the test on its rack Nodes (not by the agent): what selects them for the consumers."""
START_TIMEOUT_S = 180.0
"""Two busy cores: Kueue's certificate bootstrap and informers take seconds, not minutes."""
WAIT_S = 90.0

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.19.2"
"""The Kueue release the consumers module builds (go.mod) and whose manifests are installed."""
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SERVICE = "kueue-webhook-service"
KUEUE_SECRET = "kueue-webhook-server-cert"
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
"""The CRDs Kueue's kustomization gives a conversion webhook (config/components/crd)."""
KUEUE_WEBHOOK_GROUPS = {"kueue.x-k8s.io", "batch"}
"""The webhooks installed: Kueue's own objects and Jobs, the one integration enabled. Those for
pods, Deployments and other frameworks would sit in front of every other test's objects."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def poll(
    what: str, check: Callable[[], Any], timeout_s: float = WAIT_S, log: Path | None = None
) -> Any:
    """`check()`'s first truthy answer, polled with a short growing delay; a test failure naming
    `what` (and the log's tail) at the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = "" if log is None else "\n" + log.read_text(errors="replace")[-3000:]
            pytest.fail(f"{what}: not within {timeout_s:.0f} s{tail}", pytrace=False)
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


# --- kube-controller-manager --------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_controller_manager(
    controlplane_bin: Path, real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """kube-controller-manager's Job controller and garbage collector (which deletes a deleted
    Job's pods and Workload, as in a cluster) on the real apiserver for the whole run; its log."""
    log = tmp_path_factory.mktemp("controller-manager") / "kcm.log"
    proc = start_harness(
        controlplane_bin,
        [
            "controller-manager",
            "--kubeconfig",
            str(real_apiserver.kubeconfig),
            "--controllers",
            "job,garbagecollector",
        ],
        log,
    )
    try:
        yield log
    finally:
        stop_process(proc)


# --- kube-scheduler -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RackScheduler:
    name: str
    log: Path


@pytest.fixture(scope="session")
def rack_scheduler(
    controlplane_bin: Path, real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RackScheduler]:
    """The real kube-scheduler, default plugins, one profile under a scheduler name of its own;
    the gates its pod-group plugins need (KEP-5732) on."""
    work = tmp_path_factory.mktemp("rack-scheduler")
    name = unique("rack-scheduler")
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }
    path = work / "scheduler.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log = work / "scheduler.log"
    proc = start_harness(
        controlplane_bin,
        [
            "scheduler",
            "--config",
            str(path),
            "--kubeconfig",
            str(real_apiserver.kubeconfig),
            "--",
            SCHEDULER_FEATURE_GATES,
        ],
        log,
    )
    try:
        yield RackScheduler(name, log)
    finally:
        stop_process(proc)


# --- Simulated racks, published by the agent -----------------------------------------------------


@dataclass
class RackCluster:
    """Nodes of simulated racks on the real apiserver, their labels published by the agent."""

    id: str
    """The value of RACKS_LABEL on every node of this cluster."""
    nodes: list[RackNode]
    names: dict[str, str]
    """Rack node name (nvl72-r00-n00) to its Node's name (unique in the run)."""
    profiles: dict[str, Path]
    kubeconfig: Path
    core: k8s.CoreV1Api
    taint_fabric: bool = False
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node name to its labels after the agent's last publish."""

    def node(self, rack: int, tray: int) -> str:
        return self.names[self.rack_node(rack, tray).name]

    def rack_node(self, rack: int, tray: int) -> RackNode:
        (found,) = [n for n in self.nodes if n.rack == rack and n.tray == tray]
        return found

    def partition_of(self, node: str) -> str:
        return self.labels[node][PARTITION]

    def domain_of(self, node: str) -> str:
        return self.labels[node][DOMAIN]

    def members(self, key: str, value: str) -> set[str]:
        return {n for n, labels in self.labels.items() if labels.get(key) == value}

    def publish(
        self,
        rack_node: RackNode,
        profile: Path | None = None,
        *,
        used: tuple[int, ...] | None = None,
    ) -> dict[str, str]:
        """One `run --once` of the agent on this node (optionally from another profile, a fabric
        turned unhealthy; with `used`, `--availability --simulate-used` those GPUs): the agent as
        `run` builds it, through its lean client."""
        name = self.names[rack_node.name]
        parts = build_agent(
            Settings(
                node=name,
                kubeconfig=str(self.kubeconfig),
                prefix=PREFIX,
                simulate=str(profile or self.profiles[rack_node.name]),
                listen="",
                once=True,
                taint_unhealthy_fabric=self.taint_fabric,
                availability=used is not None,
                simulate_used=used,
            )
        )
        assert parts.agent.step(), f"the agent did not publish on {name}"
        labels = dict(self.core.read_node(name).metadata.labels or {})
        self.labels[name] = labels
        return labels


def make_rack_node(core: k8s.CoreV1Api, name: str, cluster: str) -> None:
    """A Node as a kubelet registers it and the node lifecycle controller readies it: Ready, 4
    GPUs allocatable, no not-ready taint."""
    core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {HOSTNAME: name, RACKS_LABEL: cluster}},
        }
    )
    resources = {**NODE_CAPACITY, GPU: "4"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            }
        },
    )
    core.patch_node(name, {"spec": {"taints": None}})


SHARED_CLIQUE = 17044
"""Racks 0 and 1 both report it, as two real racks did (dra-driver-nvidia-gpu#377)."""
TRAYS = 4
"""Compute trays per simulated rack here: enough to fill a partition and to run short of one."""


@pytest.fixture(scope="session")
def rack_cluster(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RackCluster]:
    """Three simulated racks of 4 trays (12 Nodes): racks 0 and 1 on clique 17044 each, rack 2
    split into two partitions of 2 trays (cliques 1 and 2), every label published by the agent."""
    work = tmp_path_factory.mktemp("racks")
    nodes = [
        *rack_nodes(2, trays=TRAYS, cliques=[SHARED_CLIQUE, SHARED_CLIQUE]),
        *[n for n in rack_nodes(3, trays=TRAYS, cliques=[0, 0, 1], partitions=2) if n.rack == 2],
    ]
    cluster_id = unique("racks")
    names = {n.name: f"{cluster_id}-{n.name}" for n in nodes}
    profiles = {
        n.name: path
        for n, path in zip(nodes, write_profiles(nodes, work / "profiles"), strict=True)
    }
    core = real_apiserver.core()
    cluster = RackCluster(cluster_id, nodes, names, profiles, real_apiserver.kubeconfig, core)
    try:
        for n in nodes:
            make_rack_node(core, names[n.name], cluster_id)
        for n in nodes:
            cluster.publish(n)
        yield cluster
    finally:
        for name in names.values():
            with contextlib.suppress(k8s.ApiException):
                core.delete_node(name)


def profile_with(rack_node: RackNode, directory: Path, **fabric: Any) -> Path:
    """The node's profile with its fabric changed (`health="unhealthy"`)."""
    profile = copy.deepcopy(rack_node.profile)
    profile["fabric"] = {**profile["fabric"], **fabric}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{rack_node.name}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False), encoding="utf-8")
    return path


# --- YuniKorn -------------------------------------------------------------------------------------

YUNIKORN = "yunikorn"
"""YuniKorn's scheduler name (its pods' `schedulerName`)."""


@pytest.fixture(scope="session")
def real_yunikorn(
    yunikorn_bin: Path, real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """YuniKorn v1.8.0's scheduler (its k8shim's own main, the core inside) for the whole run,
    in a namespace of its own (where it would read its ConfigMaps: none, so its default queue
    configuration); its log. No admission controller: the tests' pods name YuniKorn and their
    application themselves."""
    log = tmp_path_factory.mktemp("yunikorn") / "yunikorn.log"
    namespace = unique("yunikorn")
    real_apiserver.core().create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
    )
    proc = start_harness(
        yunikorn_bin,
        [],
        log,
        env={"KUBECONFIG": str(real_apiserver.kubeconfig), "NAMESPACE": namespace},
    )
    try:
        yield log
    finally:
        stop_process(proc)


# --- Kueue ----------------------------------------------------------------------------------------


def _kueue_dir() -> Path:
    return go_module_dir(KUEUE_MODULE, KUEUE_VERSION)


def kueue_crds(webhook_port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs (config/components/crd/bases) with the conversion webhook its kustomization
    patches in (patches/webhook_in_*.yaml), pointed at the webhook Service."""
    bases = _kueue_dir() / "config" / "components" / "crd" / "bases"
    crds = []
    for path in sorted(bases.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in KUEUE_CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {
                            "namespace": KUEUE_NAMESPACE,
                            "name": KUEUE_SERVICE,
                            "path": "/convert",
                            "port": webhook_port,
                        }
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(crd)
    return crds


def kueue_webhooks(webhook_port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations (config/components/webhook/manifests.yaml) for its own
    objects and Jobs, named and pointed as its kustomization does."""
    path = _kueue_dir() / "config" / "components" / "webhook" / "manifests.yaml"
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        hooks = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules", ()) for g in rule["apiGroups"]}
            if not groups <= KUEUE_WEBHOOK_GROUPS:
                continue
            service = hook["clientConfig"]["service"]
            service.update(namespace=KUEUE_NAMESPACE, name=KUEUE_SERVICE, port=webhook_port)
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


@dataclass(frozen=True)
class RealKueue:
    log: Path
    api: k8s.CustomObjectsApi

    def create(self, plural: str, body: Mapping[str, Any], namespace: str | None = None) -> Any:
        if namespace is None:
            return self.api.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural, body)
        return self.api.create_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, plural, body
        )

    def local_queue(self, name: str, cluster_queue: str, namespace: str) -> str:
        """A LocalQueue `name` in `namespace` feeding `cluster_queue`; its name."""
        self.create(
            "localqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": name},
                "spec": {"clusterQueue": cluster_queue},
            },
            namespace,
        )
        return name

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        found = self.api.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
        )
        return list(found["items"])


def project_secret(core: k8s.CoreV1Api, namespace: str, name: str, directory: Path) -> bool:
    """What the kubelet does for a Secret volume: its keys as files in `directory`. False while
    the Secret holds nothing yet (Kueue's certificate controller fills it first)."""
    data = core.read_namespaced_secret(name, namespace).data or {}
    if "tls.crt" not in data:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (directory / key).write_bytes(base64.b64decode(value))
    return True


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def real_kueue(
    kueue_bin: Path,
    real_apiserver: RealApiServer,
    real_controller_manager: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealKueue]:
    """Kueue v0.19.2's controller manager, installed and ready (its readiness probe says the
    certificates are in place and the webhook server listens)."""
    work = tmp_path_factory.mktemp("kueue")
    webhook_port, health_port = free_port(), free_port()
    api = real_apiserver.api()
    core = k8s.CoreV1Api(api)
    with contextlib.suppress(k8s.ApiException):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=KUEUE_NAMESPACE)))
    core.create_namespaced_secret(
        KUEUE_NAMESPACE, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=KUEUE_SECRET))
    )
    core.create_namespaced_service(
        KUEUE_NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": KUEUE_SERVICE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        },
    )
    install_crds(real_apiserver, kueue_crds(webhook_port))
    admission = k8s.AdmissionregistrationV1Api(api)
    mutating, validating = kueue_webhooks(webhook_port)
    admission.create_mutating_webhook_configuration(mutating)
    admission.create_validating_webhook_configuration(validating)
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "certDir": str(work / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": KUEUE_SERVICE,
            "webhookSecretName": KUEUE_SECRET,
        },
        "integrations": {"frameworks": ["batch/job"]},
        # The visibility API server would take a fixed port (8082) on the host.
        "featureGates": {"VisibilityOnDemand": False},
    }
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log = work / "kueue.log"
    proc = start_harness(
        kueue_bin,
        ["--config", str(config_path)],
        log,
        env={"KUBECONFIG": str(real_apiserver.kubeconfig)},
    )
    try:
        # Kueue waits for its certificate files to appear where the Secret is mounted in its pod.
        poll(
            "Kueue's certificate Secret",
            lambda: (
                proc.poll() is not None
                or project_secret(core, KUEUE_NAMESPACE, KUEUE_SECRET, work / "certs")
            ),
            START_TIMEOUT_S,
            log,
        )
        poll(
            "Kueue's readiness probe",
            lambda: proc.poll() is not None or _ready(f"http://127.0.0.1:{health_port}/readyz"),
            START_TIMEOUT_S,
            log,
        )
        if proc.poll() is not None:
            pytest.fail(
                f"Kueue exited ({proc.returncode}):\n{log.read_text()[-3000:]}", pytrace=False
            )
        yield RealKueue(log, k8s.CustomObjectsApi(api))
    finally:
        for delete in (
            lambda: admission.delete_mutating_webhook_configuration(mutating["metadata"]["name"]),
            lambda: admission.delete_validating_webhook_configuration(
                validating["metadata"]["name"]
            ),
        ):
            with contextlib.suppress(k8s.ApiException):
                delete()
        stop_process(proc)


VOLCANO_MODULE = "volcano.sh/volcano"
VOLCANO_VERSION = "v1.15.1"
"""The Volcano release the consumers module builds; its HyperNode CRD is installed from it."""
HYPERNODE_CRD = "config/crd/volcano/bases/topology.volcano.sh_hypernodes.yaml"


def hypernode_batches(stdout: Path) -> list[list[dict[str, Any]]]:
    """The discovery batches printed so far, oldest first (a last line still being written is
    left for the next read)."""
    text = stdout.read_text()
    lines = text.split("\n")[:-1]
    return [json.loads(line)["hyperNodes"] for line in lines if line.strip()]


def members(hypernode: dict[str, Any]) -> set[str]:
    return {m["selector"]["exactMatch"]["name"] for m in hypernode["spec"]["members"]}


def discover_hypernodes(
    consumers_bin: Path, kubeconfig: Path, work: Path, nodes: set[str], what: str
) -> list[dict[str, Any]]:
    """The HyperNodes Volcano's label discovery makes (`consumers volcano-hypernodes`, its own
    code, on the ConfigMap the test wrote): the latest batch in which `nodes` are all members of
    tier-1 HyperNodes, within the poll's bound."""
    stdout = work / "hypernodes.jsonl"
    log = work / "volcano.log"
    with stdout.open("wb") as out:
        proc = start_harness(
            consumers_bin, ["volcano-hypernodes", "--kubeconfig", str(kubeconfig)], log,
            stdout=out.fileno(),
        )  # fmt: skip
    try:

        def discovered() -> list[dict[str, Any]] | None:
            for batch in reversed(hypernode_batches(stdout)):
                tier1 = [h for h in batch if h["spec"]["tier"] == 1 and members(h) & nodes]
                if set().union(*(members(h) for h in tier1)) >= nodes:
                    return batch
            return None

        batch: list[dict[str, Any]] = poll(
            f"Volcano's HyperNodes for the {what}", discovered, log=log
        )
        return batch
    finally:
        stop_process(proc)
