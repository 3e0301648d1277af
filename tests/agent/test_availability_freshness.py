"""Availability that nobody can vouch for must not keep filtering nodes out (issue 19, item 2).

On the API server double, through each API client: the agent withdraws its availability keys
when PodResources reads keep failing, says so in readiness and metrics, and publishes again when
reads recover; it renews a heartbeat Lease while it keeps the keys current; the extender, with
heartbeats on, reads a node whose Lease is missing or expired as unknown (never filtered, neutral
score). Clocks are fake: the agent's and the extender's time pass as the test says. The same
scenarios run on the real kube-apiserver in tests/controlplane/test_freshness.py.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from parsers.kubelet import KubeletPolicies
from reporter.availability import NEUTRAL_SCORE
from reporter.collect.podresources import PodResourcesError
from reporter.publish.lease import beat as lease_beat
from reporter.publish.nrt import RBAC_VERBS, NrtOutput, NrtSink
from reporter.schema import nrt
from reporter.serve.state import Verdict
from reporter.settings import WITHDRAW_AFTER
from tests.agent.test_availability import (
    AVAILABILITY,
    FREE,
    INTERVAL_S,
    LEASE_NAMESPACE,
    NVLINK_MAX,
    FakeSource,
    Live,
    sample,
    wire_live,
)
from tests.cli.test_run import CLI, env
from tests.extender.test_protocol import pod
from tests.support.agent_support import FAST, NODE, PREFIX, ApiClientFactory, topology
from tests.support.heartbeat_support import eventually, running_extender
from tests.support.kube_double import ApiServerDouble, Fault

ALL_USED = set(range(8))
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
HEARTBEAT_S = 40.0
HEARTBEAT_RUN = ("--availability", "--simulate-used", "0,1,2,3,4,5,6,7", "--heartbeat")
"""`run` flags: every GPU of the simulated machine taken, a heartbeat Lease renewed."""
DOWN = PodResourcesError("kubelet.sock: connection refused", reason="unavailable", method="List")


@pytest.fixture
def live(kubeconfig: Path, node_client: ApiClientFactory) -> Callable[..., Live]:
    """An agent with its live loop, wired as test_agent_availability wires it, per API client."""

    def make(**kwargs: object) -> Live:
        return wire_live(kubeconfig, node_client, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def extender_kubeconfig(kubeconfig_with_token: Callable[[str], Path]) -> Path:
    """The extender's identity: list and watch Nodes and Leases, nothing else."""
    return kubeconfig_with_token("extender-token")


def fail_reads(w: Live, ticks: int) -> None:
    assert w.source is not None
    w.source.error = DOWN
    for _ in range(ticks):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())


# -- the agent: withdraw, readiness, republish -----------------------------------------------


def test_reads_that_keep_failing_withdraw_the_keys_and_a_good_read_brings_them_back(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used=ALL_USED))
    assert w.agent.step()
    assert apiserver.labels(NODE)[FREE] == "0"
    apiserver.clear_requests()

    fail_reads(w, 1)
    # One failure is ridden out: the value stays, but the agent says it is not ready, and why.
    assert apiserver.writes() == []
    assert apiserver.labels(NODE)[FREE] == "0"
    verdict = w.state.readiness()
    assert not verdict.ok
    assert verdict.reason.startswith("podresources: kubelet.sock: connection refused (1 failed")

    fail_reads(w, WITHDRAW_AFTER - 1)
    # Withdrawn: our three keys leave the Node in one patch, and nothing else is touched.
    assert [r.body for r in apiserver.writes()] == [
        {
            "metadata": {
                "annotations": {AVAILABILITY: None},
                "labels": {FREE: None, NVLINK_MAX: None},
            }
        }
    ]
    assert AVAILABILITY not in apiserver.annotations(NODE)
    assert FREE not in apiserver.labels(NODE)
    assert f"{PREFIX}/topology" in apiserver.annotations(NODE)
    assert "availability withdrawn from the Node" in w.state.readiness().reason
    assert sample(w.metrics, "topo_reporter_availability_withdrawn") == 1
    assert sample(w.metrics, "topo_reporter_podresources_consecutive_failures") == WITHDRAW_AFTER

    apiserver.clear_requests()
    fail_reads(w, 30)
    # Withdrawn and still failing: no request at all.
    assert apiserver.requests == []

    assert w.source is not None
    w.source.error, w.source.used = None, {0}
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert apiserver.labels(NODE)[FREE] == "7"
    assert w.state.readiness() == Verdict(True, "ok")
    assert sample(w.metrics, "topo_reporter_availability_withdrawn") == 0
    assert sample(w.metrics, "topo_reporter_podresources_consecutive_failures") == 0


def test_an_agent_restarted_while_reads_fail_withdraws_what_its_last_run_left(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    assert live(source=FakeSource(used=ALL_USED)).agent.step()
    assert apiserver.labels(NODE)[FREE] == "0"
    # The agent is killed; the one started after it never gets a good read.
    restarted = live(source=FakeSource(error=DOWN))
    assert not restarted.agent.step()
    assert apiserver.labels(NODE)[FREE] == "0"
    fail_reads(restarted, WITHDRAW_AFTER - 1)
    assert FREE not in apiserver.labels(NODE)
    assert AVAILABILITY not in apiserver.annotations(NODE)


def test_the_node_resource_topology_is_withdrawn_at_the_same_read_and_republished_after(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    node_client: ApiClientFactory,
    live: Callable[..., Live],
) -> None:
    """`--nrt`: the object said 0 GPUs free; reads fail. At the read that withdraws the keys,
    the object is replaced by one without the Topology Manager policy, which
    NodeResourceTopologyMatch does not filter on (reporter.schema.nrt); the next good read
    publishes the policy again."""
    # The chart's grant with --nrt, and no more: withdrawing needs no verb of its own.
    apiserver.tokens["agent-token"] |= {f"{verb} noderesourcetopologies" for verb in RBAC_VERBS}
    output = NrtOutput(
        NrtSink(
            node_client(kubeconfig, (2.0, 2.0)),
            stop=threading.Event(),
            backoff=FAST,
            log=structlog.get_logger(),
        ),
        node=NODE,
        memory=lambda: {0: 1 << 38, 1: 1 << 38},
        prefix=PREFIX,
        policies=lambda: KubeletPolicies("single-numa-node", "container"),
        log=structlog.get_logger(),
    )
    w = live(source=FakeSource(used=ALL_USED), outputs=(output,))
    assert w.agent.step()

    def policy() -> str | None:
        held = apiserver.nrt.get(NODE)
        assert held is not None
        named = {a["name"]: a["value"] for a in held["attributes"]}
        return named.get(nrt.POLICY)

    assert policy() == "single-numa-node"
    fail_reads(w, WITHDRAW_AFTER - 1)
    assert policy() == "single-numa-node"
    fail_reads(w, 1)
    assert FREE not in apiserver.labels(NODE)
    assert policy() is None
    apiserver.clear_requests()
    fail_reads(w, 30)
    assert apiserver.requests == []
    assert w.source is not None
    w.source.error = None
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert policy() == "single-numa-node"


def test_reads_failing_until_withdrawn_and_the_extender_no_longer_filters_the_node(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    """The issue's scenario: 0 free published, every pod ends, PodResources reads fail."""
    w = live(source=FakeSource(used=ALL_USED))
    assert w.agent.step()
    with running_extender(extender_kubeconfig) as extender:
        assert extender.filtered(NODE, 1)
        fail_reads(w, WITHDRAW_AFTER)
        eventually(lambda: not extender.filtered(NODE, 1), "the withdrawal to reach the extender")
        assert extender.scores([NODE], 1) == {NODE: NEUTRAL_SCORE}


# -- the agent: the heartbeat Lease -------------------------------------------------------------


def lease_writes(apiserver: ApiServerDouble) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in apiserver.writes(LEASES)]


def test_the_lease_is_created_once_then_renewed_by_one_replace_per_period_and_nodes_stay_unwritten(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used={1}), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    lease = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert lease is not None
    node_uid = apiserver.node(NODE)["metadata"]["uid"]
    assert lease["metadata"]["labels"] == {f"{PREFIX}/heartbeat": "availability"}
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
    ]
    spec = lease["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == (NODE, 40)
    assert spec["renewTime"] == spec["acquireTime"]
    assert lease_writes(apiserver) == [("POST", LEASES)]

    apiserver.clear_requests()
    w.stop.waits = int(3600 / INTERVAL_S)
    w.agent.run()
    # An idle hour: a renewal every quarter of the duration (each tick of 10 s), one PUT each,
    # no read of the Lease, and not one write on the Node. (The loop's first tick comes at the
    # instant of the step's, which had just renewed: one renewal fewer than ticks.)
    renewals = int(3600 / INTERVAL_S) - 1
    assert lease_writes(apiserver) == [("PUT", f"{LEASES}/{NODE}")] * renewals
    assert apiserver.reads(LEASES) == []
    assert apiserver.writes() == []
    renewed = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert renewed is not None
    assert renewed["spec"]["renewTime"] > spec["renewTime"]
    assert renewed["spec"]["acquireTime"] == spec["acquireTime"]
    renewed = {"result": "renewed"}
    assert sample(w.metrics, "topo_reporter_heartbeat_renewals_total", renewed) == 1 + renewals


def test_a_longer_lease_is_renewed_less_often(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(), heartbeat_s=120.0)
    assert w.agent.step()
    apiserver.clear_requests()
    w.stop.waits = int(3600 / INTERVAL_S)
    w.agent.run()
    # Every 30 s, a quarter of 120 s (the first at the step's instant, before the hour).
    assert len(lease_writes(apiserver)) == 3600 / 30 - 1


def test_the_lease_is_not_renewed_while_the_node_cannot_be_written(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    source = FakeSource()
    w = live(source=source, heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    source.used = {3}
    apiserver.clear_requests()
    apiserver.plan(*[Fault(status=500, method="PATCH")] * 3)
    for _ in range(3):
        w.clock.advance(INTERVAL_S)
        assert not w.loop.tick(topology())
    # The Node carries an old value the agent cannot replace: it does not vouch for it.
    assert lease_writes(apiserver) == []
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert lease_writes(apiserver) == [("PUT", f"{LEASES}/{NODE}")]


def test_a_failed_renewal_makes_the_agent_not_ready_and_the_next_tick_reads_and_renews(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    # Someone else changed the Lease: the agent's replace is a 409.
    lease = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert lease is not None
    apiserver.leases.put({**lease, "spec": {**lease["spec"], "leaseTransitions": 1}})
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    verdict = w.state.readiness()
    assert not verdict.ok
    assert verdict.reason.startswith(f"heartbeat: replace Lease {LEASE_NAMESPACE}/{NODE}: conflict")
    assert sample(w.metrics, "topo_reporter_heartbeat_renewals_total", {"result": "failed"}) == 1
    apiserver.clear_requests()
    w.clock.advance(INTERVAL_S)
    assert w.loop.tick(topology())
    assert [(r.method, r.path) for r in apiserver.requests] == [
        ("GET", f"{LEASES}/{NODE}"),
        ("PUT", f"{LEASES}/{NODE}"),
    ]
    assert w.state.readiness() == Verdict(True, "ok")


def test_a_renewal_sends_the_lease_back_without_its_managed_fields(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    lease = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert lease is not None
    # As the real server answers: with managedFields, which it keeps when an update omits them.
    fields = [{"manager": "python", "operation": "Update", "apiVersion": "coordination.k8s.io/v1"}]
    apiserver.leases.put({**lease, "metadata": {**lease["metadata"], "managedFields": fields}})
    apiserver.clear_requests()
    for _ in range(2):  # the first reads again (the replace met a 409), the second renews
        w.clock.advance(INTERVAL_S)
        w.loop.tick(topology())
    (put,) = [r for r in apiserver.requests if r.method == "PUT" and r.status == 200]
    assert "managedFields" not in put.body["metadata"]
    assert put.body["metadata"]["labels"] == {f"{PREFIX}/heartbeat": "availability"}
    assert put.body["spec"]["holderIdentity"] == NODE


@pytest.mark.parametrize(
    ("spec", "beat"),
    [
        ({"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": "t"}, ("t", 40)),
        ({"holderIdentity": "other", "leaseDurationSeconds": 40, "renewTime": "t"}, (None, 40)),
        ({"holderIdentity": NODE, "renewTime": "t"}, ("t", None)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": 0, "renewTime": "t"}, ("t", None)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": True, "renewTime": "t"}, ("t", None)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": 10**400, "renewTime": "t"}, ("t", None)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": "40", "renewTime": "t"}, ("t", None)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": 5}, (None, 40)),
        ({"holderIdentity": NODE, "leaseDurationSeconds": 40}, (None, 40)),
        ([], (None, None)),
    ],
    ids=[
        "held by the node",
        "held by another identity",
        "no duration",
        "a zero duration",
        "a boolean duration",
        "a duration of 400 digits",
        "a duration in text",
        "a renewTime that is not text",
        "never renewed",
        "a spec that is not an object",
    ],
)
def test_a_lease_vouches_only_when_held_by_its_node_with_a_sane_duration(
    spec: object, beat: tuple[str | None, int | None]
) -> None:
    read = lease_beat({"metadata": {"name": NODE}, "spec": spec})
    assert (read.node, read.renew_time, read.duration_s) == (NODE, *beat)


def test_a_lease_of_that_name_that_is_not_a_heartbeat_is_never_taken_over(
    apiserver: ApiServerDouble, live: Callable[..., Live]
) -> None:
    foreign = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NODE, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": "some-controller", "leaseDurationSeconds": 15},
    }
    apiserver.leases.put(foreign)
    w = live(source=FakeSource(), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    assert lease_writes(apiserver) == []
    assert "it is another component's" in w.state.readiness().reason
    stored = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert stored is not None
    assert stored["spec"]["holderIdentity"] == "some-controller"


# -- the extender: judging by heartbeats ----------------------------------------------------------


def renew_time(apiserver: ApiServerDouble, node: str = NODE) -> str:
    lease = apiserver.leases.get(LEASE_NAMESPACE, node)
    assert lease is not None
    return str(lease["spec"]["renewTime"])


def test_a_killed_agents_lease_expires_and_the_extender_reads_its_node_as_unknown(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    """The issue's second scenario: 0 free published, then the agent is killed."""
    w = live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    with running_extender(extender_kubeconfig, heartbeat_namespace=LEASE_NAMESPACE) as extender:
        heartbeats = extender.heartbeats
        assert heartbeats is not None
        extender.sees_renewal(NODE, renew_time(apiserver))
        assert extender.filtered(NODE, 1)
        # A minute and a half of renewals, each seen: trusted all along, past one duration.
        for _ in range(9):
            extender.clock.advance(INTERVAL_S)
            w.clock.advance(INTERVAL_S)
            assert w.loop.tick(topology())
            extender.sees_renewal(NODE, renew_time(apiserver))
            heartbeats.sweep()
            assert extender.filtered(NODE, 1)
        # The agent is killed: nothing renews the Lease. Trusted for one duration, then unknown.
        extender.clock.advance(HEARTBEAT_S - 1)
        heartbeats.sweep()
        assert extender.filtered(NODE, 1)
        extender.clock.advance(1)
        heartbeats.sweep()
        assert not extender.filtered(NODE, 1)
        assert extender.scores([NODE], 1) == {NODE: NEUTRAL_SCORE}
        assert not extender.filtered_whole(apiserver.node(NODE), 1)
        assert heartbeats.counts() == (0, 1)
        # The agent comes back: its first renewal makes the node trusted again.
        w.clock.advance(INTERVAL_S)
        assert w.loop.tick(topology())
        extender.sees_renewal(NODE, renew_time(apiserver))
        assert extender.filtered(NODE, 1)
        assert extender.filtered_whole(apiserver.node(NODE), 1)


def test_with_heartbeats_on_a_node_without_a_lease_is_unknown_until_its_agent_beats(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    assert live(source=FakeSource(used=ALL_USED)).agent.step()
    with running_extender(extender_kubeconfig, heartbeat_namespace=LEASE_NAMESPACE) as extender:
        assert not extender.filtered(NODE, 1)
        assert extender.scores([NODE], 1) == {NODE: NEUTRAL_SCORE}
        assert not extender.filtered_whole(apiserver.node(NODE), 1)
        beating = live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S)
        assert beating.agent.step()
        eventually(lambda: extender.filtered(NODE, 1), "the first heartbeat")


def test_a_deleted_lease_or_one_held_by_another_identity_vouches_for_nothing(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    with running_extender(extender_kubeconfig, heartbeat_namespace=LEASE_NAMESPACE) as extender:
        extender.sees_renewal(NODE, renew_time(apiserver))
        assert extender.filtered(NODE, 1)
        lease = apiserver.leases.get(LEASE_NAMESPACE, NODE)
        assert lease is not None
        apiserver.leases.put({**lease, "spec": {**lease["spec"], "holderIdentity": "gpu-node-2"}})
        eventually(lambda: not extender.filtered(NODE, 1), "the foreign holder")
        apiserver.leases.put(lease)
        eventually(lambda: extender.filtered(NODE, 1), "the node holding it again")
        apiserver.leases.delete(LEASE_NAMESPACE, NODE)
        eventually(lambda: not extender.filtered(NODE, 1), "the deletion")


def test_an_expired_lease_stays_expired_through_a_relist(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    w = live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S)
    assert w.agent.step()
    with running_extender(extender_kubeconfig, heartbeat_namespace=LEASE_NAMESPACE) as extender:
        heartbeats = extender.heartbeats
        assert heartbeats is not None
        extender.sees_renewal(NODE, renew_time(apiserver))
        extender.clock.advance(HEARTBEAT_S)
        heartbeats.sweep()
        assert not extender.filtered(NODE, 1)
        # The watch expires (compaction): the relist shows the same renewTime, not a renewal.
        watches = len(lease_watches(apiserver))
        with apiserver.leases.log.paused():
            # A change the open watch has not sent, then compaction: the watch ends with 410.
            apiserver.leases.put(
                {"metadata": {"name": "other", "namespace": LEASE_NAMESPACE}, "spec": {}}
            )
            apiserver.leases.log.compact()
        eventually(lambda: len(lease_watches(apiserver)) > watches, "the relist and a new watch")
        assert not extender.filtered(NODE, 1)


def lease_watches(apiserver: ApiServerDouble) -> list[object]:
    return [r for r in apiserver.reads(LEASES) if r.query.get("watch")]


def test_an_extender_that_may_not_watch_leases_is_not_ready_and_judges_every_node_unknown(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    live: Callable[..., Live],
) -> None:
    assert live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S).agent.step()
    apiserver.tokens["nodes-only"] = frozenset({"list nodes", "watch nodes"})
    with running_extender(
        kubeconfig_with_token("nodes-only"),
        heartbeat_namespace=LEASE_NAMESPACE,
        wait_for_leases=False,
    ) as extender:
        watcher = extender.lease_watcher
        assert watcher is not None
        eventually(lambda: "forbidden" in (watcher.problem or ""), "the refusal")
        assert watcher.problem is not None
        assert watcher.problem.startswith(f"heartbeat Leases in {LEASE_NAMESPACE}: list leases")
        assert "`list` on `leases.coordination.k8s.io`" in watcher.problem
        assert not extender.filtered(NODE, 1)


# -- both commands as an operator runs them ---------------------------------------------------


def test_run_with_heartbeat_creates_the_nodes_lease_in_its_namespace(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", "", *HEARTBEAT_RUN],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=str(kubeconfig), NODE_NAME=NODE, POD_NAMESPACE=LEASE_NAMESPACE),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert apiserver.labels(NODE)[FREE] == "0"
    lease = apiserver.leases.get(LEASE_NAMESPACE, NODE)
    assert lease is not None
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseDurationSeconds"]) == (NODE, 40)


def test_the_extender_command_judges_by_the_leases_of_its_heartbeat_namespace(
    apiserver: ApiServerDouble, extender_kubeconfig: Path, live: Callable[..., Live]
) -> None:
    assert live(source=FakeSource(used=ALL_USED)).agent.step()
    with subprocess.Popen(
        [*CLI, "extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(extender_kubeconfig)],
        stderr=subprocess.PIPE,
        text=True,
        env=env(TOPO_REPORTER_LOG_FORMAT="json", TOPO_REPORTER_HEARTBEAT_NAMESPACE=LEASE_NAMESPACE),
    ) as proc:
        try:
            assert proc.stderr is not None
            address = next(
                json.loads(line)["address"]
                for line in proc.stderr
                if json.loads(line)["event"] == "serving"
            )
            host, port = address.rsplit(":", 1)

            def get(path: str, body: object = None) -> tuple[int, str]:
                connection = http.client.HTTPConnection(host, int(port), timeout=10)
                try:
                    method = "GET" if body is None else "POST"
                    payload = None if body is None else json.dumps(body)
                    connection.request(method, path, payload)
                    response = connection.getresponse()
                    return response.status, response.read().decode()
                finally:
                    connection.close()

            def filtered() -> bool:
                status, text = get("/filter", {"Pod": pod(1), "NodeNames": [NODE]})
                return status == 200 and NODE in json.loads(text)["FailedNodes"]

            eventually(lambda: get("/readyz")[0] == 200, "the extender's lists")
            # No Lease: the node's 0 free GPUs are nobody's word. Not filtered, neutral.
            assert not filtered()
            assert 'topo_reporter_extender_heartbeats{state="fresh"} 0.0' in get("/metrics")[1]
            beating = live(source=FakeSource(used=ALL_USED), heartbeat_s=HEARTBEAT_S)
            assert beating.agent.step()
            eventually(filtered, "the node's first heartbeat")
            assert 'topo_reporter_extender_heartbeats{state="fresh"} 1.0' in get("/metrics")[1]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
