"""The control-plane harness itself (tests/controlplane): what it promises the other tests.

The apiserver issues pod-bound service-account tokens carrying the node claim (what the chart's
admission policy keys on), the scheduler binds pods, and the apiserver subcommand keeps its
interface: kubeconfig once ready, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from tests.support.controlplane_fixtures import (
    HARNESS,
    START_TIMEOUT_S,
    NodeFactory,
    RealApiServer,
    go_binary,
    start_harness,
    stop_process,
    wait_for_file,
)

pytestmark = pytest.mark.controlplane

NODE_CLAIM = "authentication.kubernetes.io/node-name"
BIND_TIMEOUT_S = 60.0


def pod(name: str, *, node: str | None = None, service_account: str = "default") -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            node_name=node,
            service_account_name=service_account,
            automount_service_account_token=False,
            containers=[k8s.V1Container(name="c", image="registry.k8s.io/pause:3.10")],
        ),
    )


def test_a_pod_bound_token_carries_the_node_claim(
    real_apiserver: RealApiServer, real_namespace: str, real_node_factory: NodeFactory
) -> None:
    core = real_apiserver.core()
    node = real_node_factory()
    core.create_namespaced_service_account(
        real_namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="agent"))
    )
    created = core.create_namespaced_pod(
        real_namespace, pod("agent-pod", node=node, service_account="agent")
    )
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=600,
            bound_object_ref=k8s.V1BoundObjectReference(
                kind="Pod", api_version="v1", name="agent-pod", uid=created.metadata.uid
            ),
        )
    )
    token = core.create_namespaced_service_account_token("agent", real_namespace, request)
    review = k8s.AuthenticationV1Api(real_apiserver.api()).create_token_review(
        k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token.status.token))
    )
    assert review.status.authenticated, review.status.error
    assert review.status.user.username == f"system:serviceaccount:{real_namespace}:agent"
    assert review.status.user.extra[NODE_CLAIM] == [node]
    assert review.status.user.extra["authentication.kubernetes.io/pod-name"] == ["agent-pod"]


@pytest.fixture
def scheduler(real_apiserver: RealApiServer, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    config = tmp_path / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    proc = start_harness(
        real_apiserver.binary,
        ["scheduler", "--config", str(config), "--kubeconfig", str(real_apiserver.kubeconfig)],
        tmp_path / "scheduler.log",
    )
    try:
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "scheduler.log").read_text()[-3000:]
    finally:
        stop_process(proc)


def test_the_scheduler_binds_a_pod_to_the_only_node_that_fits(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: NodeFactory,
    scheduler: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    log = tmp_path / "scheduler.log"
    core = real_apiserver.core()
    real_node_factory()  # not Ready, tainted not-ready: no room for the pod
    node = real_node_factory(ready=True)
    core.create_namespaced_pod(real_namespace, pod("scheduled"))
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while (bound := core.read_namespaced_pod("scheduled", real_namespace).spec.node_name) is None:
        assert scheduler.poll() is None, f"the scheduler exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not bound: {log.read_text()[-3000:]}"
        time.sleep(0.1)
    assert bound == node


def test_apiserver_writes_the_kubeconfig_when_ready_and_stops_cleanly_on_sigterm(
    controlplane_bin: Path, tmp_path: Path
) -> None:
    kubeconfig, log = tmp_path / "admin.kubeconfig", tmp_path / "apiserver.log"
    proc = start_harness(
        controlplane_bin, ["apiserver", "--kubeconfig", str(kubeconfig)], log, subprocess.PIPE
    )
    try:
        wait_for_file(kubeconfig, proc, START_TIMEOUT_S, log)
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        assert server.startswith("https://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert f"apiserver {server} ready in" in out.decode()
        assert not kubeconfig.exists()
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing of its process group is left
    finally:
        stop_process(proc)


def test_the_harness_source_is_gofmt_clean() -> None:
    """`go vet` runs in .ci/run (cold, it analyses all of Kubernetes: minutes); gofmt is instant."""
    gofmt = Path(go_binary()).resolve().with_name("gofmt")
    result = subprocess.run(
        [str(gofmt), "-l", "."], cwd=HARNESS, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"not gofmt-formatted: {result.stdout}"
