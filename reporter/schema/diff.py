"""What changed between two topologies, in the words an operator reads in an Event.

Pure: two `Topology` values in, lines out (`GPU3↔GPU5: NV18 → NV12`, `GPU6 lost`,
`GPU count 8 → 7`, `mlx5_3 gone`). GPUs are matched by PCI address, then UUID, then index, so a
renumbering after a GPU falls off the bus is not reported as every link changing. It never reads
the machine or the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from parsers.cpulist import format_cpulist
from reporter.schema.model import Gpu, Topology

EVENT_MESSAGE_MAX_BYTES = 1024
"""events.k8s.io/v1 caps `note` at 1 KiB; core/v1 messages are kept to the same size."""


def _identity(gpu: Gpu) -> str:
    if gpu.pci is not None:
        return f"pci:{gpu.pci}"
    if gpu.uuid is not None:
        return f"uuid:{gpu.uuid}"
    return f"index:{gpu.index}"


def _numa(gpu: Gpu) -> str:
    return "unknown" if gpu.numa is None else format_cpulist(gpu.numa)


def changes(old: Topology, new: Topology) -> tuple[str, ...]:
    """The differences that matter to placement, one short line each; empty when none."""
    lines: list[str] = []
    if len(old.gpus) != len(new.gpus):
        lines.append(f"GPU count {len(old.gpus)} → {len(new.gpus)}")
    if old.source is not new.source:
        lines.append(f"source {old.source.value} → {new.source.value}")
    if old.driver != new.driver:
        lines.append(f"driver {old.driver or 'unknown'} → {new.driver or 'unknown'}")

    old_by_id = {_identity(g): g for g in old.gpus}
    new_by_id = {_identity(g): g for g in new.gpus}
    for ident, gpu in old_by_id.items():
        if ident not in new_by_id:
            lines.append(f"GPU{gpu.index} gone")
    # Old index -> new index for GPUs present in both, to compare their links.
    matched: list[tuple[Gpu, Gpu]] = []
    for ident, gpu in new_by_id.items():
        before = old_by_id.get(ident)
        if before is None:
            lines.append(f"GPU{gpu.index} added")
            continue
        matched.append((before, gpu))
        if gpu.lost and not before.lost:
            lines.append(f"GPU{gpu.index} lost")
        elif before.lost and not gpu.lost:
            lines.append(f"GPU{gpu.index} back")
        if before.index != gpu.index:
            lines.append(f"GPU{before.index} is now GPU{gpu.index}")
        if before.numa != gpu.numa:
            lines.append(f"GPU{gpu.index} NUMA {_numa(before)} → {_numa(gpu)}")
        if before.mig != gpu.mig:
            lines.append(f"GPU{gpu.index} MIG {'on' if gpu.mig else 'off'}")
        if before.mig_devices != gpu.mig_devices:
            lines.append(
                f"GPU{gpu.index} MIG devices {len(before.mig_devices)} → {len(gpu.mig_devices)}"
            )
        if before.model != gpu.model:
            lines.append(f"GPU{gpu.index} model {before.model} → {gpu.model}")
    lines.extend(_link_changes(old, new, matched))
    lines.extend(_nic_changes(old, new))
    return tuple(lines)


def _link_changes(old: Topology, new: Topology, matched: Sequence[tuple[Gpu, Gpu]]) -> list[str]:
    lines: list[str] = []
    ordered = sorted(matched, key=lambda pair: pair[1].index)
    for a, (old_a, new_a) in enumerate(ordered):
        for old_b, new_b in ordered[a + 1 :]:
            was = old.link(old_a.index, old_b.index)
            now = new.link(new_a.index, new_b.index)
            if was != now:
                lines.append(f"GPU{new_a.index}↔GPU{new_b.index}: {was.token} → {now.token}")
    return lines


def _nic_changes(old: Topology, new: Topology) -> list[str]:
    lines: list[str] = []
    old_nics = {n.name: n for n in old.nics}
    new_nics = {n.name: n for n in new.nics}
    lines.extend(f"{name} gone" for name in old_nics if name not in new_nics)
    for name, nic in new_nics.items():
        before = old_nics.get(name)
        if before is None:
            lines.append(f"{name} added")
        elif len(before.links) == len(nic.links) and before.links != nic.links:
            changed = [
                f"GPU{i} {b.token} → {n.token}"
                for i, (b, n) in enumerate(zip(before.links, nic.links, strict=True))
                if b != n
            ]
            lines.append(f"{name}: " + ", ".join(changed))
    return lines


def event_message(lines: Sequence[str], max_bytes: int = EVENT_MESSAGE_MAX_BYTES) -> str:
    """Join change lines with `; `, ending in `and N more` when they do not fit in max_bytes."""
    text = ""
    for n, line in enumerate(lines):
        candidate = f"{text}; {line}" if text else line
        rest = len(lines) - n - 1
        tail = f"; and {rest} more" if rest else ""
        if len((candidate + tail).encode()) > max_bytes:
            more = len(lines) - n
            return f"{text}; and {more} more" if text else f"{more} changes"
        text = candidate
    return text
