"""Schema v2 (and v1, read): the `topology` annotation, encoded and decoded.

Encoding is byte-for-byte deterministic (fixed key order, no spaces, ASCII), so equal topologies
give equal annotations and equal hashes on every machine; it writes v2. Decoding treats its input
as untrusted: bounded in size, validated against the shipped JSON Schema of its version (v1
documents, written by earlier agents, still read), then checked for what a schema cannot say
(square matrices with X on the diagonal, islands, a clique that matches its fabric, link indexes,
GPU identities unique within the node, hash); every rejection is a `SchemaError` naming the field.
It never returns a partly decoded topology.

Two forms of one document. The annotation (`encode`, what `--format annotation` prints) writes
once what every GPU shares (`gpu_common`: on a DGX each GPU's model, memory, MIG mode and NVLink
count), which keeps what we add to a Node under 5 KiB; it is a wire encoding, not a format to
script against. The document (`to_document`; `to_json`, what `--format json` prints, and what
`--format yaml` and the kubectl plugin's `topology` hold) is the expanded form, one object per GPU
with all its fields, the same on every machine. The hash is the expanded form's, so it does not
depend on the encoding; `decode` reads both forms, so either is input to `render` and `best-set`,
and an annotation an earlier v2 agent wrote (expanded) still decodes.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from parsers.cpulist import format_cpulist, parse_cpulist
from parsers.documents import check_document, load_json
from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from parsers.links import Link, parse_link
from reporter.errors import SchemaError
from reporter.schema.keys import SCHEMA_VERSION
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

# The apiserver refuses more than 256 KiB of annotations per object; nothing larger is ours.
MAX_DOCUMENT_BYTES = 256 * 1024
# A v2 document nests 5 levels (gpus[i].nvlink.lost[k][0]); deeper is not ours, and refusing it
# before validation keeps jsonschema (which recurses, and repr()s the instance) far from the
# recursion limit.
MAX_DOCUMENT_DEPTH = 8
READ_VERSIONS = (1, SCHEMA_VERSION)
"""The schema versions `decode` reads; it writes only SCHEMA_VERSION."""
COMMON_GPU_FIELDS = ("model", "numa", "cpus", "mem_mib", "mig", "nvlink")
"""The GPU fields the annotation writes once, in `gpu_common`, where every GPU has one value."""
_GPU_FIELD_ORDER = {
    name: i
    for i, name in enumerate(
        (
            *("index", "uuid", "pci", "model", "numa", "cpus", "mem_mib", "mig", "minor"),
            *("gpu_numa", "clique", "fabric", "nvlink", "mig_devices", "lost"),
        )
    )
}
"""A GPU's fields in the order `to_document` writes them: an expanded GPU is in that order too,
so its canonical JSON (and the hash over it) is the document's."""


def schema_file(version: int = SCHEMA_VERSION) -> str:
    """The name of the JSON Schema file of `version` shipped in the package."""
    return f"topology-v{version}.schema.json"


@cache
def json_schema(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON Schema of `version` (default: the one written), as shipped in the package."""
    name = schema_file(version)
    text = resources.files("reporter.schema").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _whole_number(_: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


# JSON Schema counts 1.0 (and -0.0) as an integer. The encoder writes ints only, and a GPU index of
# 0.0 decoded fine, then crashed whatever indexed a matrix with it (the agent's Event diff, the
# doctor, `kubectl gpu-topology`): here an integer is an int, nothing else.
_STRICT_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _whole_number)
_Validator: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # types-jsonschema leaves extend unannotated
    jsonschema.Draft202012Validator, type_checker=_STRICT_TYPES
)


@cache
def _validator(version: int) -> jsonschema.protocols.Validator:
    return _Validator(json_schema(version))


def _cpulist(cpus: frozenset[int] | None) -> str | None:
    return None if cpus is None else format_cpulist(cpus)


def _row(cells: tuple[Link, ...]) -> str:
    return " ".join(c.token for c in cells)


def to_document(topology: Topology, version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The document as a dict in canonical key order, including its hash.

    `version` 1 is what an agent before v2 wrote for the same topology, without what v1 cannot
    carry (minor numbers, NVLink health, fabric details): the decoder checks v1 hashes with it.
    """
    doc: dict[str, Any] = {
        "v": version,
        "source": topology.source.value,
        "driver": topology.driver,
    }
    if topology.nvswitch:
        doc["nvswitch"] = True
    if not topology.nvlink_observed:
        doc["nvlink_observed"] = False
    doc["gpus"] = [_gpu_document(g, version) for g in topology.gpus]
    doc["links"] = [_row(r) for r in topology.links]
    if topology.pcie is not None:
        doc["pcie"] = [_row(r) for r in topology.pcie]
    doc["nics"] = [_nic_document(n) for n in topology.nics]
    doc["numa_nodes"] = [
        {"id": n.id, "cpus": format_cpulist(n.cpus), "distances": list(n.distances)}
        for n in topology.numa_nodes
    ]
    doc["islands"] = [list(i) for i in topology.islands]
    doc["hash"] = _hash(doc)
    return doc


def _gpu_document(gpu: Gpu, version: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "pci": gpu.pci,
        "model": gpu.model,
        "numa": _cpulist(gpu.numa),
        "cpus": _cpulist(gpu.cpus),
        "mem_mib": gpu.mem_mib,
        "mig": gpu.mig,
    }
    if gpu.minor is not None and version >= 2:
        doc["minor"] = gpu.minor
    if gpu.gpu_numa is not None:
        doc["gpu_numa"] = gpu.gpu_numa
    if gpu.clique is not None:
        doc["clique"] = gpu.clique
    if version >= 2:
        if gpu.fabric is not None:
            doc["fabric"] = _fabric_document(gpu.fabric)
        if gpu.nvlink is not None:
            doc["nvlink"] = _nvlink_document(gpu.nvlink)
    if gpu.mig_devices:
        doc["mig_devices"] = list(gpu.mig_devices)
    if gpu.lost:
        doc["lost"] = True
    return doc


def _fabric_document(fabric: GpuFabric) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "state": fabric.state.value,
        "cluster_uuid": fabric.cluster_uuid,
        "clique": fabric.clique,
    }
    if fabric.error is not None:
        doc["error"] = fabric.error
    if fabric.health is not None:
        doc["health"] = fabric.health.value
    if fabric.conditions:
        doc["conditions"] = list(fabric.conditions)
    if fabric.position is not None:
        p = fabric.position
        doc["position"] = {
            "chassis_serial": p.chassis_serial,
            "slot": p.slot,
            "tray": p.tray,
            "host_id": p.host_id,
        }
    if fabric.problems:
        doc["problems"] = list(fabric.problems)
    return doc


def _nvlink_document(nvlink: NvlinkHealth) -> dict[str, Any]:
    doc: dict[str, Any] = {"links": nvlink.count}
    if nvlink.down:
        doc["down"] = list(nvlink.down)
    if nvlink.lost:
        doc["lost"] = [list(pair) for pair in nvlink.lost]
    return doc


def _nic_document(nic: Nic) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": nic.name,
        "pci": nic.pci,
        "numa": _cpulist(nic.numa),
        "links": _row(nic.links),
    }
    if nic.peers is not None:
        doc["peers"] = _row(nic.peers)
    return doc


def _canonical(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _hash(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "hash"}
    return hashlib.sha256(_canonical(body).encode("ascii")).hexdigest()[:16]


def compact(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` (as `to_document` makes it) with the fields every GPU shares written once, in
    `gpu_common` before `gpus`; unchanged with fewer than two GPUs or nothing shared."""
    gpus: list[dict[str, Any]] = doc["gpus"]
    if len(gpus) < 2:
        return doc
    first = gpus[0]
    common = {
        k: first[k]
        for k in COMMON_GPU_FIELDS
        if k in first and all(k in g and g[k] == first[k] for g in gpus[1:])
    }
    if not common:
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "gpus":
            out["gpu_common"] = common
            out[key] = [{k: v for k, v in g.items() if k not in common} for g in gpus]
        else:
            out[key] = value
    return out


def expand(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` (validated, or our own encoding) with `gpu_common` written into every GPU, each GPU's
    fields in `to_document`'s order. Raises SchemaError for a GPU that repeats a field of
    `gpu_common` (which value would hold?)."""
    common: dict[str, Any] | None = doc.get("gpu_common")
    if common is None:
        return doc
    gpus = []
    for i, gpu in enumerate(doc["gpus"]):
        repeated = next((k for k in COMMON_GPU_FIELDS if k in common and k in gpu), None)
        if repeated is not None:
            raise SchemaError(f"gpus[{i}].{repeated}", "is also in gpu_common")
        whole = {**gpu, **common}
        order = sorted(whole, key=lambda k: _GPU_FIELD_ORDER.get(k, len(_GPU_FIELD_ORDER)))
        gpus.append({k: whole[k] for k in order})
    return {**{k: v for k, v in doc.items() if k != "gpu_common"}, "gpus": gpus}


def encode(topology: Topology) -> str:
    """The `topology` annotation value: compact canonical JSON, one line."""
    return _canonical(compact(to_document(topology)))


def to_json(topology: Topology) -> str:
    """The document, each GPU whole, as canonical JSON on one line: what `--format json` prints."""
    return _canonical(to_document(topology))


def decode(text: str | bytes) -> Topology:
    """Parse and validate an annotation value back into the model.

    Raises SchemaError naming the offending field for anything that is not valid v1 or v2.
    """
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > MAX_DOCUMENT_BYTES:
        raise SchemaError("", f"document is {size} bytes; a topology is at most 256 KiB")
    try:
        doc = load_json(text, max_depth=MAX_DOCUMENT_DEPTH)
    except ParseError as e:
        raise SchemaError("", str(e)) from None
    return from_document(doc)


def check(topology: Topology) -> None:
    """Raise SchemaError (naming the field) when `decode` would refuse what `encode` writes of
    `topology`: what a source observed is checked with this before anyone publishes it."""
    from_document(compact(to_document(topology)))


def from_document(doc: Any) -> Topology:
    """Validate an already-parsed v1 or v2 document and build the model. Raises SchemaError."""
    if not isinstance(doc, dict):
        raise SchemaError("", f"expected a JSON object, got {type(doc).__name__}")
    try:
        # Before validation: jsonschema's messages repr() the instance, recursively.
        check_document(doc, max_depth=MAX_DOCUMENT_DEPTH)
    except ParseError as e:
        raise SchemaError("", str(e)) from None
    version = doc.get("v", SCHEMA_VERSION)
    if type(version) is not int or version not in READ_VERSIONS:
        raise SchemaError(
            "v", f"schema version {excerpt(doc['v'])} is not supported (this reads v1 and v2)"
        )
    _validate(doc, version)
    if "gpu_common" in doc:
        doc = expand(doc)
        _check_whole(doc["gpus"], version)
    _check_identities(doc["gpus"])
    try:
        topology = Topology(
            source=Source(doc["source"]),
            driver=doc["driver"],
            gpus=tuple(_gpu(g, i, len(doc["gpus"]), version) for i, g in enumerate(doc["gpus"])),
            links=_matrix(doc["links"], "links"),
            pcie=_matrix(doc["pcie"], "pcie") if "pcie" in doc else None,
            nics=tuple(_nic(n, k) for k, n in enumerate(doc["nics"])),
            numa_nodes=tuple(_numa_node(n, k) for k, n in enumerate(doc["numa_nodes"])),
            nvswitch=doc.get("nvswitch", False),
            nvlink_observed=doc.get("nvlink_observed", True),
        )
    except SchemaError:
        raise
    except ValueError as e:
        # The model names the offending field first ("links[2] has 7 cells for 8 GPUs").
        field = re.match(r"(?:links|pcie|nics)(?:\[\d+\])*(?:\.peers(?:\[\d+\])?)?", str(e))
        raise SchemaError(field.group(0) if field else "gpus", str(e)) from None
    if [list(i) for i in topology.islands] != doc["islands"]:
        raise SchemaError(
            "islands",
            f"{doc['islands']} does not match the NVLink islands of `links` "
            f"({[list(i) for i in topology.islands]})",
        )
    expected = _hash(to_document(topology, version))
    if doc["hash"] != expected:
        raise SchemaError(
            "hash",
            f"{doc['hash']} does not match the content ({expected}): the document was edited or "
            "is not in canonical form",
        )
    return topology


def _validate(doc: dict[str, Any], version: int) -> None:
    """Raise SchemaError, naming the field, where `doc` breaks the JSON Schema of `version`."""
    error = jsonschema.exceptions.best_match(_validator(version).iter_errors(doc))
    if error is not None:
        path = _path(error.absolute_path)
        if error.validator == "required":
            missing = next(k for k in error.validator_value if k not in error.instance)
            raise SchemaError(f"{path}.{missing}" if path else missing, "is required")
        raise SchemaError(path, _schema_message(error))


def _check_whole(gpus: list[dict[str, Any]], version: int) -> None:
    """Raise SchemaError, naming the field, where a GPU expanded from `gpu_common` lacks a field
    the schema requires of every GPU of a document without it. Only presence is left to check:
    gpu_common's values were validated against the same definitions as a GPU's own."""
    required: list[str] = json_schema(version)["then"]["properties"]["gpus"]["items"]["required"]
    for i, gpu in enumerate(gpus):
        missing = next((k for k in required if k not in gpu), None)
        if missing is not None:
            raise SchemaError(f"gpus[{i}].{missing}", "is required")


_IDENTITIES = ("uuid", "pci", "minor", "mig_devices")
"""What devices are matched to a GPU by (device plugin IDs, NVIDIA's DRA device `gpu-<minor>`,
NVLink far ends): two GPUs with one of them would have another's claims counted on the wrong GPU."""


def _check_identities(gpus: list[dict[str, Any]]) -> None:
    """Raise SchemaError when two GPUs share a UUID, PCI address, minor number or MIG device."""
    owner: dict[tuple[str, Any], int] = {}
    for i, gpu in enumerate(gpus):
        for key in _IDENTITIES:
            value = gpu.get(key)
            for one in value if isinstance(value, list) else (value,):
                if one is None:
                    continue
                first = owner.setdefault((key, one), i)
                if first != i:
                    raise SchemaError(f"gpus[{i}].{key}", f"{excerpt(one)} is also GPU{first}'s")


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return f"unknown field ({error.message})"
    message = error.message if len(error.message) < 160 else f"{error.validator} failed"
    return f"{excerpt(error.instance)}: {message}"


def _cells(row: str, field: str) -> tuple[Link, ...]:
    if not row:
        return ()
    try:
        return tuple(parse_link(t) for t in row.split(" "))
    except ParseError as e:
        raise SchemaError(field, e.reason) from None


def _matrix(rows: list[str], field: str) -> tuple[tuple[Link, ...], ...]:
    return tuple(_cells(r, f"{field}[{i}]") for i, r in enumerate(rows))


def _set(value: str | None, field: str) -> frozenset[int] | None:
    if value is None:
        return None
    try:
        return parse_cpulist(value, field=field)
    except ParseError as e:
        raise SchemaError(field, e.reason) from None


_CLIQUE = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.(0|[1-9][0-9]{0,9})"
)


def _v1_fabric(clique: str | None, field: str) -> GpuFabric | None:
    """A v1 `clique` (`<clusterUuid>.<cliqueId>`, written only for attached GPUs) as a fabric."""
    if clique is None:
        return None
    match = _CLIQUE.fullmatch(clique)
    # The pattern admits only short ASCII digit runs: parse_decimal cannot refuse them.
    clique_id = None if match is None else parse_decimal(match.group(2), field=field)
    if match is None or clique_id is None or clique_id >= 2**32 - 1:
        raise SchemaError(field, f"{excerpt(clique)} is not <cluster UUID>.<clique ID>")
    return GpuFabric(state=FabricState.COMPLETED, cluster_uuid=match.group(1), clique=clique_id)


def _fabric(doc: dict[str, Any]) -> GpuFabric:
    position = doc.get("position")
    return GpuFabric(
        state=FabricState(doc["state"]),
        cluster_uuid=doc["cluster_uuid"],
        clique=doc["clique"],
        error=doc.get("error"),
        health=FabricHealth(doc["health"]) if "health" in doc else None,
        conditions=tuple(doc.get("conditions", ())),
        position=None
        if position is None
        else RackPosition(
            chassis_serial=position["chassis_serial"],
            slot=position["slot"],
            tray=position["tray"],
            host_id=position["host_id"],
        ),
        problems=tuple(doc.get("problems", ())),
    )


def _nvlink(doc: dict[str, Any] | None, field: str, index: int, n_gpus: int) -> NvlinkHealth | None:
    if doc is None:
        return None
    count, down = doc["links"], doc.get("down", [])
    if down != sorted(down) or any(link >= count for link in down):
        raise SchemaError(f"{field}.down", f"{excerpt(down)}: ascending link indexes below {count}")
    lost = tuple((peer, links) for peer, links in doc.get("lost", ()))
    for peer, _ in lost:
        if peer >= n_gpus or peer == index:
            raise SchemaError(f"{field}.lost", f"GPU{peer} is not another GPU of this node")
    return NvlinkHealth(count=count, down=tuple(down), lost=lost)


def _gpu(doc: dict[str, Any], i: int, n_gpus: int, version: int) -> Gpu:
    if doc["index"] != i:
        raise SchemaError(f"gpus[{i}].index", f"{doc['index']} out of order: expected {i}")
    clique = doc.get("clique")
    fabric: GpuFabric | None
    if "fabric" in doc:
        fabric = _fabric(doc["fabric"])
        if clique != fabric.clique_id:
            raise SchemaError(
                f"gpus[{i}].clique",
                f"{excerpt(clique)} does not match the GPU's fabric ({excerpt(fabric.clique_id)})",
            )
    elif version == 1:
        fabric = _v1_fabric(clique, f"gpus[{i}].clique")
    elif clique is not None:
        raise SchemaError(f"gpus[{i}].clique", "present without the GPU's fabric")
    else:
        fabric = None
    return Gpu(
        index=doc["index"],
        uuid=doc["uuid"],
        pci=doc["pci"],
        model=doc["model"],
        numa=_set(doc["numa"], f"gpus[{i}].numa"),
        cpus=_set(doc["cpus"], f"gpus[{i}].cpus"),
        mem_mib=doc["mem_mib"],
        mig=doc["mig"],
        gpu_numa=doc.get("gpu_numa"),
        mig_devices=tuple(doc.get("mig_devices", ())),
        lost=doc.get("lost", False),
        minor=doc.get("minor"),
        fabric=fabric,
        nvlink=_nvlink(doc.get("nvlink"), f"gpus[{i}].nvlink", i, n_gpus),
    )


def _nic(doc: dict[str, Any], k: int) -> Nic:
    return Nic(
        name=doc["name"],
        links=_cells(doc["links"], f"nics[{k}].links"),
        pci=doc["pci"],
        numa=_set(doc["numa"], f"nics[{k}].numa"),
        peers=_cells(doc["peers"], f"nics[{k}].peers") if "peers" in doc else None,
    )


def _numa_node(doc: dict[str, Any], k: int) -> NumaNode:
    cpus = _set(doc["cpus"], f"numa_nodes[{k}].cpus")
    return NumaNode(id=doc["id"], cpus=cpus or frozenset(), distances=tuple(doc["distances"]))
