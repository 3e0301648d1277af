"""How long `best_gpu_set` takes, and where its search budget ends exactness.

    python bench/best_gpu_set.py            # prints three Markdown tables

1. Every policy on machines of 8 and 16 GPUs (`best` on 32 as well), for a range of k: median
   time, work units spent (`GpuSet.work`), and whether the answer is proven optimal
   (`GpuSet.exact`).
2. Random wiring (every pair a random NVLink count or PCIe class, which no real machine has:
   the search's worst case) for 16 to 48 GPUs: which (n, k) run out of the default budget
   (`DEFAULT_BUDGET` work units) and fall back to the best set known, marked not proven optimal.

Performance lives here, not in the test suite: tests check the answer, this measures the time.
Machines are built from their wiring so the script needs nothing but the package.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from math import comb

from parsers.links import SELF, Link, LinkKind
from reporter.placement import DEFAULT_BUDGET, GpuSet, Policy, best_gpu_set
from reporter.schema.model import Gpu, Nic, Source, Topology


def build(
    n: int,
    link: Callable[[int, int], Link],
    numa: Callable[[int], int],
    nics: int = 0,
    nic_link: Callable[[int, int], Link] | None = None,
) -> Topology:
    """A topology from functions of the GPU (and NIC) indices."""
    links = tuple(
        tuple(SELF if a == b else link(min(a, b), max(a, b)) for b in range(n)) for a in range(n)
    )
    return Topology(
        source=Source.NVIDIA_SMI,
        gpus=tuple(Gpu(index=i, numa=frozenset({numa(i)})) for i in range(n)),
        links=links,
        nics=tuple(
            Nic(name=f"mlx5_{k}", links=tuple(nic_link(k, g) for g in range(n)))  # type: ignore[misc]
            for k in range(nics)
        ),
    )


def pcie_tree(per_switch: int, per_socket: int) -> Callable[[int, int], Link]:
    """PIX under one switch, NODE within a socket, SYS across sockets."""

    def link(a: int, b: int) -> Link:
        if a // per_switch == b // per_switch:
            return Link(LinkKind.PIX)
        return Link(LinkKind.NODE if a // per_socket == b // per_socket else LinkKind.SYS)

    return link


def nvswitch(
    count: int, island: int, outside: Callable[[int, int], Link]
) -> Callable[[int, int], Link]:
    """NV<count> inside islands of `island` GPUs (one NVSwitch fabric each), `outside` between."""
    return lambda a, b: Link(LinkKind.NV, count) if a // island == b // island else outside(a, b)


def nic_near(gpus_per_nic: int, n_per_socket: int) -> Callable[[int, int], Link]:
    return lambda k, g: (
        Link(LinkKind.PXB)
        if g // gpus_per_nic == k
        else Link(
            LinkKind.NODE if g // n_per_socket == k * gpus_per_nic // n_per_socket else LinkKind.SYS
        )
    )


def random_machine(n: int, seed: int) -> Topology:
    rng = random.Random(seed)
    cells = [Link(LinkKind.NV, k) for k in (1, 2, 4, 6, 12, 18)] + [
        Link(k) for k in LinkKind if k not in (LinkKind.X, LinkKind.NV)
    ]
    table = {(a, b): rng.choice(cells) for a in range(n) for b in range(a + 1, n)}
    return build(
        n,
        lambda a, b: table[a, b],
        lambda i: rng.randrange(4),
        4,
        lambda k, g: Link(rng.choice(list(LinkKind)[2:])),
    )


# DGX-1 hybrid cube-mesh (V100): NV1/NV2 within each quad and to the same slot of the other quad.
_DGX1 = {
    (0, 1): 1,
    (0, 2): 1,
    (0, 3): 2,
    (0, 4): 2,
    (1, 2): 2,
    (1, 3): 1,
    (1, 5): 2,
    (2, 3): 2,
    (2, 6): 1,
    (3, 7): 1,
}
_DGX1 |= {(a + 4, b + 4): k for (a, b), k in list(_DGX1.items()) if b < 4}


def _dgx1(a: int, b: int) -> Link:
    if (a, b) in _DGX1:
        return Link(LinkKind.NV, _DGX1[a, b])
    return Link(LinkKind.NODE if a // 4 == b // 4 else LinkKind.SYS)


MACHINES: list[tuple[str, Topology]] = [
    (
        "8x DGX A100 (NVSwitch NV12, 4 NUMA, 4 NICs)",
        build(8, nvswitch(12, 8, pcie_tree(2, 4)), lambda i: i // 2, 4, nic_near(2, 4)),
    ),
    ("8x DGX-1 hybrid cube-mesh NV1/NV2", build(8, _dgx1, lambda i: i // 4, 4, nic_near(2, 4))),
    (
        "8x PCIe (PIX pairs, 2 sockets)",
        build(8, pcie_tree(2, 4), lambda i: i // 4, 2, nic_near(4, 4)),
    ),
    (
        "16x DGX-2 (NVSwitch NV6, 2 NUMA)",
        build(16, nvswitch(6, 16, pcie_tree(2, 8)), lambda i: i // 8, 8, nic_near(2, 8)),
    ),
    (
        "16x PCIe (4 switches, 2 sockets)",
        build(16, pcie_tree(4, 8), lambda i: i // 8, 4, nic_near(4, 8)),
    ),
    ("16x random links (seed 1)", random_machine(16, 1)),
    ("16x random links (seed 2)", random_machine(16, 2)),
    (
        "32x 4 NVSwitch islands of 8 (NV18)",
        build(32, nvswitch(18, 8, pcie_tree(4, 16)), lambda i: i // 8, 8, nic_near(4, 16)),
    ),
    (
        "32x PCIe (8 switches, 2 sockets)",
        build(32, pcie_tree(4, 16), lambda i: i // 16, 8, nic_near(4, 16)),
    ),
]


def timed(topology: Topology, k: int, policy: Policy, repeat: int) -> tuple[GpuSet, float]:
    """The answer and the median seconds over `repeat` runs."""
    times = []
    best = best_gpu_set(topology, k, policy=policy)
    for _ in range(repeat):
        start = time.perf_counter()
        best_gpu_set(topology, k, policy=policy)
        times.append(time.perf_counter() - start)
    return best, statistics.median(times)


def machines_table() -> None:
    print("| machine | GPUs | k | k-subsets | policy | set | median ms | work units | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, topology in MACHINES:
        n = len(topology.gpus)
        for k in sorted({1, 2, 4, n // 4, n // 2, 3 * n // 4, n - 1} - {0}):
            # NVIDIA's policy splits every GPU of the node: only 8 and 16 GPU machines, as real
            # nodes have; packing as well, for comparison.
            for policy in [Policy.BEST] + (
                [Policy.PACKING, Policy.NVIDIA_BESTEFFORT] if n <= 16 else []
            ):
                best, s = timed(topology, k, policy, repeat=3 if n <= 16 else 1)
                gpus = ",".join(map(str, best.gpus))
                print(
                    f"| {name} | {n} | {k} | {comb(n, k)} | {policy} | {gpus} | {s * 1000:.1f} "
                    f"| {best.work} | {'yes' if best.exact else '**no**'} |"
                )


def random_table() -> None:
    print(f"\nRandom wiring, default budget {DEFAULT_BUDGET} work units, policy best:\n")
    print("| GPUs | k exact (ms) | k not proven optimal (ms) |")
    print("|---|---|---|")
    for n in (16, 24, 32, 40, 48):
        topology = random_machine(n, 1)
        exact, inexact = [], []
        for k in range(2, n - 1, max(1, n // 8)):
            best, s = timed(topology, k, Policy.BEST, repeat=1)
            (exact if best.exact else inexact).append(f"{k} ({s * 1000:.0f})")
        print(f"| {n} | {', '.join(exact) or '-'} | {', '.join(inexact) or '-'} |")


def main() -> None:
    machines_table()
    random_table()


if __name__ == "__main__":
    main()
