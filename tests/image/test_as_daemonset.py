"""The image, run as the chart's DaemonSet runs it, against the real kube-apiserver.

Every setting comes from the DaemonSet the real Helm SDK renders, so the chart and the image cannot
drift apart: the command and args, the user and group (the container's securityContext over the
pod's), a read-only root, the dropped capabilities, no privilege escalation, the env vars (the
downward API's filled in as the kubelet fills them), each volume as a bind mount (the kubelet
config file, the PodResources directory with the kubelet's own server code listening in it, /sys
read-only, the memory emptyDir as a tmpfs), the ServiceAccount token a kubelet projects (from
TokenRequest, bound to a Pod of the chart's ServiceAccount on the node) with the service host and
port a kubelet sets. The agent in the image publishes a simulated DGX H100 on its Node, and
/healthz, /readyz and /metrics answer on the port the chart's probes name. The process's uid,
capabilities and no_new_privs are read from the kernel (/proc/PID/status).

The container shares the host's network (`--network=host`: the harness's apiserver listens on
loopback only). A pod's 0.0.0.0 is its own network namespace's; here it would be the machine's,
so the agent binds the chart's port on 127.0.0.1 instead, the one change to the chart's env.
"""

from __future__ import annotations

import base64
import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client as k8s

from tests.collect.test_podresources import GPU
from tests.collect.test_podresources_kubelet import (  # noqa: F401  # the kubelet fixture
    KubeletPodResources,
    kubelet,
)
from tests.controlplane.test_identity import (  # noqa: F401  # the chart_installed fixture
    CHART_VALUES,
    chart_installed,
    pod_token,
)
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer, unique
from tests.support.helm_chart import NAMESPACE, REPO, VAP_API, render
from tests.support.image_support import BUILD_TIMEOUT_S, PODMAN_RUN, PYTHON, built_image, podman
from tests.support.podresources_double import devices_state, pod_state

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]

PREFIX = "gpu.topology.io"
KUBELET_CONFIG = REPO / "tests" / "fixtures" / "kubelet" / "gpu-single-numa-node.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
READY_S = 120.0
"""A bound on the agent's first publish, not a timing claim: two loaded cores."""
# The simulated DGX H100's GPUs the kubelet's server reports held by a pod.
HELD = (0, 5)
CASES = {
    "default values": {},
    "availability, heartbeat, admission policy": CHART_VALUES,
}
"""The chart's default DaemonSet (uid 65532), and the one with the PodResources socket mounted
(the chart runs it as uid 0, every capability still dropped). The RBAC and policy applied are
those of the second, a superset of the first's."""


def container_of(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, the agent container) of the DaemonSet the chart renders with these values."""
    pod = render(values, api_versions=(VAP_API,)).one("DaemonSet")["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    return pod, agent


def security_flags(pod: dict[str, Any], agent: dict[str, Any]) -> tuple[list[str], int]:
    """podman flags for the container's effective securityContext, and its uid."""
    context = {**pod.get("securityContext", {}), **agent.get("securityContext", {})}
    uid, gid = context["runAsUser"], context["runAsGroup"]
    if context.get("runAsNonRoot"):
        assert uid != 0, "runAsNonRoot with uid 0: the kubelet would refuse to start it"
    flags = ["--user", f"{uid}:{gid}"]
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    flags += [f"--cap-drop={c}" for c in context["capabilities"]["drop"]]
    flags += [f"--cap-add={c}" for c in context["capabilities"].get("add", [])]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    assert not context.get("privileged")
    assert context["seccompProfile"]["type"] == "RuntimeDefault"  # podman's default profile
    return flags, uid


def mount_flags(
    pod: dict[str, Any], agent: dict[str, Any], host_paths: dict[str, Path]
) -> list[str]:
    """A bind mount for each hostPath volume (from `host_paths`), a tmpfs for a memory emptyDir."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    flags: list[str] = []
    for mount in agent["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            source = host_paths[volume["hostPath"]["path"]]
            mode = "ro" if mount.get("readOnly") else "rw"
            flags += ["--volume", f"{source}:{mount['mountPath']}:{mode}"]
        elif volume.get("emptyDir", {}).get("medium") == "Memory":
            size = volume["emptyDir"]["sizeLimit"].removesuffix("i").lower()
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,size={size},mode=1777"]
        else:
            pytest.fail(f"the chart mounts {volume}, which this test cannot give the container")
    return flags


def env_flags(agent: dict[str, Any], node: str, listen_port: int) -> list[str]:
    """The container's env, the downward API's fields filled in as the kubelet fills them."""
    downward = {"spec.nodeName": node, "metadata.namespace": NAMESPACE}
    flags: list[str] = []
    for var in agent["env"]:
        if "valueFrom" in var:
            value = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
        elif var["name"] == "TOPO_REPORTER_LISTEN":
            assert var["value"] == f"0.0.0.0:{listen_port}"
            value = f"127.0.0.1:{listen_port}"  # see the module docstring
        else:
            value = var["value"]
        flags += ["--env", f"{var['name']}={value}"]
    return flags


def probe_port(agent: dict[str, Any]) -> int:
    """The port the liveness and readiness probes name, resolved through the container's ports."""
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    named = {agent[probe]["httpGet"]["port"] for probe in ("livenessProbe", "readinessProbe")}
    (port,) = {ports.get(p, p) for p in named}
    return int(port)


def service_account(server: RealApiServer, node: str, pod: str, into: Path) -> tuple[str, str]:
    """What a kubelet projects for the pod (token, ca.crt, namespace), and the service host and
    port it sets."""
    into.mkdir()
    admin = yaml.safe_load(server.kubeconfig.read_text())["clusters"][0]["cluster"]
    (into / "token").write_text(pod_token(server, node, pod))
    (into / "ca.crt").write_bytes(base64.b64decode(admin["certificate-authority-data"]))
    (into / "namespace").write_text(NAMESPACE)
    into.chmod(0o755)
    for f in into.iterdir():
        f.chmod(0o644)
    url = urlsplit(admin["server"])
    return str(url.hostname), str(url.port)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def wait_ready(port: int, container: str) -> None:
    deadline = time.monotonic() + READY_S
    while get(port, "/readyz")[0] != 200:
        state = podman("inspect", "--format", "{{.State.Running}}", container).stdout.strip()
        if state != "true" or time.monotonic() > deadline:
            logs = podman("logs", container)
            pytest.fail(f"the agent in the image is not ready:\n{logs.stderr[-4000:]}")
        time.sleep(0.5)


def proc_status(container: str) -> dict[str, str]:
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


@contextlib.contextmanager
def running(args: list[str]) -> Iterator[str]:
    name = unique("topo-reporter-image")
    started = podman(*PODMAN_RUN[1:], "--detach", "--name", name, *args)
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        podman("rm", "--force", "--time", "5", name)


@pytest.fixture(scope="module")
def image() -> str:
    return built_image()


@pytest.mark.parametrize("values", list(CASES.values()), ids=list(CASES))
def test_the_image_runs_as_the_daemonset_and_publishes_a_dgx_h100_on_its_node(
    values: dict[str, Any],
    image: str,
    real_apiserver: RealApiServer,
    chart_installed: None,  # noqa: F811  # the fixture imported above
    real_node_factory: NodeFactory,
    kubelet: KubeletPodResources,  # noqa: F811  # the fixture imported above
    tmp_path: Path,
) -> None:
    pod, agent = container_of(values)
    node = real_node_factory(labels={"team": "ml"})
    pod_name = f"topo-reporter-{node}"
    host, port = service_account(real_apiserver, node, pod_name, tmp_path / "serviceaccount")
    ids = simulated_gpu_uuids()
    kubelet.write(
        {
            "devices": devices_state(GPU, ids),
            "pods": [pod_state("train", GPU, [ids[i] for i in HELD], namespace="ml")],
        }
    )
    listen = probe_port(agent)
    security, uid = security_flags(pod, agent)
    host_paths = {
        "/sys": Path("/sys"),
        "/var/lib/kubelet/config.yaml": KUBELET_CONFIG,
        "/var/lib/kubelet/pod-resources": kubelet.socket.parent,
    }
    args = [
        "--network=host",
        *security,
        *mount_flags(pod, agent, host_paths),
        "--volume",
        f"{tmp_path / 'serviceaccount'}:{SERVICE_ACCOUNT_DIR}:ro",
        *env_flags(agent, node, listen),
        "--env",
        f"KUBERNETES_SERVICE_HOST={host}",
        "--env",
        f"KUBERNETES_SERVICE_PORT={port}",
        "--entrypoint",
        agent["command"][0],
        image,
        *agent["command"][1:],
        *agent["args"],
        # The one flag the DaemonSet lacks: no GPU here, so the simulated machine.
        "--simulate",
        "dgx-h100",
    ]
    try:
        with running(args) as container:
            wait_ready(listen, container)
            status = proc_status(container)
            assert status["Uid"].split()[:2] == [str(uid), str(uid)]
            assert status["CapEff"] == status["CapPrm"] == "0000000000000000"
            assert status["NoNewPrivs"] == "1"
            if "--read-only" in security:
                # The image has no touch, no shell: its Python writes.
                wrote = podman(
                    "exec", container, PYTHON, "-c", "open('/opt/topo-reporter/written', 'w')"
                )
                assert wrote.returncode != 0
                assert "Read-only file system" in wrote.stderr
            assert get(listen, "/healthz")[0] == 200
            code, metrics = get(listen, "/metrics")
            assert code == 200
            assert "topo_reporter_gpus 8.0" in metrics.splitlines()
            availability = bool(values.get("availability", {}).get("enabled"))
            # Ready is the first publish of the topology; the availability and the Lease follow
            # from the availability loop's first read.
            published = wait_for_node(
                real_apiserver, node, f"{PREFIX}/gpu-free" if availability else None
            )
            if availability:
                lease = wait_for_lease(real_apiserver, node)
    finally:
        real_apiserver.core().delete_namespaced_pod(pod_name, NAMESPACE)
    labels, annotations = published.labels, published.annotations
    assert labels[f"{PREFIX}/count"] == "8"
    assert labels[f"{PREFIX}/interconnect"] == "nvswitch"
    assert labels[f"{PREFIX}/topology-manager-policy"] == "single-numa-node"
    assert labels["team"] == "ml"
    assert f"{PREFIX}/topology" in annotations
    if availability:
        assert labels[f"{PREFIX}/gpu-free"] == str(len(ids) - len(HELD))
        assert lease.spec.holder_identity
    else:
        assert f"{PREFIX}/gpu-free" not in labels


def wait_for_node(server: RealApiServer, node: str, label: str | None) -> Any:
    """The Node's metadata once it carries `label` (at once when None)."""
    deadline = time.monotonic() + READY_S
    while True:
        metadata = server.core().read_node(node).metadata
        if label is None or label in (metadata.labels or {}):
            return metadata
        if time.monotonic() > deadline:
            pytest.fail(f"no {label} on {node} after {READY_S:.0f} s: {metadata.labels}")
        time.sleep(0.5)


def wait_for_lease(server: RealApiServer, node: str) -> Any:
    leases = k8s.CoordinationV1Api(server.api())
    deadline = time.monotonic() + READY_S
    while True:
        try:
            return leases.read_namespaced_lease(node, NAMESPACE)
        except k8s.ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def simulated_gpu_uuids() -> list[str]:
    from reporter.collect import build_scanner  # noqa: PLC0415  # only this test scans

    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    return [g.uuid for g in scan.topology.gpus if g.uuid is not None]
