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
and is the same on every node of its kind: product name and PCI bus ID. Where nodes share such a
key but are wired differently, the key cannot say which wiring a device sits in: the wiring of the
most nodes keeps the key, and the GPUs of the others are looked up by UUID (known from each Node's
published topology, or from the ResourceSlices of NVIDIA's driver) and given no clique. So a node
with its NVLinks down costs a few UUIDs, never a clique of its own, and no GPU of a wiring the
template was not made from shares a clique. Offline, where a profile stands for a kind of machine
and not one machine with its own UUIDs, such profiles are refused with the machines named. Every
lookup is guarded (`pciBusID` may be absent; a CEL runtime error fails the pod's whole scheduling
cycle): a GPU not in the map gets the empty list, which the allocator never counts as matching.

A template is a snapshot: a node that joins later, or is rewired, at product and bus IDs the map
holds shares their cliques, and the doctor (reporter.doctor.templates, which reads the map back
with `clique_map`) reports it as an error. The clique search is bounded per topology
(MAX_CLIQUES, MAX_CLIQUE_STEPS): a forged wiring past it leaves its node out, never the reader's
memory.

Pure: topologies in, a template document out; no I/O. The limits are those of `k8s.io/api`
v0.37.2 `resource/v1/types.go`.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from reporter.errors import ConfigError, InputError, PlacementError
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
GATES = ("DRADerivedAttributes", "DRAListTypeAttributes")
"""On kube-apiserver and kube-scheduler, both alpha and off by default in v1.37.2
(pkg/features/kube_features.go); `firstAvailable` (DRAPrioritizedList) is GA and on since 1.36."""

MAX_EXPRESSION_BYTES = 10 * 1024
"""CELSelectorExpressionMaxLength, which DeviceDerivedAttribute.Expression shares."""


class TemplateError(PlacementError):
    """A template that cannot be made: no machine has K connected GPUs, profiles the keys cannot
    tell apart, a map past the API's limits, or a cluster that cannot serve it. The request is
    well formed; the machines cannot meet it (exit 1). The message says which and what to do."""


class CliqueBoundError(InputError):
    """A topology with more maximal NVLink cliques (or more search steps) than any real machine
    has: what one hostile agent publishes to exhaust a reader's memory. Its node is left out."""


@dataclass(frozen=True, slots=True)
class Machine:
    """One kind of machine: a name for messages, the topologies of the nodes of that kind (one
    wiring), and their node names where read from the cluster (else empty)."""

    name: str
    topologies: tuple[Topology, ...]
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU as the allocator's CEL sees it: what NVIDIA's driver publishes of it."""

    uuid: str | None
    product: str | None
    bus: str | None


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A node whose wiring gives the template no clique (`--exclude`, outside `--selector`, an
    annotation that does not decode, past the clique bound, a copier of UUIDs), and its GPUs:
    its topology where known, else the devices its ResourceSlices list."""

    node: str
    topology: Topology | None = None
    devices: tuple[Device, ...] = ()


@dataclass(frozen=True, slots=True)
class Template:
    """The template document and what it took: for the caller's figures and the tests."""

    document: dict[str, Any]
    expression: str
    values: Mapping[str, tuple[str, ...]]
    """Each key the expression knows (`uuid:<UUID>` or `bus:<product>/<pciBusID>`) and its IDs;
    a UUID key always has none: it keeps a GPU of another wiring from the bus key's cliques."""
    keyed_out: tuple[str, ...] = field(default=())
    """Nodes (or machines) whose GPUs are keyed by UUID to no clique: wired otherwise than the
    nodes whose cliques their product and PCI bus IDs carry."""
    covers: tuple[str, ...] = field(default=())
    """The machines whose cliques the map holds."""
    notes: tuple[str, ...] = field(default=())
    """One line each: what was left out, and why (the command prints them as warnings)."""


Key = tuple[str, str, str]
"""("bus", product, PCI bus ID) or ("uuid", UUID, "")."""

MAX_CLIQUES = 1024
"""Maximal cliques one topology may have: a real machine has a handful (16 one-GPU-per-pair
bridges: 8; the hybrid cube mesh: 6), and an expression of 10 KiB holds far fewer IDs."""
MAX_CLIQUE_STEPS = 20_000
"""Calls of the clique search per topology: real wirings take one per clique or so."""


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def adjacency(topology: Topology) -> list[int]:
    """Per GPU, the set of its NVLink peers as a bit mask (lost GPUs as their links say)."""
    n = len(topology.gpus)
    return [
        sum(1 << b for b in range(n) if b != a and topology.link(a, b).is_nvlink) for a in range(n)
    ]


def maximal_cliques(
    topology: Topology, *, limit: int = MAX_CLIQUES, steps: int = MAX_CLIQUE_STEPS
) -> tuple[frozenset[int], ...]:
    """The maximal sets of GPUs (two or more) every two of which share NVLinks, lost GPUs left
    out, in order of their lowest member (Bron-Kerbosch with pivoting, on bit masks).

    Raises CliqueBoundError past `limit` cliques or `steps` calls: a graph of 3^(n/3) maximal
    cliques (Moon and Moser's, which 48 GPUs can be wired as) would otherwise take the reader's
    memory and hours."""
    lost = {g.index for g in topology.gpus if g.lost}
    usable = sum(1 << g.index for g in topology.gpus if not g.lost)
    adjacent = [0 if a in lost else peers & usable for a, peers in enumerate(adjacency(topology))]
    found: list[frozenset[int]] = []
    left = steps

    def past(what: str) -> CliqueBoundError:
        return CliqueBoundError(
            f"its NVLink wiring has more than {what}, which no real machine has "
            "(is its agent's annotation forged?)"
        )

    def extend(clique: int, candidates: int, excluded: int) -> None:
        nonlocal left
        left -= 1
        if left < 0:
            raise past(f"{steps} steps of maximal-clique search")
        if not candidates and not excluded:
            if clique.bit_count() >= 2:
                found.append(frozenset(_bits(clique)))
                if len(found) > limit:
                    raise past(f"{limit} maximal cliques")
            return
        pivot = max(
            _bits(candidates | excluded), key=lambda v: (adjacent[v] & candidates).bit_count()
        )
        for v in _bits(candidates & ~adjacent[pivot]):
            extend(clique | 1 << v, candidates & adjacent[v], excluded & adjacent[v])
            candidates &= ~(1 << v)
            excluded |= 1 << v

    extend(0, usable, 0)
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


def _bus_key(product: str | None, bus: str | None) -> Key | None:
    return None if product is None or bus is None else ("bus", product, bus)


def _bus_keys(topology: Topology) -> list[Key | None]:
    return [_bus_key(g.model, g.pci) for g in topology.gpus]


@dataclass(slots=True)
class _Wiring:
    """One machine's wiring, read once: its nodes, each GPU's bus key, NVLink peers, cliques."""

    machine: Machine
    keys: list[Key | None]
    adjacent: list[int]
    cliques: list[frozenset[Key]]
    """Its maximal cliques of at least the claim's GPUs, as sets of bus keys."""
    largest: int

    @classmethod
    def of(cls, machine: Machine, gpus: int) -> _Wiring:
        topology = machine.topologies[0]
        keys_ = _bus_keys(topology)
        found = maximal_cliques(topology)
        cliques = {
            frozenset(k for i in c if (k := keys_[i]) is not None) for c in found if len(c) >= gpus
        }
        return cls(
            machine,
            keys_,
            adjacency(topology),
            sorted((c for c in cliques if len(c) >= gpus), key=sorted),
            max((len(c) for c in found), default=1),
        )


def _unsound(
    keys_: Sequence[Key | None], adjacent: Sequence[int], ids: Mapping[Key, Sequence[str]], k: int
) -> bool:
    """Whether a node of this wiring has k GPUs sharing an ID that are not all joined: where the
    allocator's `matchAttribute` would hand out unconnected GPUs as connected."""
    return _shares_unjoined(
        [ids.get(key, ()) if key is not None else () for key in keys_], adjacent, k
    )


def _shares_unjoined(ids: Sequence[Sequence[str]], adjacent: Sequence[int], k: int) -> bool:
    holders: dict[str, int] = {}
    for index, cliques in enumerate(ids):
        for clique in cliques:
            holders[clique] = holders.get(clique, 0) | 1 << index
    return any(
        members.bit_count() >= k and any(members & ~(adjacent[i] | 1 << i) for i in _bits(members))
        for members in holders.values()
    )


def gpu_ids(topology: Topology, values: Mapping[Key, Sequence[str]]) -> list[Sequence[str]]:
    """Per GPU, the IDs the expression gives it: its UUID's entry where the map has one, else
    its product and bus ID's, else none."""
    out: list[Sequence[str]] = []
    for gpu in topology.gpus:
        by_uuid = ("uuid", gpu.uuid, "") if gpu.uuid is not None else None
        bus = _bus_key(gpu.model, gpu.pci)
        if by_uuid is not None and by_uuid in values:
            out.append(values[by_uuid])
        else:
            out.append(values.get(bus, ()) if bus is not None else ())
    return out


def misroutes(topology: Topology, values: Mapping[Key, Sequence[str]], k: int) -> bool:
    """Whether claims for k GPUs from a template of this map can get GPUs of this node that are
    not all NVLink-joined: k of them share an ID."""
    return _shares_unjoined(gpu_ids(topology, values), adjacency(topology), k)


def _values(cliques: Sequence[frozenset[Key]]) -> dict[Key, tuple[str, ...]]:
    values: dict[Key, list[str]] = {}
    for n, clique in enumerate(sorted(cliques, key=sorted)):
        for key in clique:
            values.setdefault(key, []).append(_clique_id(n))
    return {k: tuple(v) for k, v in values.items()}


def _clique_id(n: int) -> str:
    """Short IDs (a, b, ..., z, ba, ...): the expression's size is the binding limit."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = letters[n % 26]
    while n >= 26:
        n = n // 26
        out = letters[n % 26] + out
    return out


@dataclass(frozen=True, slots=True)
class Resolution:
    """What `resolve` decided: the map, and who got no clique from it and why."""

    values: dict[Key, tuple[str, ...]]
    covers: tuple[Machine, ...]
    keyed_out: tuple[str, ...]
    notes: tuple[str, ...]


def _node_names(machine: Machine) -> tuple[str, ...]:
    return machine.nodes or (machine.name,) * len(machine.topologies)


def resolve(
    machines: Sequence[Machine],
    gpus: int,
    *,
    uuids_known: bool,
    left_out: Sequence[LeftOut] = (),
) -> Resolution:
    """The map from bus key to clique IDs and the UUIDs kept from it, right on every node.

    Machines are taken most nodes first (then the larger cliques, then the digest); one whose
    cliques would share an ID with GPUs of a machine already taken that are not joined there, or
    the other way round, is wired otherwise at the same keys: it gives no clique, and each GPU of
    its nodes that a bus key of the map would reach is keyed by UUID to none. So a node with its
    NVLinks down costs its GPUs' UUIDs, never a clique of its own. Nodes `left_out` get the same:
    by UUID to none where their wiring (or, unknown, any of their GPUs) meets the map. A GPU that
    must be kept out but has no UUID takes its bus key out of the map (said in the notes).

    Raises ConfigError where `gpus` < 2 (no claim to make connected: bad usage), TemplateError
    where no machine taken has `gpus` connected GPUs, and,
    offline (`uuids_known` False: profiles stand for kinds of machine whose UUIDs differ node by
    node), where profiles share keys but are wired differently or a profile is past the clique
    bound.
    """
    if gpus < 2:
        raise ConfigError(
            f"--gpus {gpus}: one GPU is connected by itself, and fewer is no claim; request one "
            "with a plain claim (deviceClassName gpu.nvidia.com, count 1), or give --gpus 2 or more"
        )
    notes: list[str] = []
    wirings: list[_Wiring] = []
    strangers = list(left_out)
    for machine in machines:
        try:
            wirings.append(_Wiring.of(machine, gpus))
        except CliqueBoundError as e:
            if not uuids_known:
                raise TemplateError(f"profile {machine.name}: {e}: fix the profile") from None
            for node, topology in zip(_node_names(machine), machine.topologies, strict=True):
                notes.append(f"left out: node {node}: {e}")
                strangers.append(LeftOut(node, topology))
    wirings.sort(
        key=lambda w: (
            -len(w.machine.topologies),
            -w.largest,
            wiring_digest(w.machine.topologies[0]),
        )
    )
    taken: list[_Wiring] = []
    others: list[_Wiring] = []
    cliques: list[frozenset[Key]] = []
    for wiring in wirings:
        held = set(cliques)
        new = [c for c in wiring.cliques if c not in held]
        # The machines taken were right under the cliques before: only the new ones can wrong
        # them, and this machine must be right under all.
        if _unsound(wiring.keys, wiring.adjacent, _values([*cliques, *new]), gpus) or any(
            _unsound(t.keys, t.adjacent, _values(new), gpus) for t in taken
        ):
            others.append(wiring)
            continue
        taken.append(wiring)
        cliques += new
    values = _values(cliques)
    if others and not uuids_known:
        clashing = {k for w in others for k in w.keys if k in values}
        sharing = sorted({w.machine.name for w in wirings if clashing & set(w.keys)})
        raise TemplateError(
            f"machines {', '.join(sharing)} have GPUs of the same product at the same PCI bus "
            "IDs but wired differently, so a device's attributes cannot say which wiring it is "
            "in: make one template per wiring, or read the nodes with --kubeconfig, which keeps "
            "the fewer nodes' GPUs out of the cliques by their UUIDs"
        )
    guarded: list[tuple[str, list[Key | None], list[str | None]]] = [
        (node, w.keys, [g.uuid for g in t.gpus])
        for w in others
        for node, t in zip(_node_names(w.machine), w.machine.topologies, strict=True)
    ]
    for stranger in strangers:
        if stranger.topology is not None:
            t = stranger.topology
            if misroutes(t, values, gpus):
                guarded.append((stranger.node, _bus_keys(t), [g.uuid for g in t.gpus]))
        else:
            devices = stranger.devices
            keys_ = [_bus_key(d.product, d.bus) for d in devices]
            guarded.append((stranger.node, keys_, [d.uuid for d in devices]))
    keyed_out: list[str] = []
    dropped: dict[Key, list[str]] = {}
    for node, keys_, uuids in guarded:
        reached = [(key, uuid) for key, uuid in zip(keys_, uuids, strict=True) if key in values]
        if not reached:
            continue
        keyed_out.append(node)
        for key, uuid in reached:
            if uuid is not None:
                values[("uuid", uuid, "")] = ()
            elif key is not None:
                dropped.setdefault(key, []).append(node)
    by_nodes: dict[tuple[str, ...], list[Key]] = {}
    for key, holders in sorted(dropped.items()):
        del values[key]
        by_nodes.setdefault(tuple(sorted(set(holders))), []).append(key)
    for nodes, dropped_keys in by_nodes.items():
        shown = ", ".join(f"{k[1]} at {k[2]}" for k in dropped_keys[:3])
        more = f" and {len(dropped_keys) - 3} more" if len(dropped_keys) > 3 else ""
        notes.append(
            f"no clique on any node for {len(dropped_keys)} GPU product and PCI bus IDs "
            f"({shown}{more}): {', '.join(nodes)} {'is' if len(nodes) == 1 else 'are'} wired "
            "otherwise there and published no GPU UUID to keep apart by"
        )
    if not any(values.get(k) for k in values):
        _refuse(wirings, others, gpus, notes)
    return Resolution(
        values, tuple(w.machine for w in taken), tuple(sorted(set(keyed_out))), tuple(notes)
    )


def _refuse(
    wirings: Sequence[_Wiring], others: Sequence[_Wiring], gpus: int, notes: Sequence[str]
) -> None:
    """Raise the TemplateError of a map without a clique: what stood in the way."""
    largest = max((w.largest for w in wirings), default=1)
    if largest < gpus:
        raise TemplateError(
            f"--gpus {gpus}: no machine given has {gpus} GPUs joined to each other by NVLink "
            f"(the largest such set: {largest}); ask for at most {largest}, or add a machine "
            "that has them"
        )
    connected = sorted(w.machine.name for w in others if w.largest >= gpus)
    why = (
        f"machines {', '.join(connected)} have {gpus} connected GPUs but fewer nodes than "
        "machines of the same GPU products and PCI bus IDs wired otherwise"
        if connected
        else notes[-1]
        if notes
        else "every clique's GPUs were left out"
    )
    raise TemplateError(
        f"--gpus {gpus}: no GPU keeps a clique: {why}; fix the other nodes' NVLinks (or "
        "leave them out with --exclude or --selector), then retry"
    )


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
    left_out: Sequence[LeftOut] = (),
    selection: Sequence[str] = (),
) -> Template:
    """The ResourceClaimTemplate for `gpus` NVLink-connected GPUs on these machines.

    Raises ConfigError and TemplateError as `resolve` does, and TemplateError where the expression
    would pass the API's 10 Ki limit (the apiserver would refuse the template).
    """
    resolution = resolve(machines, gpus, uuids_known=uuids_known, left_out=left_out)
    values = resolution.values
    text = expression(values)
    size = len(text.encode())
    if size > MAX_EXPRESSION_BYTES:
        uuids = sum(k[0] == "uuid" for k in values)
        kept = f" and {uuids} GPU UUIDs of nodes wired otherwise" if uuids else ""
        raise TemplateError(
            f"the clique map for {len(resolution.covers)} kinds of machine{kept} is {size} bytes "
            f"of CEL, past the API's "
            f"{MAX_EXPRESSION_BYTES} for one expression: make one template per group of machine "
            "kinds (fewer --machine profiles, or one --selector per group of nodes), or fix the "
            "nodes wired otherwise"
        )
    attribute = keys.key(prefix, keys.NVLINK_CLIQUE_ATTRIBUTE)
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
    digests = sorted({wiring_digest(m.topologies[0]) for m in resolution.covers})
    metadata: dict[str, Any] = {
        "name": name or f"nvlink-{gpus}-gpus{'-or-any' if fallback else ''}"
    }
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["annotations"] = {
        keys.key(prefix, keys.DRA_TEMPLATE_GATES): ",".join(GATES),
        keys.key(prefix, keys.DRA_TEMPLATE_MACHINES): ",".join(digests),
    }
    if selection:
        metadata["annotations"][keys.key(prefix, keys.DRA_TEMPLATE_SELECTION)] = shlex.join(
            selection
        )
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
        resolution.keyed_out,
        tuple(m.name for m in resolution.covers),
        resolution.notes,
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


SHOWN = 5
"""Nodes the header names; the rest are counted."""


def to_yaml(template: Template) -> str:
    """The template as YAML after a comment naming the gates it needs, the machines whose
    cliques it holds and the nodes kept from them, and what it cannot see."""
    shown = ", ".join(template.keyed_out[:SHOWN])
    if len(template.keyed_out) > SHOWN:
        shown += f" and {len(template.keyed_out) - SHOWN} more"
    kept = (
        f"# No clique, by GPU UUID (wired otherwise at the same PCI bus IDs): {shown}.\n"
        if shown
        else ""
    )
    head = (
        "# NVLink-connected GPUs by a derived attribute (resource.k8s.io/v1, Kubernetes 1.37+).\n"
        f"# Feature gates: {' and '.join(GATES)} (alpha, off by default),\n"
        "# on kube-apiserver and kube-scheduler both.\n"
        f"# Cliques of: {', '.join(template.covers)}.\n"
        f"{kept}"
        "# GPUs of other wirings seen now get no clique. A node that joins later or is\n"
        "# rewired at the same product and PCI bus IDs would share these cliques: the\n"
        "# doctor (topo-reporter doctor --all) reports it; then make the template again.\n"
    )
    return head + yaml.safe_dump(template.document, sort_keys=False, width=1 << 20)


def _string_lists(value: Any) -> dict[str, tuple[str, ...]] | None:
    """A JSON object of lists of strings, else None."""
    if not isinstance(value, dict):
        return None
    out: dict[str, tuple[str, ...]] = {}
    for key, ids in value.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        out[key] = tuple(ids)
    return out


def clique_map(text: Any) -> dict[Key, tuple[str, ...]] | None:
    """The map an expression `expression` wrote holds (what the doctor checks each Node's GPUs
    against); None for any other text, edited or not ours."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_BYTES:
        return None
    head = f"cel.bind(g,device.attributes[{_cel_string(DRIVER_DOMAIN)}],"
    decoder = json.JSONDecoder()
    values: dict[Key, tuple[str, ...]] = {}
    try:
        at = len(head)
        if text.startswith("cel.bind(u,", at):
            uuids, at = decoder.raw_decode(text, at + len("cel.bind(u,"))
            for uuid, ids in (_string_lists(uuids) or {}).items():
                values[("uuid", uuid, "")] = ids
        at = text.index("cel.bind(p,", at) + len("cel.bind(p,")
        products, _ = decoder.raw_decode(text, at)
    except ValueError:
        return None
    for product, buses in products.items() if isinstance(products, dict) else ():
        for bus, ids in (_string_lists(buses) or {}).items():
            values[("bus", product, bus)] = ids
    return values if expression(values) == text else None


# -- what the cluster's ResourceSlices and Nodes say of their GPUs (read by the command) ----------

UUID_ATTRIBUTES = ("uuid", f"{DRIVER_DOMAIN}/uuid")
PRODUCT_ATTRIBUTES = ("productName", f"{DRIVER_DOMAIN}/productName")
BUS_ATTRIBUTE = f"{STANDARD_DOMAIN}/pciBusID"


def _string_attribute(attributes: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        value = _member(attributes, name).get("string")
        if isinstance(value, str):
            return value
    return None


def slice_devices(slices: Sequence[Any]) -> dict[str, list[Device]]:
    """Per node, the GPUs the ResourceSlices of NVIDIA's driver list there (v1 and v1beta2 hold
    a device's attributes at `attributes`, v1beta1 at `basic.attributes`); objects of any other
    shape or driver are passed over."""
    out: dict[str, list[Device]] = {}
    for item in slices:
        spec = _member(item, "spec")
        node, devices = spec.get("nodeName"), spec.get("devices")
        if spec.get("driver") != DRIVER_DOMAIN or not isinstance(node, str):
            continue
        for device in devices if isinstance(devices, list) else ():
            attributes = _member(device, "attributes") or _member(
                _member(device, "basic"), "attributes"
            )
            out.setdefault(node, []).append(
                Device(
                    _string_attribute(attributes, UUID_ATTRIBUTES),
                    _string_attribute(attributes, PRODUCT_ATTRIBUTES),
                    _string_attribute(attributes, (BUS_ATTRIBUTE,)),
                )
            )
    return out


def with_slice_uuids(topology: Topology, devices: Sequence[Device]) -> Topology:
    """The topology with each GPU's UUID as the node's ResourceSlice has it (matched by product
    and PCI bus ID): the one the allocator's CEL reads, whatever the annotation says."""
    by_key = {(d.product, d.bus): d.uuid for d in devices if d.uuid is not None}
    gpus = tuple(replace(g, uuid=by_key.get((g.model, g.pci), g.uuid)) for g in topology.gpus)
    return replace(topology, gpus=gpus)


def copiers(
    nodes: Sequence[tuple[str, Topology]], devices: Mapping[str, Sequence[Device]] | None
) -> tuple[set[str], list[str]]:
    """The nodes that publish another node's GPU UUID, and one line per pair of nodes sharing
    UUIDs. The copier is the one whose own ResourceSlices do not list the UUID while the other's
    do; where the slices (None: unread) do not tell, both are."""
    holders: dict[str, list[str]] = {}
    for name, topology in nodes:
        for uuid in dict.fromkeys(g.uuid for g in topology.gpus if g.uuid is not None):
            holders.setdefault(uuid, []).append(name)
    pairs: dict[tuple[str, ...], set[str]] = {}
    for uuid, names in holders.items():
        if len(names) < 2:
            continue
        listing = [
            n
            for n in names
            if devices is not None and any(d.uuid == uuid for d in devices.get(n, ()))
        ]
        pairs.setdefault(tuple(sorted(names)), set()).update(
            [n for n in names if n not in listing] if len(listing) == 1 else names
        )
    out: set[str] = set()
    lines = []
    for sharing, copying in sorted(pairs.items()):
        out |= copying
        who = (
            f"{', '.join(sorted(copying))} (the GPUs are in the other's ResourceSlice)"
            if len(copying) < len(sharing)
            else "all of them (no ResourceSlice of gpu.nvidia.com tells which holds them)"
        )
        lines.append(f"nodes {', '.join(sharing)} publish the same GPU UUIDs: left out: {who}")
    return out, lines
