"""The two output seams of the agent, one per cadence.

- A `ScanOutput` is called after each scan with the topology the agent chose (Koordinator's
  device file, DRA DeviceTaintRules).
- A `LiveOutput` is called after each good read of the allocation view (NodeResourceTopology),
  and told to withdraw while reads keep failing.

Both handle their own failures: they log and count, say a repeated failure once (see
`reporter.telling.Told`), and never raise into the loop that calls them. `reporter.assembly`
registers every output, once, from the Settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from reporter.schema.model import Topology

if TYPE_CHECKING:
    from reporter.collect.podresources import AllocationView


class ScanOutput(Protocol):
    """An output that follows the topology: called once per scan, writes only what changed."""

    def __call__(self, topology: Topology) -> None:
        """Publish what follows from `topology`."""
        ...


class LiveOutput(Protocol):
    """An output that needs the allocation view (NodeResourceTopology, ...). It handles its own
    failures (log and count, never raise) and writes only what changed."""

    def __call__(self, topology: Topology, view: AllocationView) -> None:
        """A good read: publish what follows from `view`."""
        ...

    def withdraw(self) -> None:
        """Called at each tick while the loop withdraws (reads keep failing): take back what the
        last view said, so that no scheduler goes on excluding the node on it."""
        ...
