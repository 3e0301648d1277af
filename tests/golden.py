"""Golden files for the real `nvidia-smi topo -m` fixtures: regenerate with one explicit command.

    python -m tests.golden    # rewrite tests/fixtures/nvidia-smi/*.expected.yaml and *.golden.*,
                              # and tests/fixtures/dra-template/*.yaml

Review the diff before committing: a golden file changes only when behaviour is meant to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from parsers.cpulist import format_cpulist
from parsers.errors import ParseError
from parsers.nvsmi import parse_topo
from reporter.collect import build_scanner, list_profiles
from reporter.schema import dra_template
from reporter.schema.codec import encode
from reporter.schema.labels import labels
from reporter.schema.matrix import describe_matrix, render_matrix
from reporter.schema.normalize import topology_from_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
DRA_TEMPLATES = Path(__file__).parent / "fixtures" / "dra-template"
PROVENANCE_END = "# ---\n"


def body(path: Path) -> str:
    """The pasted output of a fixture, without its provenance header."""
    return path.read_text(encoding="utf-8").split(PROVENANCE_END, 1)[1]


def expected(path: Path) -> dict[str, Any]:
    """What the parser must read from a fixture, in a form a person can check against the text."""
    try:
        matrix = parse_topo(body(path))
    except ParseError as e:
        return {"error": {"line": e.line, "contains": e.reason.split(":")[0]}}
    topology = topology_from_matrix(matrix)
    return {
        "gpus": len(topology.gpus),
        "links": [" ".join(c.token for c in row) for row in topology.links],
        "nics": {n.name: " ".join(c.token for c in n.links) for n in topology.nics},
        "nic_peers": {
            n.name: " ".join(c.token for c in n.peers) if n.peers else None for n in topology.nics
        },
        "cpu_affinity": [format_cpulist(g.cpus) if g.cpus else None for g in topology.gpus],
        "numa_affinity": [format_cpulist(g.numa) if g.numa else None for g in topology.gpus],
        "gpu_numa_id": [g.gpu_numa for g in topology.gpus],
        "pcie_only": matrix.pcie_only,
        "labels": labels(topology),
    }


def dra_templates() -> dict[str, str]:
    """`dra-template --gpus K --machine PROFILE` for every shipped profile with NVLink, K = 2
    and K = its largest clique (with `--fallback`), by file name."""
    out: dict[str, str] = {}
    for profile in list_profiles():
        topology = build_scanner("auto", Path("/"), profile.name).scan().topology
        assert topology is not None
        largest = max((len(c) for c in dra_template.maximal_cliques(topology)), default=1)
        machines = [dra_template.Machine(profile.name, (topology,))]
        for k, fallback in sorted({(2, False), (largest, True)}):
            if largest < 2:
                continue
            template = dra_template.build(machines, k, fallback=fallback)
            suffix = "-fallback" if fallback else ""
            out[f"{profile.name}-k{k}{suffix}.yaml"] = dra_template.to_yaml(template)
    return out


def main() -> None:
    DRA_TEMPLATES.mkdir(exist_ok=True)
    for name, text in dra_templates().items():
        (DRA_TEMPLATES / name).write_text(text, encoding="utf-8")
        print(f"wrote dra-template/{name}")
    for path in sorted(FIXTURES.glob("*.txt")):
        want = expected(path)
        stem = path.with_suffix("")
        Path(f"{stem}.expected.yaml").write_text(
            yaml.safe_dump(want, sort_keys=False, width=200), encoding="utf-8"
        )
        if "error" in want:
            continue
        topology = topology_from_matrix(parse_topo(body(path)))
        Path(f"{stem}.golden.json").write_text(encode(topology) + "\n", encoding="utf-8")
        Path(f"{stem}.golden.matrix").write_text(render_matrix(topology), encoding="utf-8")
        Path(f"{stem}.golden.describe").write_text(describe_matrix(topology), encoding="utf-8")
        print(f"wrote {stem.name}")


if __name__ == "__main__":
    main()
