"""`--format json` is the documented document wherever a topology is printed (issue 42).

Each GPU is whole, with every field the schema gives a GPU, on every machine: a script that reads
`.gpus[].model` reads it on a DGX, where the annotation writes the model once in `gpu_common`, as
on a node whose GPUs differ. `--format yaml` is the same document, and `--format annotation` is
the Node annotation's exact value; `render` and `best-set` read both forms. The field list comes
from the shipped JSON Schema, not from here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reporter.cli import main
from reporter.collect import build_scanner, list_profiles
from reporter.commands.gpu_topology import show_node
from reporter.schema.annotations import annotations as node_annotations
from reporter.schema.codec import decode, encode, json_schema
from reporter.schema.keys import DEFAULT_PREFIX
from tests.golden import FIXTURES

PROFILES = [p.name for p in list_profiles()]
PASTES = sorted(p for p in FIXTURES.glob("*.txt") if p.with_suffix(".golden.json").exists())


def whole_gpu_fields() -> list[str]:
    """The fields the schema requires of each GPU of a document without `gpu_common`: those a GPU
    always carries, and those it may leave to `gpu_common` in the annotation."""
    schema = json_schema()
    # The schema's `then` applies to a document without gpu_common: the expanded form.
    assert schema["if"] == {"not": {"required": ["gpu_common"]}}
    always = schema["$defs"]["gpu"]["required"]
    unless_common = schema["then"]["properties"]["gpus"]["items"]["required"]
    return list(dict.fromkeys([*always, *unless_common]))


WHOLE_GPU_FIELDS = whole_gpu_fields()


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(argv)
    out, err = capsys.readouterr()
    assert (status, err) == (0, ""), err
    return out


def assert_each_gpu_whole(document: dict[str, Any], annotation: str) -> None:
    """`document` is the expanded form of `annotation`: no `gpu_common`, every GPU carrying every
    field the schema gives a GPU, and what the annotation wrote once, in each GPU."""
    assert "gpu_common" not in document
    wire = json.loads(annotation)
    common = wire.get("gpu_common", {})
    for gpu in document["gpus"]:
        missing = [f for f in WHOLE_GPU_FIELDS if f not in gpu]
        assert not missing, f"GPU {gpu['index']} lacks {missing}"
        assert {k: gpu.get(k) for k in common} == common
    assert document["hash"] == wire["hash"]
    assert decode(json.dumps(document)) == decode(annotation)


def test_the_schema_gives_a_gpu_its_identity_and_its_shared_fields() -> None:
    # What the other tests check is only as strong as this list.
    assert {"index", "uuid", "pci", "model", "numa", "cpus", "mem_mib", "mig"} <= set(
        WHOLE_GPU_FIELDS
    )


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILES)
def test_collect_json_gives_each_gpu_whole_and_yaml_the_same_document(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collect", "--simulate", profile, "--format"]
    annotation = cli([*argv, "annotation"], capsys)
    document = json.loads(cli([*argv, "json"], capsys))
    assert_each_gpu_whole(document, annotation)
    assert yaml.safe_load(cli([*argv, "yaml"], capsys)) == document


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILES)
@pytest.mark.parametrize("form", ["annotation", "json", "yaml"])
def test_render_reads_every_form_and_prints_each_gpu_whole(
    profile: str, form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collect", "--simulate", profile, "--format"]
    annotation = cli([*argv, "annotation"], capsys)
    path = tmp_path / "topology"
    path.write_text(cli([*argv, form], capsys))
    rendered = {
        fmt: cli(["render", str(path), "--format", fmt], capsys)
        for fmt in ("json", "yaml", "annotation")
    }
    document = json.loads(rendered["json"])
    assert_each_gpu_whole(document, annotation)
    assert yaml.safe_load(rendered["yaml"]) == document
    assert rendered["annotation"] == annotation


@pytest.mark.parametrize("paste", PASTES, ids=[p.stem for p in PASTES])
def test_parse_json_gives_each_gpu_whole_and_yaml_the_same_document(
    paste: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    annotation = cli(["parse", str(paste), "--format", "annotation"], capsys)
    document = json.loads(cli(["parse", str(paste), "--format", "json"], capsys))
    assert_each_gpu_whole(document, annotation)
    assert yaml.safe_load(cli(["parse", str(paste), "--format", "yaml"], capsys)) == document


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILES)
def test_best_set_reads_the_annotation_and_the_document_alike(
    profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collect", "--simulate", profile, "--format"]
    gpus = len(json.loads(cli([*argv, "json"], capsys))["gpus"])
    chosen = {}
    for form in ("annotation", "json", "yaml"):
        path = tmp_path / form
        path.write_text(cli([*argv, form], capsys))
        best = ["best-set", "--gpus", str(max(1, gpus // 2)), "--format", "json", str(path)]
        chosen[form] = cli(best, capsys)
    assert chosen["annotation"] == chosen["json"] == chosen["yaml"]


@pytest.mark.parametrize("profile", PROFILES, ids=PROFILES)
def test_the_kubectl_plugins_json_gives_each_gpu_whole(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    annotation = cli(["collect", "--simulate", profile, "--format", "annotation"], capsys)
    node = {
        "metadata": {
            "name": "n1",
            "annotations": node_annotations(decode(annotation), DEFAULT_PREFIX),
        }
    }
    shown = json.loads(show_node(node, [], "json", DEFAULT_PREFIX))
    assert_each_gpu_whole(shown["topology"], annotation)


def shared_numa_profiles() -> list[str]:
    """The profiles whose annotation writes the GPUs' NUMA node once, in `gpu_common`: one
    socket's GPUs, where `.gpus[].numa` read null before issue 42."""
    found = []
    for profile in PROFILES:
        topology = build_scanner("auto", Path("/sys"), profile).scan().topology
        assert topology is not None
        if json.loads(encode(topology)).get("gpu_common", {}).get("numa") is not None:
            found.append(profile)
    return found


JQ_CHECKS = [("dgx-h100", "model"), *((p, "numa") for p in shared_numa_profiles())]


def test_a_simulated_profile_shares_one_numa_node_among_its_gpus() -> None:
    # Else the jq check below would lose its `.numa` case without failing.
    assert any(field == "numa" for _, field in JQ_CHECKS)


@pytest.mark.parametrize(("profile", "field"), JQ_CHECKS, ids=[f"{p} .{f}" for p, f in JQ_CHECKS])
def test_jq_reads_each_gpus_field_as_the_docs_say(profile: str, field: str) -> None:
    if shutil.which("jq") is None:
        pytest.fail("jq is missing: run `sh tests/prereqs.sh`, which installs it", pytrace=False)
    script = Path(sys.executable).parent / "topo-reporter"
    reading = f"jq -e '[.gpus[].{field}] | all'"
    command = f"{script} collect --simulate {profile} --format json | {reading}"
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{command}\n{result.stdout}{result.stderr}"
