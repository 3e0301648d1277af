"""The doctor's report: findings by node as an operator reads them in a terminal, as JSON for
scripts, the summary worst first, and one finding as an Event message.

Pure: it formats findings it is handed, and reads nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from reporter.doctor.model import Finding, Severity

WORKLOAD = "workload "
"""How a finding's subject that is a Workload, not a node, begins (`workload NAMESPACE/NAME`)."""
TEMPLATE = "template "
"""How a finding's subject that is a ResourceClaimTemplate begins (`template NAMESPACE/NAME`)."""
NETWORK = "network "
"""How a finding's subject that is a network tier of the cluster begins (`network tier-N`)."""
KINDS = {WORKLOAD: "workload", TEMPLATE: "template", NETWORK: "network"}
"""Each subject that is not a node, by how it begins: its key in the JSON report."""


def _kind(name: str) -> str | None:
    return next((k for k in KINDS if name.startswith(k)), None)


def _subject(name: str) -> str:
    return name if _kind(name) is not None else f"node {name}"


def _json_subject(name: str) -> dict[str, str]:
    kind = _kind(name)
    return {"node": name} if kind is None else {KINDS[kind]: name.removeprefix(kind)}


def summarize(
    findings_by_node: Mapping[str, list[Finding]],
) -> list[tuple[str, Severity, list[str]]]:
    """Nodes by finding, worst first: (code, severity, nodes), for `doctor --all`; a Workload's
    or a template's finding names it (`workload NAMESPACE/NAME`, `template NAMESPACE/NAME`)
    where a node's names the node."""
    nodes: dict[str, list[str]] = {}
    severity: dict[str, Severity] = {}
    for node, findings in findings_by_node.items():
        for f in findings:
            nodes.setdefault(f.code, []).append(node)
            severity[f.code] = f.severity
    counts = Counter({code: len(n) for code, n in nodes.items()})
    order = sorted(nodes, key=lambda c: (-severity[c], -counts[c], c))
    return [(code, severity[code], sorted(nodes[code])) for code in order]


def report_text(findings_by_node: Mapping[str, list[Finding]], summary: bool) -> str:
    """The report an operator reads in a terminal."""
    out: list[str] = []
    if summary:
        rows = summarize(findings_by_node)
        nodes = [n for n in findings_by_node if _kind(n) is None]
        healthy = [n for n in nodes if not findings_by_node[n]]
        out.append(f"{len(nodes)} nodes, {len(healthy)} without findings")
        out += [
            f"  {sev!s:7} {code}: {len(names)} ({', '.join(names)})" for code, sev, names in rows
        ]
        out.append("")
    for node, findings in findings_by_node.items():
        if not findings:
            if not summary:
                out.append(f"{_subject(node)}: no findings")
            continue
        plural = "s" if len(findings) > 1 else ""
        out.append(f"{_subject(node)}: {len(findings)} finding{plural}")
        for f in findings:
            out.append(f"  {f.severity!s} {f.code}: {f.summary}")
            out += [f"    evidence: {line}" for line in f.evidence]
            out.append(f"    fix: {f.fix}")
    return "\n".join(out) + "\n"


def report_json(findings_by_node: Mapping[str, list[Finding]]) -> str:
    """The same report for scripts: nodes with their findings, and the summary."""
    doc = {
        "nodes": [
            {
                **_json_subject(node),
                "findings": [
                    {
                        "code": f.code,
                        "severity": str(f.severity).lower(),
                        "summary": f.summary,
                        "evidence": list(f.evidence),
                        "fix": f.fix,
                    }
                    for f in findings
                ],
            }
            for node, findings in findings_by_node.items()
        ],
        "summary": [
            {"code": code, "severity": str(sev).lower(), "nodes": nodes}
            for code, sev, nodes in summarize(findings_by_node)
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def worst(findings_by_node: Mapping[str, list[Finding]]) -> Severity | None:
    """The most severe finding of the report, None when there is none."""
    return max((f.severity for fs in findings_by_node.values() for f in fs), default=None)


def event_text(finding: Finding) -> str:
    """A finding as one Event message: what, the evidence, the fix (kept under 1 KiB)."""
    text = f"{finding.summary}. Evidence: {'; '.join(finding.evidence)}. Fix: {finding.fix}"
    return text if len(text) <= 1024 else text[:1021] + "..."


def event_parts(message: str) -> tuple[str, str]:
    """An `event_text` message's summary and evidence (joined by `; `); the whole message and
    no evidence where it is not of that shape."""
    summary, marked, rest = message.partition(". Evidence: ")
    if not marked:
        return message, ""
    evidence, _, _ = rest.partition(". Fix: ")
    return summary, evidence
