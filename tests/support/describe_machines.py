"""Machines for the `matrix` annotation tests: every profile, every paste, the widest generated."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from parsers.links import SELF, Link, LinkKind
from parsers.nvsmi import parse_topo
from reporter.collect import build_scanner, list_profiles
from reporter.schema.model import Gpu, Nic, NumaNode, Source, Topology
from reporter.schema.normalize import topology_from_matrix
from tests.golden import FIXTURES, body

NV12, PIX, NODE, SYS = (
    Link(LinkKind.NV, 12),
    Link(LinkKind.PIX),
    Link(LinkKind.NODE),
    Link(LinkKind.SYS),
)


def generated_16_gpus_12_nics() -> Topology:
    """The widest machine the annotation must show whole: 16 NVSwitch GPUs, 12 NICs, 2 sockets."""
    gpus = tuple(
        Gpu(
            i,
            model="NVIDIA H200",
            numa=frozenset({i // 8}),
            cpus=frozenset(range(56 * (i // 8), 56 * (i // 8) + 56))
            | frozenset(range(112 + 56 * (i // 8), 168 + 56 * (i // 8))),
        )
        for i in range(16)
    )
    links = tuple(tuple(SELF if a == b else NV12 for b in range(16)) for a in range(16))

    def path(nic: int, gpu: int) -> Link:
        if nic < 8 and gpu // 2 == nic:
            return PIX
        return NODE if (nic if nic < 8 else 2 * (nic - 8)) // 4 == gpu // 8 else SYS

    nics = tuple(
        Nic(f"mlx5_{k}", tuple(path(k, g) for g in range(16)), numa=frozenset({k // 4 % 2}))
        for k in range(12)
    )
    numa_nodes = (
        NumaNode(0, frozenset(range(56)) | frozenset(range(112, 168)), (10, 21)),
        NumaNode(1, frozenset(range(56, 112)) | frozenset(range(168, 224)), (21, 10)),
    )
    return Topology(
        Source.NVML, gpus, links, nics=nics, numa_nodes=numa_nodes, nvswitch=True, driver="570.1"
    )


@cache
def machines() -> dict[str, Topology]:
    """Every shipped profile (one simulated scan), every real paste, and the generated 16x12."""
    out: dict[str, Topology] = {}
    for profile in list_profiles():
        topology = build_scanner("auto", Path("/sys"), profile.name).scan().topology
        assert topology is not None
        out[f"profile {profile.name}"] = topology
    for path in sorted(FIXTURES.glob("*.txt")):
        if path.with_suffix(".golden.json").exists():  # the rocm-smi paste has none
            out[f"fixture {path.stem}"] = topology_from_matrix(parse_topo(body(path)))
    out["generated 16 GPUs 12 NICs"] = generated_16_gpus_12_nics()
    return out
