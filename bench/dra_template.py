"""How big `topo-reporter dra-template`'s expression gets, and what Kubernetes' CEL prices it at.

    python bench/dra_template.py      # prints one Markdown table (builds tests/controlplane/dracel)

The API's limits (k8s.io/api v0.37.2 resource/v1/types.go): 10 Ki per expression, 32 derived
attributes per request (the template uses one), and one estimated-cost budget of 1,000,000 per
claim. For 8- and 16-GPU machines, and clusters of 20 machine kinds (NVLink pairs: the wiring
with the most cliques per GPU, so the largest map), the table gives the expression's bytes, the
worst-case cost Kubernetes' own DRA CEL compiler estimates (k8s.io/dynamic-resource-allocation/cel
at the harness's version, 1.34, which compiles only selectors, so what is priced is `(E) == W`:
E's own estimate plus a list comparison, an upper bound on E's), and the cost the evaluation ran
up per device, the largest over the machines' GPUs. The last rows find how many kinds of 16
GPUs fit, and how many nodes wired otherwise at the same keys (DGX H100 nodes with their NVLinks
down, each GPU keyed by UUID to no clique) fit beside 60 healthy ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.common import table
from parsers.links import SELF, Link, LinkKind
from reporter.collect import build_scanner
from reporter.schema import dra_template
from reporter.schema.dra_template import Machine, TemplateError
from reporter.schema.model import Topology
from tests.support.controlplane_fixtures import DRACEL_PROGRAM
from tests.support.dra_cel import evaluate, nvidia_attributes

NV12, SYS = Link(LinkKind.NV, 12), Link(LinkKind.SYS)


def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None
    return topology


def paired_kinds(count: int, gpus: int) -> list[Machine]:
    """`count` kinds of machine with products of their own, `gpus` GPUs each, NVLink in pairs."""
    base = scanned("dgx-2" if gpus == 16 else "pcie-8x-nvlink-pairs")
    links = tuple(
        tuple(SELF if a == b else NV12 if a // 2 == b // 2 else SYS for b in range(gpus))
        for a in range(gpus)
    )
    out = []
    for n in range(count):
        model = f"NVIDIA Kind{n:02d} GPU"
        topology = replace(
            base,
            gpus=tuple(
                replace(g, model=model, uuid=f"GPU-{n:08d}-0000-4000-8000-{g.index:012d}")
                for g in base.gpus[:gpus]
            ),
            links=links,
            pcie=None,
            nics=(),
            nvswitch=False,
        )
        out.append(Machine(f"kind-{n:02d}", (topology,)))
    return out


def numbered(topology: Topology, node: int) -> Topology:
    """The machine as one node of its kind: GPU UUIDs of its own."""
    gpus = tuple(
        replace(g, uuid=f"GPU-{node:08d}-0000-4000-8000-{g.index:012d}") for g in topology.gpus
    )
    return replace(topology, gpus=gpus)


def nodes_of(name: str, topology: Topology, first: int, count: int) -> Machine:
    """`count` nodes of one wiring, numbered from `first`, as the command groups them."""
    return Machine(
        name,
        tuple(numbered(topology, n) for n in range(first, first + count)),
        tuple(f"node-{n}" for n in range(first, first + count)),
    )


def nvlinks_down(topology: Topology) -> Topology:
    """The machine with its fabric manager stopped: every pair SYS."""
    n = len(topology.gpus)
    links = tuple(tuple(SELF if a == b else SYS for b in range(n)) for a in range(n))
    return replace(topology, links=links, nvswitch=False)


def with_down(healthy: int, down: int) -> list[Machine]:
    """DGX H100 nodes, `down` of them with their fabric manager stopped (every pair SYS)."""
    return [
        nodes_of("h100", scanned("dgx-h100"), 0, healthy),
        nodes_of("down", nvlinks_down(scanned("dgx-h100")), healthy, down),
    ]


def measure(
    binary: Path, label: str, machines: Sequence[Machine], k: int, uuids: bool
) -> list[str]:
    try:
        template = dra_template.build(machines, k, uuids_known=uuids)
    except TemplateError as e:
        size = re.search(r"is (\d+) bytes", str(e))
        return [
            label,
            str(k),
            f"refused: {int(size[1]):,} bytes" if size else "refused",
            "",
            "",
            "",
        ]
    devices = []
    for machine in machines:
        for topology in machine.topologies:
            for gpu in topology.gpus:
                by_uuid = f"uuid:{gpu.uuid}"
                ids = (
                    template.values.get(by_uuid, ())
                    if by_uuid in template.values
                    else (template.values.get(f"bus:{gpu.model}/{gpu.pci}", ()))
                )
                devices.append((nvidia_attributes(gpu), list(ids)))
    evaluation = evaluate(binary, template.expression, devices)
    assert all(ok and error is None for ok, error in evaluation.outcomes), label
    return [
        label,
        str(k),
        f"{len(template.expression.encode()):,}",
        f"{evaluation.cost:,}",
        f"{max(evaluation.costs):,}",
        f"{len(template.values)}",
    ]


def main() -> None:
    binary = DRACEL_PROGRAM.build()
    cases: list[tuple[str, list[Machine], int, bool]] = [
        ("dgx-h100 (8, NVSwitch)", [Machine("dgx-h100", (scanned("dgx-h100"),))], 8, False),
        ("pcie-8x-nvlink-pairs (8)", [Machine("p", (scanned("pcie-8x-nvlink-pairs"),))], 2, False),
        ("dgx-1-v100 (8, cube mesh)", [Machine("d", (scanned("dgx-1-v100"),))], 2, False),
        ("dgx-2 (16, NVSwitch)", [Machine("dgx-2", (scanned("dgx-2"),))], 16, False),
        ("16 GPUs in pairs", paired_kinds(1, 16), 2, False),
        ("20 kinds x 8 GPUs in pairs", paired_kinds(20, 8), 2, False),
        ("20 kinds x 16 GPUs in pairs", paired_kinds(20, 16), 2, False),
        ("26 kinds x 16 GPUs in pairs", paired_kinds(26, 16), 2, False),
        ("27 kinds x 16 GPUs in pairs", paired_kinds(27, 16), 2, False),
        ("30 DGX H100, 1 NVLinks down", with_down(29, 1), 2, True),
        ("60 DGX H100 + 26 NVLinks down", with_down(60, 26), 2, True),
        ("60 DGX H100 + 27 NVLinks down", with_down(60, 27), 2, True),
    ]
    rows = [measure(binary, label, m, k, u) for label, m, k, u in cases]
    print(
        table(
            ["machines", "k", "expression bytes", "estimated cost", "cost run up", "keys"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
