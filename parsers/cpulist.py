"""Linux CPU and NUMA-node sets: list strings (`0-23,96-119`) and bitmasks.

Three spellings of one thing: the kernel's list format (`local_cpulist`, `nvidia-smi` affinity
cells), the kernel's hex mask (`local_cpus`: 32-bit words, most significant first, comma separated)
and NVML's `nvmlDeviceGetCpuAffinity` array (unsigned longs, least significant first).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal, parse_hex_digits

# A CPU or node number beyond this is not a real machine; bounding it keeps `0-999999999` from
# allocating a huge set out of untrusted text.
MAX_CPU = 1 << 16
# The longest list of CPUs below MAX_CPU in any sane spelling (every other CPU, one by one) is about
# 190 KB; longer text is not a CPU list, and refusing it first bounds the time spent on it.
MAX_CPULIST_CHARS = 256 * 1024

# `[0-9]`, not `\d`, which matches every script's digits; the numbers go through parse_decimal.
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+)/([0-9]+))?)?")


def parse_cpulist(text: str, *, field: str = "cpulist") -> frozenset[int]:
    """Parse a kernel list string (`0-3,8,10-11`, stride groups `0-15:2/4`); empty means no CPUs.

    Raises ParseError naming `field` on anything else.
    """
    if len(text) > MAX_CPULIST_CHARS:
        raise ParseError(
            f"{len(text)} characters is longer than any CPU list (limit {MAX_CPULIST_CHARS})",
            field=field,
        )
    text = text.strip()
    if not text:
        return frozenset()
    # The set is built as a bitmask so that each range costs a few big-integer operations rather
    # than one set insertion per CPU: `0-65535` repeated must not cost 65536 insertions a time.
    mask = 0
    for part in text.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ParseError(f"{excerpt(part)} is not a CPU number or range", field=field)
        first = parse_decimal(match.group(1), field=field)
        last = parse_decimal(match.group(2), field=field) if match.group(2) is not None else first
        if last < first:
            raise ParseError(f"range {excerpt(part)} runs backwards", field=field)
        if last >= MAX_CPU:
            raise ParseError(f"{last} is beyond the largest CPU number {MAX_CPU - 1}", field=field)
        span = last - first + 1
        if match.group(3) is None:
            mask |= ((1 << span) - 1) << first
            continue
        used, group = (parse_decimal(match.group(n), field=field) for n in (3, 4))
        # A group wider than any machine would make _stride_mask allocate 2**group bits.
        if group == 0 or used > group or group > MAX_CPU:
            raise ParseError(
                f"stride {excerpt(part)} is not used/group with 0 < used <= group <= {MAX_CPU}",
                field=field,
            )
        mask |= _stride_mask(span, used, group) << first
    bits = bin(mask)[:1:-1]  # least significant bit first
    return frozenset(i for i, bit in enumerate(bits) if bit == "1")


def _stride_mask(span: int, used: int, group: int) -> int:
    # The first `used` of every `group` CPUs over `span` CPUs, by doubling the pattern: a few
    # shifts however large the span.
    mask, width = (1 << used) - 1, group
    while width < span:
        mask |= mask << width
        width *= 2
    return mask & ((1 << span) - 1)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The canonical list string: ascending, consecutive numbers merged into ranges."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def canonical_cpulist(text: str, *, field: str = "cpulist") -> str:
    """Rewrite a list string in canonical form (`1-1` becomes `1`). Raises ParseError."""
    return format_cpulist(parse_cpulist(text, field=field))


def parse_cpumask(text: str, *, field: str = "cpumask") -> frozenset[int]:
    """Parse the kernel's hex mask (`ffff,0000ffff`, words of 32 bits, most significant first).

    Raises ParseError naming `field`.
    """
    if len(text) > MAX_CPU // 32 * 9:
        raise ParseError(f"mask of {len(text)} characters is longer than any machine", field=field)
    words = text.strip().split(",")
    if not words or any(not re.fullmatch(r"[0-9a-fA-F]{1,8}", w) for w in words):
        raise ParseError(
            f"{excerpt(text.strip())} is not a comma-separated hex CPU mask", field=field
        )
    if len(words) * 32 > MAX_CPU:
        raise ParseError(f"mask of {len(words)} words is longer than any machine", field=field)
    cpus: set[int] = set()
    for position, word in enumerate(reversed(words)):
        value = parse_hex_digits(word, field=field, max_digits=8)
        cpus.update(position * 32 + bit for bit in range(32) if value >> bit & 1)
    return frozenset(cpus)


def cpus_from_mask_words(words: Sequence[int], *, word_bits: int = 64) -> frozenset[int]:
    """CPUs set in NVML's affinity array: unsigned longs, least significant word first.

    Raises ParseError for a negative word or one wider than `word_bits`.
    """
    cpus: set[int] = set()
    for position, word in enumerate(words):
        if word < 0 or word >> word_bits:
            raise ParseError(f"mask word {word:#x} does not fit {word_bits} bits", field="cpumask")
        cpus.update(position * word_bits + bit for bit in range(word_bits) if word >> bit & 1)
    return frozenset(cpus)
