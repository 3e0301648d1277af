"""Which k GPUs of a node are best connected, and how good they are: the scheduler's question.

A scheduler extender or a Volcano plugin decodes a node's topology annotation and asks
`best_gpu_set(topology, k, available)`; the `Score` it gets back ranks nodes against each other for
the same k. The scoring, closest first:

1. Link points, summed over every pair of chosen GPUs: `NV<n>` is worth 10·n (NV18 = 180, NV1 = 10),
   `PIX` 5, `PXB` 4, `PHB` 3, `NODE` 2, `SYS` 1. More bonded NVLinks score higher, any NVLink beats
   any PCIe path, and NVLink points grow with bandwidth (links × per-link bandwidth).
2. Ties: fewer NUMA nodes spanned (GPUs of unknown NUMA node count as one node together).
3. Ties: the closest RDMA NIC: for each NIC its path to the farthest chosen GPU; the best of those
   is worth the PCIe points above (`PIX` 5 … `SYS` 1); 0 when the node has no RDMA NIC.
4. Remaining ties: the lexicographically smallest GPU index tuple, so the answer is deterministic.

`Score` is `(links, -numa_nodes, nic)`: a tuple of ints that compares lexicographically, larger is
better. The search is exact (branch and bound over k-subsets, the same optimum an exhaustive search
finds); lost GPUs are never chosen.

It must never do I/O or import kubernetes: it reads only the `Topology` it is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from parsers.errors import excerpt
from parsers.links import Link, LinkKind
from reporter.errors import PlacementError
from reporter.schema.model import Topology

__all__ = ["NVLINK_POINTS", "PCIE_POINTS", "GpuSet", "Score", "best_gpu_set", "score_gpu_set"]

NVLINK_POINTS = 10
"""Points per bonded NVLink of a pair."""

PCIE_POINTS = {
    LinkKind.PIX: 5,
    LinkKind.PXB: 4,
    LinkKind.PHB: 3,
    LinkKind.NODE: 2,
    LinkKind.SYS: 1,
}
"""Points of a pair (or a NIC path) by PCIe path class."""

_BEST_NIC_POINTS = max(PCIE_POINTS.values())


class Score(NamedTuple):
    """How good a GPU set is; compares lexicographically, larger is better."""

    links: int
    """Link points summed over every pair of chosen GPUs."""
    numa: int
    """Minus the number of NUMA nodes the chosen GPUs span (-1 beats -2)."""
    nic: int
    """Points of the closest RDMA NIC's path to the farthest chosen GPU; 0 without NICs."""


@dataclass(frozen=True, slots=True)
class GpuSet:
    """A set of GPUs of one node, its score, and why it scores so."""

    gpus: tuple[int, ...]
    """GPU indices, ascending."""
    score: Score
    pairs: tuple[tuple[str, int], ...]
    """How many chosen pairs are joined by each path (`("NV12", 28)`), closest path first."""
    numa_nodes: tuple[int | None, ...]
    """The NUMA nodes the chosen GPUs belong to, ascending; None for an unknown one."""
    nic: str | None
    """The closest RDMA NIC (ties: the first in the topology), None when the node has none."""
    nic_link: Link | None
    """The closest NIC's path to the farthest chosen GPU."""

    @property
    def points_per_pair(self) -> float:
        """Link points divided by the number of pairs (0.0 for one GPU): comparable across k."""
        count = sum(n for _, n in self.pairs)
        return self.score.links / count if count else 0.0

    def explain(self) -> str:
        """Why this set scores as it does, in one line."""
        pairs = ", ".join(f"{n}x {token}" for token, n in self.pairs) or "no pairs"
        numa = ",".join("?" if n is None else str(n) for n in self.numa_nodes)
        plural = "s" if len(self.numa_nodes) != 1 else ""
        nic = (
            f"closest NIC {self.nic} ({self.nic_link} to the farthest GPU)"
            if self.nic
            else ("no RDMA NIC")
        )
        return f"pairs: {pairs}; NUMA node{plural} {numa}; {nic}"

    def to_document(self) -> dict[str, Any]:
        """The set as plain JSON-ready values (what `best-set --format json` prints)."""
        return {
            "gpus": list(self.gpus),
            "score": list(self.score),
            "points_per_pair": round(self.points_per_pair, 3),
            "pairs": dict(self.pairs),
            "numa_nodes": list(self.numa_nodes),
            "nic": self.nic,
            "nic_link": None if self.nic_link is None else self.nic_link.token,
        }


def pair_link(topology: Topology, a: int, b: int) -> Link:
    """The path joining GPUs a and b: the closer of the two matrix cells (either end may report)."""
    return min(topology.links[a][b], topology.links[b][a], key=lambda c: c.closeness)


def link_points(link: Link) -> int:
    """Points of one pair joined by `link` (see the module docstring)."""
    if link.is_nvlink:
        return NVLINK_POINTS * link.nvlinks
    return PCIE_POINTS[link.kind]


def score_gpu_set(topology: Topology, gpus: Iterable[int]) -> GpuSet:
    """Score a given set of GPUs (any order) on `topology`.

    Raises PlacementError for an empty set, a repeated or unknown index, or a lost GPU.
    """
    chosen = tuple(gpus)
    if not chosen:
        raise PlacementError("a GPU set needs at least one GPU")
    if len(set(chosen)) != len(chosen):
        raise PlacementError(f"GPU set {list(chosen)} names a GPU twice")
    _check_indices(topology, chosen, "GPU set")
    lost = [i for i in chosen if topology.gpus[i].lost]
    if lost:
        raise PlacementError(f"GPU {lost[0]} is lost (fell off the bus): it cannot be scheduled")
    chosen = tuple(sorted(chosen))
    pair_counts: Counter[Link] = Counter(
        pair_link(topology, a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]
    )
    homes = {topology.home_numa(i) for i in chosen}
    nic, nic_link = _closest_nic(topology, chosen)
    return GpuSet(
        gpus=chosen,
        score=Score(
            links=sum(link_points(link) * n for link, n in pair_counts.items()),
            numa=-len(homes),
            nic=0 if nic_link is None else PCIE_POINTS[nic_link.kind],
        ),
        pairs=tuple(
            (link.token, n) for link, n in sorted(pair_counts.items(), key=lambda p: p[0].closeness)
        ),
        numa_nodes=tuple(sorted(homes, key=lambda h: (h is None, h or 0))),
        nic=nic,
        nic_link=nic_link,
    )


def best_gpu_set(topology: Topology, k: int, available: Iterable[int] | None = None) -> GpuSet:
    """The k GPUs (out of `available`, default all) with the best score; exact, deterministic.

    Lost GPUs are never chosen. Raises PlacementError when k < 1, when an index in `available` is
    not a GPU of the topology, or when fewer than k usable GPUs are available.
    """
    if k < 1:
        raise PlacementError(f"asked for {k} GPUs: ask for at least 1")
    pool = sorted(set(range(len(topology.gpus)) if available is None else available))
    _check_indices(topology, pool, "available GPUs")
    candidates = [i for i in pool if not topology.gpus[i].lost]
    if k > len(candidates):
        lost = len(pool) - len(candidates)
        why = f" ({lost} of them lost)" if lost else ""
        raise PlacementError(
            f"asked for {k} GPUs but only {len(candidates)} of {len(pool)} available GPUs are "
            f"usable{why}: ask for fewer or free more"
        )
    return score_gpu_set(topology, _Search(topology, candidates, k).run())


def _check_indices(topology: Topology, indices: Sequence[int], what: str) -> None:
    n = len(topology.gpus)
    unknown = [
        i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n
    ]
    if unknown:
        has = f" (it has GPUs 0..{n - 1})" if n else ", which has no GPU"
        raise PlacementError(f"{what}: GPU {excerpt(unknown[0])} is not on this node{has}")


def _closest_nic(topology: Topology, chosen: Sequence[int]) -> tuple[str | None, Link | None]:
    best: tuple[str | None, Link | None] = (None, None)
    for nic in topology.nics:
        farthest = max((nic.links[i] for i in chosen), key=lambda c: c.closeness)
        if best[1] is None or farthest.closeness < best[1].closeness:
            best = (nic.name, farthest)
    return best


class _Search:
    """Branch and bound over k-subsets of the candidates, in lexicographic order.

    Subsets are visited in lexicographic order and only a strictly better score replaces the
    incumbent, so ties resolve to the lexicographically smallest set, as an exhaustive search
    with the same rule would. A subtree is cut when an upper bound of every component of the
    score of all its completions is no better than the incumbent.
    """

    def __init__(self, topology: Topology, candidates: list[int], k: int) -> None:
        self.candidates = candidates
        self.k = k
        m = len(candidates)
        self.weight = [
            [
                0 if a == b else link_points(pair_link(topology, ca, cb))
                for b, cb in enumerate(candidates)
            ]
            for a, ca in enumerate(candidates)
        ]
        # top[c][r]: the r largest pair points of candidate c: no r partners can give c more.
        self.top: list[list[int]] = []
        for a in range(m):
            row = sorted((self.weight[a][b] for b in range(m) if b != a), reverse=True)
            prefix = [0]
            for w in row:
                prefix.append(prefix[-1] + w)
            self.top.append(prefix)
        homes = [topology.home_numa(c) for c in candidates]
        ids = {h: i for i, h in enumerate(dict.fromkeys(homes))}
        self.home = [ids[h] for h in homes]
        self.nic_points = [
            [PCIE_POINTS[nic.links[c].kind] for c in candidates] for nic in topology.nics
        ]
        self.best: tuple[Score, tuple[int, ...]] | None = None
        # The state of the current branch, updated incrementally on the way down and back up.
        self.chosen: list[int] = []
        self.links = 0
        self.gain = [0] * m  # pair points of each candidate with the chosen GPUs
        self.homes_used = [0] * len(ids)
        self.spanned = 0
        self.nic_now = [_BEST_NIC_POINTS] * len(self.nic_points)  # per NIC: to the farthest chosen
        self.nic_stack: list[list[int]] = []

    def run(self) -> tuple[int, ...]:
        self._descend(0)
        assert self.best is not None  # k <= m, so at least one full set was reached
        return tuple(self.candidates[i] for i in self.best[1])

    def _descend(self, start: int) -> None:
        r = self.k - len(self.chosen)
        if r == 0:
            score = Score(self.links, -self.spanned, max(self.nic_now, default=0))
            if self.best is None or score > self.best[0]:
                self.best = (score, tuple(self.chosen))
            return
        if self.best is not None and self._bound(start, r) <= self.best[0]:
            return
        m = len(self.candidates)
        for c in range(start, m - r + 1):
            self._push(c)
            self._descend(c + 1)
            self._pop(c)

    def _push(self, c: int) -> None:
        self.chosen.append(c)
        self.links += self.gain[c]
        for x, w in enumerate(self.weight[c]):
            self.gain[x] += w
        self.homes_used[self.home[c]] += 1
        self.spanned += self.homes_used[self.home[c]] == 1
        self.nic_stack.append(self.nic_now)
        self.nic_now = [
            min(now, pts[c]) for now, pts in zip(self.nic_now, self.nic_points, strict=True)
        ]

    def _pop(self, c: int) -> None:
        self.nic_now = self.nic_stack.pop()
        self.spanned -= self.homes_used[self.home[c]] == 1
        self.homes_used[self.home[c]] -= 1
        for x, w in enumerate(self.weight[c]):
            self.gain[x] -= w
        self.links -= self.gain[c]
        self.chosen.pop()

    def _bound(self, start: int, r: int) -> Score:
        rest = range(start, len(self.candidates))
        gain, home, used = self.gain, self.home, self.homes_used
        # Each added GPU brings its pairs with the chosen ones, plus half of its pairs with the
        # other added ones, which are at most its r-1 best pairs: doubled to stay in integers.
        doubled = sorted((2 * gain[c] + self.top[c][r - 1] for c in rest), reverse=True)
        links_bound = self.links + sum(doubled[:r]) // 2
        # NUMA nodes: fill from nodes already spanned first, then from the fullest others.
        extra, need = 0, r - sum(1 for c in rest if used[home[c]])
        if need > 0:
            others = Counter(home[c] for c in rest if not used[home[c]])
            for size in sorted(others.values(), reverse=True):
                extra += 1
                need -= size
                if need <= 0:
                    break
        return Score(links_bound, -(self.spanned + extra), max(self.nic_now, default=0))
