"""A ResourceClaimTemplate whose claims the DRA allocator can only meet with NVLink-connected GPUs.

NVIDIA's DRA driver publishes each GPU with its `uuid`, `productName` and the standard
`resource.kubernetes.io/pciBusID`, but nothing of its NVLinks, so on its own the kube-scheduler's
allocator hands out whichever GPUs come first. Kubernetes 1.37 lets a request compute a derived
attribute per candidate device with CEL (`derivedAttributes`, gate `DRADerivedAttributes`), and
`matchAttribute` on a list-valued attribute (gate `DRAListTypeAttributes`) keeps a running
intersection over the devices chosen. The template gives each GPU the IDs of the maximal NVLink
cliques (sets of GPUs every two of which share NVLinks) that hold it, so k GPUs share an ID exactly
when they are all joined to each other.

The expression sees one device and no node name, so it looks a GPU up by what the device carries
and is the same on every node of its kind: product name and PCI bus ID. Where machines share such a
key but are wired differently, the key cannot say which wiring a device sits in: those GPUs are
looked up by UUID instead (known from each Node's published topology), or, offline, where a profile
stands for a kind of machine and not one machine with its own UUIDs, the template is refused with
the machines named. Every lookup is guarded (`pciBusID` may be absent; a CEL runtime error fails
the pod's whole scheduling cycle): a GPU not in the map gets the empty list, which the allocator
never counts as matching, so a new machine's GPUs are left to the fallback, not an error.

Pure: topologies in, a template document out; no I/O. The limits are those of `k8s.io/api`
v0.37.2 `resource/v1/types.go`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from reporter.errors import ConfigError
from reporter.schema import keys
from reporter.schema.model import Topology

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"
"""NVIDIA's DeviceClass for whole GPUs, as its chart installs it."""
DRIVER_DOMAIN = "gpu.nvidia.com"
STANDARD_DOMAIN = "resource.kubernetes.io"
REQUEST = "gpus"
CONNECTED = "connected"
ANY = "any"
ATTRIBUTE = "nvlinkClique"
"""The derived attribute's name after our prefix: a domain no DRA driver publishes under, so it
shadows nothing (types.go: a derived name equal to a driver's attribute replaces it)."""
GATES = ("DRADerivedAttributes", "DRAListTypeAttributes")
"""On kube-apiserver and kube-scheduler, both alpha and off by default in v1.37.2
(pkg/features/kube_features.go); `firstAvailable` (DRAPrioritizedList) is GA and on since 1.36."""

MAX_EXPRESSION_BYTES = 10 * 1024
"""CELSelectorExpressionMaxLength, which DeviceDerivedAttribute.Expression shares."""

ANNOTATION_GATES = "dra-template-gates"
ANNOTATION_MACHINES = "dra-template-machines"
"""The wirings the template covers, one digest each: the doctor compares them with the Nodes'."""


class TemplateError(ConfigError):
    """A template that cannot be made: no machine has K connected GPUs, machines the keys cannot
    tell apart, or a map past the API's limits. The message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Machine:
    """One kind of machine: a name for messages, and the topologies of the nodes of that kind."""

    name: str
    topologies: tuple[Topology, ...]


@dataclass(frozen=True, slots=True)
class Template:
    """The template document and what it took: for the caller's figures and the tests."""

    document: dict[str, Any]
    expression: str
    values: Mapping[str, tuple[str, ...]]
    """Each key the expression knows (`uuid:<UUID>` or `bus:<product>/<pciBusID>`) and its IDs."""
    by_uuid: tuple[str, ...] = field(default=())
    """Machines whose GPUs are looked up by UUID, because their keys collide."""


Key = tuple[str, str, str]
"""("bus", product, PCI bus ID) or ("uuid", UUID, "")."""


def maximal_cliques(topology: Topology) -> tuple[frozenset[int], ...]:
    """The maximal sets of GPUs (two or more) every two of which share NVLinks, lost GPUs left
    out, in order of their lowest member (Bron-Kerbosch with pivoting: 16 GPUs are instant)."""
    usable = {g.index for g in topology.gpus if not g.lost}
    adjacent = {a: {b for b in usable if b != a and topology.link(a, b).is_nvlink} for a in usable}
    found: list[frozenset[int]] = []

    def extend(clique: set[int], candidates: set[int], excluded: set[int]) -> None:
        if not candidates and not excluded:
            if len(clique) >= 2:
                found.append(frozenset(clique))
            return
        pivot = max(candidates | excluded, key=lambda v: len(adjacent[v] & candidates))
        for v in sorted(candidates - adjacent[pivot]):
            extend(clique | {v}, candidates & adjacent[v], excluded & adjacent[v])
            candidates = candidates - {v}
            excluded = excluded | {v}

    extend(set(), set(usable), set())
    return tuple(sorted(found, key=sorted))


def wiring_digest(topology: Topology) -> str:
    """12 hex digits naming a wiring: each GPU's product and bus ID, and its NVLink peers."""
    rows = [
        [
            g.model,
            g.pci,
            [b for b in range(len(topology.gpus)) if topology.link(g.index, b).is_nvlink],
        ]
        for g in topology.gpus
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]


def _bus_key(topology: Topology, index: int) -> Key | None:
    gpu = topology.gpus[index]
    if gpu.model is None or gpu.pci is None:
        return None
    return ("bus", gpu.model, gpu.pci)


def _keys(topology: Topology, by_uuid: frozenset[Key]) -> dict[int, Key]:
    """Each GPU's key in the map: its bus key, or its UUID where that bus key collides."""
    out: dict[int, Key] = {}
    for gpu in topology.gpus:
        bus = _bus_key(topology, gpu.index)
        if bus is not None and bus not in by_uuid:
            out[gpu.index] = bus
        elif gpu.uuid is not None:
            out[gpu.index] = ("uuid", gpu.uuid, "")
    return out


def _clique_sets(
    machines: Sequence[Machine], gpus: int, by_uuid: frozenset[Key]
) -> list[frozenset[Key]]:
    """Every machine's maximal cliques that can hold `gpus`, as sets of keys, each once."""
    seen: set[frozenset[Key]] = set()
    for machine in machines:
        for topology in machine.topologies:
            named = _keys(topology, by_uuid)
            for clique in maximal_cliques(topology):
                members = frozenset(named[i] for i in clique if i in named)
                if len(members) >= gpus:
                    seen.add(members)
    return sorted(seen, key=sorted)


def _clique_id(n: int) -> str:
    """Short IDs (a, b, ..., z, ba, ...): the expression's size is the binding limit."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = letters[n % 26]
    while n >= 26:
        n = n // 26
        out = letters[n % 26] + out
    return out


def _values(cliques: Sequence[frozenset[Key]]) -> dict[Key, tuple[str, ...]]:
    values: dict[Key, list[str]] = {}
    for n, clique in enumerate(cliques):
        for key in clique:
            values.setdefault(key, []).append(_clique_id(n))
    return {k: tuple(v) for k, v in values.items()}


def _miswired(
    machines: Sequence[Machine],
    gpus: int,
    values: Mapping[Key, tuple[str, ...]],
    by_uuid: frozenset[Key],
) -> dict[str, set[Key]]:
    """Per machine, the keys that share an ID there with a GPU they have no NVLink to, where a
    claim could take both: what another machine's wiring would hand out wrongly here."""
    wrong: dict[str, set[Key]] = {}
    for machine in machines:
        for topology in machine.topologies:
            named = _keys(topology, by_uuid)
            holders: dict[str, list[int]] = {}
            for index, key in named.items():
                for clique in values.get(key, ()):
                    holders.setdefault(clique, []).append(index)
            for members in holders.values():
                if len(members) < gpus:
                    continue
                for a in members:
                    for b in members:
                        if a < b and not topology.link(a, b).is_nvlink:
                            wrong.setdefault(machine.name, set()).update({named[a], named[b]})
    return wrong


def resolve(
    machines: Sequence[Machine], gpus: int, *, uuids_known: bool
) -> tuple[dict[Key, tuple[str, ...]], frozenset[Key], list[str]]:
    """The map from key to clique IDs that is right on every machine, the bus keys moved to UUID
    lookups, and the machines those keys came from. Raises TemplateError where no machine has
    `gpus` connected GPUs, or keys collide and UUIDs are not known (`uuids_known`: offline
    profiles stand for kinds of machine, whose UUIDs differ node by node)."""
    if gpus < 2:
        raise TemplateError(
            f"--gpus {gpus}: one GPU is connected by itself, and fewer is no claim; request one "
            "with a plain claim (deviceClassName gpu.nvidia.com, count 1), or give --gpus 2 or more"
        )
    by_uuid: frozenset[Key] = frozenset()
    while True:
        cliques = _clique_sets(machines, gpus, by_uuid)
        if not cliques:
            largest = max(
                (len(c) for m in machines for t in m.topologies for c in maximal_cliques(t)),
                default=1,
            )
            raise TemplateError(
                f"--gpus {gpus}: no machine given has {gpus} GPUs joined to each other by NVLink "
                f"(the largest such set: {largest}); ask for at most {largest}, or add a machine "
                "that has them"
            )
        values = _values(cliques)
        wrong = _miswired(machines, gpus, values, by_uuid)
        if not wrong:
            moved = sorted(
                {
                    m.name
                    for m in machines
                    for t in m.topologies
                    if _keys(t, frozenset()) != _keys(t, by_uuid)
                }
            )
            return values, by_uuid, moved
        colliding = {k for keys_ in wrong.values() for k in keys_ if k[0] == "bus"}
        if not colliding:
            # Only UUID keys clash: two nodes publish one UUID, which no lookup can untangle.
            raise TemplateError(
                f"machines {', '.join(sorted(wrong))} publish the same GPU UUIDs with different "
                "wiring: fix their topology annotations (topo-reporter doctor --all), then retry"
            )
        sharing = sorted(
            {
                m.name
                for m in machines
                for t in m.topologies
                if colliding & set(_keys(t, frozenset()).values())
            }
        )
        if not uuids_known:
            raise TemplateError(
                f"machines {', '.join(sharing)} have GPUs of the same product at the same PCI bus "
                "IDs but wired differently, so a device's attributes cannot say which wiring it is "
                "in: make one template per wiring, or read the nodes with --kubeconfig, which keys "
                "those GPUs by UUID"
            )
        missing = sorted(
            {
                m.name
                for m in machines
                for t in m.topologies
                for g in t.gpus
                if g.uuid is None and _bus_key(t, g.index) in colliding
            }
        )
        if missing:
            raise TemplateError(
                f"machines {', '.join(sharing)} share GPU product and PCI bus IDs but are wired "
                f"differently, and {', '.join(missing)} published no GPU UUIDs to tell them apart: "
                "make one template per wiring"
            )
        by_uuid = by_uuid | colliding


def _cel_string(text: str) -> str:
    """A CEL string literal: JSON's escapes are CEL's for every character a product name has."""
    return json.dumps(text, ensure_ascii=True)


def _cel_list(ids: Sequence[str]) -> str:
    return "[" + ",".join(_cel_string(i) for i in ids) + "]"


def expression(values: Mapping[Key, tuple[str, ...]]) -> str:
    """The CEL expression: this device's clique IDs, or [] for a GPU the map does not hold.

    Reads only `device.attributes`, each lookup optional (`.?` and `orValue`) and then tested with
    `in` before it indexes a map: `in` answers false for a key of another type (an int, a list),
    so no device, whatever it carries, makes it fail at run time. No `type()` test: the cost
    estimator prices `type(dyn)` at its ceiling, past the claim's budget.
    """
    by_product: dict[str, dict[str, tuple[str, ...]]] = {}
    by_uuid: dict[str, tuple[str, ...]] = {}
    for (kind, first, second), ids in sorted(values.items()):
        if kind == "bus":
            by_product.setdefault(first, {})[second] = ids
        else:
            by_uuid[first] = ids
    products = (
        "{"
        + ",".join(
            _cel_string(product)
            + ":{"
            + ",".join(f"{_cel_string(bus)}:{_cel_list(ids)}" for bus, ids in sorted(buses.items()))
            + "}"
            for product, buses in sorted(by_product.items())
        )
        + "}"
    )
    by_bus = (
        f"cel.bind(p,{products},"
        f"cel.bind(n,g.?productName.orValue(''),"
        f"cel.bind(b,device.attributes[{_cel_string(STANDARD_DOMAIN)}].?pciBusID.orValue(''),"
        "n in p&&b in p[n]?p[n][b]:[])))"
    )
    if by_uuid:
        uuids = (
            "{"
            + ",".join(f"{_cel_string(u)}:{_cel_list(i)}" for u, i in sorted(by_uuid.items()))
            + "}"
        )
        body = f"cel.bind(u,{uuids},cel.bind(i,g.?uuid.orValue(''),i in u?u[i]:{by_bus}))"
    else:
        body = by_bus
    return f"cel.bind(g,device.attributes[{_cel_string(DRIVER_DOMAIN)}],{body})"


def build(
    machines: Sequence[Machine],
    gpus: int,
    *,
    fallback: bool = False,
    device_class: str = DEFAULT_DEVICE_CLASS,
    name: str | None = None,
    namespace: str | None = None,
    prefix: str = keys.DEFAULT_PREFIX,
    uuids_known: bool = False,
) -> Template:
    """The ResourceClaimTemplate for `gpus` NVLink-connected GPUs on these machines.

    Raises TemplateError as `resolve` does, and where the expression would pass the API's
    10 Ki limit (the apiserver would refuse the template).
    """
    values, _, moved = resolve(machines, gpus, uuids_known=uuids_known)
    text = expression(values)
    size = len(text.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise TemplateError(
            f"the clique map for {len(machines)} kinds of machine is {size} bytes of CEL, past the "
            f"API's {MAX_EXPRESSION_BYTES} for one expression: make one template per group of "
            "machine kinds (fewer --simulate profiles, or fewer nodes' wirings)"
        )
    attribute = keys.key(prefix, ATTRIBUTE)
    exact: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": gpus,
        "derivedAttributes": [{"name": attribute, "expression": text}],
    }
    if fallback:
        request: dict[str, Any] = {
            "name": REQUEST,
            "firstAvailable": [
                {"name": CONNECTED, **exact},
                {
                    "name": ANY,
                    "deviceClassName": device_class,
                    "allocationMode": "ExactCount",
                    "count": gpus,
                },
            ],
        }
        constrained = f"{REQUEST}/{CONNECTED}"
    else:
        request = {"name": REQUEST, "exactly": exact}
        constrained = REQUEST
    digests = sorted({wiring_digest(t) for m in machines for t in m.topologies})
    metadata: dict[str, Any] = {
        "name": name or f"nvlink-{gpus}-gpus{'-or-any' if fallback else ''}"
    }
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["annotations"] = {
        keys.key(prefix, ANNOTATION_GATES): ",".join(GATES),
        keys.key(prefix, ANNOTATION_MACHINES): ",".join(digests),
    }
    document = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {
            "spec": {
                "devices": {
                    "requests": [request],
                    "constraints": [{"requests": [constrained], "matchAttribute": attribute}],
                }
            }
        },
    }
    return Template(
        document,
        text,
        {f"{k[0]}:{k[1]}" + (f"/{k[2]}" if k[2] else ""): v for k, v in values.items()},
        tuple(moved),
    )


def _member(obj: Any, name: str) -> Mapping[str, Any]:
    """`obj[name]` where both are objects, else empty."""
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def connected_request(template: Any) -> tuple[Mapping[str, Any], bool] | None:
    """In a template as stored (any shape), the request that asks for connected GPUs (`exactly`,
    or the `firstAvailable` subrequest named `connected`) and whether it has a fallback; None
    where it has none."""
    devices = _member(_member(_member(template, "spec"), "spec"), "devices")
    requests = devices.get("requests")
    for request in requests if isinstance(requests, list) else ():
        exactly = _member(request, "exactly")
        if exactly:
            return exactly, False
        alternatives = request.get("firstAvailable") if isinstance(request, Mapping) else None
        for sub in alternatives if isinstance(alternatives, list) else ():
            if isinstance(sub, Mapping) and sub.get("name") == CONNECTED:
                return sub, True
    return None


def keeps_derived_attributes(stored: Any) -> bool:
    """Whether a template as the apiserver stored (or would store) it still has the derived
    attribute on its connected request: kube-apiserver drops the alpha field, without a word,
    where DRADerivedAttributes is off. False for any shape but ours."""
    found = connected_request(stored)
    derived = found[0].get("derivedAttributes") if found is not None else None
    return isinstance(derived, list) and bool(derived)


def to_yaml(template: Template, machines: Sequence[Machine]) -> str:
    """The template as YAML after a comment naming the gates it needs and the machines it covers."""
    uuid = ", ".join(template.by_uuid)
    lookup = f"# Keyed by GPU UUID (product and PCI bus IDs collide): {uuid}.\n" if uuid else ""
    head = (
        "# NVLink-connected GPUs by a derived attribute (resource.k8s.io/v1, Kubernetes 1.37+).\n"
        f"# Feature gates: {' and '.join(GATES)} (alpha, off by default),\n"
        "# on kube-apiserver and kube-scheduler both.\n"
        f"# Covers: {', '.join(m.name for m in machines)}; a GPU of another wiring is never\n"
        "# counted as connected.\n"
        f"{lookup}"
    )
    return head + yaml.safe_dump(template.document, sort_keys=False, width=1 << 20)
