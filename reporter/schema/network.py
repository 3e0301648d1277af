"""The network tiers above a node, as label values: tier 0, the group of top-of-rack switches
its compute NICs are cabled to; and as labels, under our keys or Topograph's.

A value must group nodes exactly as the switches do: equal on every node that hears the same set
of switches, different for any other set, whatever the order or the NIC that heard each, and a
valid label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends) however
long or odd the switches' IDs are. So it is not the IDs themselves but a digest of them:
`eth-` and the first 16 hex digits of the SHA-256 of the sorted distinct chassis IDs, one per
line. 64 bits keep two different sets of a site's few thousand switches from colliding
(a chance of about one in 10^12 at 10,000 groups); `eth-` says the tier was read from Ethernet
(LLDP), not from an InfiniBand fabric.

Readers (the extender's gauges, `kubectl gpu-topology --network`, the doctor) take every tier a
Node carries as it comes, `network-tier-<N>` for any N (`network_tiers`), so a tier a new source
writes is counted without a change to them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from reporter.schema import keys

ETHERNET_TIER_PREFIX = "eth-"
TIER_DIGEST_HEX_DIGITS = 16
NETWORK_LABEL_STYLES = ("topo-reporter", "topograph")
"""Whose keys the tiers go under (`--network-label-style`): ours, `<prefix>/network-tier-<N>`,
or NVIDIA Topograph's, `fabric.topograph.run/tier-<N>` (its tier 0 the switch closest to the
node, as ours), for sites whose scheduler configuration already reads those."""


def ethernet_tier_0(chassis_ids: Iterable[str]) -> str:
    """The tier-0 value of a node whose compute NICs hear the switches of these chassis IDs (as
    parsers.lldp writes them: printable, no newline). Raises ValueError for no chassis at all."""
    distinct = sorted(set(chassis_ids))
    if not distinct:
        raise ValueError("tier 0 needs at least one switch's chassis ID")
    digest = hashlib.sha256("\n".join(distinct).encode("utf-8")).hexdigest()
    return ETHERNET_TIER_PREFIX + digest[:TIER_DIGEST_HEX_DIGITS]


NETWORK_TIER_NAME = "network-tier-"
"""What every tier's key name starts with, the tier number following: `network-tier-0` (keys.py
holds each tier's constant) is the closest to the node."""
MAX_TIER_DIGITS = 2


def tier_of_key(full_key: str, prefix: str) -> int | None:
    """The tier a label key `<prefix>/network-tier-<N>` names, N a decimal without a leading 0;
    None for any other key."""
    name = full_key.removeprefix(f"{prefix}/")
    if name == full_key or not name.startswith(NETWORK_TIER_NAME):
        return None
    digits = name.removeprefix(NETWORK_TIER_NAME)
    if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_TIER_DIGITS:
        return None
    if digits != str(int(digits)):
        return None  # `network-tier-01` is not tier 1's key: nothing writes it
    return int(digits)


def network_tiers(labels: Mapping[str, object], prefix: str) -> dict[int, str]:
    """A Node's network groups by tier (`{0: leaf group, 1: spine group}`) from its labels: every
    `<prefix>/network-tier-<N>` with a non-empty value, whichever tiers its agent wrote."""
    head = f"{prefix}/{NETWORK_TIER_NAME}"
    found: dict[int, str] = {}
    for label, value in labels.items():
        # The extender reads every label of every Node on a relist: most fail this at once.
        if not label.startswith(head):
            continue
        tier = tier_of_key(label, prefix)
        if tier is not None and isinstance(value, str) and value:
            found[tier] = value
    return dict(sorted(found.items()))


def tier_labels(tiers: Sequence[str], prefix: str, style: str) -> dict[str, str]:
    """The labels of a node's tier values, closest first, in `style` (one of
    NETWORK_LABEL_STYLES). Raises ValueError for more tiers than there are keys."""
    if len(tiers) > len(keys.NETWORK_TIERS):
        raise ValueError(f"{len(tiers)} tiers, but keys for only {len(keys.NETWORK_TIERS)}")
    if style == "topograph":
        return dict(zip(keys.TOPOGRAPH_TIER_KEYS, tiers, strict=False))
    return {
        keys.key(prefix, name): value
        for name, value in zip(keys.NETWORK_TIERS, tiers, strict=False)
    }
