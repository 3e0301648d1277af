"""Findings about the network tiers across nodes: NVIDIA Topograph's grouping against ours, tier
by tier, and NVLink domains that do not nest under one tier-0 group.

Two labellings of one fabric must put the same nodes together: Topograph's
`fabric.topograph.run/tier-<N>` and our `<prefix>/network-tier-<N>` number tiers alike (tier 0
the switch closest to the node) but write different values (switch IDs, digests), so they are
compared as partitions, class by class, never value by value. And a scheduler given the levels
`[network-tier-0, nvlink-domain]` (NVLink under the network) assumes each NVLink domain lies in
one tier-0 group, which on NVL72 racks whose trays are cabled across leaf groups it may not.

Pure: it judges Node objects from their labels alone, and reads nothing itself. Each finding is
one per tier, under the subject `network tier-<N>`, its evidence bounded (SHOWN_NODES,
SHOWN_DOMAINS) whatever the cluster's size.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from reporter.doctor.model import Code, Finding, Severity, node_annotations, node_labels
from reporter.doctor.report import NETWORK
from reporter.publish.patch import owned
from reporter.schema import keys
from reporter.schema.network import network_tiers

TOPOGRAPH_TIER = re.compile(re.escape(keys.TOPOGRAPH_TIER_DOMAIN) + r"/tier-(0|[1-9][0-9]?)")
"""Topograph v1.0's tier keys, `fabric.topograph.run/tier-<N>` for any N (it has no maximum
depth): a decimal without a leading 0, as for ours."""
SHOWN_NODES = 5
"""Nodes named in a disagreement's evidence; the rest are counted."""
SHOWN_DOMAINS = 5
"""NVLink domains named in a nesting finding's evidence; the rest are counted."""
SHOWN_GROUPS = 4
"""Tier-0 groups named for one NVLink domain; the rest are counted."""


def network_findings(nodes: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, list[Finding]]:
    """Both checks by subject, for `doctor --all`: `topograph_findings` and `nesting_findings`,
    tier 0's findings together."""
    out = topograph_findings(nodes, prefix)
    for subject, findings in nesting_findings(nodes, prefix).items():
        out[subject] = [*out.get(subject, []), *findings]
    return out


def topograph_tiers(node: Mapping[str, Any]) -> dict[int, str]:
    """The tiers Topograph wrote on a Node (`{0: value, 1: value}`); none where the agent wrote
    them itself (`--network-label-style topograph` lists them in its `owned` annotation): those
    are ours under Topograph's keys, and there is nothing to compare."""
    found: dict[int, str] = {}
    for label, value in node_labels(node).items():
        match = TOPOGRAPH_TIER.fullmatch(label)
        if match is not None and isinstance(value, str) and value:
            found[int(match.group(1))] = value
    return found


def _ours_under_their_keys(node: Mapping[str, Any], prefix: str) -> bool:
    theirs = frozenset(k for k in node_labels(node) if TOPOGRAPH_TIER.fullmatch(k))
    return bool(theirs & owned(node_annotations(node), prefix, theirs))


def disagreeing(ours: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The nodes both map (node name to group) whose group of fellow nodes differs between the
    two, sorted: empty exactly when the two partitions of the nodes both map are equal.

    A node agrees when its group under `ours` and its group under `theirs` are the same set of
    nodes, that is when both groups and their intersection have the same size."""
    common = ours.keys() & theirs.keys()
    size_ours = Counter(ours[n] for n in common)
    size_theirs = Counter(theirs[n] for n in common)
    size_both = Counter((ours[n], theirs[n]) for n in common)
    return sorted(
        n
        for n in common
        if not size_ours[ours[n]] == size_theirs[theirs[n]] == size_both[(ours[n], theirs[n])]
    )


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", "?"))


def topograph_findings(nodes: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, list[Finding]]:
    """`topograph-tiers-disagree` for each tier both Topograph and the agent label nodes with,
    where the two group the nodes both label differently; by subject (`network tier-<N>`).
    Nothing where they agree, where only one side labels, or where Topograph's keys carry our
    own values."""
    ours: dict[int, dict[str, str]] = {}
    theirs: dict[int, dict[str, str]] = {}
    for node in nodes:
        name = _name(node)
        for tier, value in network_tiers(node_labels(node), prefix).items():
            ours.setdefault(tier, {})[name] = value
        if _ours_under_their_keys(node, prefix):
            continue
        for tier, value in topograph_tiers(node).items():
            theirs.setdefault(tier, {})[name] = value
    out: dict[str, list[Finding]] = {}
    for tier in sorted(ours.keys() & theirs.keys()):
        differ = disagreeing(ours[tier], theirs[tier])
        if differ:
            finding = _disagreement(tier, ours[tier], theirs[tier], differ, prefix)
            out[f"{NETWORK}tier-{tier}"] = [finding]
    return out


def _disagreement(
    tier: int,
    ours: Mapping[str, str],
    theirs: Mapping[str, str],
    differ: Sequence[str],
    prefix: str,
) -> Finding:
    common = ours.keys() & theirs.keys()
    size_ours = Counter(ours[n] for n in common)
    size_theirs = Counter(theirs[n] for n in common)
    size_both = Counter((ours[n], theirs[n]) for n in common)
    our_key = keys.key(prefix, f"network-tier-{tier}")
    their_key = f"{keys.TOPOGRAPH_TIER_DOMAIN}/tier-{tier}"
    evidence = [
        f"over the {len(common)} nodes both label: {len(size_ours)} groups of ours, "
        f"{len(size_theirs)} of Topograph's"
    ]
    # The nodes of the rarest pairings first: a node that moved shows before the group it left.
    shown = sorted(differ, key=lambda n: (size_both[(ours[n], theirs[n])], n))[:SHOWN_NODES]
    for n in shown:
        o, t = ours[n], theirs[n]
        evidence.append(
            f"{n}: ours {o} ({size_ours[o]} nodes), Topograph's {t} ({size_theirs[t]} nodes), "
            f"{size_both[(o, t)]} in both"
        )
    if len(differ) > SHOWN_NODES:
        evidence.append(f"{len(differ) - SHOWN_NODES} more nodes")
    return Finding(
        code=Code.TOPOGRAPH_TIERS_DISAGREE,
        severity=Severity.WARNING,
        summary=f"{their_key} and {our_key} group {len(differ)} of {len(common)} nodes "
        "differently: a job kept in one group of either can span two groups of the other",
        evidence=tuple(evidence),
        fix="decide which the schedulers read (each Kueue Topology, Volcano HyperNode or KAI "
        "Topology names one key per level) and find the stale side: ours is read by each node "
        "from its own NICs (`topo-reporter network --infiniband` or `--lldp` on a named node "
        "prints what it sees), Topograph's from its provider (UFM, ibnetdiscover, a cloud API); "
        "a node that moved, or HCAs one side counts and the other not (a storage HCA), make "
        "the usual difference",
    )


def nesting_findings(nodes: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, list[Finding]]:
    """`nvlink-domain-spans-network-groups` where an NVLink domain's nodes carry two or more
    `network-tier-0` values, by subject (`network tier-0`): one finding for the cluster, naming
    SHOWN_DOMAINS domains. Nodes without both labels take no part, and so does a node that is
    its own domain (one node is in one group)."""
    domain_key = keys.key(prefix, keys.NVLINK_DOMAIN)
    groups: dict[str, Counter[str]] = {}
    for node in nodes:
        labels = node_labels(node)
        domain = labels.get(domain_key)
        tier_0 = network_tiers(labels, prefix).get(0)
        if domain and tier_0:
            groups.setdefault(domain, Counter())[tier_0] += 1
    split = sorted((d for d, g in groups.items() if len(g) > 1), key=lambda d: (-len(groups[d]), d))
    if not split:
        return {}
    evidence = [f"{len(split)} of {len(groups)} NVLink domains span two or more tier-0 groups"]
    for domain in split[:SHOWN_DOMAINS]:
        by_size = sorted(groups[domain].items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{g} ({n} nodes)" for g, n in by_size[:SHOWN_GROUPS])
        more = len(by_size) - SHOWN_GROUPS
        evidence.append(f"{domain}: {shown}" + (f" and {more} more groups" if more > 0 else ""))
    if len(split) > SHOWN_DOMAINS:
        evidence.append(f"{len(split) - SHOWN_DOMAINS} more domains")
    tier_0_key = keys.key(prefix, keys.NETWORK_TIER_0)
    return {
        f"{NETWORK}tier-0": [
            Finding(
                code=Code.NVLINK_DOMAIN_SPANS_NETWORK_GROUPS,
                severity=Severity.WARNING,
                summary=f"{len(split)} NVLink domain{'' if len(split) == 1 else 's'} "
                f"({domain_key}) {'does' if len(split) == 1 else 'do'} not nest under one "
                f"{tier_0_key} group: a topology that puts NVLink under the network splits "
                f"{'it' if len(split) == 1 else 'them'}",
                evidence=tuple(evidence),
                fix="give Kueue, Volcano and KAI the network-only level list (the network tiers, "
                f"then kubernetes.io/hostname), and jobs that must share an NVLink domain a "
                f"Topology of their own ({domain_key}, {keys.key(prefix, keys.NVLINK_PARTITION)}, "
                "kubernetes.io/hostname): the list with NVLink under the network holds only "
                "where every domain nests (docs/network.md, Checking it: doctor)",
            )
        ]
    }
