"""`nvidia-besteffort` against go-gpuallocator itself: its own test cases, read from its test files
in the Go module cache, and its own code, built from the module cache
(tests/support/gpuallocator.py) and run on the same requests and on many more drawn from the shipped
machines.

The release is the one NVIDIA's k8s-device-plugin pins (reporter.gpuallocator.
GO_GPUALLOCATOR_VERSION). Go is needed, as for the PodResources proto test; without it these
tests fail with one line saying so.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from parsers.links import SELF, Link, LinkKind
from reporter.errors import PlacementError
from reporter.gpuallocator import NVLINK_POINTS, PCIE_POINTS, pair_points
from reporter.placement import Policy, best_gpu_set, pair_link
from reporter.schema.model import Gpu, Source, Topology
from tests.placement.test_best_set import SIMULATED
from tests.support import gpuallocator

NVIDIA = Policy.NVIDIA_BESTEFFORT

# go-gpuallocator's PCIe link types as the topology names their paths. P2PLinkSameBoard (NVML's
# INTERNAL) reads as PIX here: it appears in none of its test nodes.
PCIE_TOKENS = {
    "P2PLinkCrossCPU": "SYS",
    "P2PLinkSameCPU": "NODE",
    "P2PLinkHostBridge": "PHB",
    "P2PLinkMultiSwitch": "PXB",
    "P2PLinkSingleSwitch": "PIX",
}


@pytest.fixture(scope="module")
def module() -> Path:
    return gpuallocator.module_dir()


@dataclass(frozen=True, slots=True)
class GoTestNode:
    """One of go-gpuallocator's test machines (common_test.go): its directed links by type name."""

    name: str
    links: tuple[tuple[int, int, str], ...]

    @property
    def gpus(self) -> int:
        return 1 + max(max(a, b) for a, b, _ in self.links)

    def topology(self) -> Topology:
        """The machine as the topology describes it: NVLink counts over the PCIe paths."""
        n = self.gpus
        nvlinks: dict[tuple[int, int], int] = {}
        pcie: dict[tuple[int, int], str] = {}
        for a, b, kind in self.links:
            if "NVLINK" in kind:
                nvlinks[(a, b)] = gpuallocator.LINK_TYPES.index(kind) - 5
            else:
                pcie[(a, b)] = PCIE_TOKENS[kind]
        links = tuple(
            tuple(
                SELF
                if a == b
                else Link(LinkKind.NV, nvlinks[(a, b)])
                if (a, b) in nvlinks
                else Link(LinkKind(pcie[(a, b)]))
                for b in range(n)
            )
            for a in range(n)
        )
        paths = (
            tuple(
                tuple(SELF if a == b else Link(LinkKind(pcie[(a, b)])) for b in range(n))
                for a in range(n)
            )
            if len(pcie) == n * (n - 1)
            else None
        )
        # The 4x RTX 8000 gives its NVLink pairs no PCIe type: the topology then has no PCIe
        # matrix, as parsed `nvidia-smi topo -m` text has none, and those pairs score NVLink only.
        return Topology(
            source=Source.NVML,
            gpus=tuple(Gpu(index=i) for i in range(n)),
            links=links,
            pcie=paths,
        )

    def request_links(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((a, b, 1 + gpuallocator.LINK_TYPES.index(kind)) for a, b, kind in self.links)


def go_test_nodes(module: Path) -> dict[str, GoTestNode]:
    """Every `func NewXxxNode() TestNode` of common_test.go that builds a machine."""
    text = (module / "gpuallocator" / "common_test.go").read_text()
    nodes = {}
    for name, body in re.findall(
        r"^func (New\w+Node)\(\) TestNode \{\n(.*?)^\}", text, re.M | re.S
    ):
        links = tuple(
            (int(a), int(b), kind)
            for a, b, kind in re.findall(r"node\.AddLink\((\d+), (\d+), nvml\.(\w+)\)", body)
        )
        if links:
            nodes[name] = GoTestNode(name, links)
    return nodes


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


@dataclass(frozen=True, slots=True)
class Case:
    """One expectation of besteffort_test.go: a request and the GPUs it must answer (any order)."""

    description: str
    node: GoTestNode
    available: tuple[int, ...]
    required: tuple[int, ...]
    size: int
    result: tuple[int, ...]


def own_cases(module: Path) -> list[Case]:
    """TestBestEffortAllocate's table, and the TestBestEffort*Alloc* sequences, in which an
    Allocator hands out sets one after the other from the GPUs left (in index order)."""
    nodes = go_test_nodes(module)
    text = (module / "gpuallocator" / "besteffort_test.go").read_text()
    cases = []
    for name, body in re.findall(
        r"^func (Test\w+)\(t \*testing\.T\) \{\n(.*?)^\}", text, re.M | re.S
    ):
        node_name = re.search(r"devices := (New\w+Node)\(\)\.Devices\(\)", body)
        if node_name is None or node_name.group(1) not in nodes:
            continue
        node = nodes[node_name.group(1)]
        table = re.findall(
            r'\{\s*"([^"]+)",\s*devices,\s*\[\]int\{([^}]*)\},\s*\[\]int\{([^}]*)\},\s*(\d+),'
            r"\s*\[\]int\{([^}]*)\},\s*\}",
            body,
        )
        for description, available, required, size, result in table:
            cases.append(
                Case(
                    f"{name}: {description}",
                    node,
                    _ints(available),
                    _ints(required),
                    int(size),
                    _ints(result),
                )
            )
        if "RunAllocTests" in body:
            left = list(range(node.gpus))
            for step, (size, result) in enumerate(
                re.findall(r"\{(\d+), \[\]int\{([^}]*)\}\}", body), start=1
            ):
                got = _ints(result)
                cases.append(Case(f"{name} #{step}", node, tuple(left), (), int(size), got))
                left = [g for g in left if g not in got]
    return cases


def ours(case: Case) -> tuple[int, ...]:
    """What reporter's nvidia-besteffort answers; () where go-gpuallocator answers nothing."""
    try:
        chosen = best_gpu_set(
            case.node.topology(),
            case.size,
            case.available,
            must_include=case.required,
            policy=NVIDIA,
        )
    except PlacementError:
        return ()
    return chosen.gpus


def test_its_own_test_files_are_read_whole(module: Path) -> None:
    nodes = go_test_nodes(module)
    assert sorted(nodes) == ["New4xRTX8000Node", "NewDGX1PascalNode", "NewDGX1VoltaNode"]
    for node in nodes.values():  # every ordered pair has a PCIe type, an NVLink count or both
        linked = {(a, b) for a, b, _ in node.links}
        assert linked == set(itertools.permutations(range(node.gpus), 2)), node.name
    cases = own_cases(module)
    # 11 requests in TestBestEffortAllocate; 10, 19 and 19 allocations on the three machines.
    assert len([c for c in cases if c.description.startswith("TestBestEffortAllocate:")]) == 11
    assert len(cases) == 11 + 10 + 19 + 19


def test_our_points_are_go_gpuallocators(module: Path) -> None:
    text = (module / "gpuallocator" / "besteffort_policy.go").read_text()
    points = dict(re.findall(r"case nvml\.(\w+):\s*score \+= (\d+)", text))
    assert sorted(points) == sorted(gpuallocator.LINK_TYPES)
    for kind, token in PCIE_TOKENS.items():
        assert PCIE_POINTS[LinkKind(token)] == int(points[kind]), kind
    for n, kind in enumerate(gpuallocator.LINK_TYPES[6:], start=1):
        assert NVLINK_POINTS * n == int(points[kind]), kind
    assert gpuallocator.declared_link_types(module) == gpuallocator.LINK_TYPES
    # Each of its test machines scores the same pair by pair, read either way.
    for node in go_test_nodes(module).values():
        topology = node.topology()
        for a, b in itertools.combinations(range(node.gpus), 2):
            theirs = sum(int(points[t]) for x, y, t in node.links if (x, y) == (a, b))
            assert pair_points(topology, a, b) == theirs, (node.name, a, b)


def test_ours_answers_go_gpuallocators_own_cases(module: Path) -> None:
    for case in own_cases(module):
        assert sorted(ours(case)) == sorted(case.result), case.description


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpuallocator.build(tmp_path_factory.mktemp("gpuallocator"))


def test_its_own_code_answers_its_cases_as_ours_does(module: Path, runner: Path) -> None:
    cases = own_cases(module)
    theirs = gpuallocator.run(
        runner,
        [
            gpuallocator.Request(
                c.node.gpus, c.node.request_links(), c.available, c.required, c.size
            )
            for c in cases
        ],
    )
    for case, answer in zip(cases, theirs, strict=True):
        assert sorted(answer) == sorted(case.result) == sorted(ours(case)), case.description  # type: ignore[type-var]


def go_links(topology: Topology) -> tuple[tuple[int, int, int], ...]:
    """The links go-gpuallocator builds for a machine (both directions): its PCIe type, and an
    NVLink count unless the NVLinks go through NVSwitches, which it cannot see."""
    types = {token: 1 + gpuallocator.LINK_TYPES.index(kind) for kind, token in PCIE_TOKENS.items()}
    out = []
    for a, b in itertools.permutations(range(len(topology.gpus)), 2):
        assert topology.pcie is not None
        out.append((a, b, types[topology.pcie[a][b].token]))
        link = pair_link(topology, a, b)
        if link.is_nvlink and not topology.nvswitch:
            out.append((a, b, 6 + link.nvlinks))
    return tuple(out)


def drawn_requests(rng: random.Random) -> Iterator[tuple[Topology, gpuallocator.Request]]:
    """For every shipped machine of 8 GPUs or fewer, 12 free sets of every size, every k, the
    free GPUs in a random order, sometimes required GPUs; and every 5 free GPUs of a DGX A100 in
    index order asked for 3, where go-gpuallocator's padded answers are."""
    a100 = dict(SIMULATED)["simulated-dgx-a100"]
    for free in itertools.combinations(range(8), 5):
        yield a100, gpuallocator.Request(8, go_links(a100), free, (), 3)
    for _, topology in SIMULATED:
        n = len(topology.gpus)
        if topology.pcie is None or n > 8:
            continue
        links = go_links(topology)
        for size in range(1, n + 1):
            frees = list(itertools.combinations(range(n), size))
            for free in rng.sample(frees, min(len(frees), 12)):
                for k in range(1, size + 1):
                    order = rng.sample(free, size)
                    required = rng.sample(order, rng.randint(1, min(k, 2))) if k % 3 == 0 else []
                    yield topology, gpuallocator.Request(n, links, tuple(order), tuple(required), k)


def test_its_own_code_agrees_with_ours_on_the_shipped_machines(runner: Path) -> None:
    drawn = list(drawn_requests(random.Random(7)))
    theirs = gpuallocator.run(runner, [request for _, request in drawn])
    padded = 0
    for (topology, r), answer in zip(drawn, theirs, strict=True):
        if None in answer:
            padded += 1
            with pytest.raises(PlacementError, match="empty place"):
                best_gpu_set(topology, r.size, r.available, must_include=r.required, policy=NVIDIA)
            continue
        got = best_gpu_set(topology, r.size, r.available, must_include=r.required, policy=NVIDIA)
        assert got.gpus == tuple(sorted(answer)), r  # type: ignore[type-var]
    assert len(drawn) > 1000
    assert padded > 0  # the DGX A100's padded answers are among them
