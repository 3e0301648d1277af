"""Findings about the ResourceClaimTemplates `topo-reporter dra-template` made: one that no longer
covers the cluster's machines, and one stored while kube-apiserver had the gate of
`derivedAttributes` off.

The templates read are ResourceClaimTemplates (`resource.k8s.io`, every namespace) that carry our
`<prefix>/dra-template-machines` annotation: the wiring digests (reporter.schema.dra_template's
`wiring_digest`) of the machines the template's clique map was made for. A GPU of any other wiring
gets no clique ID, so the template never hands it out as connected: each GPU Node whose published
topology has another digest, and at least the template's count of GPUs, is a node it should cover
and does not. kube-apiserver silently drops an alpha field whose gate is off, so a stored template
whose connected request has no `derivedAttributes` was made while DRADerivedAttributes was off:
no device then carries the attribute its `matchAttribute` constraint names.

Pure: it judges the template and Node objects `topo-reporter doctor --all` hands it, and reads
nothing itself. Objects of any shape are passed over, never raised on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reporter.doctor.model import Finding, Severity, field
from reporter.doctor.report import TEMPLATE
from reporter.errors import InputError
from reporter.schema import dra_template, keys
from reporter.schema.node import decode_node, node_name

TEMPLATE_GROUP = "resource.k8s.io"
UNCOVERED = "dra-template-uncovered-nodes"
GATE_OFF = "dra-template-gate-off"
SHOWN_NODES = 5
"""Nodes named in the evidence, by name; the rest are counted."""
DERIVED_GATE = dra_template.GATES[0]
"""The gate of `derivedAttributes` (the other, DRAListTypeAttributes, drops no stored field)."""


def covered_digests(template: Any, prefix: str) -> tuple[str, ...] | None:
    """The wiring digests a template's `<prefix>/dra-template-machines` annotation lists; None
    where it has no such annotation (not one of ours)."""
    annotations = field(field(template, "metadata"), "annotations")
    value = annotations.get(keys.key(prefix, dra_template.ANNOTATION_MACHINES))
    if not isinstance(value, str):
        return None
    return tuple(d.strip() for d in value.split(",") if d.strip())


def _count(request: Mapping[str, Any]) -> int | None:
    count = request.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    return count


def _digests(nodes: Sequence[Any], prefix: str) -> dict[str, tuple[str, int]]:
    """Each Node with a topology that decodes: its wiring digest and number of GPUs. A node whose
    annotation does not decode is left out: its own `topology-unreadable` says so."""
    out: dict[str, tuple[str, int]] = {}
    for node in nodes:
        try:
            topology = decode_node(node, prefix)
        except InputError:
            continue
        out[node_name(node)] = (dra_template.wiring_digest(topology), len(topology.gpus))
    return out


def dra_template_findings(
    templates: Sequence[Any], nodes: Sequence[Any], prefix: str
) -> dict[str, list[Finding]]:
    """Findings by subject (`template NAMESPACE/NAME`): each of our templates stored without its
    `derivedAttributes`, and each that does not cover the wiring of GPU nodes big enough for its
    claims. Templates that do not read as ours are passed over."""
    if not templates:
        return {}
    wirings = _digests(nodes, prefix)
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
            uncovered = sorted(
                n
                for n, (digest, gpus) in wirings.items()
                if gpus >= count and digest not in covered
            )
            if uncovered:
                command = _command(count, fallback, namespace, name, prefix)
                findings.append(_uncovered(uncovered, count, covered, wirings, command))
        if findings:
            out[subject] = findings
    return out


def _command(count: int, fallback: bool, namespace: Any, name: Any, prefix: str) -> str:
    """The `dra-template` command line that makes this template again, for the nodes now."""
    args = [f"--gpus {count}"]
    if fallback:
        args.append("--fallback")
    if isinstance(name, str):
        args.append(f"--name {name}")
    if isinstance(namespace, str):
        args.append(f"--namespace {namespace}")
    if prefix != keys.DEFAULT_PREFIX:
        args.append(f"--prefix {prefix}")
    return f"topo-reporter dra-template {' '.join(args)}"


def _gate_off(prefix: str, fallback: bool) -> Finding:
    attribute = keys.key(prefix, dra_template.ATTRIBUTE)
    effect = (
        "so its claims never get connected GPUs, only the fallback's any GPUs"
        if fallback
        else "so every claim from it is unschedulable"
    )
    return Finding(
        code=GATE_OFF,
        severity=Severity.ERROR,
        summary=f"the template's request has no derivedAttributes: kube-apiserver drops them "
        f"while the {DERIVED_GATE} feature gate is off, so no device carries {attribute}, "
        f"which its matchAttribute constraint needs, {effect}",
        evidence=(
            f"annotation {keys.key(prefix, dra_template.ANNOTATION_GATES)}: made for "
            f"{', '.join(dra_template.GATES)}",
            "spec.spec.devices.requests: no derivedAttributes",
        ),
        fix=f"turn on {' and '.join(dra_template.GATES)} on kube-apiserver and kube-scheduler, "
        "then apply the template again",
    )


def _uncovered(
    nodes: Sequence[str],
    count: int,
    covered: Sequence[str],
    wirings: Mapping[str, tuple[str, int]],
    command: str,
) -> Finding:
    shown = ", ".join(nodes[:SHOWN_NODES])
    if len(nodes) > SHOWN_NODES:
        shown += f" and {len(nodes) - SHOWN_NODES} more"
    digests = sorted({wirings[n][0] for n in nodes})
    plural = "s" if len(nodes) > 1 else ""
    return Finding(
        code=UNCOVERED,
        severity=Severity.WARNING,
        summary=f"{len(nodes)} node{plural} with {count} or more GPUs {'are' if plural else 'is'} "
        "of a wiring the template was not made for: its claims never get their GPUs as "
        "NVLink-connected",
        evidence=(
            f"nodes: {shown}",
            f"their wirings: {', '.join(digests)}",
            f"the template covers: {', '.join(covered) or 'none'}",
        ),
        fix=f"run `{command}` again and apply it",
    )
