"""Findings about the ResourceClaimTemplates `topo-reporter dra-template` made: one that would
hand a node's unconnected GPUs out as connected, one that gives a node's GPUs no clique, and one
stored while kube-apiserver had the gate of `derivedAttributes` off.

The templates read are ResourceClaimTemplates (`resource.k8s.io`, every namespace) that carry our
`<prefix>/dra-template-machines` annotation: the wiring digests (reporter.schema.dra_template's
`wiring_digest`) of the machines whose cliques the template's map holds. A template is a snapshot:
the map keys GPUs by product and PCI bus ID, so a node that joined later, or was rewired (its
NVLinks down), at product and bus IDs the map holds gets those cliques, and the allocator's
`matchAttribute` then hands out its GPUs as NVLink-connected whether they are or not. The map is
read back from the expression (`clique_map`) and each Node's published GPUs looked up in it as
the expression looks them up: k GPUs sharing an ID that are not all joined is an error. A node of
another wiring whose GPUs share no ID the claim could use is a warning: its claims never get
connected GPUs. kube-apiserver silently drops an alpha field whose gate is off, so a stored
template whose connected request has no `derivedAttributes` was made while DRADerivedAttributes
was off: no device then carries the attribute its `matchAttribute` constraint names.

Nothing here enumerates cliques past the bound `dra-template` keeps (MAX_CLIQUES): the checks
look IDs up, and a node's largest clique is searched only under that bound.

Pure: it judges the template and Node objects `topo-reporter doctor --all` hands it, and reads
nothing itself. Objects of any shape are passed over, never raised on.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reporter.doctor.model import Code, Finding, Severity, field
from reporter.doctor.report import TEMPLATE
from reporter.errors import InputError
from reporter.schema import dra_template, keys
from reporter.schema.model import Topology
from reporter.schema.node import decode_node, node_name

TEMPLATE_GROUP = "resource.k8s.io"
SHOWN_NODES = 5
"""Nodes named in the evidence, by name; the rest are counted."""
DERIVED_GATE = dra_template.GATES[0]
"""The gate of `derivedAttributes` (the other, DRAListTypeAttributes, drops no stored field)."""


def covered_digests(template: Any, prefix: str) -> tuple[str, ...] | None:
    """The wiring digests a template's `<prefix>/dra-template-machines` annotation lists; None
    where it has no such annotation (not one of ours)."""
    annotations = field(field(template, "metadata"), "annotations")
    value = annotations.get(keys.key(prefix, keys.DRA_TEMPLATE_MACHINES))
    if not isinstance(value, str):
        return None
    return tuple(d.strip() for d in value.split(",") if d.strip())


def _count(request: Mapping[str, Any]) -> int | None:
    count = request.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    return count


@dataclass(frozen=True, slots=True)
class _Node:
    """A GPU Node as the template findings need it: its topology, read once."""

    name: str
    topology: Topology
    digest: str


def _nodes(nodes: Sequence[Any], prefix: str, slices: Sequence[Any] | None) -> list[_Node]:
    """Each Node with a topology that decodes, its GPUs' UUIDs those its ResourceSlices list
    (the ones the expression reads) where they list them. A node whose annotation does not
    decode is left out: its own `topology-unreadable` says so."""
    devices = dra_template.slice_devices(slices or [])
    out = []
    for node in nodes:
        try:
            published = decode_node(node, prefix)
        except InputError:
            continue
        name = node_name(node)
        topology = dra_template.with_slice_uuids(published, devices.get(name, ()))
        out.append(_Node(name, topology, dra_template.wiring_digest(topology)))
    return out


def _largest(topology: Topology) -> int | None:
    """The node's largest NVLink clique; None past the bound dra-template keeps."""
    try:
        return max((len(c) for c in dra_template.maximal_cliques(topology)), default=1)
    except dra_template.CliqueBoundError:
        return None


def dra_template_findings(
    templates: Sequence[Any],
    nodes: Sequence[Any],
    prefix: str,
    slices: Sequence[Any] | None = None,
) -> dict[str, list[Finding]]:
    """Findings by subject (`template NAMESPACE/NAME`): each of our templates stored without its
    `derivedAttributes`, each that would hand out a node's unconnected GPUs as connected, and
    each whose map gives no clique to nodes of another wiring that have connected GPUs (`slices`:
    the cluster's ResourceSlices, whose UUIDs the expression reads; None: the nodes' own).
    Templates that do not read as ours are passed over."""
    if not templates:
        return {}
    read = _nodes(nodes, prefix, slices)
    largest: dict[str, int | None] = {}
    out: dict[str, list[Finding]] = {}
    for template in templates:
        covered = covered_digests(template, prefix)
        found = dra_template.connected_request(template)
        if covered is None or found is None:
            continue
        request, fallback = found
        meta = field(template, "metadata")
        namespace, name = meta.get("namespace", "?"), meta.get("name", "?")
        subject = f"{TEMPLATE}{namespace}/{name}"
        findings: list[Finding] = []
        if not dra_template.keeps_derived_attributes(template):
            findings.append(_gate_off(prefix, fallback))
        count = _count(request)
        if count is not None:
            command = _command(template, count, fallback, prefix)
            values = _clique_map(request)
            misrouted, uncovered, unbounded = [], [], []
            for node in read:
                if len(node.topology.gpus) < count:
                    continue
                if values is None:
                    if node.digest not in covered:
                        misrouted.append(node)
                    continue
                if dra_template.misroutes(node.topology, values, count):
                    misrouted.append(node)
                    continue
                if node.digest in covered or _serves(node.topology, values, count):
                    continue
                if node.digest not in largest:
                    largest[node.digest] = _largest(node.topology)
                size = largest[node.digest]
                if size is None:
                    unbounded.append(node)
                elif size >= count:
                    uncovered.append(node)
            if misrouted:
                findings.append(_misrouted(misrouted, count, covered, values is None, command))
            if uncovered or unbounded:
                findings.append(_uncovered(uncovered, unbounded, count, covered, command))
        if findings:
            out[subject] = findings
    return out


def _clique_map(request: Mapping[str, Any]) -> dict[dra_template.Key, tuple[str, ...]] | None:
    """The map of the request's derived attribute, as dra-template wrote it; empty where it has
    none (the gate off: no device carries an ID); None for an expression not ours."""
    derived = request.get("derivedAttributes")
    if not isinstance(derived, list) or not derived:
        return {}
    first = derived[0]
    return dra_template.clique_map(first.get("expression") if isinstance(first, Mapping) else None)


def _serves(topology: Topology, values: Mapping[dra_template.Key, Sequence[str]], k: int) -> bool:
    """Whether some ID of the map is held by k GPUs of the node (all joined: not misrouted)."""
    held: dict[str, int] = {}
    for ids in dra_template.gpu_ids(topology, values):
        for clique in ids:
            held[clique] = held.get(clique, 0) + 1
    return any(n >= k for n in held.values())


def _command(template: Any, count: int, fallback: bool, prefix: str) -> str:
    """The `dra-template` command line that makes this template again, for the nodes now: its
    count, fallback, device class, names, prefix and the node selection it was made with."""
    meta = field(template, "metadata")
    request = dra_template.connected_request(template)
    device_class = request[0].get("deviceClassName") if request is not None else None
    args = ["--gpus", str(count)]
    if fallback:
        args.append("--fallback")
    if isinstance(device_class, str) and device_class != dra_template.DEFAULT_DEVICE_CLASS:
        args += ["--device-class", device_class]
    for flag, value in (("--name", meta.get("name")), ("--namespace", meta.get("namespace"))):
        if isinstance(value, str):
            args += [flag, value]
    if prefix != keys.DEFAULT_PREFIX:
        args += ["--prefix", prefix]
    args += _selection(
        field(meta, "annotations").get(keys.key(prefix, keys.DRA_TEMPLATE_SELECTION))
    )
    return f"topo-reporter dra-template {shlex.join(args)}"


def _selection(value: Any) -> list[str]:
    """The --selector and --exclude arguments the annotation holds; none where it holds anything
    else (it is read back into a command line the operator runs)."""
    try:
        words = shlex.split(value) if isinstance(value, str) else []
    except ValueError:
        return []
    pairs = list(zip(words[::2], words[1::2], strict=False))
    if len(words) % 2 or any(flag not in ("--selector", "--exclude") for flag, _ in pairs):
        return []
    return words


def _gate_off(prefix: str, fallback: bool) -> Finding:
    attribute = keys.key(prefix, keys.NVLINK_CLIQUE_ATTRIBUTE)
    effect = (
        "so its claims never get connected GPUs, only the fallback's any GPUs"
        if fallback
        else "so every claim from it is unschedulable"
    )
    return Finding(
        code=Code.DRA_TEMPLATE_GATE_OFF,
        severity=Severity.ERROR,
        summary=f"the template's request has no derivedAttributes: kube-apiserver drops them "
        f"while the {DERIVED_GATE} feature gate is off, so no device carries {attribute}, "
        f"which its matchAttribute constraint needs, {effect}",
        evidence=(
            f"annotation {keys.key(prefix, keys.DRA_TEMPLATE_GATES)}: made for "
            f"{', '.join(dra_template.GATES)}",
            "spec.spec.devices.requests: no derivedAttributes",
        ),
        fix=f"turn on {' and '.join(dra_template.GATES)} on kube-apiserver and kube-scheduler, "
        "then apply the template again",
    )


def _named(nodes: Sequence[_Node]) -> str:
    names = sorted(n.name for n in nodes)
    shown = ", ".join(names[:SHOWN_NODES])
    if len(nodes) > SHOWN_NODES:
        shown += f" and {len(nodes) - SHOWN_NODES} more"
    return shown


def _misrouted(
    nodes: Sequence[_Node], count: int, covered: Sequence[str], unread: bool, command: str
) -> Finding:
    plural = len(nodes) > 1
    return Finding(
        code=Code.DRA_TEMPLATE_MISROUTED_NODES,
        severity=Severity.ERROR,
        summary=f"{len(nodes)} node{'s' if plural else ''} of a wiring the template was not made "
        f"from {'have' if plural else 'has'} GPUs at product and PCI bus IDs its clique map holds: "
        f"claims for {count} GPUs from it can get GPUs there that are not NVLink-connected, "
        "handed out as connected",
        evidence=(
            f"nodes: {_named(nodes)}",
            f"their wirings: {', '.join(sorted({n.digest for n in nodes}))}",
            f"the template covers: {', '.join(covered) or 'none'}",
            *(
                ("its expression is not one dra-template writes: every node of another wiring "
                 "is counted",)
                if unread
                else ()
            ),
        ),
        fix=f"make the template again from the nodes now and apply it: `{command}` (a node that "
        "joined later or whose NVLinks went down then gets no clique)",
    )  # fmt: skip


def _uncovered(
    nodes: Sequence[_Node],
    unbounded: Sequence[_Node],
    count: int,
    covered: Sequence[str],
    command: str,
) -> Finding:
    every = [*nodes, *unbounded]
    plural = len(every) > 1
    return Finding(
        code=Code.DRA_TEMPLATE_UNCOVERED_NODES,
        severity=Severity.WARNING,
        summary=f"{len(every)} node{'s' if plural else ''} with {count} or more NVLink-connected "
        f"GPUs {'are' if plural else 'is'} of a wiring the template was not made from, and its "
        f"map gives no {count} of {'their' if plural else 'its'} GPUs a clique: the template's "
        "claims never get GPUs there as NVLink-connected",
        evidence=(
            f"nodes: {_named(every)}",
            f"their wirings: {', '.join(sorted({n.digest for n in every}))}",
            f"the template covers: {', '.join(covered) or 'none'}",
            *(
                (f"past the clique search's bound ({dra_template.MAX_CLIQUES} maximal cliques), "
                 f"which dra-template leaves out: {_named(unbounded)}",)
                if unbounded
                else ()
            ),
        ),
        fix="where their NVLinks are down, bring them back; then make the template again from "
        f"the nodes now and apply it: `{command}`",
    )  # fmt: skip
