"""The agent on a rack node, against the API server double: the fabric's labels, its Warning
Events (once per distinct problem), readiness while the partition is withheld, and the Events
that say what changed in a GPU's fabric or links."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from reporter.agent import REASON_FABRIC
from reporter.collect import ScanResult, build_scanner
from reporter.collect.simulate.machine import shipped_profile
from reporter.schema.model import NvlinkHealth, Topology
from tests.support.agent_support import API_CLIENTS, NODE, PREFIX, FakeScanner, ok, wire_agent
from tests.support.kube_double import ApiServerDouble

CLUSTER = "6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31"


def rack_scan(tmp_path: Path, name: str, **fabric: Any) -> ScanResult:
    """One scan of the gb200-nvl tray with its profile's fabric changed (same GPU UUIDs: the
    file's stem seeds them)."""
    data = shipped_profile("gb200-nvl")
    data["fabric"] = {**data["fabric"], **fabric}
    (tmp_path / name).mkdir()
    path = tmp_path / name / "tray.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = build_scanner("auto", Path("/sys"), str(path)).scan()
    assert result.topology is not None
    return ok(result.topology)


def ours(apiserver: ApiServerDouble) -> dict[str, str]:
    labels = apiserver.node(NODE)["metadata"].get("labels", {})
    return {k.split("/")[1]: v for k, v in labels.items() if k.startswith(PREFIX)}


def fabric_events(apiserver: ApiServerDouble) -> list[tuple[str, str]]:
    return [(e["type"], e["message"]) for e in apiserver.events if e["reason"] == REASON_FABRIC]


def test_a_fabric_still_joining_withholds_the_partition_until_it_completes(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    joining = rack_scan(tmp_path, "joining", state="in-progress")
    completed = rack_scan(tmp_path, "completed")
    scanner = FakeScanner([joining, joining, completed])
    w = wire_agent(
        kubeconfig,
        scanner,
        client=API_CLIENTS["lean"],
    )
    assert w.agent.step()
    labels = ours(apiserver)
    assert "nvlink-partition" not in labels
    assert labels["nvlink-domain"] == f"node-{NODE}"
    assert labels["fabric-health"] == "in-progress"
    assert fabric_events(apiserver) == [
        (
            "Warning",
            "no nvlink-partition label: fabric not completed: GPU0 in-progress, GPU1 "
            "in-progress, GPU2 in-progress, GPU3 in-progress",
        )
    ]
    verdict = w.state.readiness()
    # Said, not made NotReady: a rack's hardware must not stall the DaemonSet's rollout.
    assert verdict.ok
    assert "; no nvlink-partition label: fabric not completed: GPU0" in verdict.reason

    assert w.agent.step()  # the same problems: no second Event, no write
    assert len(fabric_events(apiserver)) == 1
    writes = len(apiserver.writes())

    assert w.agent.step()
    assert ours(apiserver)["nvlink-partition"] == f"{CLUSTER}.32766"
    assert ours(apiserver)["fabric-health"] == "healthy"
    assert w.state.readiness().ok
    assert len(fabric_events(apiserver)) == 1
    assert len(apiserver.writes()) == writes + 1
    changed = [e["message"] for e in apiserver.events if e["reason"] == "GPUTopologyChanged"]
    assert changed[-1].startswith(f"GPU0 clique none → {CLUSTER}.32766; GPU0 fabric in-progress")


def test_garbage_from_the_driver_is_one_warning_and_the_node_stays_ready(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    garbled = rack_scan(tmp_path, "garbled", chassis_serial="S" * 200)
    w = wire_agent(
        kubeconfig,
        FakeScanner([garbled]),
        client=API_CLIENTS["lean"],
    )
    assert w.agent.step()
    assert w.agent.step()
    assert ours(apiserver)["nvlink-partition"] == f"{CLUSTER}.32766"
    assert "rack-serial" not in ours(apiserver)
    assert fabric_events(apiserver) == [
        (
            "Warning",
            "NVLink fabric: GPU0,GPU1,GPU2,GPU3: chassis serial fills all 16 bytes: cut short or "
            "garbage",
        )
    ]
    assert w.state.readiness().ok


def _with_links_down(topology: Topology, gpu: int, down: int) -> Topology:
    gpus = list(topology.gpus)
    count = 18
    gpus[gpu] = replace(gpus[gpu], nvlink=NvlinkHealth(count, tuple(range(count - down, count))))
    return replace(topology, gpus=tuple(gpus))


def test_links_going_down_is_a_warning_that_counts_them(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    healthy = rack_scan(tmp_path, "healthy")
    assert healthy.topology is not None
    hurt = ok(_with_links_down(healthy.topology, 2, 2))
    w = wire_agent(
        kubeconfig,
        FakeScanner([healthy, hurt]),
        client=API_CLIENTS["lean"],
    )
    assert w.agent.step()
    assert w.agent.step()
    assert ours(apiserver)["nvlink-health"] == "degraded"
    last = apiserver.events[-1]
    assert (last["type"], last["reason"]) == ("Warning", "GPUTopologyChanged")
    assert last["message"] == "GPU2 NVLinks active 18/18 → 16/18"


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FABRIC_TAINT = f"{PREFIX}/fabric-health"


def taints(apiserver: ApiServerDouble) -> list[dict[str, Any]]:
    return list(apiserver.node(NODE).get("spec", {}).get("taints") or [])


def test_opted_in_a_hurt_fabric_taints_the_node_and_a_healthy_one_untaints_it(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    apiserver.edit_node(NODE, {"spec": {"taints": [GPU_TAINT]}})
    unhealthy = rack_scan(tmp_path, "unhealthy", health="unhealthy")
    limited = rack_scan(tmp_path, "limited", health="limited-capacity")
    healthy = rack_scan(tmp_path, "healthy")
    w = wire_agent(
        kubeconfig,
        FakeScanner([unhealthy, unhealthy, limited, healthy, healthy]),
        client=API_CLIENTS["lean"],
        taint_unhealthy_fabric=True,
    )
    own = {"key": FABRIC_TAINT, "effect": "NoSchedule"}
    expected = [
        [GPU_TAINT, {**own, "value": "unhealthy"}],
        [GPU_TAINT, {**own, "value": "unhealthy"}],
        [GPU_TAINT, {**own, "value": "degraded"}],
        [GPU_TAINT],
        [GPU_TAINT],
    ]
    writes = []
    for want in expected:
        before = len(apiserver.writes())
        assert w.agent.step()
        assert taints(apiserver) == want
        writes.append(len(apiserver.writes()) - before)
    # Steady states write nothing; each change is one patch, labels and taint together.
    assert writes == [1, 0, 1, 1, 0]
    patches = [r.body for r in apiserver.writes() if r.method == "PATCH"]
    assert all(p["metadata"]["resourceVersion"] for p in patches)
    assert patches[-1]["spec"] == {"taints": [GPU_TAINT]}
    assert ours(apiserver)["fabric-health"] == "healthy"


def test_opted_in_the_taint_comes_back_when_someone_removes_it_at_the_next_resync(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    unhealthy = rack_scan(tmp_path, "unhealthy", health="unhealthy")
    w = wire_agent(
        kubeconfig,
        FakeScanner([unhealthy] * 3),
        client=API_CLIENTS["lean"],
        taint_unhealthy_fabric=True,
    )
    assert w.agent.step()
    apiserver.edit_node(NODE, {"spec": {"taints": None}})
    w.clock.advance(400)  # past the resync period: the Node is read again
    assert w.agent.step()
    own = {"key": FABRIC_TAINT, "value": "unhealthy", "effect": "NoSchedule"}
    assert taints(apiserver) == [own]


def test_not_opted_in_the_agent_never_touches_taints(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    apiserver.edit_node(NODE, {"spec": {"taints": [GPU_TAINT]}})
    unhealthy = rack_scan(tmp_path, "unhealthy", health="unhealthy")
    w = wire_agent(kubeconfig, FakeScanner([unhealthy]), client=API_CLIENTS["lean"])
    assert w.agent.step()
    assert ours(apiserver)["fabric-health"] == "unhealthy"
    assert taints(apiserver) == [GPU_TAINT]
    assert all("spec" not in r.body for r in apiserver.writes())
