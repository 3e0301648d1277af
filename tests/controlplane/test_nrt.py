"""The NodeResourceTopology sink and the agent's NRT output on the real kube-apiserver, with the
real CRD (`manifests/crd.yaml` of the NodeResourceTopology API module that NFD v0.17.3 and
scheduler-plugins pin, taken from Go's module cache): the API server's own structural-schema
validation judges every object written, the fingerprint attribute included. Writes happen only on
change, and another producer's object is never touched. Last, the chart's RBAC and admission
policy with a DaemonSet pod's own token: its node's object is written, no other node's."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from structlog.testing import capture_logs

from parsers.kubelet import KubeletPolicies
from reporter.collect.podresources import PodResourcesError, PodResourcesReader, allocation_view
from reporter.errors import ApiPermanentError
from reporter.publish import kube
from reporter.publish.api import ApiClient
from reporter.publish.nrt import ForeignProducerError, NrtOutput, NrtSink
from reporter.publish.rest import RestApiClient, load_rest_config
from reporter.schema import nrt
from reporter.schema.nrt import NodeState, PodRef, node_resource_topology, pods_fingerprint
from reporter.settings import WITHDRAW_AFTER
from tests.agent.test_availability import INTERVAL_S, FakeSource, wire_live
from tests.agent.test_kubectl import kubectl
from tests.cli.test_run import CLI, env
from tests.collect.test_podresources import GPU, uuids
from tests.collect.test_podresources_kubelet import KubeletPodResources, converge
from tests.controlplane.test_identity import pod_token
from tests.support.agent_support import FAST, PREFIX, ApiClientFactory, topology
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer
from tests.support.helm_chart import NAMESPACE, VAP_API, render
from tests.support.kube_double import write_kubeconfig
from tests.support.podresources_double import devices_state, pod_state

pytestmark = pytest.mark.controlplane

MEMORY = {0: 1 << 38, 1: 1 << 38}
POLICIES = KubeletPolicies("single-numa-node", "pod")
PODS = (PodRef("ml", "train-0"), PodRef("kube-system", "coredns-7db6d8ff4d-x2x9l"))


class Store:
    """The NodeResourceTopology objects as the real server holds them (the admin's client)."""

    def __init__(self, server: RealApiServer) -> None:
        self._api = k8s.CustomObjectsApi(server.api())

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found = self._api.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    def version(self, name: str) -> str:
        obj = self.get(name)
        assert obj is not None, f"no NodeResourceTopology {name}"
        return str(obj["metadata"]["resourceVersion"])

    def create(self, body: dict[str, Any], *, field_manager: str) -> None:
        self._api.create_cluster_custom_object(
            nrt.GROUP, nrt.VERSION, nrt.PLURAL, body, field_manager=field_manager
        )

    def delete(self, name: str) -> None:
        with contextlib.suppress(k8s.ApiException):
            self._api.delete_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)


@pytest.fixture
def store(real_apiserver: RealApiServer, real_nrt_crd: str) -> Store:
    return Store(real_apiserver)


@pytest.fixture
def node(store: Store, real_node_factory: NodeFactory) -> Iterator[str]:
    """A fresh Node; its NodeResourceTopology, if any, is deleted after the test."""
    name = real_node_factory()
    yield name
    store.delete(name)


def api_client(kind: str, kubeconfig: Path) -> ApiClient:
    if kind == "lean":
        return RestApiClient(load_rest_config(str(kubeconfig)))
    return kube.KubeApiClient(kube.load_configuration(str(kubeconfig)))


@pytest.fixture(params=["lean", "official"])
def sink(request: pytest.FixtureRequest, real_apiserver: RealApiServer) -> Callable[[], NrtSink]:
    """A new sink at each call (what a restarted agent has), over each client in turn."""

    def make() -> NrtSink:
        client = api_client(request.param, real_apiserver.kubeconfig)
        return NrtSink(client, stop=threading.Event(), backoff=FAST, log=structlog.get_logger())

    return make


def desired(node: str, free: frozenset[int], pods: tuple[PodRef, ...] = PODS) -> dict[str, Any]:
    state = NodeState(pods=pods, free_gpus=free)
    return node_resource_topology(
        node, topology(8), state, MEMORY, policies=POLICIES, prefix=PREFIX
    )


def test_the_real_crd_takes_the_object_as_built_fingerprint_and_policies_included(
    store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    want = desired(node, frozenset({0, 1, 5}))
    assert sink().publish(want) is True
    held = store.get(node)
    assert held is not None
    # Nothing pruned or defaulted by the structural schema: what we built is what is stored.
    assert held["zones"] == want["zones"]
    assert held["attributes"] == want["attributes"]
    attributes = {a["name"]: a["value"] for a in held["attributes"]}
    assert attributes == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        nrt.FINGERPRINT: pods_fingerprint(PODS),
        nrt.FINGERPRINT_METHOD: "all",
    }
    gpus = {
        z["name"]: next(r for r in z["resources"] if r["name"] == nrt.GPU_RESOURCE)
        for z in held["zones"]
    }
    assert {z: (r["allocatable"], r["available"]) for z, r in gpus.items()} == {
        "node-0": ("4", "2"),
        "node-1": ("4", "1"),
    }
    assert held["metadata"]["labels"] == nrt.own_labels(node, PREFIX)


def test_an_unchanged_object_is_never_written_again_not_even_after_a_restart(
    store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    running = sink()
    running.publish(desired(node, frozenset({0})))
    version = store.version(node)
    assert running.publish(desired(node, frozenset({0}))) is False
    assert sink().publish(desired(node, frozenset({0}))) is False
    assert store.version(node) == version


@pytest.mark.parametrize(
    ("free", "pods"),
    [
        (frozenset({0}), PODS),
        (frozenset({0, 1}), PODS[:1]),
    ],
    ids=["a GPU taken", "a GPU freed as its pod left (the fingerprint moves too)"],
)
def test_a_change_of_allocation_replaces_the_object(
    store: Store,
    node: str,
    sink: Callable[[], NrtSink],
    free: frozenset[int],
    pods: tuple[PodRef, ...],
) -> None:
    running = sink()
    running.publish(desired(node, frozenset({0, 1})))
    version = store.version(node)
    assert running.publish(desired(node, free, pods)) is True
    held = store.get(node)
    assert held is not None
    assert held["metadata"]["resourceVersion"] != version
    assert held["zones"] == desired(node, free, pods)["zones"]
    assert held["attributes"] == desired(node, free, pods)["attributes"]


def foreign(node: str, labels: dict[str, str]) -> dict[str, Any]:
    """Another producer's object, as NFD's topology-updater or RTE would have written it."""
    return {
        "apiVersion": f"{nrt.GROUP}/{nrt.VERSION}",
        "kind": nrt.KIND,
        "metadata": {"name": node, "labels": labels},
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"}
                ],
            }
        ],
        "attributes": [{"name": "topologyManagerPolicy", "value": "best-effort"}],
    }


@pytest.mark.parametrize(
    ("manager", "labels", "named"),
    [
        ("nfd-topology-updater", {}, "field manager nfd-topology-updater"),
        (
            "resource-topology-exporter",
            {nrt.MANAGED_BY: "resource-topology-exporter"},
            f"{nrt.MANAGED_BY}=resource-topology-exporter",
        ),
    ],
    ids=["NFD's topology-updater", "resource-topology-exporter"],
)
def test_another_producers_object_is_refused_in_one_line_and_left_untouched(
    store: Store,
    node: str,
    sink: Callable[[], NrtSink],
    manager: str,
    labels: dict[str, str],
    named: str,
) -> None:
    store.create(foreign(node, labels), field_manager=manager)
    before = store.get(node)
    assert before is not None
    with pytest.raises(ForeignProducerError) as refused:
        sink().publish(desired(node, frozenset({0})))
    message = str(refused.value)
    assert named in message
    assert "turn that producer off on this node, or turn --nrt off" in message
    assert "\n" not in message
    after = store.get(node)
    assert after == before


def test_the_real_crd_refuses_a_broken_object_in_one_line(
    store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    broken = desired(node, frozenset({0}))
    del broken["zones"][0]["resources"][0]["available"]
    with pytest.raises(ApiPermanentError) as refused:
        sink().publish(broken)
    assert "the API server refused the object (422)" in str(refused.value)
    assert "available" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert store.get(node) is None


def test_the_agents_output_publishes_each_allocation_view_and_counts_what_it_did(
    store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    machine = topology(8)
    uuids = [g.uuid or "" for g in machine.gpus]
    results: list[str] = []
    output = NrtOutput(
        sink(),
        node=node,
        memory=lambda: MEMORY,
        prefix=PREFIX,
        policies=lambda: POLICIES,
        log=structlog.get_logger(),
        on_result=results.append,
    )
    view = allocation_view(
        machine, uuids, [uuids[0], f"{uuids[4]}::1"], [PodRef("ml", "a"), PodRef("ml", "b")]
    )
    output(machine, view)
    output(machine, view)
    held = store.get(node)
    assert held is not None
    assert held["zones"] == desired(node, frozenset(view.free), view.pods)["zones"]
    attributes = {a["name"]: a["value"] for a in held["attributes"]}
    assert attributes[nrt.FINGERPRINT] == pods_fingerprint(view.pods)
    version = held["metadata"]["resourceVersion"]
    freed = allocation_view(machine, uuids, [uuids[0]], [PodRef("ml", "a")])
    output(machine, freed)
    assert store.version(node) != version
    assert results == ["written", "unchanged", "written"]


def test_the_agents_output_never_raises_over_a_foreign_object_and_says_so_once(
    store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    store.create(foreign(node, {}), field_manager="nfd-topology-updater")
    before = store.get(node)
    machine = topology(8)
    uuids = [g.uuid or "" for g in machine.gpus]
    results: list[str] = []
    output = NrtOutput(
        sink(),
        node=node,
        memory=lambda: MEMORY,
        prefix=PREFIX,
        policies=lambda: POLICIES,
        log=structlog.get_logger(),
        on_result=results.append,
    )
    view = allocation_view(machine, uuids, [], [PodRef("ml", "a")])
    with capture_logs() as logs:
        output(machine, view)
        output(machine, view)
    assert results == ["refused", "refused"]
    errors = [e for e in logs if e["event"] == "nrt_publish_failed"]
    assert len(errors) == 1
    assert "field manager nfd-topology-updater" in errors[0]["error"]
    assert store.get(node) == before


def test_reads_that_keep_failing_withdraw_the_object_and_a_good_read_publishes_it_again(
    real_apiserver: RealApiServer,
    store: Store,
    node: str,
    node_client: ApiClientFactory,
) -> None:
    """Issue 19.2 with `--nrt`: after as many failed PodResources reads as withdraw the Node's
    keys, the object keeps its zones but loses the Topology Manager policy (what the plugin
    filters on) and says why; the server's structural schema keeps what was sent. Another
    producer's object is never touched (the foreign tests above: `_read` refuses it first)."""
    output = NrtOutput(
        NrtSink(
            node_client(real_apiserver.kubeconfig, (2.0, 2.0)),
            stop=threading.Event(),
            backoff=FAST,
            log=structlog.get_logger(),
        ),
        node=node,
        memory=lambda: MEMORY,
        prefix=PREFIX,
        policies=lambda: POLICIES,
        log=structlog.get_logger(),
    )
    w = wire_live(
        real_apiserver.kubeconfig,
        node_client,
        source=FakeSource(used=set(range(8))),
        outputs=(output,),
        node=node,
    )
    assert w.agent.step()
    published = store.get(node)
    assert published is not None
    assert w.source is not None
    w.source.error = PodResourcesError("kubelet.sock: connection refused", reason="unavailable")
    for _ in range(WITHDRAW_AFTER - 1):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())
    assert store.get(node) == published
    w.clock.advance(INTERVAL_S)
    assert not w.loop.tick(topology())
    withdrawn = store.get(node)
    assert withdrawn is not None
    assert withdrawn["zones"] == published["zones"]
    assert {a["name"]: a["value"] for a in withdrawn["attributes"]} == {
        "topologyManagerScope": "pod",
        nrt.FINGERPRINT: pods_fingerprint(()),
        nrt.FINGERPRINT_METHOD: "all",
        nrt.WITHDRAWN: nrt.WITHDRAWN_VALUE,
    }
    # Still failing: nothing more is written.
    for _ in range(3):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())
    assert store.version(node) == withdrawn["metadata"]["resourceVersion"]
    w.source.error = None
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    again = store.get(node)
    assert again is not None
    assert again["attributes"] == published["attributes"]
    assert again["zones"] == published["zones"]


# --- the chart's RBAC and admission policy, with a DaemonSet pod's own token -------------------

NRT_CHART = {
    "availability": {"enabled": True},
    "nrt": {"enabled": True},
    "admissionPolicy": {"enabled": True},
}
POLICY_TIMEOUT_S = 60.0


def kubectl_objects(server: RealApiServer, verb: list[str], objects: list[dict[str, Any]]) -> None:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(server.kubeconfig), *verb, "-f", "-"],
        input=yaml.safe_dump_all(objects),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 or verb[0] == "delete", done.stderr


@pytest.fixture(scope="module")
def nrt_chart(real_apiserver: RealApiServer, real_nrt_crd: str) -> Iterator[None]:
    """The chart's objects with nrt.enabled and the admission policies, applied to the server."""
    rendered = render(NRT_CHART, api_versions=(VAP_API,))
    with contextlib.suppress(k8s.ApiException):
        real_apiserver.core().create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE))
        )
    objects = list(rendered.objects)
    kubectl_objects(real_apiserver, ["apply"], objects)
    yield
    kubectl_objects(real_apiserver, ["delete", "--ignore-not-found", "--wait=false"], objects)


def agent_kubeconfig(server: RealApiServer, node: str, directory: Path) -> Path:
    """A kubeconfig holding the token of the agent's pod bound to `node` (its node-name claim)."""
    token = pod_token(server, node, f"topo-reporter-{node}")
    cluster = yaml.safe_load(server.kubeconfig.read_text())["clusters"][0]["cluster"]
    ca = directory / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    return write_kubeconfig(directory / "agent.kubeconfig", cluster["server"], token, ca_cert=ca)


def wait_for_nrt_policy(kubeconfig: Path, other_node: str) -> None:
    """The apiserver enforces a new policy once its informer has it: a dry-run create of another
    node's object (admission runs, nothing is stored) is denied from then on."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        objects = k8s.CustomObjectsApi(api)
        deadline = time.monotonic() + POLICY_TIMEOUT_S
        while True:
            try:
                objects.create_cluster_custom_object(
                    nrt.GROUP,
                    nrt.VERSION,
                    nrt.PLURAL,
                    desired(other_node, frozenset()),
                    dry_run="All",
                )
            except k8s.ApiException as e:
                if e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body):
                    return
                raise
            assert time.monotonic() < deadline, f"not enforced within {POLICY_TIMEOUT_S:.0f} s"
            time.sleep(0.1)
    finally:
        api.close()


def test_the_agents_own_token_writes_its_nodes_object_and_no_other(
    real_apiserver: RealApiServer,
    nrt_chart: None,
    store: Store,
    real_node_factory: NodeFactory,
    tmp_path: Path,
) -> None:
    own, other = real_node_factory(), real_node_factory()
    kubeconfig = agent_kubeconfig(real_apiserver, own, tmp_path)
    try:
        wait_for_nrt_policy(kubeconfig, other)
        client = RestApiClient(load_rest_config(str(kubeconfig)))

        def sink() -> NrtSink:
            return NrtSink(client, stop=threading.Event(), backoff=FAST, log=structlog.get_logger())

        # Created, then replaced: RBAC's get, create and update, and the policy, let both through.
        running = sink()
        assert running.publish(desired(own, frozenset({0}))) is True
        assert running.publish(desired(own, frozenset())) is True
        held = store.get(own)
        assert held is not None
        assert held["zones"] == desired(own, frozenset())["zones"]
        # Withdrawn (reads failing) with the same grant: update, on its own node's object.
        assert running.withdraw(own, PREFIX) is True
        assert nrt.WITHDRAWN in {a["name"] for a in (store.get(own) or {})["attributes"]}

        with pytest.raises(ApiPermanentError) as denied:
            sink().publish(desired(other, frozenset({0})))
        assert "forbidden (403)" in str(denied.value)
        assert "only the NodeResourceTopology of the Node its pod runs on" in str(denied.value)
        assert store.get(other) is None

        # An object of ours on the other node (a previous pod there) cannot be replaced either.
        store.create(desired(other, frozenset({0})), field_manager="topo-reporter")
        before = store.get(other)
        with pytest.raises(ApiPermanentError) as denied:
            sink().publish(desired(other, frozenset()))
        assert "only the NodeResourceTopology of the Node its pod runs on" in str(denied.value)
        assert store.get(other) == before
    finally:
        real_apiserver.core().delete_namespaced_pod(f"topo-reporter-{own}", NAMESPACE)
        store.delete(own)
        store.delete(other)


# --- end to end: the kubelet's PodResources server, the reader, the output, the API server -------


def test_what_the_kubelet_lists_reaches_the_object_the_scheduler_reads(
    controlplane_bin: Path, store: Store, node: str, sink: Callable[[], NrtSink]
) -> None:
    machine = topology(8)
    ids = uuids(machine)
    directory = Path(tempfile.mkdtemp(prefix="podres-n-", dir="/tmp"))
    kubelet = KubeletPodResources(
        controlplane_bin, directory / "kubelet.sock", directory / "state.json"
    )
    pods = [
        pod_state("train", GPU, [ids[0], ids[1]], namespace="ml"),
        pod_state("infer", GPU, [ids[6]], namespace="ml"),
        {"namespace": "kube-system", "name": "coredns", "containers": [{"name": "c"}]},
    ]
    kubelet.write({"devices": devices_state(GPU, ids), "pods": pods})
    kubelet.start()
    try:
        with PodResourcesReader(kubelet.socket) as reader:
            view = converge(lambda: reader.allocated(machine), lambda v: len(v.pods) == 3)
    finally:
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    results: list[str] = []
    output = NrtOutput(
        sink(),
        node=node,
        memory=lambda: MEMORY,
        prefix=PREFIX,
        policies=lambda: POLICIES,
        log=structlog.get_logger(),
        on_result=results.append,
    )
    output(machine, view)
    assert results == ["written"]
    held = store.get(node)
    assert held is not None
    attributes = {a["name"]: a["value"] for a in held["attributes"]}
    # Every pod the kubelet listed, the one without devices too, as the scheduler recomputes it.
    assert attributes[nrt.FINGERPRINT] == pods_fingerprint(
        (PodRef("ml", "train"), PodRef("ml", "infer"), PodRef("kube-system", "coredns"))
    )
    available = sum(
        int(r["available"])
        for z in held["zones"]
        for r in z["resources"]
        if r["name"] == nrt.GPU_RESOURCE
    )
    assert available == len(ids) - 3


# A simulated machine has no kubelet config: the policy is stated (without it, no object).
NRT_FLAGS = (
    "--availability",
    "--nrt",
    "--topology-manager-policy",
    "single-numa-node",
    "--kubelet-config",
    "/nonexistent/kubelet/config.yaml",
    "--simulate-used",
)


@pytest.mark.parametrize("client", ["lean", "official"])
def test_run_nrt_publishes_the_nodes_object_from_the_agents_own_loop(
    real_apiserver: RealApiServer, store: Store, node: str, client: str
) -> None:
    """`run --availability --nrt` end to end through the CLI: the live loop hands each allocation
    view to the NRT output, which writes through the client the agent picked."""
    admin = str(real_apiserver.kubeconfig)
    # A list of kubeconfigs to merge is served by the official client only.
    kubeconfig = admin if client == "lean" else os.pathsep.join([admin, admin])

    def run(used: str) -> None:
        result = subprocess.run(
            [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", "", *NRT_FLAGS, used],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(KUBECONFIG=kubeconfig, NODE_NAME=node, TOPO_REPORTER_LOG_FORMAT="json"),
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f'"api_client": "{client}"' in result.stderr

    def gpus_available() -> dict[str, str]:
        held = store.get(node)
        assert held is not None
        return {
            z["name"]: next(r["available"] for r in z["resources"] if r["name"] == nrt.GPU_RESOURCE)
            for z in held["zones"]
        }

    run("0,1,5")
    assert gpus_available() == {"node-0": "2", "node-1": "3"}
    version = store.version(node)
    run("0,1,5")
    assert store.version(node) == version
    run("")
    assert gpus_available() == {"node-0": "4", "node-1": "4"}
