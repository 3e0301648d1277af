"""The kubelet's configuration file (`KubeletConfiguration`): the policies behind GPU alignment.

Only the three settings that change how GPUs are admitted are read. A setting the file leaves out
has the kubelet's default (`none`, `container`, `none`), as the kubelet itself applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parsers.documents import load_yaml
from parsers.errors import ParseError, excerpt

KIND = "KubeletConfiguration"
# A kubelet config is a few kilobytes; anything far larger is not one.
MAX_INPUT_BYTES = 1024 * 1024
_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class KubeletPolicies:
    """The kubelet's Topology Manager and CPU Manager settings."""

    topology_manager_policy: str = "none"
    """none, best-effort, restricted or single-numa-node."""
    topology_manager_scope: str = "container"
    """container or pod."""
    cpu_manager_policy: str = "none"
    """none or static."""

    @property
    def aligns_numa(self) -> bool:
        """Whether admission fails when devices cannot come from one NUMA node."""
        return self.topology_manager_policy in ("restricted", "single-numa-node")


_FIELDS = {
    "topologyManagerPolicy": "topology_manager_policy",
    "topologyManagerScope": "topology_manager_scope",
    "cpuManagerPolicy": "cpu_manager_policy",
}


def parse_kubelet_config(text: str) -> KubeletPolicies:
    """Read the policies from a kubelet configuration file (YAML or JSON).

    Raises ParseError for text that is not YAML, not a KubeletConfiguration, or whose policy values
    are not words a kubelet could hold.
    """
    if len(text) > MAX_INPUT_BYTES:
        raise ParseError(f"{len(text)} bytes is not a kubelet configuration file")
    doc = load_yaml(text, max_chars=MAX_INPUT_BYTES)
    if doc is None:
        return KubeletPolicies()
    if not isinstance(doc, dict):
        raise ParseError(f"expected a {KIND} mapping, got {type(doc).__name__}")
    kind = doc.get("kind")
    if kind is not None and kind != KIND:
        raise ParseError(f"kind is {excerpt(kind)}, expected {KIND}", field="kind")
    values: dict[str, str] = {}
    for key, attribute in _FIELDS.items():
        value = doc.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ParseError(f"{excerpt(value)} is not a policy name", field=key)
        values[attribute] = value
    return KubeletPolicies(**values)
