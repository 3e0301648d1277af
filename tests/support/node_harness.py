"""A real node for the tests: `controlplane node` (tests/controlplane/node.go), the real kubelet
v1.37.2 on containerd, with a double of NVIDIA's device plugin, against an apiserver of the tests'
own with the controllers and the scheduler a Helm install needs.

Where the machine cannot run a kubelet (not root) the tests skip, saying why in one line; where a
tool tests/prereqs.sh installs is missing (containerd, runc, the CNI plugins, gcc) they fail, as
the other tests of real tools do. Every node is stopped with SIGTERM and the host checked
afterwards: no mount, process, cgroup, bridge, address, sysctl change or directory of the node's
is left."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.support.controlplane_fixtures import (
    RealApiServer,
    _tail,
    build_harness,
    running_apiserver,
    start_harness,
    stop_process,
    wait_for_file,
)

NODE_CONTROLLERS = (
    "daemonset,job,serviceaccount,garbagecollector,nodelifecycle,root-ca-cert-publisher"
)
"""What a DaemonSet on a real node needs: nodelifecycle lifts the not-ready taint the kubelet
registers with, serviceaccount and root-ca-cert-publisher make what a projected token mounts,
garbagecollector deletes the pods of an uninstalled DaemonSet, job runs the prune hook."""
NODE_READY_TIMEOUT_S = 240.0
"""The harness gives up after 3 minutes itself; on this machine the node is ready in ~2 s."""
NODE_STOP_TIMEOUT_S = 120.0
"""The harness waits 20 s for the kubelet and 10 s for containerd, then cleans up."""
CONTROL_TIMEOUT_S = 30.0
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
"""The host sysctls the kubelet (and the bridge plugin) may change, which the node restores."""
FIXED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/run/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/etc/cni",
)
"""Host paths a kubelet or containerd would make; the node makes them only in its namespace.
(/run/netns is left out: other tests make and remove it with `ip netns` at any time.)"""
CNI_PLUGINS = Path("/usr/lib/cni")


def require_node() -> None:
    """Skip where the machine cannot run a kubelet (not root); fail where a prerequisite is
    missing, which tests/prereqs.sh installs."""
    if os.geteuid() != 0:
        pytest.skip("the node harness needs root (mounts, namespaces, cgroups, a bridge)")
    missing = [t for t in ("containerd", "ctr", "runc", "ip", "gcc") if shutil.which(t) is None]
    missing += [
        f"{CNI_PLUGINS}/{p}"
        for p in ("bridge", "host-local", "loopback")
        if not (CNI_PLUGINS / p).exists()
    ]
    if missing:
        pytest.fail(
            f"the node harness needs {', '.join(missing)}: run tests/prereqs.sh", pytrace=False
        )


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _ours(cmdline: list[str]) -> bool:
    if not cmdline:
        return False
    program = os.path.basename(cmdline[0])
    if program.startswith(("containerd", "runc")):
        return True
    return (
        len(cmdline) > 1
        and cmdline[1] in ("node", "node-namespace", "kubelet")
        and (program == "controlplane")
    )


@dataclass(frozen=True)
class HostState:
    """What of the host's a node could leave behind, as sets to compare before and after."""

    mounts: frozenset[str]
    processes: frozenset[str]
    cgroups: frozenset[str]
    links: frozenset[str]
    addresses: frozenset[str]
    sysctls: tuple[tuple[str, str], ...]
    paths: frozenset[str]
    iptables: frozenset[str]

    @classmethod
    def now(cls) -> HostState:
        mounts = set()
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if re.search(
                r"kubelet|containerd|netns|/var/lib/cni|/var/log/(containers|pods)", point
            ):
                mounts.add(point)
        processes = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if _ours(cmdline):
                processes.add(f"{proc.name} {' '.join(cmdline).strip()}")
        cgroups = {
            str(p)
            for pattern in ("*/controlplane-node-*", "*/kubepods*")
            for p in Path("/sys/fs/cgroup").glob(pattern)
        }
        links = subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        addrs = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        iptables = ""
        if shutil.which("iptables-save"):
            iptables = subprocess.run(
                ["iptables-save"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        return cls(
            mounts=frozenset(mounts),
            processes=frozenset(processes),
            cgroups=frozenset(cgroups),
            links=frozenset(re.findall(r"^\d+: (cpnode\d+)", links, re.M)),
            addresses=frozenset(re.findall(r"inet (10\.96\.0\.1/32|10\.244\.\d+\.\d+/\d+)", addrs)),
            sysctls=tuple((k, _read(f"/proc/sys/{k.replace('.', '/')}")) for k in SYSCTLS),
            paths=frozenset(p for p in FIXED_PATHS if os.path.lexists(p)),
            iptables=frozenset(line for line in iptables.splitlines() if "KUBE" in line.upper()),
        )

    def left_after(self, later: HostState) -> dict[str, Any]:
        """What `later` has that this state had not (and the sysctls that differ)."""
        left: dict[str, Any] = {}
        for name in ("mounts", "processes", "cgroups", "links", "addresses", "paths", "iptables"):
            extra = sorted(getattr(later, name) - getattr(self, name))
            if extra:
                left[name] = extra
        changed = [
            (k, v, w) for (k, v), (_, w) in zip(self.sysctls, later.sysctls, strict=True) if v != w
        ]
        if changed:
            left["sysctls"] = changed
        return left


@dataclass
class RealNode:
    """A running `controlplane node`: the real kubelet, containerd and the device plugin double."""

    name: str
    root: Path
    log: Path
    proc: subprocess.Popen[bytes]
    ready_s: float
    """Seconds from the start until DIR/ready appeared."""

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet" / "config.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def control(self, command: str) -> None:
        """A command to the device plugin double: unhealthy ID, healthy ID, stop, crash, start."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(CONTROL_TIMEOUT_S)
            sock.connect(str(self.root / "device-plugin.control"))
            sock.sendall(command.encode() + b"\n")
            answer = sock.makefile().readline().strip()
        assert answer == "ok", f"device plugin double: {command}: {answer}"

    def restart_kubelet(self) -> None:
        """Restart the kubelet (SIGHUP to the node); containerd and the pods stay."""
        self.proc.send_signal(signal.SIGHUP)

    def events(self) -> list[dict[str, Any]]:
        """Every call the kubelet made to the device plugin double, in order."""
        path = self.root / "logs" / "device-plugin.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's log lines as the kubelet wrote them (CRI format), every restart."""
        found = sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log"))
        return "".join(p.read_text(errors="replace") for p in found)

    def namespace_logs(self, namespace: str) -> str:
        """The tail of every container log of the namespace's pods on this node."""
        found = sorted(self.pod_logs.glob(f"{namespace}_*/*/*.log"))
        return _tail("".join(f"--- {p}\n" + p.read_text(errors="replace") for p in found))

    def log_tail(self) -> str:
        parts = [self.log.read_text(errors="replace")]
        for name in ("kubelet.log", "containerd.log", "namespace.log"):
            path = self.root / "logs" / name
            if path.exists():
                parts.append(f"--- {name}\n" + _tail(path.read_text(errors="replace")))
        return _tail("\n".join(parts))


@contextlib.contextmanager
def running_node(
    binary: Path,
    kubeconfig: Path,
    work: Path,
    name: str,
    *,
    devices: Sequence[Mapping[str, Any]] | None = None,
    images: Sequence[Path] = (),
    policy: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[RealNode]:
    """A node from the harness, ready (registered, Ready, its GPUs allocatable), stopped with
    SIGTERM when the block ends; the host is checked afterwards for anything it left."""
    require_node()
    before = HostState.now()
    root = work / "node"
    root.mkdir(parents=True, exist_ok=True)
    args = ["node", "--kubeconfig", str(kubeconfig), "--root", str(root), "--name", name]
    if devices is not None:
        devices_file = work / "devices.json"
        devices_file.write_text(json.dumps(list(devices)))
        args += ["--devices", str(devices_file)]
    for image in images:
        args += ["--image", str(image)]
    if policy is not None:
        args += ["--topology-manager-policy", policy]
    log = work / "node.log"
    proc = start_harness(binary, args, log, env=env)
    try:
        ready_s = wait_for_file(root / "ready", proc, NODE_READY_TIMEOUT_S, log)
        yield RealNode(name, root, log, proc, ready_s)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=NODE_STOP_TIMEOUT_S)
        finally:
            stop_process(proc)
    assert status == 0, f"the node did not stop cleanly ({status}):\n" + _tail(
        log.read_text(errors="replace")
    )
    left = before.left_after(HostState.now())
    assert not left, f"the node left this behind: {left}"


@dataclass
class NodeCluster:
    """An apiserver of the node tests' own, with the controllers and the scheduler a Helm install
    needs (nodelifecycle would mark every kubelet-less Node of the shared apiserver unreachable)."""

    server: RealApiServer
    binary: Path
    work: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def core(self) -> k8s.CoreV1Api:
        return self.server.core()

    def node(self, work: Path, name: str, **kw: Any) -> contextlib.AbstractContextManager[RealNode]:
        return running_node(self.binary, self.server.kubeconfig, work, name, **kw)


@contextlib.contextmanager
def running_cluster(binary: Path, work: Path) -> Iterator[NodeCluster]:
    """The apiserver, `controller-manager --controllers NODE_CONTROLLERS` and the scheduler."""
    with running_apiserver(binary, work) as server:
        cluster = NodeCluster(server, binary, work)
        scheduler_config = work / "scheduler.yaml"
        scheduler_config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        kubeconfig = str(server.kubeconfig)
        try:
            cluster.processes.append(
                start_harness(
                    binary,
                    [
                        "controller-manager",
                        "--kubeconfig",
                        kubeconfig,
                        "--controllers",
                        NODE_CONTROLLERS,
                    ],
                    work / "controller-manager.log",
                )
            )
            cluster.processes.append(
                start_harness(
                    binary,
                    ["scheduler", "--config", str(scheduler_config), "--kubeconfig", kubeconfig],
                    work / "scheduler.log",
                )
            )
            yield cluster
        finally:
            for proc in cluster.processes:
                stop_process(proc)


def image_archive(image: str, work: Path) -> Path:
    """`podman save` of an image as a docker archive, for `node --image`."""
    archive = work / (re.sub(r"[^A-Za-z0-9.-]+", "_", image) + ".tar")
    saved = subprocess.run(
        ["podman", "save", "--format", "docker-archive", "-o", str(archive), image],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr[-2000:]
    return archive


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """One NodeCluster per test module (skips where no node can run, before building anything)."""
    require_node()
    with running_cluster(build_harness(), tmp_path_factory.mktemp("node-cluster")) as cluster:
        yield cluster


def topo_reporter() -> str:
    """The `topo-reporter` command of this environment (the venv's), for the device plugin's
    preferred-allocation command line."""
    script = Path(sys.executable).parent / "topo-reporter"
    return str(script) if script.exists() else "topo-reporter"


def wait_until(what: str, check: Any, timeout_s: float = 60.0, log: str | Any = "") -> Any:
    """Poll `check()` until it returns something true; fail naming `what` (and `log()`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what}: not within {timeout_s:.0f} s\n{log() if callable(log) else log}",
                pytrace=False,
            )
        time.sleep(0.2)
