"""Fuzzing every parser: any text ends in a value or ParseError, never another exception.

Inputs are arbitrary text and structured damage to the real `nvidia-smi topo -m` pastes and kubelet
configurations in tests/fixtures/ (cells replaced, lines dropped or repeated, tabs lost or expanded,
ANSI codes inserted, lines cut short). Budgets come from tests/support/fuzz.py; no test asserts a
time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from parsers.cpulist import canonical_cpulist, parse_cpulist, parse_cpumask
from parsers.errors import ParseError
from parsers.kubelet import KubeletPolicies, parse_kubelet_config
from parsers.links import parse_link, split_fused_links
from parsers.nvsmi import NIC_NAME, TopoMatrix, parse_topo
from parsers.pci import normalize_pci_address
from parsers.sysfs import parse_distance_row, parse_hex, parse_int, parse_numa_node
from reporter.errors import InputError
from reporter.schema.formats import format_topology
from reporter.schema.matrix import render_matrix
from reporter.schema.model import Topology
from reporter.schema.reading import topology_from_document_text, topology_from_text
from tests.support.fuzz import ANSI_CODES, CELLS, HUGE, fuzz, outcome
from tests.support.strategies import text_topologies

PREFIX = "gpu.topology.io"

FIXTURES = Path(__file__).parents[1] / "fixtures"
PASTES = [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "nvidia-smi").glob("*.txt"))]
KUBELET_CONFIGS = [
    p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "kubelet").iterdir()) if p.is_file()
]


def _line_index(draw: st.DrawFn, lines: list[str]) -> int:
    # Damage lands in the matrix block most of the time: that is where the parser's work is.
    matrix = [i for i, line in enumerate(lines) if "\t" in line or "GPU" in line]
    if matrix and draw(st.integers(0, 4)):
        return draw(st.sampled_from(matrix))
    return draw(st.integers(0, len(lines) - 1))


def _replace_cell(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    cells = lines[i].split("\t")
    cells[draw(st.integers(0, len(cells) - 1))] = draw(CELLS)
    lines[i] = "\t".join(cells)


def _drop_line(draw: st.DrawFn, lines: list[str]) -> None:
    if len(lines) > 1:
        del lines[_line_index(draw, lines)]


def _repeat_line(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    lines.insert(draw(st.integers(0, len(lines))), lines[i])


def _lose_tabs(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    lines[i] = lines[i].replace("\t", "", draw(st.integers(1, 40)))


def _expand_tabs(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    lines[i] = lines[i].expandtabs(draw(st.sampled_from([1, 4, 8])))


def _insert_ansi(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    at = draw(st.integers(0, len(lines[i])))
    lines[i] = lines[i][:at] + draw(st.sampled_from(ANSI_CODES)) + lines[i][at:]


def _cut_line(draw: st.DrawFn, lines: list[str]) -> None:
    i = _line_index(draw, lines)
    lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]


def _insert_text(draw: st.DrawFn, lines: list[str]) -> None:
    lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=40)))


MUTATIONS = [
    _replace_cell,
    _drop_line,
    _repeat_line,
    _lose_tabs,
    _expand_tabs,
    _insert_ansi,
    _cut_line,
    _insert_text,
]


@st.composite
def damaged_pastes(draw: st.DrawFn) -> str:
    """A real paste with one to four random kinds of damage."""
    lines = draw(st.sampled_from(PASTES)).split("\n")
    for _ in range(draw(st.integers(1, 4))):
        draw(st.sampled_from(MUTATIONS))(draw, lines)
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return newline.join(lines)


def _topo_or_parse_error(text: str) -> None:
    matrix = outcome(lambda: parse_topo(text), ParseError)
    event(type(matrix).__name__)
    if isinstance(matrix, ParseError):
        assert str(matrix)  # a message the user can act on, never empty
        return
    assert isinstance(matrix, TopoMatrix)
    n = len(matrix.gpu_links)
    assert all(len(row) == n for row in matrix.gpu_links)
    assert len(matrix.cpu_affinity) == len(matrix.numa_affinity) == n


@fuzz(1500)
@given(damaged_pastes())
def test_damaged_pastes_parse_or_raise_parse_error(text: str) -> None:
    _topo_or_parse_error(text)


@fuzz(400)
@given(damaged_pastes())
def test_damaged_pastes_normalize_or_raise_input_error(text: str) -> None:
    # The CLI path: parse, then build the model, which has its own checks (symmetry, NICs).
    result = outcome(lambda: topology_from_text(text, "paste"), InputError)
    assert isinstance(result, Topology) or str(result).startswith("paste")


@fuzz(400)
@given(
    st.text() | st.text(alphabet=st.sampled_from(list("GPU0123 \tXNVSYPIXBHODE-,\n")), max_size=400)
)
def test_arbitrary_text_parses_or_raises_parse_error(text: str) -> None:
    _topo_or_parse_error(text)


@fuzz(200)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_read_as_text_parse_or_raise_parse_error(data: bytes) -> None:
    # What the CLI does with stdin or a file that is not quite UTF-8 text: surrogates included.
    _topo_or_parse_error(data.decode("utf-8", errors="surrogateescape"))


CPU_TEXT = st.text(alphabet=st.sampled_from(list("0123456789-,:/ \nabf")), max_size=60)


@fuzz(400)
@given(CPU_TEXT | st.text(max_size=30) | CELLS)
def test_cpulists_parse_or_raise(text: str) -> None:
    cpus = outcome(lambda: parse_cpulist(text, field="cpus"), ParseError)
    if isinstance(cpus, ParseError):
        assert cpus.field == "cpus"
        return
    # What parses is a set of real CPU numbers whose canonical form reads back to itself.
    assert all(0 <= c < 1 << 16 for c in cpus)
    assert parse_cpulist(canonical_cpulist(text)) == cpus


@fuzz(300)
@given(st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEF, \nxg")), max_size=80))
def test_cpumasks_parse_or_raise(text: str) -> None:
    cpus = outcome(lambda: parse_cpumask(text, field="local_cpus"), ParseError)
    if isinstance(cpus, ParseError):
        assert cpus.field == "local_cpus"
        return
    assert all(0 <= c < 1 << 16 for c in cpus)


@fuzz(300)
@given(st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEF:. x")), max_size=24))
def test_pci_addresses_normalize_or_raise(text: str) -> None:
    address = outcome(lambda: normalize_pci_address(text, field="busId"), ParseError)
    if isinstance(address, ParseError):
        assert address.field == "busId"
        return
    assert normalize_pci_address(address) == address


SCALARS: list[Callable[[str], object]] = [
    lambda t: parse_int(t, field="f"),
    lambda t: parse_hex(t, field="f"),
    lambda t: parse_numa_node(t, field="f"),
    lambda t: parse_distance_row(t, field="f"),
]


@fuzz(300)
@given(
    st.sampled_from(SCALARS),
    st.text(alphabet=st.sampled_from(list("0123456789-+x abcdefX_\n")), max_size=30) | st.text(),
)
def test_sysfs_scalars_parse_or_raise(parse: Callable[[str], object], text: str) -> None:
    result = outcome(lambda: parse(text), ParseError)
    assert not isinstance(result, ParseError) or result.field == "f"


@fuzz(300)
@given(CELLS | st.text(alphabet=st.sampled_from(list("NVPIXSYOCDEHB0123456789")), max_size=20))
def test_link_tokens_parse_or_raise(token: str) -> None:
    link = outcome(lambda: parse_link(token), ParseError)
    if isinstance(link, ParseError):
        fused = split_fused_links(token)
        assert fused is None or all(parse_link(f.token) == f for f in fused)
        return
    assert parse_link(link.token) == link


KUBELET_VALUES = st.one_of(
    st.sampled_from(["static", "none", "single-numa-node", "pod", "best-effort", ""]),
    st.text(max_size=20),
    st.integers(),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)
KUBELET_KEYS = st.sampled_from(
    ["topologyManagerPolicy", "topologyManagerScope", "cpuManagerPolicy", "kind", "apiVersion"]
)


@st.composite
def damaged_kubelet_configs(draw: st.DrawFn) -> str:
    """A real kubelet config with settings overwritten or lines damaged, or plain text."""
    base = draw(st.sampled_from(KUBELET_CONFIGS))
    choice = draw(st.integers(0, 2))
    if choice == 0:
        value = json.dumps(draw(KUBELET_VALUES))
        return f"{base}\n{draw(KUBELET_KEYS)}: {value}\n"
    lines = base.split("\n")
    if choice == 1:
        for _ in range(draw(st.integers(1, 3))):
            draw(st.sampled_from([_drop_line, _cut_line, _insert_text, _repeat_line]))(draw, lines)
        return "\n".join(lines)
    return draw(st.text(max_size=200))


@fuzz(300)
@given(damaged_kubelet_configs())
def test_kubelet_configs_parse_or_raise(text: str) -> None:
    policies = outcome(lambda: parse_kubelet_config(text), ParseError)
    assert isinstance(policies, KubeletPolicies) or str(policies)


HUGE_INPUTS: list[tuple[str, Callable[[str], object]]] = [
    ("parse_topo", parse_topo),
    ("parse_cpulist", parse_cpulist),
    ("parse_cpumask", parse_cpumask),
    ("parse_kubelet_config", parse_kubelet_config),
    ("normalize_pci_address", normalize_pci_address),
    ("parse_int", lambda t: parse_int(t, field="numa_node")),
    ("parse_numa_node", parse_numa_node),
]


@pytest.fixture(scope="module")
def huge_text() -> str:
    # Digits and separators: the worst case for parsers that would read on rather than refuse.
    return ("0-65535," * (HUGE // 8 + 1))[:HUGE]


@pytest.mark.parametrize(("name", "parse"), HUGE_INPUTS, ids=[n for n, _ in HUGE_INPUTS])
def test_a_100_mb_input_is_refused_with_parse_error(
    name: str, parse: Callable[[str], object], huge_text: str
) -> None:
    with pytest.raises(ParseError):
        parse(huge_text)


# A NIC name as the schema allows it, or anything a legend line can hold: non-ASCII, long, quoted.
LEGEND_NAMES = st.from_regex(NIC_NAME, fullmatch=True) | st.text(
    alphabet=st.characters(exclude_categories=("Z", "C")), min_size=1, max_size=100
)
DRIVERS = st.none() | st.from_regex(r"[0-9][0-9A-Za-z._-]{0,80}", fullmatch=True)


@st.composite
def legend_topologies(draw: st.DrawFn) -> Topology:
    """A topology that text carries completely, its NICs renamed to random legend names."""
    topology = draw(text_topologies(max_gpus=4))
    names = draw(
        st.lists(
            LEGEND_NAMES, min_size=len(topology.nics), max_size=len(topology.nics), unique=True
        )
    )
    nics = tuple(replace(nic, name=name) for nic, name in zip(topology.nics, names, strict=True))
    return replace(topology, nics=nics)


@fuzz(300)
@given(legend_topologies(), DRIVERS)
def test_what_parse_prints_render_reads_back(topology: Topology, driver: str | None) -> None:
    text = render_matrix(topology)
    if driver is not None:
        text = f"Driver Version: {driver}\n{text}"
    valid = all(NIC_NAME.fullmatch(n.name) for n in topology.nics) and len(driver or "") <= 64
    parsed = outcome(lambda: topology_from_text(text, "paste"), InputError)
    event("parsed" if isinstance(parsed, Topology) else "refused")
    if isinstance(parsed, InputError):
        # Refused in one line, and only for what the schema itself refuses.
        assert not valid, parsed
        assert "\n" not in str(parsed)
        return
    assert valid
    for fmt in ("json", "yaml"):
        printed = format_topology(parsed, fmt, PREFIX)
        assert topology_from_document_text(printed, "parse output", PREFIX) == parsed
