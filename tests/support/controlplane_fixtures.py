"""The real Kubernetes control plane for the tests: the Go harness in tests/controlplane/, built
with `go build` (cached), its kube-apiserver started once per pytest run, and fresh Nodes and
namespaces per test. Tests that use it carry the `controlplane` marker; without Go they fail, never
skip."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

HARNESS = Path(__file__).resolve().parents[1] / "controlplane"
GO_MISSING = (
    "the control-plane tests need Go: install Go 1.26 (https://go.dev/dl/) and put `go` on PATH"
)
GO_FALLBACK = Path("/usr/local/go/bin/go")
"""Where the official Go tarball (and tests/prereqs.sh) installs; found even when PATH does not name
it, or names an older Go (Debian's golang-go)."""
GO_MIN = (1, 26)

BUILD_TIMEOUT_S = 3600.0
"""A cold build compiles kube-apiserver and etcd: tens of minutes on two cores; warm, seconds."""
START_TIMEOUT_S = 240.0
"""The harness itself gives up after 3 minutes without /readyz; this only catches a hung process."""
STOP_TIMEOUT_S = 40.0
MAX_LOG_TAIL = 4000
APISERVER_FLAGS = (
    "--feature-gates=DRADerivedAttributes=true,DRAListTypeAttributes=true,"
    "GenericWorkload=true,TopologyAwareWorkloadScheduling=true",
    "--runtime-config=scheduling.k8s.io/v1beta1=true",
)
"""The shared kube-apiserver (1.37) serves DRA's derived and list-type attributes (alpha: a claim
may carry `derivedAttributes`, a slice list-valued attributes) and KEP-5732's PodGroups (the beta
`scheduling.k8s.io/v1beta1` API, which beta APIs need turned on): one server for every
control-plane test is cheaper than a second one with gates of its own. DeviceTaintRules are GA
(`resource.k8s.io/v1`) and on by default."""
RULES_VERSION = "v1"
"""The version the harness's apiserver serves DeviceTaintRules in (GA from 1.37; the agent finds
the newest served one, reporter.schema.dra.VERSIONS)."""
SCHEDULER_FEATURE_GATES = (
    "--feature-gates=DRADerivedAttributes=true,DRAListTypeAttributes=true,"
    "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
)
"""The scheduler's allocator evaluates derived attributes, and its pod-group plugins place a
PodGroup by its topology key, only with their own gates on."""


def go_version(go: str) -> tuple[int, int]:
    """(major, minor) of a `go` command; (0, 0) when it does not say. Asked outside any module,
    with GOTOOLCHAIN=local, so that no go.mod makes it download another toolchain."""
    result = subprocess.run(
        [go, "env", "GOVERSION"],
        cwd="/",
        env={**os.environ, "GOTOOLCHAIN": "local"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.match(r"go(\d+)\.(\d+)", result.stdout.strip())
    return (int(found[1]), int(found[2])) if found else (0, 0)


def go_binary() -> str:
    """The first Go 1.26 or newer, on PATH or in /usr/local/go, or a test failure in one line
    saying what to install."""
    older = []
    for go in (shutil.which("go"), str(GO_FALLBACK) if GO_FALLBACK.is_file() else None):
        if go is None:
            continue
        version = go_version(go)
        if version >= GO_MIN:
            return go
        older.append(f"{go} (go{version[0]}.{version[1]})")
    if older:
        pytest.fail(
            f"the control-plane tests need Go 1.26 or newer, found only {', '.join(older)}: "
            "install Go 1.26 (https://go.dev/dl/, or sh tests/prereqs.sh)",
            pytrace=False,
        )
    pytest.fail(GO_MISSING, pytrace=False)


CONSUMERS = HARNESS / "consumers"
"""The second Go module: other projects' own code (Koordinator's koordlet, Volcano's discovery), on
the harness's Kubernetes."""
PLUGINS = HARNESS / "plugins"
"""The third Go module: schedulers whose latest releases build only against Kubernetes 1.34
(scheduler-plugins' NodeResourceTopologyMatch, YuniKorn), run against the harness's apiserver."""
LIBPFM_MISSING = (
    "the consumers module needs libpfm4-dev (Koordinator's koordlet links libpfm4 through cgo): "
    "apt-get install -y libpfm4-dev"
)


def _tail(text: str) -> str:
    return text[-MAX_LOG_TAIL:]


@dataclass
class GoProgram:
    """A Go program of the tests, `go build -o CACHE PACKAGE` in its module, once per pytest
    process; Go's build cache makes an unchanged build take seconds, and an up-to-date binary is
    not even relinked. `package` is `.` (the module's own main) or another project's main package
    that the module's go.mod lists as a `tool` (Kueue's controller manager, YuniKorn's
    scheduler), built as that project builds it."""

    name: str
    module: Path
    package: str = "."
    selected_by: str = ""
    """The fixture whose use makes `build_before_tests` build it ("": every control-plane test)."""
    tags: tuple[str, ...] = ()
    """Build tags, as the project documents them for a smaller build."""
    _built: Path | str | None = field(default=None, repr=False)
    """The binary, or why it could not be built: one attempt per pytest process."""

    def cache_path(self) -> Path:
        # One binary per checkout: two worktrees building at once must not overwrite each other.
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        checkout = hashlib.sha256(str(self.module).encode()).hexdigest()[:12]
        return base / "topo-reporter" / f"{self.name}-{checkout}" / self.name

    def build(self) -> Path:
        """The binary, built or found up to date; a test failure in one line when it cannot be."""
        if isinstance(self._built, str):
            pytest.fail(self._built, pytrace=False)
        if self._built is not None:
            return self._built
        try:
            self._built = self._build()
        except pytest.fail.Exception as failure:
            self._built = str(failure)
            raise
        return self._built

    def _build(self) -> Path:
        go = go_binary()
        out = self.cache_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        # cgo compiles its probes from files in TMPDIR, where `#include "x.h"` finds an x.h lying
        # there before the package's own: a stray /tmp/nvml.h broke go-nvml's build. A private one.
        scratch = out.parent / "tmp"
        scratch.mkdir(exist_ok=True)
        # GOTOOLCHAIN=local: an older Go must say so, not try to download a newer one.
        env = {**os.environ, "GOTOOLCHAIN": "local", "TMPDIR": str(scratch)}
        try:
            result = subprocess.run(
                [
                    go,
                    "build",
                    *(["-tags", ",".join(self.tags)] if self.tags else []),
                    "-o",
                    str(out),
                    self.package,
                ],
                cwd=self.module,
                env=env,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"`go build {self.package}` in {self.module} ran over {BUILD_TIMEOUT_S:.0f} s",
                pytrace=False,
            )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            if "perfmon/pfmlib.h" in output:
                pytest.fail(LIBPFM_MISSING, pytrace=False)
            pytest.fail(
                f"`go build {self.package}` in {self.module} failed (Go 1.26 and the Go module "
                "proxy are needed):\n" + _tail(output),
                pytrace=False,
            )
        return out


HARNESS_PROGRAM = GoProgram("controlplane", HARNESS)
CONSUMERS_PROGRAM = GoProgram("consumers", CONSUMERS, selected_by="consumers_bin")
KUEUE = HARNESS / "kueue"
"""The fourth Go module: Kueue alone, on the Kubernetes its own go.mod pins (1.36)."""
KUEUE_PROGRAM = GoProgram(
    "kueue", KUEUE, package="sigs.k8s.io/kueue/cmd/kueue", selected_by="kueue_bin"
)
PLUGINS_PROGRAM = GoProgram("plugins", PLUGINS, selected_by="plugins_bin")
YUNIKORN_PROGRAM = GoProgram(
    "yunikorn",
    PLUGINS,
    package="github.com/apache/yunikorn-k8shim/pkg/cmd/shim",
    selected_by="yunikorn_bin",
)
DRACEL_PROGRAM = GoProgram("dracel", HARNESS, package="./dracel", selected_by="dracel_bin")
PROMETHEUS_MODULE = HARNESS / "prometheus"
"""The fifth Go module: Prometheus' own promtool and server (v0.314.0, on the harness's Kubernetes
like the consumers module, which cannot hold it: Koordinator's replace block pins
github.com/prometheus/prometheus to v0.39.2 there)."""
# remove_all_sd: Prometheus' own tag for a build without the service discoveries' cloud SDKs
# (the tests scrape static loopback targets); promtool keeps the kubernetes and file ones.
PROMTOOL_PROGRAM = GoProgram(
    "promtool",
    PROMETHEUS_MODULE,
    package="github.com/prometheus/prometheus/cmd/promtool",
    selected_by="promtool_bin",
    tags=("remove_all_sd",),
)
PROMETHEUS_PROGRAM = GoProgram(
    "prometheus",
    PROMETHEUS_MODULE,
    package="github.com/prometheus/prometheus/cmd/prometheus",
    selected_by="prometheus_bin",
    tags=("remove_all_sd",),
)
PROGRAMS = (
    HARNESS_PROGRAM,
    CONSUMERS_PROGRAM,
    KUEUE_PROGRAM,
    PLUGINS_PROGRAM,
    YUNIKORN_PROGRAM,
    DRACEL_PROGRAM,
    PROMTOOL_PROGRAM,
    PROMETHEUS_PROGRAM,
)


def build_harness() -> Path:
    """The harness binary (tests/controlplane/), built or found up to date."""
    return HARNESS_PROGRAM.build()


def build_consumers() -> Path:
    """The consumers binary (tests/controlplane/consumers/), built or found up to date."""
    return CONSUMERS_PROGRAM.build()


def build_before_tests(session: pytest.Session) -> None:
    """Build the Go binaries the selected tests need after collection, so that a cold build
    (minutes) is not charged to the first test's timeout. A failure is reported by the fixture."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for program in PROGRAMS:
        if program.selected_by:
            needed = any(
                program.selected_by in getattr(item, "fixturenames", ()) for item in session.items
            )
        else:
            needed = any(item.get_closest_marker("controlplane") for item in session.items)
        if not needed:
            continue
        if reporter is not None:
            reporter.write_line(
                f"building {program.name} ({program.package}) in {program.module} (cached by Go)"
            )
        with contextlib.suppress(pytest.fail.Exception):
            program.build()


def _die_with_parent() -> None:
    """Runs in the child before exec: if pytest is killed outright, the kernel stops the server."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, a bounded wait, then SIGKILL to the whole process group: nothing is left behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout_s)


def start_harness(
    binary: Path,
    args: list[str],
    log: Path,
    stdout: int | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a harness subcommand (or another Go program of the tests) in its own process group,
    stderr (and stdout) into `log`; `env` adds to the environment."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else sink,
            stderr=sink,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no Python state touched
        )


@dataclass
class RealApiServer:
    """A running kube-apiserver (on embedded etcd) started from the harness."""

    binary: Path
    kubeconfig: Path
    """The admin's kubeconfig: a client certificate in `system:masters`."""
    log: Path
    start_s: float
    """Seconds from the process start until the kubeconfig appeared (server ready)."""
    _api: k8s.ApiClient | None = field(default=None, repr=False)

    def api(self) -> k8s.ApiClient:
        """An official-client ApiClient with the admin's credentials."""
        if self._api is None:
            self._api = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api())

    def log_tail(self) -> str:
        return _tail(self.log.read_text(errors="replace"))


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> float:
    """Seconds until `path` exists; fails at once if the process exits first."""
    started = time.monotonic()
    delay = 0.02
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(
                f"the harness exited ({proc.returncode}) before writing {path}:\n"
                + _tail(log.read_text(errors="replace")),
                pytrace=False,
            )
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"no {path} after {timeout_s:.0f} s; see {log}", pytrace=False)
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
    return time.monotonic() - started


@pytest.fixture(scope="session")
def controlplane_bin() -> Path:
    """The harness binary, built (or found up to date) with `go build`."""
    return build_harness()


@pytest.fixture(scope="session")
def consumers_bin() -> Path:
    """The consumers binary (Koordinator's koordlet, Volcano's discovery), built or up to date."""
    return build_consumers()


@pytest.fixture(scope="session")
def kueue_bin() -> Path:
    """Kueue's controller manager, its own main package, built in the kueue module."""
    return KUEUE_PROGRAM.build()


@pytest.fixture(scope="session")
def dracel_bin() -> Path:
    """Kubernetes' DRA CEL compiler and evaluator over stdin (tests/controlplane/dracel)."""
    return DRACEL_PROGRAM.build()


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    """Prometheus' promtool, its own main package, built in the prometheus module."""
    return PROMTOOL_PROGRAM.build()


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The Prometheus server, its own main package, built in the prometheus module."""
    return PROMETHEUS_PROGRAM.build()


@pytest.fixture(scope="session")
def plugins_bin() -> Path:
    """kube-scheduler 1.34.9 with scheduler-plugins' NodeResourceTopologyMatch registered
    (tests/controlplane/plugins)."""
    return PLUGINS_PROGRAM.build()


@pytest.fixture(scope="session")
def yunikorn_bin() -> Path:
    """YuniKorn's scheduler (the k8shim with the core inside), its own main, built in the plugins
    module."""
    return YUNIKORN_PROGRAM.build()


@contextlib.contextmanager
def running_apiserver(
    binary: Path, work: Path, flags: Sequence[str] = APISERVER_FLAGS
) -> Iterator[RealApiServer]:
    """A real kube-apiserver (on embedded etcd) from the harness, its kubeconfig and log in
    `work`, stopped when the block ends (also on an error); `flags`: kube-apiserver's own."""
    kubeconfig, log = work / "admin.kubeconfig", work / "apiserver.log"
    proc = start_harness(binary, ["apiserver", "--kubeconfig", str(kubeconfig), "--", *flags], log)
    try:
        start_s = wait_for_file(kubeconfig, proc, START_TIMEOUT_S, log)
        server = RealApiServer(binary, kubeconfig, log, start_s)
        try:
            yield server
        finally:
            if server._api is not None:
                server._api.close()
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def real_apiserver(
    controlplane_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealApiServer]:
    """One real kube-apiserver for the whole run, stopped at the end (also when a test fails)."""
    with running_apiserver(controlplane_bin, tmp_path_factory.mktemp("controlplane")) as server:
        yield server


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def real_namespace(real_apiserver: RealApiServer) -> Iterator[str]:
    """A fresh namespace with its `default` ServiceAccount, deleted after the test.

    No controller-manager runs, so nothing would finalize it after the delete: the fixture clears
    its finalizer as the namespace controller would, so the name is really gone. Objects left inside
    stay in etcd, which dies with the run."""
    core = real_apiserver.core()
    name = unique("t")
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    # What the serviceaccount controller would add at once: pods name it by default.
    core.create_namespaced_service_account(
        name, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
    )
    yield name
    with contextlib.suppress(k8s.ApiException):
        core.delete_namespace(name)
        core.replace_namespace_finalize(
            name,
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name), spec=k8s.V1NamespaceSpec()),
        )


NodeFactory = Callable[..., str]


NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}


def create_node(
    core: k8s.CoreV1Api,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    name: str | None = None,
    ready: bool = False,
    allocatable: Mapping[str, str] | None = None,
) -> str:
    """A fresh Node (no kubelet behind it: the object is all most tests need); returns its name.

    `ready=True` does what a kubelet and the node lifecycle controller would: reports the Node
    Ready with NODE_CAPACITY plus `allocatable` (e.g. {"nvidia.com/gpu": "8"}), and lifts the
    `node.kubernetes.io/not-ready` taint the apiserver put on it, so the scheduler can use it."""
    node = name or unique("node")
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {"kubernetes.io/hostname": node, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
    }
    core.create_node(body)
    if ready or allocatable:
        resources = {**NODE_CAPACITY, **(allocatable or {})}
        status: dict[str, Any] = {"capacity": resources, "allocatable": resources}
        if ready:
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        core.patch_node_status(node, {"status": status})
    if ready:
        core.patch_node(node, {"spec": {"taints": None}})
    return node


@pytest.fixture
def real_node_factory(real_apiserver: RealApiServer) -> Iterator[NodeFactory]:
    """Makes fresh Nodes with `create_node` (its keywords); deletes them after the test."""
    core = real_apiserver.core()
    made: list[str] = []

    def make(**kw: Any) -> str:
        node = create_node(core, **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        with contextlib.suppress(k8s.ApiException):
            core.delete_node(node)


NFD_MODULE = "sigs.k8s.io/node-feature-discovery"
NFD_VERSION = "v0.17.3"
"""The NFD release whose CRDs the NodeFeature tests install (taken from Go's module cache)."""
NFD_CRDS = "deployment/base/nfd-crds/nfd-api-crds.yaml"
ESTABLISH_TIMEOUT_S = 60.0


NRT_API_MODULE = "github.com/k8stopologyawareschedwg/noderesourcetopology-api"
NRT_API_VERSION = "v0.1.2"
"""The NodeResourceTopology API that NFD v0.17.3 and scheduler-plugins pin in their go.mod; its
`manifests/crd.yaml` is the CRD NFD ships (byte for byte) and the NRT tests install."""
NRT_CRD = "manifests/crd.yaml"


def go_module_dir(module: str, version: str) -> Path:
    """A Go module's directory in Go's module cache (`go mod download`, cached by Go)."""
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{module}@{version}"],
        cwd=HARNESS,
        env={**os.environ, "GOTOOLCHAIN": "local"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"`go mod download {module}@{version}` failed: " + _tail(result.stdout),
            pytrace=False,
        )
    return Path(json.loads(result.stdout)["Dir"])


def _crds(path: Path) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(path.read_text())
    return [d for d in docs if d and d.get("kind") == "CustomResourceDefinition"]


def nfd_crds() -> list[dict[str, Any]]:
    """NFD's own CRD manifests, from the NFD Go module."""
    return _crds(go_module_dir(NFD_MODULE, NFD_VERSION) / NFD_CRDS)


def nrt_crds() -> list[dict[str, Any]]:
    """The NodeResourceTopology CRD, from the NodeResourceTopology API Go module."""
    return _crds(go_module_dir(NRT_API_MODULE, NRT_API_VERSION) / NRT_CRD)


KOORDINATOR_MODULE = "github.com/koordinator-sh/koordinator"
KOORDINATOR_VERSION = "v1.8.0"
"""The Koordinator release whose koordlet the consumers module runs and whose Device CRD the
Koordinator tests install (taken from Go's module cache)."""
KOORDINATOR_DEVICE_CRD = "config/crd/bases/scheduling.koordinator.sh_devices.yaml"


def koordinator_device_crds() -> list[dict[str, Any]]:
    """Koordinator's Device CRD, from the Koordinator Go module."""
    return _crds(go_module_dir(KOORDINATOR_MODULE, KOORDINATOR_VERSION) / KOORDINATOR_DEVICE_CRD)


def install_crds(server: RealApiServer, crds: list[dict[str, Any]]) -> list[str]:
    """Create `crds` on the real server (once per run) and wait until each is Established."""
    ext = k8s.ApiextensionsV1Api(server.api())
    names = []
    for crd in crds:
        try:
            ext.create_custom_resource_definition(crd)
        except k8s.ApiException as e:
            if e.status != 409:  # installed already, by an earlier test of this run
                raise
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + ESTABLISH_TIMEOUT_S
    for name in names:
        while not any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or ()
        ):
            if time.monotonic() > deadline:
                pytest.fail(f"CRD {name} not Established within {ESTABLISH_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
    return names


@pytest.fixture(scope="session")
def real_nfd_crds(real_apiserver: RealApiServer) -> list[str]:
    """NFD's CRDs installed on the real server and Established; their names."""
    return install_crds(real_apiserver, nfd_crds())


@pytest.fixture(scope="session")
def real_koordinator_device_crd(real_apiserver: RealApiServer) -> str:
    """Koordinator's Device CRD installed on the real server and Established; its name."""
    (name,) = install_crds(real_apiserver, koordinator_device_crds())
    return name


@pytest.fixture(scope="session")
def real_nrt_crd(real_apiserver: RealApiServer) -> str:
    """The NodeResourceTopology CRD installed on the real server and Established; its name."""
    (name,) = install_crds(real_apiserver, nrt_crds())
    return name
