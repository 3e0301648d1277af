"""The agent against the real kube-apiserver (tests/controlplane), through each API client.

The same promises test_agent_loop checks on the double, now checked against the server itself:
its merge-patch, resourceVersion preconditions, validation and 256 KiB annotation limit. A fresh
Node per test; the admin's client reads what landed.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from structlog.testing import capture_logs

from parsers.kubelet import KubeletPolicies
from reporter.collect.kubelet import KubeletReading
from reporter.publish import patch as node_patch
from reporter.publish.patch import NodeMetadata
from reporter.schema.annotations import annotations
from reporter.schema.codec import decode
from reporter.schema.labels import labels
from reporter.schema.model import Link, LinkKind, Topology
from tests.support.agent_support import PREFIX, FakeScanner, WireAgent, ok, topology
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer

pytestmark = pytest.mark.controlplane

OWNED = f"{PREFIX}/owned"
BUDGET = node_patch.ANNOTATION_BUDGET_BYTES


def read(server: RealApiServer, node: str) -> tuple[dict[str, str], dict[str, str], str]:
    """The Node's labels, annotations and resourceVersion, as the server holds them."""
    meta = server.core().read_node(node).metadata
    return dict(meta.labels or {}), dict(meta.annotations or {}), meta.resource_version


def ours(server: RealApiServer, node: str) -> node_patch.Desired:
    node_labels, node_annotations, _ = read(server, node)
    return node_patch.ours(NodeMetadata(node, node_labels, node_annotations), PREFIX)


def events(server: RealApiServer, node: str) -> list[tuple[str, str, str]]:
    listed = server.core().list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}"
    )
    ordered = sorted(listed.items, key=lambda e: (e.metadata.creation_timestamp, e.metadata.name))
    return [(e.type, e.reason, e.message) for e in ordered]


def projection(t: Topology, node: str) -> node_patch.Desired:
    """What the agent publishes on `node` (a node without a fabric is its own NVLink domain)."""
    return node_patch.desired(labels(t, PREFIX, node), annotations(t, PREFIX), PREFIX)


def test_first_publish_lands_whole_and_tells_operators_with_an_event(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    node = real_node_factory()
    w = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    assert w.agent.step()
    published = ours(real_apiserver, node)
    assert published == projection(topology(), node)
    assert published.labels[f"{PREFIX}/interconnect"] == "nvswitch"
    assert decode(published.annotations[f"{PREFIX}/topology"]) == topology()
    assert "matrix" in published.annotations[OWNED].split(",")
    assert events(real_apiserver, node) == [
        (
            "Normal",
            "GPUTopologyChanged",
            "published: 8x NVIDIA H100 80GB HBM3, NVSwitch NV18, 2 NUMA nodes, 2 RDMA NICs",
        )
    ]
    assert w.state.readiness().ok


def test_rerun_and_restart_with_the_same_topology_write_nothing(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    node = real_node_factory()
    w = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    assert w.agent.step()
    *_, version = read(real_apiserver, node)
    for _ in range(3):
        w.clock.advance(60)
        assert w.agent.step()
    restarted = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    assert restarted.agent.step()
    # The server bumps resourceVersion on every write, even one that changes nothing.
    assert read(real_apiserver, node)[2] == version
    assert len(events(real_apiserver, node)) == 1
    assert w.metrics.publishes.labels(result="written")._value.get() == 1


def test_foreign_labels_and_annotations_survive_and_a_stale_owned_key_goes(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    foreign_labels = {
        "nvidia.com/gpu.count": "8",
        "team": "ml",
        f"{PREFIX}/added-by-hand": "yes",
    }
    foreign_annotations = {"other.io/note": "keep me", "nfd.node.kubernetes.io/x": "y"}
    node = real_node_factory(labels=foreign_labels, annotations=foreign_annotations)
    kubelet: list[KubeletPolicies | None] = [KubeletPolicies("single-numa-node")]
    w = wire(
        real_apiserver.kubeconfig,
        FakeScanner([ok(topology())]),
        node=node,
        kubelet=lambda: KubeletReading(kubelet[0]),
    )
    assert w.agent.step()
    policy = f"{PREFIX}/topology-manager-policy"
    assert read(real_apiserver, node)[0][policy] == "single-numa-node"
    # The kubelet config goes away: the policy labels it owned are stale and must go.
    kubelet[0] = None
    w.scanner.then(ok(topology(4, nics=())))
    w.clock.advance(60)
    assert w.agent.step()
    node_labels, node_annotations, _ = read(real_apiserver, node)
    assert {k: node_labels[k] for k in foreign_labels} == foreign_labels
    assert {k: node_annotations[k] for k in foreign_annotations} == foreign_annotations
    assert policy not in node_labels
    assert node_labels[f"{PREFIX}/count"] == "4"
    mine, want = ours(real_apiserver, node), projection(topology(4, nics=()), node)
    assert mine.labels == {**want.labels, f"{PREFIX}/added-by-hand": "yes"}
    assert mine.annotations == want.annotations


def test_a_concurrent_writers_409_is_recovered_by_rereading(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    node = real_node_factory()
    w = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    assert w.agent.step()
    # Another writer changes the Node after our read: our next patch carries a stale version.
    real_apiserver.core().patch_node(node, {"metadata": {"labels": {"team": "ml"}}})
    w.scanner.then(ok(topology(lost=[1])))
    w.clock.advance(60)
    assert w.agent.step()
    assert w.metrics.api_errors.labels(kind="conflict")._value.get() == 1
    node_labels, _, _ = read(real_apiserver, node)
    assert node_labels["team"] == "ml"
    assert ours(real_apiserver, node) == projection(topology(lost=[1]), node)


def test_a_change_is_an_event_in_words(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    node = real_node_factory()
    w = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    assert w.agent.step()
    w.scanner.then(ok(topology(overrides={(3, 5): Link(LinkKind.NV, 12)})))
    w.clock.advance(60)
    assert w.agent.step()
    told = events(real_apiserver, node)
    assert len(told) == 2
    assert ("Normal", "GPUTopologyChanged", "GPU3↔GPU5: NV18 → NV12") in told


def _filler(room: int) -> dict[str, str]:
    """A foreign annotation that leaves exactly `room` bytes of the budget after our publish."""
    key = "other.io/blob"
    # The annotations do not depend on the node's name (`owned` lists the same keys for any).
    ours_after = node_patch.annotation_bytes(projection(topology(), "any").annotations)
    return {key: "x" * (BUDGET - ours_after - len(key) - room)}


def test_the_annotation_budget_is_the_servers_to_the_byte(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    exact = real_node_factory(annotations=_filler(0))
    assert wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=exact).agent.step()
    assert ours(real_apiserver, exact) == projection(topology(), exact)


def test_an_annotation_overflow_is_refused_with_the_documented_error_as_the_server_would(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, wire: WireAgent
) -> None:
    node = real_node_factory(annotations=_filler(-1))
    *_, version = read(real_apiserver, node)
    w = wire(real_apiserver.kubeconfig, FakeScanner([ok(topology())]), node=node)
    with capture_logs() as logs:
        assert not w.agent.step()
    (refusal,) = [e for e in logs if e["event"] == "publish_refused"]
    assert f"over the apiserver's {BUDGET}-byte limit" in refusal["error"]
    assert "remove large foreign annotations" in refusal["error"]
    assert read(real_apiserver, node)[2] == version
    # The patch the agent held back is one the server itself refuses.
    annotations = dict(projection(topology(), node).annotations)
    body: dict[str, Any] = {"metadata": {"annotations": annotations}}
    with pytest.raises(k8s.ApiException) as refused:
        real_apiserver.core().patch_node(node, body)
    assert refused.value.status == 422
    assert f"Too long: may not be more than {BUDGET} bytes" in str(refused.value.body)
