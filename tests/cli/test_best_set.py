"""`topo-reporter best-set`, the pictures on `parse`/`render`, and the public API of `reporter`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes.client import V1Node, V1ObjectMeta

import reporter
from reporter.cli import main
from reporter.errors import InputError, SchemaError
from reporter.schema.annotations import annotations
from reporter.schema.codec import encode
from tests.golden import FIXTURES
from tests.placement.test_best_set import REAL

DGX_A100 = FIXTURES / "03-dgx-a100-nv12-mlx5.txt"
DGX1_TEXT = FIXTURES / "01-dgx1-style-8x-v100-nv1-nv2-nic-gpu-numa-id.txt"
TOPOLOGY = dict(REAL)["03-dgx-a100-nv12-mlx5"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def node_object(prefix: str = "gpu.topology.io") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "dgx-01", "annotations": annotations(TOPOLOGY, prefix)},
    }


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """The same machine in every shape `best-set` reads."""
    shapes = {
        "nvidia-smi text": DGX_A100.read_text(),
        "annotation": encode(TOPOLOGY),
        "Node JSON": json.dumps(node_object()),
        "Node YAML": yaml.safe_dump(node_object()),
        "NodeList JSON": json.dumps({"kind": "List", "items": [node_object()]}),
    }
    paths = {}
    for name, text in shapes.items():
        paths[name] = tmp_path / name.replace(" ", "-")
        paths[name].write_text(text)
    return paths


@pytest.mark.parametrize(
    "shape", ["nvidia-smi text", "annotation", "Node JSON", "Node YAML", "NodeList JSON"]
)
def test_best_set_reads_every_shape_and_prints_the_set_its_score_and_why(
    shape: str, inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["best-set", "--gpus", "2", str(inputs[shape])], capsys)
    assert (status, err) == (0, "")
    assert out == (
        "GPUs: 0,1\n"
        "score: 120 -1 4 0 (link points, minus NUMA nodes spanned, NIC points, PCIe points; "
        "larger is better; 120.0 points per pair)\n"
        "why: pairs: 1x NV12; NUMA node 3; closest NIC mlx5_0 (PXB to the farthest GPU)\n"
    )


def test_best_set_json_with_available_gpus_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(DGX_A100.read_bytes())))
    status, out, _ = run(
        ["best-set", "--gpus", "3", "--available", "1,2,3,5", "--format", "json", "-"], capsys
    )
    assert status == 0
    assert json.loads(out) == {
        "gpus": [1, 2, 3],
        "score": [360, -2, 1, 0],
        "points_per_pair": 120.0,
        "pairs": {"NV12": 3},
        "numa_nodes": [1, 3],
        "nic": "mlx5_0",
        "nic_link": "SYS",
        "exact": True,
        "policy": "best",
    }


def test_best_set_reads_a_node_under_another_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(node_object("x.io")))
    status, out, _ = run(["best-set", "--gpus", "8", "--prefix", "x.io", str(path)], capsys)
    assert status == 0
    assert out.startswith("GPUs: 0,1,2,3,4,5,6,7\nscore: 3360 -4 1 0 ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--gpus", "0"], "argument --gpus: 0: ask for at least 1 GPU", id="k below 1"),
        pytest.param(["--gpus", "two"], "'two' is not a number of GPUs", id="k not a number"),
        pytest.param(
            ["--gpus", "2", "--available", "1,a"],
            "'1,a' is not a comma-separated list of GPU indices",
            id="available not indices",
        ),
        pytest.param(
            ["--gpus", "2", "--must-include", "x"],
            "'x' is not a comma-separated list of GPU indices",
            id="must-include not indices",
        ),
        pytest.param(
            ["--gpus", "2", "--policy", "spread"], "invalid Policy value: 'spread'", id="bad policy"
        ),
        pytest.param(["--gpus", "2", "--budget", "0"], "give at least 1 work unit", id="budget 0"),
        pytest.param(
            ["--gpus", "2", "--budget", "lots"], "'lots' is not a number of work units", id="budget"
        ),
        pytest.param(
            ["--available", "1"], "the following arguments are required: --gpus", id="no k"
        ),
        pytest.param(
            ["--gpus", "2", "--format", "yaml"], "invalid choice: 'yaml'", id="bad format"
        ),
    ],
)
def test_bad_usage_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["best-set", *argv, str(DGX_A100)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "text", "message"),
    [
        pytest.param(
            ["--gpus", "9"],
            None,
            "asked for 9 GPUs but only 8 of 8 available GPUs are usable: ask for fewer or free "
            "more",
            id="more GPUs than the node has",
        ),
        pytest.param(
            ["--gpus", "3", "--available", "0,1"],
            None,
            "asked for 3 GPUs but only 2 of 2 available GPUs are usable",
            id="more GPUs than available",
        ),
        pytest.param(
            ["--gpus", "2", "--available", ""],
            None,
            "asked for 2 GPUs but only 0 of 0 available GPUs are usable",
            id="no free GPU at all: cannot meet",
        ),
        pytest.param(
            ["--gpus", "2", "--available", ","],
            None,
            "asked for 2 GPUs but only 0 of 0 available GPUs are usable",
            id="an empty list of available GPUs",
        ),
        pytest.param(
            ["--gpus", "2", "--available", "0,1", "--must-include", "5"],
            None,
            "must-include GPU 5 is not among the available GPUs: add it to them",
            id="must-include not available",
        ),
        pytest.param(
            ["--gpus", "2", "--must-include", "9"],
            None,
            "must-include GPUs: GPU 9 is not on this node (it has GPUs 0..7)",
            id="must-include unknown",
        ),
        pytest.param(
            ["--gpus", "1", "--must-include", "0,1"],
            None,
            "2 must-include GPUs do not fit in a set of 1",
            id="must-include more than K",
        ),
        pytest.param(
            ["--gpus", "1", "--available", "0,8"],
            None,
            "available GPUs: GPU 8 is not on this node (it has GPUs 0..7)",
            id="unknown GPU index",
        ),
        pytest.param(
            ["--gpus", "1"],
            '{"v": 1, "gpus": []}',
            "is required",
            id="an annotation that does not validate",
        ),
        pytest.param(
            ["--gpus", "1"],
            '{"kind": "Node", "metadata": {"name": "n1"}}',
            "node n1 has no gpu.topology.io/topology annotation",
            id="a Node without the annotation",
        ),
        pytest.param(
            ["--gpus", "1"],
            "GPU0 GPU1\nthis is not it\n",
            "no nvidia-smi topology matrix found",
            id="text that is no matrix",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    argv: list[str],
    text: str | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = DGX_A100
    if text is not None:
        path = tmp_path / "input"
        path.write_text(text)
    status, out, err = run(["best-set", *argv, str(path)], capsys)
    assert (status, out) == (1, "")
    assert err.startswith("topo-reporter: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_best_set_with_must_include_and_the_packing_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(["best-set", "--gpus", "2", "--must-include", "5", str(DGX_A100)], capsys)
    assert status == 0
    assert out.startswith("GPUs: 4,5\n")
    argv = ["best-set", "--gpus", "2", "--available", "0,1,2,3,4", "--policy", "packing"]
    status, out, _ = run([*argv, str(DGX_A100)], capsys)
    assert status == 0
    assert out.startswith("GPUs: 0,1\n")
    assert out.endswith(
        "policy: packing (connected where it can be, cutting into the smallest connected set: "
        "the largest stay whole)\n"
    )
    status, out, _ = run([*argv, "--format", "json", str(DGX_A100)], capsys)
    assert json.loads(out)["policy"] == "packing"


def test_best_set_with_nvidia_s_policy_honours_the_order_of_available(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The DGX-1 text: GPUs 0-3 and 4-7 are NVLink quads, 0-4 and 1-5 NV2 across. go-gpuallocator
    # splits all six free GPUs into pairs for the most NVLinks summed, {0,4} {1,5} {6,7}, and hands
    # out the first pair of two NVLinks in the order it was given.
    argv = ["best-set", "--gpus", "2", "--policy", "nvidia-besteffort", str(DGX1_TEXT)]
    status, out, _ = run([*argv, "--available", "0,1,4,5,6,7"], capsys)
    assert status == 0
    assert out.startswith("GPUs: 0,4\n")
    assert out.endswith(
        "policy: nvidia-besteffort (go-gpuallocator v0.6.0's best-effort choice, as NVIDIA's "
        "device plugin makes it; ties go to the order of --available)\n"
    )
    status, out, _ = run([*argv, "--available", "6,7,0,1,4,5"], capsys)
    assert out.startswith("GPUs: 6,7\n")


def test_best_set_says_when_the_budget_ran_out(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["best-set", "--gpus", "4", "--budget", "1", str(DGX_A100)], capsys)
    assert status == 0
    assert out.endswith(
        "note: not proven optimal: the search budget of 1 work units ran out first; this is the "
        "best set found (raise --budget to search further)\n"
    )
    status, out, _ = run(
        ["best-set", "--gpus", "4", "--budget", "1", "--format", "json", str(DGX_A100)], capsys
    )
    assert json.loads(out)["exact"] is False


@pytest.mark.parametrize("fmt", ["dot", "mermaid"])
def test_parse_and_render_print_pictures(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "topology.json"
    path.write_text(encode(TOPOLOGY))
    _, parsed, _ = run(["parse", str(DGX_A100), "--format", fmt], capsys)
    status, rendered, _ = run(["render", str(path), "--format", fmt], capsys)
    assert status == 0
    assert parsed == rendered
    assert parsed.startswith("graph topology {" if fmt == "dot" else "---\ntitle: ")


@pytest.mark.parametrize("fmt", ["dot", "mermaid"])
def test_collect_prints_pictures_of_a_simulated_machine(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(["collect", "--simulate", "dgx-h100", "--format", fmt], capsys)
    assert status == 0
    assert "NV18" in out
    assert "NVSwitch" in out


# The public API, as a scheduler author imports it.
def test_decode_node_reads_a_node_dict_and_a_kubernetes_v1node() -> None:
    as_dict = node_object()
    as_client = V1Node(
        metadata=V1ObjectMeta(name="dgx-01", annotations=annotations(TOPOLOGY, "gpu.topology.io"))
    )
    assert reporter.decode_node(as_dict) == TOPOLOGY
    assert reporter.decode_node(as_client) == TOPOLOGY
    assert reporter.best_gpu_set(reporter.decode_node(as_client), 2).gpus == (0, 1)


@pytest.mark.parametrize(
    ("node", "error", "message"),
    [
        pytest.param(
            SimpleNamespace(metadata=SimpleNamespace(name="n1", annotations=None)),
            InputError,
            "node n1 has no gpu.topology.io/topology annotation",
            id="no annotations",
        ),
        pytest.param(
            {"kind": "Pod", "metadata": {}}, InputError, "got kind 'Pod'", id="not a Node"
        ),
        pytest.param({"spec": {}}, InputError, "it has no metadata", id="no metadata"),
        pytest.param(
            {"metadata": {"name": "n1", "annotations": {"gpu.topology.io/topology": "{"}}},
            SchemaError,
            "not JSON",
            id="annotation not JSON",
        ),
        pytest.param(
            {"metadata": {"name": "n1", "annotations": {"gpu.topology.io/topology": 7}}},
            InputError,
            "annotation is not a string",
            id="annotation not a string",
        ),
    ],
)
def test_decode_node_errors(node: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        reporter.decode_node(node)


def test_the_public_api_is_exported_and_importing_it_loads_no_kubernetes() -> None:
    for name in ("decode", "decode_node", "best_gpu_set", "score_gpu_set", "Topology", "Link"):
        assert name in reporter.__all__
        assert callable(getattr(reporter, name)) or isinstance(getattr(reporter, name), type)
    assert reporter.LinkKind.NV.value == "NV"
    # Every public name, each loading its module (the package imports them when asked for).
    probe = "import sys; from reporter import *; "
    probe += "print(sorted(m for m in sys.modules if m.split('.')[0] in "
    probe += "('kubernetes', 'pynvml', 'urllib3')))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded == "[]\n"
