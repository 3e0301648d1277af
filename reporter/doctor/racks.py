"""Findings across nodes and racks: partitions short of a tray, clique IDs shared between
NVLink domains, and one node's partition label that disagrees with GPU Feature Discovery's.

Pure: it judges Node objects (dicts, as the API serves them) from their labels alone, and reads
nothing itself: `topo-reporter doctor --all` hands it every GPU Node it listed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from parsers.cpulist import format_cpulist
from reporter.doctor.model import (
    FABRIC_CHECK,
    GFD_CLIQUE_LABEL,
    Code,
    Finding,
    Severity,
    node_labels,
)
from reporter.schema import keys


def partition_label_mismatch(labels: Mapping[str, str], prefix: str) -> list[Finding]:
    """One node's partition label against GPU Feature Discovery's clique label beside it: a
    scheduler grouping by either must see the same partitions."""
    ours = labels.get(keys.key(prefix, keys.NVLINK_PARTITION))
    theirs = labels.get(GFD_CLIQUE_LABEL)
    if ours is None or theirs is None or ours == theirs:
        return []
    return [
        Finding(
            code=Code.PARTITION_LABEL_MISMATCH,
            severity=Severity.ERROR,
            summary=f"{prefix}/{keys.NVLINK_PARTITION} and {GFD_CLIQUE_LABEL} name different "
            "NVLink partitions: a scheduler keyed on either can split a job across partitions",
            evidence=(
                f"{prefix}/{keys.NVLINK_PARTITION}={ours}",
                f"{GFD_CLIQUE_LABEL}={theirs}",
            ),
            fix="one of the two is stale (GPU Feature Discovery relabels on its own interval, "
            f"the agent each scan): compare {FABRIC_CHECK}, then restart the one that is wrong",
        )
    ]


def fabric_cluster_findings(
    nodes: Sequence[Mapping[str, Any]], prefix: str
) -> dict[str, list[Finding]]:
    """Cluster-wide NVLink fabric findings, by node name, from the Nodes' labels alone:
    - `partition-short`: a partition with fewer nodes than its peers, the partitions of domains
      split the same way (a tray missing from a rack, or its node not publishing);
    - `clique-id-shared`: one clique ID under two or more cluster UUIDs (not wrong: clique IDs
      are per rack; wrong is keying on the ID alone).
    Nodes that are their own domain (no multi-node fabric) take no part."""
    domain_key = keys.key(prefix, keys.NVLINK_DOMAIN)
    partition_key = keys.key(prefix, keys.NVLINK_PARTITION)
    tray_key = keys.key(prefix, keys.RACK_TRAY)
    members: dict[str, list[str]] = {}
    domain_of: dict[str, str] = {}
    trays: dict[str, list[int]] = {}
    for node in nodes:
        labels = node_labels(node)
        domain, partition = labels.get(domain_key), labels.get(partition_key)
        if domain is None or partition is None or not partition.startswith(domain + "."):
            continue
        name = str((node.get("metadata") or {}).get("name", "?"))
        members.setdefault(partition, []).append(name)
        domain_of[partition] = domain
        tray = labels.get(tray_key, "")
        if tray.isdigit():
            trays.setdefault(partition, []).append(int(tray))
    out: dict[str, list[Finding]] = {}
    for partition, finding in _short_partitions(members, domain_of, trays, prefix):
        for name in members[partition]:
            out.setdefault(name, []).append(finding)
    for partitions, finding in _shared_cliques(members, domain_of, prefix):
        for partition in partitions:
            for name in members[partition]:
                out.setdefault(name, []).append(finding)
    return out


def _short_partitions(
    members: Mapping[str, list[str]],
    domain_of: Mapping[str, str],
    trays: Mapping[str, list[int]],
    prefix: str,
) -> list[tuple[str, Finding]]:
    split: Counter[str] = Counter(domain_of.values())
    classes: dict[int, list[str]] = {}
    for partition, domain in domain_of.items():
        classes.setdefault(split[domain], []).append(partition)
    out: list[tuple[str, Finding]] = []
    for parts, partitions in sorted(classes.items()):
        if len(partitions) < 2:
            continue
        sizes = Counter(len(members[p]) for p in partitions)
        # The size most partitions of this split have; a tie goes to the larger.
        usual = max(sizes, key=lambda size: (sizes[size], size))
        peers = f"{sizes[usual]} partitions" + ("" if parts == 1 else f" of racks split in {parts}")
        for partition in sorted(partitions):
            count = len(members[partition])
            if count >= usual:
                continue
            evidence = [f"{partition}: {count} nodes", f"its peers ({peers}): {usual} nodes"]
            present = sorted(set(trays.get(partition, ())))
            if present:
                gaps = sorted(set(range(present[0], present[-1] + 1)) - set(present))
                evidence.append(
                    f"trays present: {format_cpulist(present)}"
                    + (f"; missing between them: {format_cpulist(gaps)}" if gaps else "")
                )
            out.append(
                (
                    partition,
                    Finding(
                        code=Code.PARTITION_SHORT,
                        severity=Severity.WARNING,
                        summary=f"NVLink partition {partition} has {count} nodes where its "
                        f"peers have {usual}: a job sized for a full partition waits",
                        evidence=tuple(evidence),
                        fix="a compute tray is missing from the rack, or its node has not "
                        "joined or not published: list the partition's nodes (`kubectl get "
                        f"nodes -l {keys.key(prefix, keys.NVLINK_PARTITION)}={partition}`), "
                        "check the missing tray's node, its topo-reporter pod and its fabric "
                        f"({FABRIC_CHECK})",
                    ),
                )
            )
    return out


def _shared_cliques(
    members: Mapping[str, list[str]], domain_of: Mapping[str, str], prefix: str
) -> list[tuple[list[str], Finding]]:
    by_clique: dict[str, list[str]] = {}
    for partition, domain in domain_of.items():
        by_clique.setdefault(partition[len(domain) + 1 :], []).append(partition)
    out: list[tuple[list[str], Finding]] = []
    for clique, partitions in sorted(by_clique.items()):
        if len(partitions) < 2:
            continue
        partitions.sort()
        out.append(
            (
                partitions,
                Finding(
                    code=Code.CLIQUE_ID_SHARED,
                    severity=Severity.INFO,
                    summary=f"clique ID {clique} names partitions of {len(partitions)} "
                    "different NVLink domains: never select or group nodes by the clique ID "
                    "alone",
                    evidence=tuple(
                        f"domain {domain_of[p]}: {len(members[p])} nodes" for p in partitions
                    ),
                    fix="nothing to repair: clique IDs are assigned per rack. Group by "
                    f"{keys.key(prefix, keys.NVLINK_PARTITION)} (or {GFD_CLIQUE_LABEL}), which "
                    "include the cluster UUID; a job split across these racks has no NVLink "
                    "between them",
                ),
            )
        )
    return out
