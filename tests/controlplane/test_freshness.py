"""Availability nobody can vouch for stops filtering, on the real kube-apiserver (issue 19, item 2).

The issue's two scenarios, through each API client: the agent publishes 0 free on a real Node;
then PodResources reads fail (the agent withdraws its keys; the extender, watching the real
server, stops filtering the node), or the agent is killed (its heartbeat Lease, as the real server
stores it, expires on the extender's clock; the node reads as unknown). The agent and the extender
run in-process with fake clocks: no test waits for time to pass. The same scenarios on the API
double, with more detail, are in tests/agent/test_availability_freshness.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client as k8s

from reporter.availability import NEUTRAL_SCORE
from reporter.settings import WITHDRAW_AFTER
from tests.agent.test_availability import INTERVAL_S, FakeSource, Live, wire_live
from tests.agent.test_availability_freshness import ALL_USED, DOWN, HEARTBEAT_S
from tests.support.agent_support import ApiClientFactory, topology
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer
from tests.support.heartbeat_support import eventually, running_extender

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"


@pytest.fixture
def live_on(real_apiserver: RealApiServer, node_client: ApiClientFactory) -> Callable[..., Live]:
    """An agent with its live loop on a real Node, through each API client."""

    def make(node: str, **kwargs: object) -> Live:
        return wire_live(real_apiserver.kubeconfig, node_client, node=node, **kwargs)  # type: ignore[arg-type]

    return make


def test_reads_failing_withdraw_the_keys_and_the_extender_stops_filtering(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, live_on: Callable[..., Live]
) -> None:
    node = real_node_factory()
    w = live_on(node, source=FakeSource(used=ALL_USED))
    assert w.agent.step()
    labels = real_apiserver.core().read_node(node).metadata.labels
    assert labels[f"{PREFIX}/gpu-free"] == "0"
    with running_extender(real_apiserver.kubeconfig) as extender:
        assert extender.filtered(node, 1)
        assert w.source is not None
        w.source.error = DOWN
        for _ in range(WITHDRAW_AFTER):
            w.clock.advance(INTERVAL_S)
            assert not w.loop.tick(topology())
        meta = real_apiserver.core().read_node(node).metadata
        assert f"{PREFIX}/gpu-free" not in meta.labels
        assert f"{PREFIX}/availability" not in (meta.annotations or {})
        assert f"{PREFIX}/topology" in meta.annotations
        eventually(lambda: not extender.filtered(node, 1), "the withdrawal to reach the extender")
        assert extender.scores([node], 1) == {node: NEUTRAL_SCORE}
        assert not w.state.readiness().ok


def test_a_killed_agents_lease_expires_and_the_extender_reads_its_node_as_unknown(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    real_namespace: str,
    live_on: Callable[..., Live],
) -> None:
    node = real_node_factory()
    w = live_on(
        node,
        source=FakeSource(used=ALL_USED),
        heartbeat_s=HEARTBEAT_S,
        lease_namespace=real_namespace,
    )
    assert w.agent.step()
    leases = k8s.CoordinationV1Api(real_apiserver.api())
    stored = leases.read_namespaced_lease(node, real_namespace)
    assert (stored.spec.holder_identity, stored.spec.lease_duration_seconds) == (node, 40)
    assert (
        stored.metadata.owner_references[0].uid
        == real_apiserver.core().read_node(node).metadata.uid
    )
    with running_extender(
        real_apiserver.kubeconfig, heartbeat_namespace=real_namespace
    ) as extender:
        heartbeats = extender.heartbeats
        assert heartbeats is not None

        def renew_time() -> str:
            lease = leases.read_namespaced_lease(node, real_namespace)
            # The client parses MicroTime; the extender compares the text the server sent.
            return lease.spec.renew_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        extender.sees_renewal(node, renew_time())
        assert extender.filtered(node, 1)
        for _ in range(6):
            extender.clock.advance(INTERVAL_S)
            w.clock.advance(INTERVAL_S)
            assert w.loop.tick(topology())
            extender.sees_renewal(node, renew_time())
            heartbeats.sweep()
            assert extender.filtered(node, 1)
        # The agent is killed: nothing renews the Lease.
        extender.clock.advance(HEARTBEAT_S - 1)
        heartbeats.sweep()
        assert extender.filtered(node, 1)
        extender.clock.advance(1)
        heartbeats.sweep()
        assert not extender.filtered(node, 1)
        assert extender.scores([node], 1) == {node: NEUTRAL_SCORE}
        # The real Node still says 0 free: only the judge changed its mind.
        labels = real_apiserver.core().read_node(node).metadata.labels
        assert labels[f"{PREFIX}/gpu-free"] == "0"
