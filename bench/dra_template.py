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
GPUs fit, and how many UUID-keyed GPUs (nodes whose keys collide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.common import table
from parsers.links import SELF, Link, LinkKind
from reporter.collect import build_scanner
from reporter.schema import dra_template
from reporter.schema.dra_template import Machine, TemplateError
from reporter.schema.model import Topology
from tests.controlplane_fixtures import DRACEL_PROGRAM
from tests.dra_cel import evaluate, nvidia_attributes

NV12, SYS = Link(LinkKind.NV, 12), Link(LinkKind.SYS)


def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None
    return topology


def paired_kinds(count: int, gpus: int, *, uuids: bool = False) -> list[Machine]:
    """`count` kinds of machine with products of their own, `gpus` GPUs each, NVLink in pairs.
    `uuids`: one product for all, so every bus key collides and each GPU goes by its UUID."""
    base = scanned("dgx-2" if gpus == 16 else "pcie-8x-nvlink-pairs")
    links = tuple(
        tuple(SELF if a == b else NV12 if a // 2 == b // 2 else SYS for b in range(gpus))
        for a in range(gpus)
    )
    out = []
    for n in range(count):
        # Kinds that collide differ in wiring: each shifts its pairs by one GPU.
        shift = n % 2 if uuids else 0
        rewired = tuple(
            tuple(links[(a + shift) % gpus][(b + shift) % gpus] for b in range(gpus))
            for a in range(gpus)
        )
        model = "NVIDIA H100 NVL" if uuids else f"NVIDIA Kind{n:02d} GPU"
        topology = replace(
            base,
            gpus=tuple(
                replace(g, model=model, uuid=f"GPU-{n:08d}-0000-4000-8000-{g.index:012d}")
                for g in base.gpus[:gpus]
            ),
            links=rewired,
            pcie=None,
            nics=(),
            nvswitch=False,
        )
        out.append(Machine(f"kind-{n:02d}", (topology,)))
    return out


def measure(
    binary: Path, label: str, machines: Sequence[Machine], k: int, uuids: bool
) -> list[str]:
    try:
        template = dra_template.build(machines, k, uuids_known=uuids)
    except TemplateError as e:
        return [label, str(k), "refused", str(e).split(":")[0][:60], "", ""]
    devices = []
    for machine in machines:
        for gpu in machine.topologies[0].gpus:
            ids = template.values.get(f"uuid:{gpu.uuid}") or template.values.get(
                f"bus:{gpu.model}/{gpu.pci}", ()
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
        ("12 nodes x 16 GPUs by UUID", paired_kinds(12, 16, uuids=True), 2, True),
        ("13 nodes x 16 GPUs by UUID", paired_kinds(13, 16, uuids=True), 2, True),
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
