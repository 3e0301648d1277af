"""What others can write or answer since schema v2, DRA and heartbeats, end to end (third review).

An outsider who may edit Nodes (another tool), create DeviceTaintRules, or a broken driver or
host mount answering garbage: each case here failed before its fix (a traceback that stopped the
agent, the doctor or `kubectl gpu-topology`; a topology published that the agent's own decoder
refuses; GPUs that claims hold published free; a scan stuck on a FIFO; another node's
DeviceTaintRule deleted or ours never created). What held is asserted as well, so that it keeps
holding.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from reporter.cli import main
from reporter.errors import SchemaError
from reporter.kubectl_plugin import main as plugin_main
from reporter.schema.codec import decode, encode, from_document, to_document
from reporter.schema.model import (
    FabricState,
    GpuFabric,
    NvlinkHealth,
    RackPosition,
    Topology,
)
from tests.agent_support import NODE, PREFIX, FakeScanner, ok, topology, wire_agent
from tests.fuzz import fuzz, outcome
from tests.kube_double import ApiServerDouble
from tests.strategies import topologies
from tests.test_fuzz_codec import _rehash

TOPOLOGY_KEY = f"{PREFIX}/topology"
FIXTURES = Path(__file__).parent / "fixtures"
LOG = structlog.get_logger("test")


# -- 1. Numbers in the topology annotation: whole numbers only -----------------------------------


def every_field_topology() -> Topology:
    """Four GPUs with every integer the v2 document can carry: minor, NUMA ids, link health with
    links down and bonds lost, a fabric with an error and a rack position."""
    base = topology(4)
    fabric = GpuFabric(
        state=FabricState.COMPLETED,
        cluster_uuid="6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31",
        clique=7,
        error=3,
        position=RackPosition(chassis_serial="1821622000007", slot=3, tray=2, host_id=0),
    )
    gpus = tuple(
        replace(
            g,
            minor=g.index,
            gpu_numa=g.index + 2,
            fabric=fabric,
            nvlink=NvlinkHealth(18, (0, 1), ((1, 2),)) if g.index == 0 else NvlinkHealth(18),
        )
        for g in base.gpus
    )
    return replace(base, gpus=gpus)


def document_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The every-field document with the value at `path` replaced and the hash computed again, as
    whoever edits the annotation would."""
    doc = to_document(every_field_topology())
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    assert type(parent[path[-1]]) is int, path  # the table names integers only
    parent[path[-1]] = value(parent[path[-1]])
    _rehash(doc)
    return doc


INTEGER_FIELDS = {
    "gpus[1].index": ("gpus", 1, "index"),
    "gpus[0].minor": ("gpus", 0, "minor"),
    "gpus[0].mem_mib": ("gpus", 0, "mem_mib"),
    "gpus[0].gpu_numa": ("gpus", 0, "gpu_numa"),
    "gpus[0].nvlink.links": ("gpus", 0, "nvlink", "links"),
    "gpus[0].nvlink.down[1]": ("gpus", 0, "nvlink", "down", 1),
    "gpus[0].nvlink.lost[0][0]": ("gpus", 0, "nvlink", "lost", 0, 0),
    "gpus[0].nvlink.lost[0][1]": ("gpus", 0, "nvlink", "lost", 0, 1),
    "gpus[0].fabric.error": ("gpus", 0, "fabric", "error"),
    "gpus[0].fabric.position.slot": ("gpus", 0, "fabric", "position", "slot"),
    "gpus[0].fabric.position.host_id": ("gpus", 0, "fabric", "position", "host_id"),
    "numa_nodes[1].id": ("numa_nodes", 1, "id"),
    "numa_nodes[0].distances[1]": ("numa_nodes", 0, "distances", 1),
}
NOT_WHOLE = {
    "the same value as a float (1.0)": float,
    "negative zero where zero is": lambda v: -0.0 if v == 0 else float(v),
}


@pytest.mark.parametrize("how", sorted(NOT_WHOLE))
@pytest.mark.parametrize("field", sorted(INTEGER_FIELDS))
def test_a_number_that_is_not_a_whole_number_is_a_schema_error_naming_its_field(
    field: str, how: str
) -> None:
    doc = document_with(INTEGER_FIELDS[field], NOT_WHOLE[how])
    with pytest.raises(SchemaError) as caught:
        decode(json.dumps(doc, separators=(",", ":")))
    assert caught.value.field == field
    assert "is not of type 'integer'" in str(caught.value)


def test_the_every_field_document_itself_decodes() -> None:
    # The table above tests the numbers, not a document that was refused for something else.
    assert decode(encode(every_field_topology())) == every_field_topology()


def _int_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if type(node) is int:
        return [prefix]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _int_paths(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for k, v in enumerate(node) for p in _int_paths(v, (*prefix, k))]
    return []


@st.composite
def documents_with_a_float(draw: st.DrawFn) -> dict[str, Any]:
    """A valid v2 document of a random topology with one whole number written as a float."""
    # With a GPU, so that there is a whole number besides `v` (a GPU's index at least).
    doc = to_document(draw(topologies(max_gpus=5).filter(lambda t: bool(t.gpus))))
    path = draw(st.sampled_from([p for p in _int_paths(doc) if p != ("v",)]))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = float(parent[path[-1]])
    _rehash(doc)
    return doc


@fuzz(200)
@given(documents_with_a_float())
def test_any_whole_number_written_as_a_float_is_refused(doc: dict[str, Any]) -> None:
    result = outcome(lambda: from_document(doc), SchemaError)
    assert isinstance(result, SchemaError), "a float where the schema says integer was accepted"


def floats_annotation(t: Topology) -> str:
    """`t` as another tool could rewrite it: every GPU index a float, the hash made to match."""
    doc = to_document(t)
    for gpu in doc["gpus"]:
        gpu["index"] = float(gpu["index"])
    _rehash(doc)
    return json.dumps(doc, separators=(",", ":"))


def test_the_agent_restarted_on_a_node_whose_annotation_another_tool_rewrote_republishes(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    # The annotation decoded, so the agent took it for what it had published; the next scan
    # differed, and the Event text's diff indexed the matrix with 0.0: TypeError, agent gone.
    apiserver.add_node(NODE, annotations={TOPOLOGY_KEY: floats_annotation(topology(4))})
    wired = wire_agent(kubeconfig, FakeScanner([ok(topology(4, nv=12))]))
    assert wired.agent.step()
    assert decode(apiserver.nodes[NODE]["metadata"]["annotations"][TOPOLOGY_KEY]) == topology(
        4, nv=12
    )


def test_kubectl_gpu_topology_and_the_doctor_report_such_an_annotation_as_unreadable(
    apiserver: ApiServerDouble, admin_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.add_node("edited", annotations={TOPOLOGY_KEY: floats_annotation(topology(4))})
    assert plugin_main(["edited", "--kubeconfig", str(admin_kubeconfig)]) == 1
    out = capsys.readouterr().out
    assert "topology-unreadable" in out
    assert re.search(r"gpus\[[0-3]\]\.index: ([0-3])\.0: \1\.0 is not of type 'integer'", out)
    assert main(["doctor", "--kubeconfig", str(admin_kubeconfig), "--all"]) == 1
    assert "topology-unreadable: 1 (edited)" in capsys.readouterr().out


# -- 2. Identities a GPU is found by are unique within a node -----------------------------------


IDENTITIES = {
    "minor": ("minor", lambda i: 0),
    "uuid": ("uuid", lambda i: "GPU-00000000-0000-0000-0000-000000000000"),
    "pci": ("pci", lambda i: "0000:18:00.0"),
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
def test_two_gpus_with_one_identity_are_a_schema_error(name: str) -> None:
    key, value = IDENTITIES[name]
    doc = to_document(every_field_topology())
    for i, gpu in enumerate(doc["gpus"]):
        gpu[key] = value(i)
    _rehash(doc)
    with pytest.raises(SchemaError, match=rf"^gpus\[1\]\.{key}: .* is also GPU0's"):
        from_document(doc)


def test_two_gpus_with_one_mig_device_are_a_schema_error() -> None:
    doc = to_document(every_field_topology())
    for gpu in doc["gpus"][:2]:
        gpu["mig"] = True
        gpu["mig_devices"] = ["MIG-1b2c3d4e-0000-5111-8222-333344445555"]
    _rehash(doc)
    with pytest.raises(SchemaError, match=r"^gpus\[1\]\.mig_devices: .* is also GPU0's"):
        from_document(doc)
