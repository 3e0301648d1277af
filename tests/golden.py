"""Golden files for the real `nvidia-smi topo -m` fixtures: regenerate with one explicit command.

    python -m tests.golden        # rewrite tests/fixtures/nvidia-smi/*.expected.yaml and *.golden.*

Review the diff before committing: a golden file changes only when behaviour is meant to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from parsers.cpulist import format_cpulist
from parsers.errors import ParseError
from parsers.nvsmi import parse_topo
from reporter.schema.codec import encode
from reporter.schema.labels import describe_matrix, labels, render_matrix
from reporter.schema.normalize import topology_from_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
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


def main() -> None:
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
