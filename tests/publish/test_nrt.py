"""The NodeResourceTopology sink through the lean client against the API server double: writes
only on change, never over another producer's object, and says what to do when refused."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from parsers.kubelet import KubeletPolicies
from reporter.assembly import nrt_output
from reporter.collect.podresources import AllocationView, allocation_view
from reporter.errors import ApiPermanentError, PublishError
from reporter.publish.nrt import RBAC_VERBS, ForeignProducerError, NrtOutput, NrtSink
from reporter.schema import nrt as schema_nrt
from reporter.schema.nrt import NodeState, PodRef, node_resource_topology
from reporter.serve.metrics import Metrics
from reporter.settings import Settings
from tests.support.agent_support import FAST, PREFIX, ApiClientFactory, topology
from tests.support.kube_double import ApiServerDouble, Fault

NODE = "gpu-node-1"
MEMORY = {0: 1 << 38, 1: 1 << 38}
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


def desired(free: frozenset[int] = frozenset({0, 1}), pods: int = 2) -> dict[str, Any]:
    state = NodeState(pods=tuple(PodRef("ml", f"p{i}") for i in range(pods)), free_gpus=free)
    return node_resource_topology(
        NODE,
        topology(8),
        state,
        MEMORY,
        policies=KubeletPolicies("single-numa-node", "pod"),
        prefix=PREFIX,
    )


@pytest.fixture
def sink(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    node_client: ApiClientFactory,
) -> Callable[..., NrtSink]:
    """An NrtSink through each ApiClient (lean, official): each test runs with both."""

    def make(
        token: str = "admin-token", on_error: Callable[[PublishError], None] = lambda e: None
    ) -> NrtSink:
        client = node_client(kubeconfig_with_token(token), (2.0, 2.0))
        return NrtSink(
            client,
            stop=threading.Event(),
            backoff=FAST,
            log=structlog.get_logger(),
            on_error=on_error,
        )

    return make


def writes(apiserver: ApiServerDouble) -> list[str]:
    return [r.method for r in apiserver.writes(NRT_PATH)]


def test_creates_then_replaces_only_on_change(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    nrt = sink()
    assert nrt.publish(desired()) is True
    assert nrt.publish(desired()) is False
    assert nrt.publish(desired(free=frozenset({0}))) is True
    assert nrt.publish(desired(free=frozenset({0}), pods=3)) is True  # the fingerprint moved
    assert writes(apiserver) == ["POST", "PUT", "PUT"]
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    assert stored["zones"] == desired(free=frozenset({0}), pods=3)["zones"]
    assert stored["attributes"] == desired(free=frozenset({0}), pods=3)["attributes"]


def test_after_a_restart_an_equal_object_is_not_written(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    sink().publish(desired())
    apiserver.clear_requests()
    assert sink().publish(desired()) is False
    assert writes(apiserver) == []


@pytest.mark.parametrize(
    "labels",
    [
        {"app.kubernetes.io/managed-by": "topo-reporter"},
        {"app.kubernetes.io/managed-by": "topo-reporter", "old.example.com/node": NODE},
    ],
    ids=["an earlier version's, unlabelled", "an agent's under another prefix"],
)
def test_an_object_of_ours_without_this_prefixs_label_is_written_again_with_it_alone(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink], labels: dict[str, str]
) -> None:
    # The same content, but not this install's label: prune under the old prefix (or with
    # --unlabelled) would take it from the current install, so it is written at once.
    apiserver.nrt.put({**desired(), "metadata": {"name": NODE, "labels": labels}})
    apiserver.clear_requests()
    assert sink().publish(desired()) is True
    assert writes(apiserver) == ["PUT"]
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    assert stored["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "topo-reporter",
        f"{PREFIX}/node": NODE,
    }


@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        (
            {"labels": {"app.kubernetes.io/managed-by": "resource-topology-exporter"}},
            "managed by app.kubernetes.io/managed-by=resource-topology-exporter",
        ),
        ({"managedFields": [{"manager": "nfd-topology-updater"}]}, "field manager nfd-topology"),
        ({}, "a producer without the app.kubernetes.io/managed-by=topo-reporter label"),
    ],
    ids=["resource-topology-exporter", "NFD's topology-updater", "an unlabelled producer"],
)
def test_another_producers_object_is_never_written(
    apiserver: ApiServerDouble,
    sink: Callable[..., NrtSink],
    metadata: dict[str, Any],
    named: str,
) -> None:
    theirs = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": NODE, **metadata},
        "zones": [],
    }
    apiserver.nrt.put(theirs)
    with pytest.raises(ForeignProducerError) as caught:
        sink().publish(desired())
    assert named in str(caught.value)
    assert "turn that producer off" in str(caught.value)
    assert writes(apiserver) == []
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    assert stored["zones"] == []


def test_a_conflict_reads_again_and_writes_over_the_fresh_version(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    nrt = sink()
    nrt.publish(desired())
    apiserver.plan(Fault(status=409, method="PUT", path=NRT_PATH))
    assert nrt.publish(desired(free=frozenset())) is True
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    assert stored["zones"] == desired(free=frozenset())["zones"]
    assert len(apiserver.reads(NRT_PATH)) == 2  # the first read, and the one after the conflict


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no-crd", "install the NodeResourceTopology CRD"),
        ("forbidden", "forbidden (403): grant the agent `get` on"),
    ],
    ids=["a cluster without the CRD", "credentials without the RBAC"],
)
def test_refusals_are_one_line_saying_what_to_do(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink], setup: str, message: str
) -> None:
    token = "admin-token"
    if setup == "no-crd":
        apiserver.nrt.installed = False
    else:
        apiserver.tokens["nodes-only"] = frozenset({"get nodes"})
        token = "nodes-only"
    with pytest.raises(ApiPermanentError) as caught:
        sink(token).publish(desired())
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_verbs_it_needs_are_the_verbs_it_uses(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    apiserver.tokens["nrt-writer"] = frozenset(
        {f"{verb} noderesourcetopologies" for verb in RBAC_VERBS}
    )
    nrt = sink("nrt-writer")
    nrt.publish(desired())
    nrt.forget()
    nrt.publish(desired(free=frozenset()))
    assert writes(apiserver) == ["POST", "PUT"]


def test_transient_failures_are_retried(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    apiserver.plan(Fault(status=503, method="GET", path=NRT_PATH))
    errors: list[PublishError] = []
    assert sink(on_error=errors.append).publish(desired()) is True
    assert [e.status for e in errors] == [503]


def attributes(obj: dict[str, Any] | None) -> dict[str, str]:
    assert obj is not None
    return {a["name"]: a["value"] for a in obj["attributes"]}


def test_withdrawing_drops_the_policy_keeps_the_zones_once_and_a_publish_restores_it(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    nrt = sink()
    nrt.publish(desired(free=frozenset()))
    assert nrt.withdraw(NODE, PREFIX) is True
    assert nrt.withdraw(NODE, PREFIX) is False
    assert sink().withdraw(NODE, PREFIX) is False  # a restarted agent reads it and writes nothing
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    # The zones stay as they were; the plugin reads a node without the policy as `none`.
    assert stored["zones"] == desired(free=frozenset())["zones"]
    assert attributes(stored) == {
        "topologyManagerScope": "pod",
        schema_nrt.FINGERPRINT: attributes(desired(free=frozenset()))[schema_nrt.FINGERPRINT],
        schema_nrt.FINGERPRINT_METHOD: "all",
        schema_nrt.WITHDRAWN: schema_nrt.WITHDRAWN_VALUE,
    }
    assert stored["metadata"]["labels"] == schema_nrt.own_labels(NODE, PREFIX)
    assert nrt.publish(desired(free=frozenset())) is True
    assert apiserver.nrt.get(NODE) is not None
    assert attributes(apiserver.nrt.get(NODE)) == attributes(desired(free=frozenset()))
    # Update only: the verbs the sink already had.
    assert writes(apiserver) == ["POST", "PUT", "PUT"]


def test_withdrawing_where_there_is_no_object_writes_nothing(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    assert sink().withdraw(NODE, PREFIX) is False
    assert writes(apiserver) == []
    assert apiserver.nrt.get(NODE) is None


def test_another_producers_object_is_never_withdrawn(
    apiserver: ApiServerDouble, sink: Callable[..., NrtSink]
) -> None:
    theirs = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": NODE, "managedFields": [{"manager": "nfd-topology-updater"}]},
        "zones": [],
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
    }
    apiserver.nrt.put(theirs)
    before = apiserver.nrt.get(NODE)
    with pytest.raises(ForeignProducerError):
        sink().withdraw(NODE, PREFIX)
    assert writes(apiserver) == []
    assert apiserver.nrt.get(NODE) == before


# --- the agent's live output --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def view(held: tuple[int, ...] = (), pods: int = 1) -> AllocationView:
    machine = topology(8)
    uuids = [g.uuid or "" for g in machine.gpus]
    refs = [PodRef("ml", f"p{i}") for i in range(pods)]
    return allocation_view(machine, uuids, [uuids[i] for i in held], refs)


@pytest.fixture
def output(
    sink: Callable[..., NrtSink],
) -> Callable[..., tuple[NrtOutput, list[str], Clock]]:
    def make(memory: dict[int, int] = MEMORY) -> tuple[NrtOutput, list[str], Clock]:
        results: list[str] = []
        clock = Clock()
        made = NrtOutput(
            sink(),
            node=NODE,
            memory=lambda: memory,
            prefix=PREFIX,
            policies=lambda: KubeletPolicies("single-numa-node", "pod"),
            log=structlog.get_logger(),
            resync_s=300.0,
            clock=clock,
            on_result=results.append,
        )
        return made, results, clock

    return make


def test_the_output_publishes_the_view_and_writes_only_when_it_changes(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    publish, results, _ = output()
    publish(topology(8), view(held=(0, 5), pods=2))
    publish(topology(8), view(held=(0, 5), pods=2))
    publish(topology(8), view(held=(0,), pods=1))
    assert results == ["written", "unchanged", "written"]
    assert writes(apiserver) == ["POST", "PUT"]
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    want = node_resource_topology(
        NODE,
        topology(8),
        NodeState(pods=(PodRef("ml", "p0"),), free_gpus=frozenset(range(1, 8))),
        MEMORY,
        policies=KubeletPolicies("single-numa-node", "pod"),
        prefix=PREFIX,
    )
    assert stored["zones"] == want["zones"]
    assert stored["attributes"] == want["attributes"]


def test_the_output_counts_exclusive_cpus_out_of_their_zones_available_cpu(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    publish, _, _ = output()
    machine = topology(8)
    uuids = [g.uuid or "" for g in machine.gpus]
    publish(machine, allocation_view(machine, uuids, [], [PodRef("ml", "p")], [0, 1, 50]))
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    cpu = {
        z["name"]: next(
            (r["capacity"], r["available"]) for r in z["resources"] if r["name"] == "cpu"
        )
        for z in stored["zones"]
    }
    numa0 = len(machine.numa_nodes[0].cpus)
    numa1 = len(machine.numa_nodes[1].cpus)
    assert cpu == {"node-0": (str(numa0), str(numa0 - 2)), "node-1": (str(numa1), str(numa1 - 1))}


def test_a_refusal_is_logged_once_and_not_asked_again_until_the_object_changes_or_resync(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    apiserver.nrt.put(
        {
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": NODE, "managedFields": [{"manager": "nfd-topology-updater"}]},
            "zones": [],
        }
    )
    publish, results, clock = output()
    with capture_logs() as logs:
        publish(topology(8), view())
        publish(topology(8), view())
        assert len(apiserver.reads(NRT_PATH)) == 1
        publish(topology(8), view(held=(1,)))
        assert len(apiserver.reads(NRT_PATH)) == 2
        clock.now = 301.0
        publish(topology(8), view(held=(1,)))
        assert len(apiserver.reads(NRT_PATH)) == 3
    assert results == ["refused"] * 4
    assert [e["event"] for e in logs] == ["nrt_publish_failed"]
    assert "field manager nfd-topology-updater" in logs[0]["error"]
    assert writes(apiserver) == []


def test_an_object_that_cannot_be_built_is_refused_without_a_request(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    publish, results, _ = output(memory={0: 1 << 30})
    with capture_logs() as logs:
        publish(topology(8), view())
        publish(topology(8), view())
    assert results == ["refused", "refused"]
    assert len(logs) == 1
    assert "the memory of NUMA node 1 is unknown" in logs[0]["error"]
    assert apiserver.reads(NRT_PATH) == []


def test_a_failure_is_counted_never_raised_and_the_next_read_recovers(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    apiserver.plan(*[Fault(status=503, method="GET", path=NRT_PATH)] * FAST.attempts)
    publish, results, _ = output()
    with capture_logs() as logs:
        publish(topology(8), view())
        publish(topology(8), view())
    assert results == ["failed", "written"]
    assert [e["event"] for e in logs if e["event"].startswith("nrt_")] == [
        "nrt_publish_failed",
        "nrt_created",
        "nrt_recovered",
    ]


def test_the_output_withdraws_once_asks_again_at_resync_and_republishes_at_a_good_read(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    publish, results, clock = output()
    publish(topology(8), view(held=tuple(range(8))))
    apiserver.clear_requests()
    with capture_logs() as logs:
        publish.withdraw()
        publish.withdraw()
        assert [r.method for r in apiserver.requests] == ["PUT"]
        clock.now = 301.0
        publish.withdraw()  # resync: one read, and nothing to write
        assert [r.method for r in apiserver.requests] == ["PUT", "GET"]
        publish(topology(8), view(held=tuple(range(8))))
    assert results == ["written", "withdrawn", "unchanged", "unchanged", "written"]
    assert [e["event"] for e in logs] == ["nrt_withdrawn", "nrt_replaced"]
    assert schema_nrt.WITHDRAWN not in attributes(apiserver.nrt.get(NODE))


def test_a_failed_withdrawal_is_logged_once_and_tried_again_at_the_next_tick(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    publish, results, _ = output()
    publish(topology(8), view())
    apiserver.plan(*[Fault(status=503, method="PUT", path=NRT_PATH)] * FAST.attempts)
    with capture_logs() as logs:
        publish.withdraw()
        publish.withdraw()
    assert results == ["written", "failed", "withdrawn"]
    assert [e["event"] for e in logs if e["event"].startswith("nrt_")] == [
        "nrt_publish_failed",
        "nrt_withdrawn",
        "nrt_recovered",
    ]


def test_a_foreign_object_is_not_withdrawn_and_said_once_until_resync(
    apiserver: ApiServerDouble, output: Callable[..., tuple[NrtOutput, list[str], Clock]]
) -> None:
    apiserver.nrt.put(
        {
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": NODE, "managedFields": [{"manager": "nfd-topology-updater"}]},
            "zones": [],
        }
    )
    publish, results, _ = output()
    with capture_logs() as logs:
        publish.withdraw()
        publish.withdraw()
    assert results == ["refused", "unchanged"]
    assert len(apiserver.reads(NRT_PATH)) == 1
    assert [e["event"] for e in logs] == ["nrt_publish_failed"]
    assert writes(apiserver) == []


def test_the_agents_factory_reads_numa_memory_and_the_kubelet_policies_and_counts_results(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    node_client: ApiClientFactory,
    tmp_path: Path,
) -> None:
    for numa in (0, 1):
        meminfo = tmp_path / "sys" / "devices" / "system" / "node" / f"node{numa}" / "meminfo"
        meminfo.parent.mkdir(parents=True)
        meminfo.write_text(f"Node {numa} MemTotal:       1048576 kB\n")
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text(
        "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n"
        "topologyManagerScope: pod\n"
    )
    config = Settings(
        node=NODE,
        sysfs_root=str(tmp_path / "sys"),
        kubelet_config=str(kubelet),
        availability=True,
        nrt=True,
    ).validate()
    metrics = Metrics()
    log = structlog.get_logger()
    client = node_client(kubeconfig_with_token("admin-token"), (2.0, 2.0))
    publish = nrt_output(config, client, log, stop=threading.Event(), metrics=metrics)
    publish(topology(8), view(held=(2,)))
    publish(topology(8), view(held=(2,)))
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    memory = {
        z["name"]: next(r["capacity"] for r in z["resources"] if r["name"] == "memory")
        for z in stored["zones"]
    }
    assert memory == {"node-0": str(1 << 30), "node-1": str(1 << 30)}
    assert {a["name"]: a["value"] for a in stored["attributes"]}["topologyManagerPolicy"] == (
        "single-numa-node"
    )
    rendered = metrics.render().decode()
    assert 'topo_reporter_nrt_publishes_total{result="written"} 1.0' in rendered
    assert 'topo_reporter_nrt_publishes_total{result="unchanged"} 1.0' in rendered


def factory_settings(tmp_path: Path, kubelet: str | None, **stated: str) -> Settings:
    """`run --availability --nrt` settings over a sysfs with two NUMA nodes' memory, and a kubelet
    config holding `kubelet` (None: no file)."""
    for numa in (0, 1):
        meminfo = tmp_path / "sys" / "devices" / "system" / "node" / f"node{numa}" / "meminfo"
        meminfo.parent.mkdir(parents=True, exist_ok=True)
        meminfo.write_text(f"Node {numa} MemTotal:       1048576 kB\n")
    path = tmp_path / "kubelet.yaml"
    if kubelet is not None:
        path.write_text(kubelet)
    return Settings(
        node=NODE,
        sysfs_root=str(tmp_path / "sys"),
        kubelet_config=str(path),
        availability=True,
        nrt=True,
        **stated,  # type: ignore[arg-type]
    ).validate()


@pytest.mark.parametrize(
    "kubelet",
    [None, "kind: [\n"],
    ids=["no kubelet config", "a kubelet config that does not parse"],
)
def test_without_the_kubelets_policy_no_object_is_published(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    node_client: ApiClientFactory,
    tmp_path: Path,
    kubelet: str | None,
) -> None:
    """An object without topologyManagerPolicy makes NodeResourceTopologyMatch take the node for
    policy none and admit pods a single-numa-node kubelet rejects: none is better."""
    metrics = Metrics()
    client = node_client(kubeconfig_with_token("admin-token"), (2.0, 2.0))
    config = factory_settings(tmp_path, kubelet)
    publish = nrt_output(
        config, client, structlog.get_logger(), stop=threading.Event(), metrics=metrics
    )
    with capture_logs() as logs:
        publish(topology(8), view())
        publish(topology(8), view())
    assert apiserver.nrt.get(NODE) is None
    assert apiserver.reads(NRT_PATH) == []
    failed = [e for e in logs if e["event"] == "nrt_publish_failed"]
    assert len(failed) == 1
    assert "the kubelet's Topology Manager policy is unknown" in failed[0]["error"]
    assert "--topology-manager-policy" in failed[0]["error"]
    assert 'topo_reporter_nrt_publishes_total{result="refused"} 2.0' in metrics.render().decode()


def test_the_policy_the_user_states_stands_in_for_an_unreadable_kubelet_config(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    node_client: ApiClientFactory,
    tmp_path: Path,
) -> None:
    client = node_client(kubeconfig_with_token("admin-token"), (2.0, 2.0))
    config = factory_settings(
        tmp_path, None, topology_manager_policy="single-numa-node", topology_manager_scope="pod"
    )
    nrt_output(config, client, structlog.get_logger(), stop=threading.Event(), metrics=Metrics())(
        topology(8), view()
    )
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    attributes = {a["name"]: a["value"] for a in stored["attributes"]}
    assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == (
        "single-numa-node",
        "pod",
    )


def test_a_readable_kubelet_config_wins_over_the_stated_policy(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    node_client: ApiClientFactory,
    tmp_path: Path,
) -> None:
    client = node_client(kubeconfig_with_token("admin-token"), (2.0, 2.0))
    config = factory_settings(
        tmp_path,
        "kind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n",
        topology_manager_policy="single-numa-node",
    )
    nrt_output(config, client, structlog.get_logger(), stop=threading.Event(), metrics=Metrics())(
        topology(8), view()
    )
    stored = apiserver.nrt.get(NODE)
    assert stored is not None
    attributes = {a["name"]: a["value"] for a in stored["attributes"]}
    assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == (
        "best-effort",
        "container",
    )
