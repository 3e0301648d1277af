"""`--format dot` and `--format mermaid`: valid for their tools on every machine; what they draw.

Validity is checked by the tools themselves: Graphviz's `dot -Tsvg` (Debian package `graphviz`)
must accept every picture without a warning, and the real Mermaid parser (npm `mermaid`, run in
Node with jsdom, pinned in tests/mermaid/) must parse every flowchart. `.ci/run` installs both; a
checkout without the npm packages gets them from the npm registry on first use (about 10 s).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.links import SELF, Link, LinkKind
from reporter.schema.model import Gpu, Nic, Source, Topology
from reporter.schema.pictures import to_dot, to_mermaid
from tests.placement.test_best_set import MACHINES, REAL, machine
from tests.support.strategies import topologies

MERMAID = Path(__file__).parents[1] / "mermaid"
MermaidParse = Callable[[list[str]], list[str | None]]


def dot_problems(text: str) -> str:
    """What `dot -Tsvg` says about a picture: empty when it renders without a word."""
    dot = shutil.which("dot")
    assert dot, "Graphviz `dot` is missing: apt-get install graphviz (.ci/run does)"
    result = subprocess.run(
        [dot, "-Tsvg", "-o", "/dev/null"], input=text, capture_output=True, text=True, check=False
    )
    return f"exit {result.returncode}: {result.stderr}" if result.returncode else result.stderr


@pytest.fixture(scope="session")
def mermaid_parse() -> MermaidParse:
    """A function: Mermaid texts in, parser errors out (None for each text that parses)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node, "Node.js is needed to run the Mermaid parser"
    assert npm, "npm is needed to install the Mermaid parser"
    if not (MERMAID / "node_modules" / "mermaid").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(MERMAID)],
            check=True,
            capture_output=True,
            timeout=110,
        )

    def parse(texts: list[str]) -> list[str | None]:
        result = subprocess.run(
            [node, str(MERMAID / "check.mjs")],
            input=json.dumps(texts),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        errors: list[str | None] = json.loads(result.stdout)
        return errors

    return parse


HOSTILE = Topology(
    source=Source.NVML,
    gpus=(
        Gpu(index=0, model='Tesla "V100" <b>#1</b> \\ end', numa=frozenset({0})),
        Gpu(index=1, model="subgraph\nend;}", numa=frozenset({0}), lost=True),
    ),
    links=((SELF, Link(LinkKind.PIX)), (Link(LinkKind.PIX), SELF)),
    nics=(Nic(name="end", links=(Link(LinkKind.PIX), Link(LinkKind.PXB))),),
)

CASES = [*MACHINES, ("hostile-labels", HOSTILE), ("no-gpus", Topology(Source.NVML, (), ()))]


@pytest.mark.parametrize(("name", "topology"), CASES, ids=[name for name, _ in CASES])
def test_dot_renders_every_machine_without_a_warning(name: str, topology: Topology) -> None:
    assert dot_problems(to_dot(topology)) == ""


def test_mermaid_parses_every_machine(mermaid_parse: MermaidParse) -> None:
    texts = [to_mermaid(topology) for _, topology in CASES]
    errors = mermaid_parse(texts)
    assert dict(zip([name for name, _ in CASES], errors, strict=True)) == {
        name: None for name, _ in CASES
    }


def test_the_mermaid_check_rejects_a_broken_flowchart(mermaid_parse: MermaidParse) -> None:
    broken = to_mermaid(REAL[0][1]).replace("===", "== =", 1)
    assert mermaid_parse([broken])[0] is not None


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(topologies(max_gpus=8), min_size=12, max_size=12))
def test_generated_topologies_are_valid_pictures(
    batch: list[Topology], mermaid_parse: MermaidParse
) -> None:
    # One Node process per batch: starting Mermaid costs a second.
    assert [dot_problems(to_dot(t)) for t in batch] == [""] * len(batch)
    assert mermaid_parse([to_mermaid(t) for t in batch]) == [None] * len(batch)


def edges(dot: str) -> set[tuple[str, str, str]]:
    return {
        (m[1], m[2], m[3])
        for m in re.finditer(r"^  (\w+) -- (\w+) \[label=\"([^\"]*)\"", dot, re.M)
    }


A100 = dict(REAL)["03-dgx-a100-nv12-mlx5"]
DGX1 = dict(REAL)["01-dgx1-style-8x-v100-nv1-nv2-nic-gpu-numa-id"]
RTX4090 = dict(REAL)["14-8x-rtx4090-all-sys-2nic"]
P40 = dict(REAL)["16-8x-tesla-p40-pix-pxb-soc-old-driver"]


def test_a_uniform_nvswitch_fabric_is_one_hub_not_a_clique() -> None:
    drawn = edges(to_dot(A100))
    assert {e for e in drawn if e[1] == "nvswitch"} == {
        (f"gpu{g}", "nvswitch", "NV12") for g in range(8)
    }
    assert not any(a.startswith("gpu") and b.startswith("gpu") for a, b, _ in drawn)


def test_nics_attach_to_their_nearest_gpus_and_sys_only_nics_stand_alone() -> None:
    drawn = edges(to_dot(A100))
    assert {e for e in drawn if e[0] == "nic0"} == {
        ("nic0", "gpu0", "PXB"),
        ("nic0", "gpu1", "PXB"),
    }
    assert not any(e[0] == "nic4" for e in drawn)  # mlx5_4 is SYS from every GPU


def test_gpus_are_grouped_by_numa_node() -> None:
    dot = to_dot(A100)
    cluster = dot[dot.index("subgraph cluster_numa3") : dot.index("}", dot.index("cluster_numa3"))]
    assert re.findall(r"(gpu\d|nic\d+) \[", cluster) == ["gpu0", "gpu1", "nic0", "nic1"]
    assert 'subgraph numa3["NUMA node 3"]' in to_mermaid(A100)


def test_a_mesh_draws_each_nvlink_pair_with_its_bond() -> None:
    drawn = edges(to_dot(DGX1))
    nvlink = {(a, b, label) for a, b, label in drawn if label.startswith("NV")}
    expected = {
        (f"gpu{a}", f"gpu{b}", DGX1.links[a][b].token)
        for a in range(8)
        for b in range(a + 1, 8)
        if DGX1.links[a][b].is_nvlink
    }
    assert nvlink == expected
    assert len(expected) == 16


@pytest.mark.parametrize(
    ("topology", "expected"),
    [
        pytest.param(RTX4090, set(), id="all SYS: no PCIe edge between GPUs at all"),
        pytest.param(
            P40,
            {
                (f"gpu{a}", f"gpu{b}", "PIX")
                for q in (0, 4)
                for a in range(q, q + 4)
                for b in range(a + 1, q + 4)
            },
            id="no NVLink: PIX peers under one switch only",
        ),
        pytest.param(
            machine(["X NV2 PIX", "NV2 X PIX", "PIX PIX X"]),
            {("gpu0", "gpu1", "NV2")},
            id="a GPU with NVLink gets no PCIe edges, its PCIe peer none to it",
        ),
    ],
)
def test_pcie_pairs_are_not_drawn_as_a_clique(
    topology: Topology, expected: set[tuple[str, str, str]]
) -> None:
    assert {e for e in edges(to_dot(topology)) if e[0].startswith("gpu")} == expected


def test_labels_are_escaped_for_each_tool() -> None:
    dot = to_dot(HOSTILE)
    assert 'gpu0 [label="GPU0\\nTesla \\"V100\\" <b>#1</b> \\\\ end", shape=box];' in dot
    assert (
        'gpu1 [label="GPU1\\nsubgraph\\nend;} (lost)", shape=box, style=dashed, color=red];' in dot
    )
    mermaid = to_mermaid(HOSTILE)
    assert 'gpu0["GPU0<br/>Tesla #quot;V100#quot; #lt;b#gt;#35;1#lt;/b#gt; \\ end"]' in mermaid
    assert 'nic0(["end"])' in mermaid
    assert "class gpu1 lost" in mermaid
