"""The network tiers above a node, as label values: tier 0, the group of top-of-rack switches
its compute NICs are cabled to.

A value must group nodes exactly as the switches do: equal on every node that hears the same set
of switches, different for any other set, whatever the order or the NIC that heard each, and a
valid label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends) however
long or odd the switches' IDs are. So it is not the IDs themselves but a digest of them:
`eth-` and the first 16 hex digits of the SHA-256 of the sorted distinct chassis IDs, one per
line. 64 bits keep two different sets of a site's few thousand switches from colliding
(a chance of about one in 10^12 at 10,000 groups); `eth-` says the tier was read from Ethernet
(LLDP), not from an InfiniBand fabric.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

ETHERNET_TIER_PREFIX = "eth-"
TIER_DIGEST_HEX_DIGITS = 16


def ethernet_tier_0(chassis_ids: Iterable[str]) -> str:
    """The tier-0 value of a node whose compute NICs hear the switches of these chassis IDs (as
    parsers.lldp writes them: printable, no newline). Raises ValueError for no chassis at all."""
    distinct = sorted(set(chassis_ids))
    if not distinct:
        raise ValueError("tier 0 needs at least one switch's chassis ID")
    digest = hashlib.sha256("\n".join(distinct).encode("utf-8")).hexdigest()
    return ETHERNET_TIER_PREFIX + digest[:TIER_DIGEST_HEX_DIGITS]
