"""The NodeResourceTopology sink through the lean client against the API server double: writes
only on change, never over another producer's object, and says what to do when refused."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from parsers.kubelet import KubeletPolicies
from reporter.errors import ApiPermanentError, PublishError
from reporter.publish.nrt import RBAC_VERBS, ForeignProducerError, NrtSink
from reporter.schema.nrt import NodeState, PodRef, node_resource_topology
from tests.agent_support import FAST, ApiClientFactory, topology
from tests.kube_double import ApiServerDouble, Fault

NODE = "gpu-node-1"
MEMORY = {0: 1 << 38, 1: 1 << 38}
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


def desired(free: frozenset[int] = frozenset({0, 1}), pods: int = 2) -> dict[str, Any]:
    state = NodeState(pods=tuple(PodRef("ml", f"p{i}") for i in range(pods)), free_gpus=free)
    return node_resource_topology(
        NODE, topology(8), state, MEMORY, policies=KubeletPolicies("single-numa-node", "pod")
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
