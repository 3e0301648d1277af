"""Schema v2 (v1 still read): the annotation round trip, determinism, what the decoder refuses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings

from parsers.links import SELF, Link, LinkKind
from reporter.errors import SchemaError
from reporter.schema.codec import compact, decode, encode, expand, json_schema, to_document
from reporter.schema.fabric import CONDITIONS
from reporter.schema.model import (
    FabricHealth,
    FabricState,
    Gpu,
    GpuFabric,
    Nic,
    NumaNode,
    NvlinkHealth,
    RackPosition,
    Source,
    Topology,
)
from tests.support.strategies import topologies

NV18 = Link(LinkKind.NV, 18)
SYS = Link(LinkKind.SYS)
PIX = Link(LinkKind.PIX)

EXAMPLE = Topology(
    source=Source.NVML,
    driver="550.54.15",
    gpus=(
        Gpu(
            0,
            "GPU-0a",
            "0000:18:00.0",
            "NVIDIA H100 80GB HBM3",
            frozenset({0}),
            frozenset(range(48)) | frozenset(range(96, 144)),
            81559,
            False,
        ),
        Gpu(
            1,
            "GPU-1b",
            "0000:2a:00.0",
            "NVIDIA H100 80GB HBM3",
            frozenset({1}),
            frozenset(range(48, 96)),
            81559,
            False,
            lost=True,
        ),
    ),
    links=((SELF, NV18), (NV18, SELF)),
    pcie=((SELF, SYS), (SYS, SELF)),
    nics=(Nic("mlx5_0", (PIX, SYS), "0000:1a:00.0", frozenset({0}), (SELF,)),),
    numa_nodes=(NumaNode(0, frozenset(range(48)), (10, 21)), NumaNode(1, frozenset(), (21, 10))),
    nvswitch=True,
)


@settings(max_examples=200, deadline=None)
@given(topologies())
def test_decode_inverts_encode(topology: Topology) -> None:
    assert decode(encode(topology)) == topology


@settings(max_examples=100, deadline=None)
@given(topologies())
def test_every_encoding_validates_against_the_shipped_json_schema(topology: Topology) -> None:
    jsonschema.validate(json.loads(encode(topology)), json_schema())


def test_encoding_is_compact_ordered_and_stable() -> None:
    text = encode(EXAMPLE)
    assert ", " not in text
    assert ": " not in text
    assert "\n" not in text
    assert list(json.loads(text)) == [
        "v",
        "source",
        "driver",
        "nvswitch",
        "gpu_common",
        "gpus",
        "links",
        "pcie",
        "nics",
        "numa_nodes",
        "islands",
        "hash",
    ]
    # The hash is part of the contract: it must not change across runs, machines or versions.
    # It is the expanded document's (each GPU whole), however the annotation writes the GPUs.
    doc = json.loads(text)
    body = json.dumps({k: v for k, v in expand(doc).items() if k != "hash"}, separators=(",", ":"))
    assert doc["hash"] == hashlib.sha256(body.encode()).hexdigest()[:16] == "a506e988c623ba61"
    assert encode(EXAMPLE) == text


def test_hash_covers_the_content() -> None:
    other = Topology(
        source=EXAMPLE.source, driver="550.54.14", gpus=EXAMPLE.gpus, links=EXAMPLE.links
    )
    assert to_document(other)["hash"] != to_document(EXAMPLE)["hash"]


def _doc(**changes: Any) -> str:
    doc = to_document(EXAMPLE)
    for path, value in changes.items():
        target: Any = doc
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if k.isdigit() else target[k]
        last = keys[-1]
        if value is KeyError:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_doc(v=3), "v"),
        (_doc(v="2"), "v"),
        (_doc(source="guess"), "source"),
        (_doc(gpus__0__pci="18:00.0"), "gpus[0].pci"),
        (_doc(gpus__1__uuid=KeyError), "gpus[1].uuid"),
        (_doc(gpus__0__cpus="0-x"), "gpus[0].cpus"),
        (_doc(gpus__0__colour="green"), "gpus[0]"),
        (_doc(links__1="NV18 X NV18"), "links[1]"),
        (_doc(links__0="X NV99"), "links[0]"),
        (_doc(links__0="Y NV18"), "links[0]"),
        (_doc(nics__0__links="PIX"), "nics[0]"),
        (_doc(nics__0__links="NV2 SYS"), "nics[0].links"),
        (_doc(islands=[]), "islands"),
        (_doc(hash="0000000000000000"), "hash"),
        (_doc(gpus__1__index=5), "gpus[1].index"),
        (_doc(numa_nodes__0__distances=[10, 999]), "numa_nodes[0].distances[1]"),
        (_doc(gpus__0__mig_devices=["GPU-0"]), "gpus[0].mig_devices[0]"),
        (_doc(gpus__0__mig_devices=[]), "gpus[0].mig_devices"),
        ("[]", ""),
        ("{", ""),
        ("[" * 100_000 + "]" * 100_000, ""),
        ('{"v":1,"pad":"' + "x" * 300_000 + '"}', ""),
    ],
    ids=[
        "a future schema version",
        "a version that is a string",
        "an unknown source",
        "a PCI address without domain",
        "a missing uuid",
        "a garbage CPU list",
        "an unknown field",
        "a ragged matrix",
        "an NVLink count beyond any hardware",
        "an unknown link token",
        "a NIC row too short",
        "a NIC over NVLink",
        "islands that do not match the links",
        "a hash that does not match",
        "GPU indices out of order",
        "a SLIT distance beyond 255",
        "a MIG device that is not a MIG UUID",
        "an empty MIG device list (absent when there is none)",
        "a JSON array",
        "broken JSON",
        "nesting deep enough to overflow a recursive parser",
        "a document over 256 KiB",
    ],
)
def test_decoder_rejects_with_a_schema_error_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(SchemaError) as info:
        decode(text)
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_decoder_accepts_keys_in_any_order() -> None:
    doc = to_document(EXAMPLE)
    assert decode(json.dumps(dict(reversed(list(doc.items()))))) == EXAMPLE


def _patterns(node: Any) -> list[str]:
    stack, found = [node], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("pattern"), str):
                found.append(item["pattern"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_every_schema_pattern_ends_where_the_string_ends_in_any_regex_dialect() -> None:
    # Python's `$` also matches before a final newline, ECMA-262's does not: `$(?!\n)` is the end
    # in both, so the shipped schema means the same to every validator.
    patterns = _patterns(json_schema())
    assert patterns
    assert all(p.startswith("^") and p.endswith("$(?!\\n)") for p in patterns), patterns


SCHEMA_FIXTURES = Path(__file__).parents[1] / "fixtures" / "schema"
CLUSTER = "6b3f1c2e-9a4d-4e8b-b1c7-2f5e8d9a0c31"


@pytest.mark.parametrize("profile", ["gb200-nvl", "dgx-h100"])
def test_a_v1_document_written_by_a_v1_agent_still_decodes(profile: str) -> None:
    # Written by `topo-reporter collect --simulate <profile>` at commit d028fc7, the last v1 agent.
    text = (SCHEMA_FIXTURES / f"v1-{profile}.json").read_text(encoding="utf-8").strip()
    topology = decode(text)
    assert len(topology.gpus) == {"gb200-nvl": 4, "dgx-h100": 8}[profile]
    assert to_document(topology, version=1)["hash"] == json.loads(text)["hash"]
    assert all(g.minor is None and g.nvlink is None for g in topology.gpus)
    if profile == "gb200-nvl":
        # v1's `clique` is the fabric of an attached GPU: the same partition, nothing more known.
        fabric = topology.gpus[0].fabric
        assert fabric == GpuFabric(FabricState.COMPLETED, CLUSTER, 32766)
        assert topology.gpus[0].clique == f"{CLUSTER}.32766"
    # Read back, it is written as v2 and reads again.
    assert json.loads(encode(topology))["v"] == 2
    assert decode(encode(topology)) == topology


def test_a_v1_document_with_a_clique_that_names_no_cluster_is_refused() -> None:
    doc = json.loads((SCHEMA_FIXTURES / "v1-gb200-nvl.json").read_text(encoding="utf-8"))
    doc["gpus"][0]["clique"] = "not-a-uuid.3"
    with pytest.raises(SchemaError) as info:
        decode(json.dumps(doc))
    assert info.value.field == "gpus[0].clique"


RACK_GPU = Gpu(
    0,
    "GPU-0a",
    "0008:01:00.0",
    "NVIDIA GB200",
    frozenset({0}),
    frozenset(range(72)),
    189471,
    False,
    minor=0,
    fabric=GpuFabric(
        FabricState.COMPLETED,
        CLUSTER,
        32766,
        health=FabricHealth.LIMITED_CAPACITY,
        conditions=("degraded-bandwidth",),
        position=RackPosition("1821622000007", 3, 2, 0),
    ),
    nvlink=NvlinkHealth(18, (16, 17)),
)
RACK = Topology(Source.NVML, (RACK_GPU,), ((SELF,),))


def test_a_v2_gpu_carries_its_minor_fabric_and_nvlink_health() -> None:
    gpu = to_document(RACK)["gpus"][0]
    assert gpu["minor"] == 0
    assert gpu["clique"] == f"{CLUSTER}.32766"
    assert gpu["fabric"] == {
        "state": "completed",
        "cluster_uuid": CLUSTER,
        "clique": 32766,
        "health": "limited-capacity",
        "conditions": ["degraded-bandwidth"],
        "position": {"chassis_serial": "1821622000007", "slot": 3, "tray": 2, "host_id": 0},
    }
    assert gpu["nvlink"] == {"links": 18, "down": [16, 17]}
    assert decode(encode(RACK)) == RACK


def _rack_doc(path: str, value: Any) -> str:
    doc = to_document(RACK)
    target = doc["gpus"][0]
    *parents, last = path.split(".")
    for part in parents:
        target = target[part]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    _rehash(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("clique", f"{CLUSTER}.7", "gpus[0].clique"),
        ("fabric", KeyError, "gpus[0].clique"),
        ("fabric.clique", 2**32 - 1, "gpus[0].fabric.clique"),
        ("fabric.cluster_uuid", CLUSTER.upper(), "gpus[0].fabric.cluster_uuid"),
        ("fabric.state", "done", "gpus[0].fabric.state"),
        ("fabric.conditions", ["on-fire"], "gpus[0].fabric.conditions[0]"),
        ("fabric.position.chassis_serial", "SN\a", "gpus[0].fabric.position.chassis_serial"),
        ("fabric.problems", ["bell \a"], "gpus[0].fabric.problems[0]"),
        ("nvlink.down", [17, 16], "gpus[0].nvlink.down"),
        ("nvlink.down", [18], "gpus[0].nvlink.down"),
        ("nvlink.lost", [[0, 1]], "gpus[0].nvlink.lost"),
        ("nvlink.links", 0, "gpus[0].nvlink.links"),
        ("minor", -1, "gpus[0].minor"),
    ],
    ids=[
        "a clique that is not the fabric's",
        "a clique without the fabric it comes from",
        "the clique 2^32-1, which is no partition",
        "a cluster UUID not in canonical lower case",
        "an unknown fabric state",
        "an unknown fabric condition",
        "a rack serial with a control character",
        "a problem line with a control character",
        "down links out of order",
        "a down link the GPU does not have",
        "a bond lost to the GPU itself",
        "a GPU with zero NVLinks (absent instead)",
        "a negative minor number",
    ],
)
def test_the_v2_decoder_refuses_what_cannot_be_true(path: str, value: Any, field: str) -> None:
    with pytest.raises(SchemaError) as info:
        decode(_rack_doc(path, value))
    assert info.value.field == field


def test_the_schema_names_every_fabric_condition_the_code_knows() -> None:
    fabric = json_schema()["$defs"]["fabric"]["properties"]
    assert fabric["conditions"]["items"]["enum"] == list(CONDITIONS)


def test_the_v1_schema_still_ships_and_is_what_v1_documents_validate_against() -> None:
    assert json_schema(1)["properties"]["v"] == {"const": 1}
    assert json_schema()["properties"]["v"] == {"const": 2}


GOLDEN_A100 = (
    Path(__file__).parents[1] / "fixtures" / "nvidia-smi" / "03-dgx-a100-nv12-mlx5.golden.json"
)


def _rehash(doc: dict[str, Any]) -> None:
    body = {k: v for k, v in expand(doc).items() if k != "hash"}
    canonical = json.dumps(body, separators=(",", ":"), ensure_ascii=True)
    doc["hash"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]


TRAILING_NEWLINE_FIELDS: list[tuple[tuple[str | int, ...], str]] = [
    (("driver",), "550.54.15"),
    (("gpus", 0, "model"), "NVIDIA A100-SXM4-40GB"),
    (("gpus", 0, "uuid"), "GPU-1234"),
    (("gpus", 0, "pci"), "0000:07:00.0"),
    (("gpus", 0, "cpus"), "48-63"),
    (("nics", 0, "name"), "mlx5_0"),
    (("nics", 0, "links"), "PXB PXB SYS SYS SYS SYS SYS SYS"),
    (("links", 0), "X NV12 NV12 NV12 NV12 NV12 NV12 NV12"),
]


@pytest.mark.parametrize(
    ("path", "value"),
    TRAILING_NEWLINE_FIELDS,
    ids=[".".join(map(str, p)) for p, _ in TRAILING_NEWLINE_FIELDS],
)
def test_a_trailing_newline_is_refused_in_every_patterned_field(
    path: tuple[str | int, ...], value: str
) -> None:
    # Expanded, as an earlier v2 agent wrote it: every field in its GPU (gpu_common's below).
    doc = expand(json.loads(GOLDEN_A100.read_text(encoding="utf-8")))
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    _rehash(doc)
    decode(json.dumps(doc))  # the value itself is valid
    target[path[-1]] = value + "\n"
    _rehash(doc)
    with pytest.raises(SchemaError, match=r"does not match"):
        decode(json.dumps(doc))


def test_a_trailing_newline_is_refused_in_gpu_common() -> None:
    doc = json.loads(GOLDEN_A100.read_text(encoding="utf-8"))
    doc["gpu_common"]["model"] = "NVIDIA A100-SXM4-40GB"
    _rehash(doc)
    decode(json.dumps(doc))  # the value itself is valid
    doc["gpu_common"]["model"] += "\n"
    _rehash(doc)
    with pytest.raises(SchemaError, match=r"gpu_common\.model.*does not match"):
        decode(json.dumps(doc))


@settings(max_examples=100, deadline=None)
@given(topologies())
def test_the_annotation_writes_shared_gpu_fields_once_and_expands_to_the_document(
    topology: Topology,
) -> None:
    doc = to_document(topology)
    written = json.loads(encode(topology))
    assert written == compact(doc)
    if "gpu_common" in written:
        assert len(doc["gpus"]) >= 2
        assert all(not set(g) & set(written["gpu_common"]) for g in written["gpus"])
    # Byte for byte: the expanded form is the document, key order included (the hash is its).
    assert json.dumps(expand(written)) == json.dumps(doc)


def test_an_annotation_an_earlier_v2_agent_wrote_each_gpu_whole_still_decodes() -> None:
    earlier = json.dumps(to_document(EXAMPLE), separators=(",", ":"))
    assert "gpu_common" not in earlier
    assert decode(earlier) == EXAMPLE == decode(encode(EXAMPLE))
    assert json.loads(earlier)["hash"] == json.loads(encode(EXAMPLE))["hash"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d["gpus"][1].update(model="other"), r"gpus\[1\]\.model: is also in gpu_common"),
        (lambda d: d["gpus"][0].pop("numa"), r"gpus\[0\]\.numa: is required"),
        (lambda d: d["gpu_common"].update(index=0), r"gpu_common: unknown field"),
        (lambda d: d.update(gpu_common={}), r"gpu_common"),
    ],
    ids=[
        "a GPU that repeats a shared field is refused: which value would hold",
        "a field neither the GPU nor gpu_common has is missing",
        "gpu_common holds only the fields GPUs can share",
        "an empty gpu_common is not ours",
    ],
)
def test_gpu_common_is_checked(change: Any, error: str) -> None:
    doc = json.loads(encode(EXAMPLE))
    change(doc)
    with pytest.raises(SchemaError, match=error):
        decode(json.dumps(doc))
