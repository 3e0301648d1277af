"""The doctor's DRA findings: claims on lost GPUs, DRA slices that availability does not count, and
availability counting DRA alone where no DRA driver publishes the node's GPUs.

Pure judgements on Node objects and a DraObservation, and `dra_observation` on ResourceSlices and
ResourceClaims as the API lists them (hostile shapes included). The same findings on the real
apiserver's objects: tests/controlplane/test_dra.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from reporter.doctor.model import AgentObservation, DraObservation
from reporter.doctor.node import node_findings
from reporter.doctor.reader import dra_observation
from tests.doctor.test_findings import dgx, node

PREFIX = "gpu.topology.io"
HEALTHY = AgentObservation(pod_found=True, pod_ready=True)
DPLUGIN_AVAILABILITY = {f"{PREFIX}/availability": "1;;"}


def with_minors(lost: tuple[int, ...] = ()) -> Any:
    topology = dgx(lost=lost)
    return replace(topology, gpus=tuple(replace(g, minor=g.index) for g in topology.gpus))


def annotated(annotations: dict[str, str], gpus: int | None = 8) -> dict[str, Any]:
    n = node(gpus)
    n["metadata"]["annotations"] = annotations
    return n


def codes(findings: list[Any]) -> list[str]:
    return [f.code for f in findings]


def test_a_claim_on_a_lost_gpu_is_an_error_naming_the_claim() -> None:
    seen = DraObservation(slices=1, claims=(("ml/train", "gpu-3"), ("ml/ok", "gpu-1")))
    findings = node_findings(node(None), with_minors(lost=(3,)), PREFIX, HEALTHY, seen)
    (finding,) = [f for f in findings if f.code == "dra-claims-on-lost-gpus"]
    assert finding.evidence == ("ResourceClaim ml/train holds gpu-3 (GPU3, lost)",)


def test_a_mig_slice_claimed_on_a_lost_gpu_counts_too() -> None:
    seen = DraObservation(slices=1, claims=(("ml/infer", "gpu-2-mig-1g10gb-19-0"),))
    findings = node_findings(node(None), with_minors(lost=(2,)), PREFIX, HEALTHY, seen)
    assert "dra-claims-on-lost-gpus" in codes(findings)


def test_without_claims_readable_the_published_claimed_gpus_say_it() -> None:
    annotations = {**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "1;dra;2-3"}
    seen = DraObservation(slices=None, claims=None)
    findings = node_findings(
        annotated(annotations, None), with_minors(lost=(3,)), PREFIX, HEALTHY, seen
    )
    (finding,) = [f for f in findings if f.code == "dra-claims-on-lost-gpus"]
    assert finding.evidence == ("a ResourceClaim holds GPU3 (lost)",)


def test_a_lost_gpu_no_claim_holds_is_no_dra_finding() -> None:
    seen = DraObservation(slices=1, claims=(("ml/a", "gpu-0"),))
    findings = node_findings(node(None), with_minors(lost=(3,)), PREFIX, HEALTHY, seen)
    assert "dra-claims-on-lost-gpus" not in codes(findings)
    assert "gpu-lost" in codes(findings)


@pytest.mark.parametrize(
    ("annotations", "slices", "code"),
    [
        (DPLUGIN_AVAILABILITY, 1, "dra-not-counted"),
        ({**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "1;dra;"}, 1, None),
        ({**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "1;device-plugin,dra;"}, 1, None),
        ({**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "1;dra;"}, 0, "dra-slices-missing"),
        ({**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "1;device-plugin,dra;"}, 0, None),
        (DPLUGIN_AVAILABILITY, 0, None),
        ({}, 1, None),
        (DPLUGIN_AVAILABILITY, None, None),
        ({**DPLUGIN_AVAILABILITY, f"{PREFIX}/allocation": "garbage"}, 1, None),
    ],
    ids=[
        "slices, availability counts the device plugin only",
        "slices, availability counts DRA",
        "slices, availability counts both",
        "no slices, availability counts DRA alone",
        "no slices, availability counts both (a device plugin node)",
        "no slices, device plugin only",
        "slices, no availability published",
        "slices not readable",
        "a damaged allocation annotation",
    ],
)
def test_dra_slices_and_what_availability_counts_agree(
    annotations: dict[str, str], slices: int | None, code: str | None
) -> None:
    seen = DraObservation(slices=slices, claims=())
    findings = node_findings(annotated(annotations, None), with_minors(), PREFIX, HEALTHY, seen)
    dra = [c for c in codes(findings) if c.startswith("dra-")]
    assert dra == ([code] if code else [])


def test_a_dra_node_without_the_gpu_resource_is_not_missing_its_device_plugin() -> None:
    plain = node_findings(node(None), with_minors(), PREFIX, HEALTHY, DraObservation(slices=0))
    assert "device-plugin-missing" in codes(plain)
    dra = node_findings(node(None), with_minors(), PREFIX, HEALTHY, DraObservation(slices=2))
    assert "device-plugin-missing" not in codes(dra)


NODE = "dgx-07"


def nvidia_slice(node: str, *, pool: str | None = None, driver: str = "gpu.nvidia.com") -> Any:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": pool or node}}}


def allocated_claim(namespace: str, name: str, results: Any) -> Any:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_slices_and_claims_of_this_node_and_driver_are_counted_and_the_rest_ignored() -> None:
    slices = [
        nvidia_slice(NODE),
        nvidia_slice("dgx-08"),
        nvidia_slice(NODE, driver="nic.example.com"),
        {"spec": None},
        {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "dgx-07"}}},
        {"spec": {"driver": "gpu.nvidia.com", "pool": "dgx-07"}},
        {},
        "not an object",
    ]
    claims = [
        allocated_claim("ml", "a", [{"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"}]),
        allocated_claim(
            "ml", "b", [{"driver": "gpu.nvidia.com", "pool": "dgx-08", "device": "gpu-1"}]
        ),
        allocated_claim("ml", "c", [{"driver": "nic.example.com", "pool": NODE, "device": "eth0"}]),
        allocated_claim("ml", "d", ["not an object", None]),
        {"metadata": {"name": "pending"}, "status": {}},
        {"metadata": [], "status": {"allocation": {"devices": {"results": "x"}}}},
        {"status": []},
        {},
    ]
    seen = dra_observation(NODE, slices, claims)
    assert seen == DraObservation(slices=2, claims=(("ml/a", "gpu-1"),))


def test_unreadable_lists_stay_unknown() -> None:
    assert dra_observation(NODE, None, None) == DraObservation()
