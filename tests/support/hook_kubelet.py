"""A double of the kubelet, for the pods of a Helm hook Job on the real control plane.

The harness runs no kubelet, so a Job's pod would stay Pending and `helm uninstall` would wait on
its pre-delete hook until it timed out. This double does, for the pods the real Job controller
creates from the hook Job, what a kubelet does and nothing more: it takes the pod's own container
command and args, resolves its env (values and the downward API's `metadata.namespace`), mints a
token for the pod's ServiceAccount bound to that pod (TokenRequest, as the kubelet's projected
token volume does), and runs the command as a process whose kubeconfig carries that token (the
stand-in for the in-cluster mount: no Service routes to the API server here). Then it writes the
pod's status as the kubelet would: Succeeded or Failed, with the container's exit code. The Job
controller, Helm's wait on the hook and everything the command does are real.

What is not real: no image, no container runtime, no security context (the process runs as the
test's user); the program is the checkout's `topo-reporter` console script.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client as k8s

from tests.cli.test_run import env
from tests.controlplane.test_prune import kubeconfig_for_token
from tests.support.controlplane_fixtures import RealApiServer

POLL_S = 0.2


@dataclass(frozen=True)
class Ran:
    """One pod the double ran: its name, the argv, the exit status and the output."""

    pod: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass
class HookKubelet:
    """Runs every pod of the Job `job` in `namespace` once, from a thread, until stopped."""

    server: RealApiServer
    namespace: str
    job: str
    work: Path
    ran: list[Ran] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> HookKubelet:
        self._thread = threading.Thread(target=self._loop, name="hook-kubelet", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=180)
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        core = self.server.core()
        done: set[str] = set()
        try:
            while not self._stop.is_set():
                pods = core.list_namespaced_pod(
                    self.namespace, label_selector=f"batch.kubernetes.io/job-name={self.job}"
                ).items
                for pod in pods:
                    if pod.metadata.name not in done and pod.status.phase in (None, "Pending"):
                        done.add(pod.metadata.name)
                        self._run(core, pod)
                time.sleep(POLL_S)
        except BaseException as e:  # reported by __exit__, in the test's thread
            self._error = e

    def _run(self, core: k8s.CoreV1Api, pod: k8s.V1Pod) -> None:
        (container,) = pod.spec.containers
        token = core.create_namespaced_service_account_token(
            pod.spec.service_account_name,
            self.namespace,
            k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(
                    audiences=[],
                    expiration_seconds=3600,
                    bound_object_ref=k8s.V1BoundObjectReference(
                        kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                    ),
                )
            ),
        ).status.token
        work = self.work / pod.metadata.name
        work.mkdir(parents=True)
        kubeconfig = kubeconfig_for_token(self.server, token, work)
        environ = {"KUBECONFIG": str(kubeconfig)}
        for var in container.env or ():
            if var.value_from is not None:
                assert var.value_from.field_ref.field_path == "metadata.namespace", var
                environ[var.name] = pod.metadata.namespace
            else:
                environ[var.name] = var.value
        (program, *rest) = [*container.command, *(container.args or ())]
        # The image's program is this checkout's console script, beside the test's Python.
        found = shutil.which(program, path=str(Path(sys.executable).parent))
        assert found is not None, f"{program} is not installed beside {sys.executable}"
        started = datetime.now(UTC)
        done = subprocess.run(
            [found, *rest],
            capture_output=True,
            text=True,
            timeout=120,
            env=env(**environ),
            check=False,
        )
        self.ran.append(
            Ran(pod.metadata.name, (program, *rest), done.returncode, done.stdout, done.stderr)
        )
        stamp = started.strftime("%Y-%m-%dT%H:%M:%SZ")
        core.patch_namespaced_pod_status(
            pod.metadata.name,
            self.namespace,
            {
                "status": {
                    "phase": "Succeeded" if done.returncode == 0 else "Failed",
                    "startTime": stamp,
                    "containerStatuses": [
                        {
                            "name": container.name,
                            "image": container.image,
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": done.returncode,
                                    "reason": "Completed" if done.returncode == 0 else "Error",
                                    "startedAt": stamp,
                                    "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                }
                            },
                        }
                    ],
                }
            },
        )
