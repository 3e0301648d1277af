"""The `nvidia-smi topo -m` parser on every real paste we have, on damage, and on its own render."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings

from parsers.errors import ParseError
from parsers.links import Link, LinkKind
from parsers.nvsmi import parse_topo
from reporter.schema.codec import encode
from reporter.schema.matrix import describe_matrix, render_matrix
from reporter.schema.model import Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import FIXTURES, body, expected
from tests.support.strategies import text_topologies

REAL = sorted(FIXTURES.glob("*.txt"))


def parse(text: str) -> Topology:
    return topology_from_matrix(parse_topo(text))


def fixture(prefix: str) -> str:
    return body(next(p for p in REAL if p.name.startswith(prefix)))


@pytest.mark.parametrize("path", REAL, ids=[p.stem for p in REAL])
def test_every_real_paste_reads_as_written_out(path: Path) -> None:
    want = yaml.safe_load(path.with_suffix(".expected.yaml").read_text(encoding="utf-8"))
    assert expected(path) == want


@pytest.mark.parametrize(
    "path", [p for p in REAL if p.with_suffix(".golden.json").exists()], ids=lambda p: p.stem
)
def test_every_real_paste_encodes_and_renders_byte_for_byte_as_its_golden_files(path: Path) -> None:
    topology = parse(body(path))
    assert encode(topology) + "\n" == path.with_suffix(".golden.json").read_text(encoding="utf-8")
    assert render_matrix(topology) == path.with_suffix(".golden.matrix").read_text(encoding="utf-8")
    describe = path.with_suffix(".golden.describe").read_text(encoding="utf-8")
    assert describe_matrix(topology) == describe


def test_the_matrix_of_a_dgx1_reads_cell_by_cell() -> None:
    t = parse(fixture("01-"))
    assert t.links[0][3] == Link(LinkKind.NV, 2)
    assert t.links[0][1] == Link(LinkKind.NV, 1)
    assert t.links[0][5] == Link(LinkKind.SYS)
    assert t.nics[0].name == "mlx5_2"
    assert [c.token for c in t.nics[0].links] == ["NODE"] * 4 + ["SYS"] * 4
    assert t.gpus[4].cpus == frozenset(range(20, 40)) | frozenset(range(60, 80))
    assert t.gpus[4].numa == frozenset({1})
    assert t.gpus[0].gpu_numa is None


@pytest.mark.parametrize(
    ("prefix", "gpu", "cpus", "numa", "gpu_numa"),
    [
        ("31-", 0, None, {0}, None),
        ("31-", 4, {1}, {1}, None),
        ("08-", 1, set(range(72)), {0, *range(3, 10), *range(11, 18)}, 10),
        ("06-", 2, set(range(32)), None, None),
        ("18-", 0, set(range(8)), None, None),
        ("04-", 7, {1}, None, None),
        ("32-", 0, {*range(24, 32), *range(56, 64)}, {3}, None),
    ],
    ids=[
        "an empty CPU Affinity cell is null and the NUMA cell after it still reads",
        "a cgroup-confined CPU list of one CPU reads as that CPU",
        "a GB200 GPU lists its Grace node and its memory nodes, and its own GPU NUMA ID",
        "N/A NUMA affinity in a VM is null",
        "one GPU with N/A in both NUMA columns",
        "an old driver's 1-1 range reads as CPU 1",
        "a header joined by spaces still maps the affinity columns",
    ],
)
def test_affinity_cells_of_real_pastes(
    prefix: str, gpu: int, cpus: set[int] | None, numa: set[int] | None, gpu_numa: int | None
) -> None:
    t = parse(fixture(prefix))
    assert t.gpus[gpu].cpus == (None if cpus is None else frozenset(cpus))
    assert t.gpus[gpu].numa == (None if numa is None else frozenset(numa))
    assert t.gpus[gpu].gpu_numa == gpu_numa


def test_old_soc_token_reads_as_sys_and_a_header_without_tabs_still_names_the_columns() -> None:
    t = parse(fixture("04-"))
    assert t.links[0][5] == Link(LinkKind.SYS)
    assert [n.name for n in t.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]


def test_topo_mp_is_a_pcie_view_that_does_not_claim_nvlink_is_absent() -> None:
    t = parse(fixture("02-"))
    assert not t.nvlink_observed
    assert t.pcie == t.links


def test_a_paste_with_a_p2p_matrix_after_reads_only_the_topology() -> None:
    t = parse(fixture("15-"))
    assert len(t.gpus) == 2
    assert t.links[0][1] == Link(LinkKind.PIX)


def test_rocm_smi_output_is_refused_by_name() -> None:
    with pytest.raises(ParseError, match="rocm-smi"):
        parse_topo(fixture("29-"))


CLEAN = fixture("01-")


def _replace_row(text: str, label: str, new: str) -> str:
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith(label + "\t"))
    lines[i] = new
    return "\n".join(lines)


def _row(text: str, label: str) -> str:
    return next(line for line in text.split("\n") if line.startswith(label + "\t"))


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        ("", "no nvidia-smi topology matrix"),
        ("   \n\n", "no nvidia-smi topology matrix"),
        ("GPU0 is fine, thanks\n", "no nvidia-smi topology matrix"),
        (CLEAN.split("\nGPU7\t")[0], "truncated"),
        (_replace_row(CLEAN, "GPU3", _row(CLEAN, "GPU3").rsplit("\tNV1", 1)[0]), "path cells"),
        (_replace_row(CLEAN, "GPU2", _row(CLEAN, "GPU2").replace("NV1", "NV4", 1)), "symmetric"),
        (_replace_row(CLEAN, "GPU1", _row(CLEAN, "GPU1").replace("NV2", " X ", 1)), "diagonal"),
        (_replace_row(CLEAN, "GPU1", _row(CLEAN, "GPU1").replace("NV2", "NVX", 1)), "path cells"),
        (_replace_row(CLEAN, "GPU1", _row(CLEAN, "GPU1").replace("0-19,40-59", "0-x")), "0-x"),
        (_replace_row(CLEAN, "GPU1", _row(CLEAN, "GPU1").replace("GPU1", "GPU9")), "out of order"),
        (_replace_row(CLEAN, "NIC0", _row(CLEAN, "NIC0").replace("NODE", "NV2", 1)), "NIC"),
    ],
    ids=[
        "an empty file holds no matrix",
        "blank lines hold no matrix",
        "prose mentioning GPU0 holds no matrix",
        "a paste cut before the last rows is truncated",
        "a row missing its last cell is truncated",
        "an asymmetric pair is damage, not data",
        "an X off the diagonal is damage",
        "an unknown token stops the row short",
        "a garbage CPU list names the column",
        "row labels out of order are refused",
        "a NIC reached over NVLink is refused",
    ],
)
def test_damage_raises_a_parse_error_naming_the_line(damaged: str, message: str) -> None:
    with pytest.raises(ParseError, match=message) as info:
        parse_topo(damaged)
    assert info.value.line is not None
    assert "line " in str(info.value)


@pytest.mark.parametrize(
    "variant",
    [
        CLEAN.replace("\n", "\r\n"),
        "\n".join("    " + line for line in CLEAN.split("\n")),
        _replace_row(CLEAN, "GPU0", _row(CLEAN, "GPU0").replace("NV2\tNV2", "NV2NV2")),
        _replace_row(CLEAN, "GPU0", _row(CLEAN, "GPU0").replace("NODE\t0-19", "NODE0-19")),
        "```\n$ nvidia-smi topo -m\n" + CLEAN,
        CLEAN.expandtabs(8),
    ],
    ids=[
        "CRLF line endings",
        "a markdown-indented block",
        "two path cells fused by a lost tab are split unambiguously",
        "a path fused to the CPU affinity is split unambiguously",
        "a code fence and a prompt before the matrix",
        "tabs expanded to spaces",
    ],
)
def test_harmless_paste_damage_reads_like_the_clean_paste(variant: str) -> None:
    assert parse(variant) == parse(CLEAN)


def test_huge_input_is_refused_before_parsing() -> None:
    with pytest.raises(ParseError, match="bytes"):
        parse_topo("GPU0 " * 1_000_000)


@settings(max_examples=150, deadline=None)
@given(text_topologies())
def test_parsing_the_rendered_matrix_gives_the_topology_back(topology: Topology) -> None:
    assert parse(render_matrix(topology)) == topology
