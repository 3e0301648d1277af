"""Small parsers: cpulists, CPU masks, PCI addresses, sysfs scalars, link tokens."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.cpulist import (
    canonical_cpulist,
    cpus_from_mask_words,
    format_cpulist,
    parse_cpulist,
    parse_cpumask,
)
from parsers.errors import ParseError
from parsers.links import Link, LinkKind, link_from_nvml_level, parse_link, split_fused_links
from parsers.pci import normalize_pci_address
from parsers.sysfs import parse_distance_row, parse_hex, parse_int, parse_numa_node


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-23,96-119", {*range(24), *range(96, 120)}),
        ("", set()),
        ("\n", set()),
        ("5", {5}),
        ("1-1", {1}),
        ("0,3-9,11-17", {0, *range(3, 10), *range(11, 18)}),
        ("0-15:2/4", {0, 1, 4, 5, 8, 9, 12, 13}),
        ("3,1,2", {1, 2, 3}),
    ],
    ids=[
        "two ranges",
        "empty",
        "newline only",
        "one cpu",
        "degenerate range",
        "gb200 numa list",
        "stride groups",
        "unordered",
    ],
)
def test_cpulists_parse(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(
    "text",
    ["a", "1-", "-1", "3-1", "1,,2", "0-99999999", "1 2", "0-3:0/0", "0-3:5/4"],
)
def test_bad_cpulists_raise_naming_the_field(text: str) -> None:
    with pytest.raises(ParseError, match="local_cpulist"):
        parse_cpulist(text, field="local_cpulist")


@given(st.frozensets(st.integers(0, 4095)))
def test_cpulist_format_and_parse_are_inverse(cpus: frozenset[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == cpus
    assert canonical_cpulist(text) == text


@given(st.lists(st.integers(0, 300), max_size=50))
def test_canonical_form_is_ascending_with_ranges_merged(cpus: list[int]) -> None:
    text = format_cpulist(cpus)
    spans = [[int(x) for x in part.split("-")] for part in text.split(",") if part]
    numbers = [x for span in spans for x in span]
    assert numbers == sorted(set(numbers))
    # Merged: a gap of at least one number separates neighbouring parts.
    assert all(b[0] > a[-1] + 1 for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize(
    ("mask", "cpus"),
    [
        ("ffff,0000ffff", {*range(16), *range(32, 48)}),
        ("00000001", {0}),
        ("80000000,00000000", {63}),
        ("0", set()),
    ],
)
def test_kernel_cpumasks(mask: str, cpus: set[int]) -> None:
    assert parse_cpumask(mask) == frozenset(cpus)


@pytest.mark.parametrize("mask", ["", "xyz", "1,,2", "123456789"])
def test_bad_cpumasks_raise(mask: str) -> None:
    with pytest.raises(ParseError, match="local_cpus"):
        parse_cpumask(mask, field="local_cpus")


def test_nvml_affinity_words_are_least_significant_first() -> None:
    assert cpus_from_mask_words([0xFFFF, 1]) == frozenset({*range(16), 64})
    assert cpus_from_mask_words([0b101], word_bits=32) == frozenset({0, 2})
    with pytest.raises(ParseError):
        cpus_from_mask_words([1 << 64])
    with pytest.raises(ParseError):
        cpus_from_mask_words([-1])


@given(st.frozensets(st.integers(0, 511)))
def test_mask_words_and_kernel_mask_agree(cpus: frozenset[int]) -> None:
    words = [sum(1 << (c - 64 * w) for c in cpus if 64 * w <= c < 64 * (w + 1)) for w in range(8)]
    hex_words = ",".join(
        f"{sum(1 << (c - 32 * w) for c in cpus if 32 * w <= c < 32 * (w + 1)):08x}"
        for w in reversed(range(16))
    )
    assert cpus_from_mask_words(words) == parse_cpumask(hex_words) == cpus


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("18:00.0", "0000:18:00.0"),
        ("00000000:C1:00.0", "0000:c1:00.0"),
        ("00010000:01:00.0", "00010000:01:00.0"),
        ("0001:01:1f.7", "0001:01:1f.7"),
    ],
    ids=[
        "nvml",
        "sysfs",
        "no domain",
        "upper case",
        "wide vmd domain keeps 8 digits",
        "max device",
    ],
)
def test_pci_addresses_normalize(text: str, normal: str) -> None:
    assert normalize_pci_address(text) == normal


@pytest.mark.parametrize("text", ["", "0000:18:00", "0000:18:20.0", "0000:18:00.8", "zz:00.0"])
def test_bad_pci_addresses_raise(text: str) -> None:
    with pytest.raises(ParseError, match="busId"):
        normalize_pci_address(text, field="busId")


def test_sysfs_scalars() -> None:
    assert parse_int("42\n", field="f") == 42
    assert parse_hex("0x10de\n", field="vendor") == 0x10DE
    assert parse_numa_node("-1\n") is None
    assert parse_numa_node("1") == 1
    assert parse_distance_row("10 21\n") == (10, 21)


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda t: parse_int(t, field="f"), "x"),
        (lambda t: parse_hex(t, field="class"), "10de"),
        (lambda t: parse_hex(t, field="class"), "0xZZ"),
        (parse_numa_node, "-2"),
        (parse_numa_node, "node0"),
        (parse_distance_row, ""),
        (parse_distance_row, "10 abc"),
        (parse_distance_row, "10 999"),
    ],
)
def test_bad_sysfs_values_raise(call: object, text: str) -> None:
    with pytest.raises(ParseError):
        call(text)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("token", "link"),
    [
        ("NV18", Link(LinkKind.NV, 18)),
        ("NV1", Link(LinkKind.NV, 1)),
        ("SOC", Link(LinkKind.SYS)),
        ("PIX", Link(LinkKind.PIX)),
        ("X", Link(LinkKind.X)),
    ],
)
def test_link_tokens(token: str, link: Link) -> None:
    assert parse_link(token) == link


@pytest.mark.parametrize("token", ["NV", "NV0", "NV999", "nv4", "PCI", "", "X "])
def test_bad_link_tokens_raise(token: str) -> None:
    with pytest.raises(ParseError, match=r"not a link|NVLinks"):
        parse_link(token)


def test_link_ordering_puts_more_nvlinks_first_and_sys_last() -> None:
    order = ["X", "NV18", "NV12", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    links = [parse_link(t) for t in order]
    shuffled = links[4:] + links[:4]
    assert sorted(shuffled, key=lambda link: link.closeness) == links


def test_fused_cells_split_only_when_every_piece_is_a_token() -> None:
    assert split_fused_links("NV18NV18") == [Link(LinkKind.NV, 18)] * 2
    assert split_fused_links("SYSPIX") == [Link(LinkKind.SYS), Link(LinkKind.PIX)]
    assert split_fused_links("NV18") is None
    assert split_fused_links("NV18x") is None
    assert split_fused_links("NV730") is None


@pytest.mark.parametrize(
    ("level", "kind"),
    [(0, "PIX"), (10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS")],
)
def test_nvml_common_ancestor_levels(level: int, kind: str) -> None:
    assert link_from_nvml_level(level).token == kind


def test_unknown_nvml_level_raises() -> None:
    with pytest.raises(ValueError, match="60"):
        link_from_nvml_level(60)


def _cpulist_by_enumeration(text: str) -> set[int]:
    # The kernel's bitmap_parselist semantics spelled out one CPU at a time, as a reference.
    cpus: set[int] = set()
    for part in text.split(","):
        span, _, stride = part.partition(":")
        first, _, last = span.partition("-")
        used, _, group = stride.partition("/")
        lo, hi = int(first), int(last or first)
        cpus.update(c for c in range(lo, hi + 1) if not stride or (c - lo) % int(group) < int(used))
    return cpus


@given(
    st.lists(
        st.tuples(st.integers(0, 600), st.integers(0, 600), st.integers(1, 9), st.integers(1, 9))
        .filter(lambda t: t[0] <= t[1])
        .map(lambda t: f"{t[0]}-{t[1]}" + (f":{min(t[2], t[3])}/{t[3]}" if t[2] % 2 else "")),
        min_size=1,
        max_size=12,
    )
)
def test_cpulist_ranges_and_strides_match_cpu_by_cpu_enumeration(parts: list[str]) -> None:
    text = ",".join(parts)
    assert parse_cpulist(text) == _cpulist_by_enumeration(text)


def test_repeated_full_ranges_are_one_set_not_a_huge_amount_of_work() -> None:
    # 30000 copies of the widest range once took a minute (one set insertion per CPU per copy);
    # the answer is the set of all CPUs, as for one copy.
    assert parse_cpulist(",".join(["0-65535"] * 30000)) == frozenset(range(65536))
    assert parse_cpulist(",".join(["0-65535:1/2"] * 2000)) == frozenset(range(0, 65536, 2))


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_cpulist, "0," * 50_000_000),
        (parse_cpumask, "ffffffff," * 10_000_000),
    ],
    ids=["cpulist of 100 MB", "cpumask of 90 MB"],
)
def test_huge_cpu_sets_are_refused_by_length(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError, match="longer than any"):
        parse(text)
