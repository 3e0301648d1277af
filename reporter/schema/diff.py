"""What changed between two topologies, in the words an operator reads in an Event.

Pure: two `Topology` values in, lines out (`GPU3↔GPU5: NV18 → NV12`, `GPU6 lost`,
`GPU count 8 → 7`, `mlx5_3 gone`). GPUs are matched by PCI address, then UUID, then index, so a
renumbering after a GPU falls off the bus is not reported as every link changing, and a GPU NVML
reports lost (known by its index alone) is that GPU lost, not one gone and another added.
It never reads the machine or the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parsers.cpulist import format_cpulist
from reporter.schema.fabric import gpu_health
from reporter.schema.model import Gpu, Topology

EVENT_MESSAGE_MAX_BYTES = 1024
"""events.k8s.io/v1 caps `note` at 1 KiB; core/v1 messages are kept to the same size."""


def _same_gpu(a: Gpu, b: Gpu) -> bool:
    """Nothing known of the two tells them apart: no PCI address or UUID known on both differs."""
    return all(x is None or y is None or x == y for x, y in ((a.pci, b.pci), (a.uuid, b.uuid)))


def match_gpus(old: Topology, new: Topology) -> tuple[list[Gpu], list[tuple[Gpu, Gpu]], list[Gpu]]:
    """(gone, matched old→new pairs, added): the same GPU on both sides, however it is known.

    By PCI address where both sides know it, then by UUID, then by index for the rest, where
    nothing known contradicts: a GPU NVML reports lost carries neither address nor UUID, and is
    still the GPU that was at its index, not one gone and another added.
    """
    gone = list(old.gpus)
    added = list(new.gpus)
    matched: list[tuple[Gpu, Gpu]] = []

    def pair(key: Callable[[Gpu], object]) -> None:
        by_key = {key(g): g for g in gone if key(g) is not None}
        for gpu in list(added):
            before = by_key.pop(key(gpu), None) if key(gpu) is not None else None
            if before is not None and _same_gpu(before, gpu):
                matched.append((before, gpu))
                gone.remove(before)
                added.remove(gpu)

    pair(lambda g: g.pci)
    pair(lambda g: g.uuid)
    pair(lambda g: g.index)
    return gone, matched, added


def _numa(gpu: Gpu) -> str:
    return "unknown" if gpu.numa is None else format_cpulist(gpu.numa)


def changes(old: Topology, new: Topology) -> tuple[str, ...]:
    """The differences that matter to placement, one short line each; empty when none.

    A GPU lost on either side is reported as lost or back and nothing more: its fields and links
    are unknown while it is lost, not changed.
    """
    lines: list[str] = []
    if len(old.gpus) != len(new.gpus):
        lines.append(f"GPU count {len(old.gpus)} → {len(new.gpus)}")
    if old.source is not new.source:
        lines.append(f"source {old.source.value} → {new.source.value}")
    if old.driver != new.driver:
        lines.append(f"driver {old.driver or 'unknown'} → {new.driver or 'unknown'}")

    gone, matched, added = match_gpus(old, new)
    lines.extend(f"GPU{gpu.index} gone" for gpu in gone)
    for before, gpu in sorted(matched, key=lambda pair: pair[1].index):
        if gpu.lost and not before.lost:
            lines.append(f"GPU{gpu.index} lost")
        elif before.lost and not gpu.lost:
            lines.append(f"GPU{gpu.index} back")
        if before.index != gpu.index:
            lines.append(f"GPU{before.index} is now GPU{gpu.index}")
        if before.lost or gpu.lost:
            continue
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
        lines.extend(_fabric_changes(before, gpu))
    lines.extend(f"GPU{gpu.index} added" for gpu in sorted(added, key=lambda g: g.index))
    known = [(a, b) for a, b in matched if not a.lost and not b.lost]
    lines.extend(_link_changes(old, new, known))
    lines.extend(_nic_changes(old, new, known))
    return tuple(lines)


def _active(gpu: Gpu) -> str:
    return "?" if gpu.nvlink is None else f"{gpu.nvlink.active}/{gpu.nvlink.count}"


def _fabric_word(gpu: Gpu) -> str:
    return "none" if gpu.fabric is None else gpu_health(gpu.fabric)


def _fabric_changes(before: Gpu, gpu: Gpu) -> list[str]:
    """A GPU's clique, fabric health, active NVLinks or minor number, where they changed and
    both sides know them (a v1 document knows none of the last three)."""
    lines = []
    if before.clique != gpu.clique:
        lines.append(f"GPU{gpu.index} clique {before.clique or 'none'} → {gpu.clique or 'none'}")
    if before.fabric is not None and gpu.fabric is not None:
        was, now = _fabric_word(before), _fabric_word(gpu)
        if was != now:
            lines.append(f"GPU{gpu.index} fabric {was} → {now}")
    if before.nvlink is not None and gpu.nvlink is not None and before.nvlink != gpu.nvlink:
        lines.append(f"GPU{gpu.index} NVLinks active {_active(before)} → {_active(gpu)}")
    if None not in (before.minor, gpu.minor) and before.minor != gpu.minor:
        lines.append(f"GPU{gpu.index} minor {before.minor} → {gpu.minor}")
    return lines


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


def _nic_changes(old: Topology, new: Topology, known: Sequence[tuple[Gpu, Gpu]]) -> list[str]:
    """NICs gone, added, or with another path to a GPU known on both sides (matched, not lost)."""
    lines: list[str] = []
    old_nics = {n.name: n for n in old.nics}
    new_nics = {n.name: n for n in new.nics}
    lines.extend(f"{name} gone" for name in old_nics if name not in new_nics)
    for name, nic in new_nics.items():
        before = old_nics.get(name)
        if before is None:
            lines.append(f"{name} added")
            continue
        changed = [
            f"GPU{b.index} {before.links[a.index].token} → {nic.links[b.index].token}"
            for a, b in sorted(known, key=lambda pair: pair[1].index)
            if a.index < len(before.links)
            and b.index < len(nic.links)
            and before.links[a.index] != nic.links[b.index]
        ]
        if changed:
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
