"""Numbers in text we did not write, as a class (issue 19, item 1).

`int()` takes digits of every script, signs, underscores and spaces, and raises a bare ValueError
past 4,300 digits: one availability annotation of 4,301 zeros killed the extender's watch thread.
Every reader turns digits into numbers through `parsers.integers`; here hypothesis hands every
entry point that reads numbers out of text the kinds of digits that broke them (runs of thousands
of ASCII digits, other scripts' decimal digits, superscripts and fractions that `str.isdigit()`
accepts), alone and inside otherwise valid text, and each must end in a value or its documented
error.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.cpulist import parse_cpulist, parse_cpumask
from parsers.errors import ParseError
from parsers.integers import MAX_DIGITS, parse_decimal, parse_hex_digits
from parsers.links import parse_link
from parsers.nvidia_proc import parse_device_minor
from parsers.nvsmi import parse_topo
from parsers.pci import normalize_pci_address
from parsers.sysfs import parse_distance_row, parse_hex, parse_int, parse_node_memtotal
from reporter.errors import ConfigError, SchemaError
from reporter.schema.availability import decode_availability
from reporter.schema.scheduler import PodRequestError, gpus_requested
from reporter.settings import listen_address, parse_count, parse_indexes
from tests.support.fuzz import fuzz

# Characters int() or str.isdigit() take for digits besides 0-9: Arabic-Indic three, fullwidth
# seven, mathematical bold zero, Devanagari five; superscript two and vulgar half (isdigit() and
# isnumeric() say yes, int() says no); a Roman numeral twelve.
FOREIGN_DIGITS = ["٣", "７", "𝟘", "५", "²", "½", "Ⅻ"]
OTHER = ["_", "-", "+", " ", "\t", "0x", "e", ".", ",", ":", "/", ";"]


@st.composite
def digit_runs(draw: st.DrawFn) -> str:
    """A run of ASCII digits, at times longer than int()'s 4,300-digit limit."""
    length = draw(st.one_of(st.integers(1, 30), st.integers(4290, 4410)))
    return draw(st.sampled_from("0159")) * length


NUMBER_PIECES = st.one_of(digit_runs(), st.sampled_from(FOREIGN_DIGITS), st.sampled_from(OTHER))
NUMBER_TEXTS = st.lists(NUMBER_PIECES, min_size=1, max_size=5).map("".join)
"""Text made of digit runs, foreign digits and separators."""


@fuzz(300)
@given(NUMBER_TEXTS)
def test_parse_decimal_takes_exactly_short_runs_of_ascii_digits(text: str) -> None:
    plain = text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS
    if plain:
        assert parse_decimal(text) == int(text)
        return
    with pytest.raises(ParseError) as refused:
        parse_decimal(text)
    assert "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200


@fuzz(100)
@given(NUMBER_TEXTS)
def test_parse_hex_digits_takes_exactly_short_runs_of_ascii_hex_digits(text: str) -> None:
    plain = text.isascii() and all(c in "0123456789abcdefABCDEF" for c in text) and text != ""
    if plain and len(text) <= 16:
        assert parse_hex_digits(text) == int(text, 16)
        return
    with pytest.raises(ParseError):
        parse_hex_digits(text)


# Each reader with the text around the number it reads, and the one error it may raise.
READERS: list[tuple[str, Callable[[str], object], str, type[Exception]]] = [
    ("cpulist", parse_cpulist, "0-{}", ParseError),
    ("cpulist stride", parse_cpulist, "0-15:{}/4", ParseError),
    ("cpumask", parse_cpumask, "{},ffffffff", ParseError),
    ("sysfs int", lambda t: parse_int(t, field="numa_node"), "{}\n", ParseError),
    ("sysfs hex", lambda t: parse_hex(t, field="vendor"), "0x{}\n", ParseError),
    ("distance row", parse_distance_row, "10 {}", ParseError),
    ("meminfo", parse_node_memtotal, "Node 0 MemTotal: {} kB\n", ParseError),
    ("link token", parse_link, "NV{}", ParseError),
    ("PCI address", normalize_pci_address, "{}:18:00.0", ParseError),
    ("availability free", decode_availability, "1;{};0.1.1.0.1", SchemaError),
    ("availability entry", decode_availability, "1;0;{}.1.1.0.1", SchemaError),
    ("availability whole", decode_availability, "3;0;0.1.1.0.1.1.{}", SchemaError),
    ("GPU request", lambda t: gpus_requested(_pod(t)), "{}", PodRequestError),
    ("listen port", listen_address, "0.0.0.0:{}", ConfigError),
    ("GPU indexes", lambda t: parse_indexes(t, name="--simulate-used"), "0,{}", ConfigError),
    ("nvidia-smi CPU affinity", parse_topo, "\tGPU0\tCPU Affinity\nGPU0\t X \t{}\n", ParseError),
    ("nvidia-smi GPU NUMA ID", parse_topo, "\tGPU0\tGPU NUMA ID\nGPU0\t X \t{}\n", ParseError),
    ("nvidia-smi row label", parse_topo, "\tGPU0\nGPU{}\t X \n", ParseError),
    ("driver minor number", parse_device_minor, "Model: x\nDevice Minor: {}\n", ParseError),
    ("a settings count", lambda t: parse_count(t, name="--withdraw-after"), "{}", ConfigError),
]


def _pod(count: str) -> dict[str, object]:
    return {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": count}}}]}}


@pytest.mark.parametrize(
    ("read", "template", "error"), [r[1:] for r in READERS], ids=[r[0] for r in READERS]
)
@fuzz(40)
@given(number=NUMBER_TEXTS)
def test_every_reader_of_numbers_ends_in_a_value_or_its_own_error(
    read: Callable[[str], object], template: str, error: type[Exception], number: str
) -> None:
    message = ""
    try:
        read(template.format(number))
    except error as e:
        message = str(e)
    assert "\n" not in message
