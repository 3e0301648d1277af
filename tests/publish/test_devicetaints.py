"""The DeviceTaintRule sink: writes only on change, touches only its own node's rules, and says once
that a cluster serves none.

Against the real kube-apiserver (the shared one, 1.37, serves DeviceTaintRules as GA
resource.k8s.io/v1), through both API clients; the answers a server without the
gate gives (404 for every version) and a refusal (403) come from the API server double.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes import client as k8s
from structlog.testing import capture_logs

from reporter.publish.devicetaints import DeviceTaintOutput, DeviceTaintSink
from reporter.schema import dra
from reporter.schema.dra import DeviceTaint
from reporter.schema.model import Topology
from tests.doctor.test_findings import dgx
from tests.support.agent_support import ApiClientFactory
from tests.support.controlplane_fixtures import RULES_VERSION, RealApiServer, unique
from tests.support.kube_double import ApiServerDouble

PREFIX = "gpu.topology.io"
RULES = ("resource.k8s.io", RULES_VERSION, "devicetaintrules")
LOG = structlog.get_logger("test")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def taint(minor: int, reason: str = dra.REASON_NVLINK_DEGRADED) -> DeviceTaint:
    return DeviceTaint(minor, dra.gpu_device(minor), reason)


# --- what a server answers that the real one here does not: no gate, a refusal ------------------


def test_a_cluster_serving_no_device_taint_rules_is_told_once_and_asked_no_more(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    sink = DeviceTaintSink(
        node_client(admin_kubeconfig, (2.0, 2.0)), node="dgx-07", prefix=PREFIX, resync_s=1, log=LOG
    )
    with capture_logs() as logs:
        for _ in range(3):
            assert sink.publish([taint(1)]) == 0
    asked = [r for r in apiserver.requests if "/apis/resource.k8s.io/" in r.path]
    assert [r.path for r in asked] == [
        f"/apis/resource.k8s.io/{v}/devicetaintrules" for v in dra.VERSIONS
    ]
    told = [e for e in logs if e["event"] == "device_taints_not_served"]
    assert len(told) == 1
    assert "--feature-gates=DRADeviceTaints=true" in told[0]["hint"]
    assert not sink.served


def test_a_refusal_is_logged_once_and_not_sent_again_until_health_changes(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    clock = Clock()
    sink = DeviceTaintSink(
        node_client(kubeconfig, (2.0, 2.0)),
        node="dgx-07",
        prefix=PREFIX,
        resync_s=300,
        log=LOG,
        clock=clock,
    )
    output = DeviceTaintOutput(sink, LOG, lambda *event: None)
    topology = lost_topology((1,))
    with capture_logs() as logs:
        for _ in range(3):
            output(topology)
        clock.now = 301  # a resync period later: tried once more
        output(topology)
    asked = [r for r in apiserver.requests if "/apis/resource.k8s.io/" in r.path]
    assert len(asked) == 2
    assert [e["event"] for e in logs if e["event"].startswith("device_taints")] == [
        "device_taints_failed"
    ]


def lost_topology(lost: tuple[int, ...]) -> Topology:
    topology = dgx(lost=lost)
    return replace(topology, gpus=tuple(replace(g, minor=g.index) for g in topology.gpus))


# --- the real kube-apiserver ---------------------------------------------------------------------


@pytest.fixture
def rules(real_apiserver: RealApiServer) -> Iterator[k8s.CustomObjectsApi]:
    api = k8s.CustomObjectsApi(real_apiserver.api())
    before = {r["metadata"]["name"] for r in api.list_cluster_custom_object(*RULES)["items"]}
    yield api
    for item in api.list_cluster_custom_object(*RULES)["items"]:
        if item["metadata"]["name"] not in before:
            with contextlib.suppress(k8s.ApiException):
                api.delete_cluster_custom_object(*RULES, item["metadata"]["name"])


def names(api: k8s.CustomObjectsApi, node: str) -> dict[str, str]:
    """This node's rules as the agent labels them: device -> taint value."""
    found = api.list_cluster_custom_object(*RULES, label_selector=dra.owned_selector(node, PREFIX))
    return {
        r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["value"] for r in found["items"]
    }


def body(name: str, node: str, device: str, labels: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": f"resource.k8s.io/{RULES_VERSION}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": device},
            "taint": {"key": "other.io/x", "value": "y", "effect": "NoSchedule"},
        },
    }


@pytest.mark.controlplane
def test_on_the_real_server_rules_follow_health_and_only_changes_are_written(
    real_apiserver: RealApiServer,
    rules: k8s.CustomObjectsApi,
    node_client: ApiClientFactory,
) -> None:
    node, other = unique("n"), unique("n")
    # Someone else's rule under the name the agent would give gpu-1, and the agent's labels on
    # another node's rule: neither is the agent's to touch.
    taken = dra.rule_name(node, "gpu-1")
    rules.create_cluster_custom_object(*RULES, body(taken, node, "gpu-1"))
    labels = {"app.kubernetes.io/managed-by": "topo-reporter", f"{PREFIX}/node": other}
    rules.create_cluster_custom_object(
        *RULES, body(dra.rule_name(other, "gpu-0"), other, "gpu-0", labels)
    )
    clock = Clock()
    sink = DeviceTaintSink(
        node_client(real_apiserver.kubeconfig, (5.0, 15.0)),
        node=node,
        prefix=PREFIX,
        resync_s=300,
        log=LOG,
        clock=clock,
    )
    assert sink.publish([taint(1), taint(2)]) == 1
    assert sink.blocked == (taken,)
    assert sink.publish([taint(1), taint(2)]) == 0  # steady: nothing written
    assert sink.blocked == (taken,)
    assert names(rules, node) == {"gpu-2": dra.REASON_NVLINK_DEGRADED}

    assert sink.publish([taint(2, dra.REASON_LOST)]) == 2  # a new reason: delete, create
    assert names(rules, node) == {"gpu-2": dra.REASON_LOST}
    assert sink.publish([]) == 1
    assert names(rules, node) == {}
    assert sink.publish([]) == 0

    # Someone deletes the agent's rule: the next resync's list sees it and writes it again.
    assert sink.publish([taint(3)]) == 1
    rules.delete_cluster_custom_object(*RULES, dra.rule_name(node, "gpu-3"))
    assert sink.publish([taint(3)]) == 0
    clock.now = 300
    assert sink.publish([taint(3)]) == 1
    assert names(rules, node) == {"gpu-3": dra.REASON_NVLINK_DEGRADED}

    # An administrator's quarantine under the agent's name and labels, NoExecute: not a rule the
    # agent writes, so it is neither deleted nor replaced, and the GPU's rule is told blocked.
    quarantine = dra.rule(taint(4), node=node, prefix=PREFIX, version=RULES_VERSION)
    quarantine["spec"]["taint"]["effect"] = "NoExecute"
    rules.create_cluster_custom_object(*RULES, quarantine)
    clock.now = 600
    assert sink.publish([taint(3), taint(4)]) == 0
    assert sink.blocked == (dra.rule_name(node, "gpu-4"),)
    stored = rules.get_cluster_custom_object(*RULES, dra.rule_name(node, "gpu-4"))
    assert stored["spec"]["taint"]["effect"] == "NoExecute"
    assert sink.publish([]) == 1  # its own gpu-3 rule only
    assert names(rules, node) == {"gpu-4": dra.REASON_NVLINK_DEGRADED}

    # Never touched: the foreign rule and the other node's.
    kept = {r["metadata"]["name"] for r in rules.list_cluster_custom_object(*RULES)["items"]}
    assert {taken, dra.rule_name(other, "gpu-0")} <= kept

    # Once the rule that held its name is gone, the next resync writes the agent's own.
    rules.delete_cluster_custom_object(*RULES, taken)
    clock.now = 900
    assert sink.publish([taint(1)]) == 1
    assert sink.blocked == ()
    assert names(rules, node) == {
        "gpu-1": dra.REASON_NVLINK_DEGRADED,
        "gpu-4": dra.REASON_NVLINK_DEGRADED,  # the quarantine, still there
    }
