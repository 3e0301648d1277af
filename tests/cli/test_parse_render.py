"""`topo-reporter parse` and `render`: every format, every input shape, every user error."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reporter.cli import main
from reporter.errors import InputError
from reporter.schema.reading import topology_from_document_text
from tests.golden import FIXTURES, body

DGX_A100 = FIXTURES / "03-dgx-a100-nv12-mlx5.txt"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def annotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    status, out, _ = run(["parse", str(DGX_A100), "--format", "annotation"], capsys)
    assert status == 0
    path = tmp_path / "topology.json"
    path.write_text(out)
    return path


def test_parse_prints_the_schema_with_source_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["parse", str(DGX_A100)], capsys)
    doc = json.loads(out)
    assert (status, err) == (0, "")
    assert doc["source"] == "nvidia-smi"
    assert doc["gpus"][0]["uuid"] is None
    assert doc["links"][0].split() == ["X"] + ["NV12"] * 7
    assert doc["nics"][0] == {
        "name": "mlx5_0",
        "pci": None,
        "numa": None,
        "links": "PXB PXB SYS SYS SYS SYS SYS SYS",
        "peers": "X PXB" + " SYS" * 10,
    }
    assert "pcie" not in doc


def test_parse_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(DGX_A100.read_bytes())))
    status, out, _ = run(["parse", "-"], capsys)
    assert status == 0
    assert json.loads(out)["v"] == 2


@pytest.mark.parametrize("fmt", ["json", "yaml", "annotation", "matrix", "labels"])
def test_render_gives_what_parse_gives(
    fmt: str, annotation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, parsed, _ = run(["parse", str(DGX_A100), "--format", fmt], capsys)
    _, rendered, _ = run(["render", str(annotation), "--format", fmt], capsys)
    assert parsed == rendered


def test_yaml_and_labels_formats(annotation: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["render", str(annotation), "--format", "yaml"], capsys)
    assert yaml.safe_load(out)["links"][1].startswith("NV12 X")
    _, out, _ = run(["render", str(annotation), "--format", "labels", "--prefix", "x.io"], capsys)
    lines = out.splitlines()
    assert "x.io/interconnect=nvswitch" in lines
    assert "x.io/nvlink-island-size=8" in lines
    assert "x.io/numa-nodes=4" in lines
    assert "x.io/max-gpus-per-numa=2" in lines
    assert "x.io/rdma-nics=12" in lines
    matrix_line = next(line for line in lines if line.startswith("x.io/matrix="))
    assert json.loads(matrix_line.split("=", 1)[1]).startswith("8x GPU, NVSwitch NV12")


def _node(annotation: Path, prefix: str = "gpu.topology.io") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "dgx-07",
            "annotations": {f"{prefix}/topology": annotation.read_text().strip()},
        },
    }


@pytest.mark.parametrize(
    "wrap",
    [
        json.dumps,
        yaml.safe_dump,
        lambda node: json.dumps({"kind": "List", "items": [node]}),
    ],
    ids=["kubectl get node -o json", "kubectl get node -o yaml", "a list of one node"],
)
def test_render_reads_a_whole_node(
    wrap: object, annotation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node"
    path.write_text(wrap(_node(annotation)))  # type: ignore[operator]
    status, out, _ = run(["render", str(path), "--format", "annotation"], capsys)
    assert status == 0
    assert out.strip() == annotation.read_text().strip()


@pytest.mark.parametrize(
    ("argv", "content", "message"),
    [
        (["parse", "{missing}"], None, "cannot read"),
        (["parse", "{file}"], b"\xff\xfe", "not UTF-8"),
        (["parse", "{file}"], b"hello", "no nvidia-smi topology matrix"),
        (
            ["parse", "{file}"],
            body(FIXTURES / "29-amd-4x-mi210-rocm-smi-showtopo-xgmi.txt").encode(),
            "rocm-smi",
        ),
        (["render", "{file}"], b'{"v":1}', "source: is required"),
        (["render", "{file}"], b"[:", "neither JSON nor YAML"),
        (
            ["render", "{file}"],
            json.dumps({"kind": "Node", "metadata": {"name": "n1"}}).encode(),
            "node n1 has no gpu.topology.io/topology annotation",
        ),
        (["render", "{file}"], json.dumps({"kind": "NodeList", "items": []}).encode(), "0 nodes"),
    ],
    ids=[
        "a missing file",
        "a binary file",
        "text without a matrix",
        "AMD's rocm-smi",
        "a document missing fields",
        "neither JSON nor YAML",
        "a node without our annotation",
        "an empty node list",
    ],
)
def test_user_errors_end_in_one_line_and_exit_1(
    argv: list[str],
    content: bytes | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "input"
    if content is not None:
        path.write_bytes(content)
    argv = [a.format(missing=tmp_path / "nope", file=path) for a in argv]
    status, out, err = run(argv, capsys)
    assert status == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("topo-reporter: error: ")
    assert message in err


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["parse", str(DGX_A100), "--format", "xml"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_the_console_script_is_installed_with_version_and_help() -> None:
    exe = Path(sys.executable).with_name("topo-reporter")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("topo-reporter 0.1.0")
    for command in ("parse", "render"):
        help_text = subprocess.run(
            [exe, command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        assert "--format" in help_text


TOPOLOGY_KEY = "gpu.topology.io/topology"


def _mangled_node(metadata: object, kind: str = "Node") -> str:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": metadata}
    return json.dumps(node if kind == "Node" else {"kind": kind, "items": node})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_mangled_node({"name": "n1", "annotations": {TOPOLOGY_KEY: []}}), "is not a string"),
        (_mangled_node({"name": "n1", "annotations": {TOPOLOGY_KEY: 7}}), "is not a string"),
        (_mangled_node({"name": "n1", "annotations": [TOPOLOGY_KEY]}), "not a mapping"),
        (_mangled_node(["name"]), "node \\? has no"),
        (_mangled_node({"name": "n1"}, kind="NodeList"), "holds 0 nodes"),
        ('{"kind": "List", "items": 3}', "holds 0 nodes"),
        ("[" * 5_000_000, "larger than"),
    ],
    ids=[
        "annotation value is a list",
        "annotation value is a number",
        "annotations is a list",
        "metadata is a list",
        "items is an object",
        "items is a number",
        "input beyond the size limit is refused before parsing",
    ],
)
def test_mangled_node_documents_are_input_errors_not_tracebacks(text: str, message: str) -> None:
    # Found by tests/fuzz/test_codec.py: these once ended in TypeError or AttributeError.
    with pytest.raises(InputError, match=message):
        topology_from_document_text(text, "node.json", "gpu.topology.io")
