"""Which k GPUs of a node are best connected, and how good they are: the scheduler's question.

A scheduler extender or a Volcano plugin decodes a node's topology annotation and asks
`best_gpu_set(topology, k, available)`; the `Score` it gets back ranks nodes against each other for
the same k. A device plugin answering the kubelet's GetPreferredAllocation passes `available` and
`must_include` exactly as the kubelet hands them. The scoring, closest first:

1. Link points, summed over every pair of chosen GPUs: `NV<n>` is worth 10·n (NV18 = 180, NV1 = 10),
   `PIX` 5, `PXB` 4, `PHB` 3, `NODE` 2, `SYS` 1. More bonded NVLinks score higher, any NVLink beats
   any PCIe path, and NVLink points grow with bandwidth (links × per-link bandwidth).
2. Ties: fewer NUMA nodes spanned (GPUs of unknown NUMA node count as one node together).
3. Ties: the closest RDMA NIC: for each NIC its path to the farthest chosen GPU; the best of those
   is worth the PCIe points above (`PIX` 5 … `SYS` 1); 0 when the node has no RDMA NIC.
4. Ties: the PCIe path beneath the pairs, when the topology knows it (`pcie`, as `nvidia-smi topo
   -mp` shows): the pairs' PCIe points summed. On a DGX-1 two NV1 pairs tie on links; the one
   sharing a PCIe switch (PIX) beats the one across the host bridge. 0 without a `pcie` matrix.
5. Remaining ties: the lexicographically smallest GPU index tuple, so the answer is deterministic.

`Score` is `(links, -numa_nodes, nic, pcie)`: a tuple of ints that compares lexicographically,
larger is better.

Three policies (`Policy`):
- `best` (the default): the best single set, as above.
- `packing`: keep the largest NVLink-connected sets whole for the pods that come next. Each free GPU
  has a reach: the size of the largest set of free GPUs, all pairwise NVLink-connected, that holds
  it (a clique of the free NVLink graph; 1 for a GPU without a free NVLink peer). A set's fit is
  the largest reach of its GPUs: the biggest connected set it cuts into. `packing` takes a fully
  connected set whenever one exists, of the smallest fit, then the best score as above; without
  one, the smallest fit, then the best score. A one-GPU pod on a workstation whose other two GPUs
  are an NVLink pair gets the lone GPU; a pair on a DGX-1 with one whole quad free and a loose pair
  gets the loose pair. The price: sometimes a set with fewer NVLinks than `best` would give.
- `nvidia-besteffort`: what NVIDIA's device plugin takes, go-gpuallocator's best-effort policy,
  re-implemented in `reporter.gpuallocator` (its own scores and order; the order of `available`
  decides its ties). The score returned is still this module's.

The search is bounded. Branch and bound (exact: the same optimum an exhaustive search finds)
runs under a budget of work units (`DEFAULT_BUDGET`; one unit is about one pair-weight operation),
seeded with a greedy-plus-local-search answer; the reach of each GPU (`packing`) is a budgeted
clique search too, falling back to the size of the GPU's free NVLink island. When the budget runs
out the best set known is returned with `GpuSet.exact = False`: a good answer, not proven optimal.
Real machines (NVSwitch islands, PCIe trees, the shipped fixtures and profiles) finish exactly far
below the budget; `bench/best_gpu_set.py` shows where exactness ends on random wiring. Lost GPUs
are never chosen.

It must never do I/O or import kubernetes: it reads only the `Topology` it is given.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, NamedTuple

from parsers.errors import excerpt
from parsers.links import Link
from reporter.errors import PlacementError
from reporter.gpuallocator import GO_GPUALLOCATOR_VERSION, BestEffort, pair_points_matrix
from reporter.schema.availability import NVLINK_POINTS, PCIE_POINTS
from reporter.schema.model import Topology

__all__ = [
    "DEFAULT_BUDGET",
    "NVLINK_POINTS",
    "PCIE_POINTS",
    "GpuSet",
    "Policy",
    "Score",
    "best_gpu_set",
    "nvlink_reach",
    "score_gpu_set",
]

_BEST_NIC_POINTS = max(PCIE_POINTS.values())

DEFAULT_BUDGET = 2_000_000
"""Work units one search may spend before it settles for the best set known: seconds of one core
at worst, and far more than a search over a real machine's GPUs spends (bench/README.md,
"`best_gpu_set`", has both figures)."""


class Policy(StrEnum):
    """How the set is chosen: see the module docstring."""

    BEST = "best"
    PACKING = "packing"
    NVIDIA_BESTEFFORT = "nvidia-besteffort"


class Score(NamedTuple):
    """How good a GPU set is; compares lexicographically, larger is better."""

    links: int
    """Link points summed over every pair of chosen GPUs."""
    numa: int
    """Minus the number of NUMA nodes the chosen GPUs span (-1 beats -2)."""
    nic: int
    """Points of the closest RDMA NIC's path to the farthest chosen GPU; 0 without NICs."""
    pcie: int = 0
    """PCIe points summed over the chosen pairs' `pcie` cells; 0 when the topology has none."""


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
    exact: bool = True
    """Proven optimal; False when the search budget ran out first (the best set known)."""
    work: int = field(default=0, compare=False)
    """Work units the search spent (0 for a set scored by `score_gpu_set`)."""

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
            "exact": self.exact,
        }


def pair_link(topology: Topology, a: int, b: int) -> Link:
    """The path joining GPUs a and b: the closer of the two matrix cells (either end may report)."""
    ab, ba = topology.links[a][b], topology.links[b][a]
    return ab if ab == ba else min(ab, ba, key=lambda c: c.closeness)


def link_points(link: Link) -> int:
    """Points of one pair joined by `link` (see the module docstring)."""
    if link.is_nvlink:
        return NVLINK_POINTS * link.nvlinks
    return PCIE_POINTS[link.kind]


def pcie_points(topology: Topology, a: int, b: int) -> int:
    """PCIe points of the path beneath the pair a, b; 0 when the topology has no `pcie` matrix."""
    if topology.pcie is None:
        return 0
    ab, ba = topology.pcie[a][b], topology.pcie[b][a]
    return PCIE_POINTS[(ab if ab == ba else min(ab, ba, key=lambda c: c.closeness)).kind]


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
    _check_not_lost(topology, chosen)
    chosen = tuple(sorted(chosen))
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    pair_counts: Counter[Link] = Counter(pair_link(topology, a, b) for a, b in pairs)
    homes = {topology.home_numa(i) for i in chosen}
    nic, nic_link = _closest_nic(topology, chosen)
    return GpuSet(
        gpus=chosen,
        score=Score(
            links=sum(link_points(link) * n for link, n in pair_counts.items()),
            numa=-len(homes),
            nic=0 if nic_link is None else PCIE_POINTS[nic_link.kind],
            pcie=sum(pcie_points(topology, a, b) for a, b in pairs),
        ),
        pairs=tuple(
            (link.token, n) for link, n in sorted(pair_counts.items(), key=lambda p: p[0].closeness)
        ),
        numa_nodes=tuple(sorted(homes, key=lambda h: (h is None, h or 0))),
        nic=nic,
        nic_link=nic_link,
    )


def best_gpu_set(
    topology: Topology,
    k: int,
    available: Iterable[int] | None = None,
    *,
    must_include: Iterable[int] = (),
    policy: Policy = Policy.BEST,
    budget: int = DEFAULT_BUDGET,
) -> GpuSet:
    """The k GPUs (out of `available`, default all, holding every GPU of `must_include`) chosen by
    `policy`; deterministic, and exact unless `budget` work units run out (`GpuSet.exact`).

    Lost GPUs are never chosen. Raises PlacementError when k < 1, when an index in `available` or
    `must_include` is not a GPU of the topology, when a must-include GPU is lost, not available or
    more than k of them are named, or when fewer than k usable GPUs are available.
    """
    if k < 1:
        raise PlacementError(f"asked for {k} GPUs: ask for at least 1")
    if budget < 1:
        raise PlacementError(f"a search budget of {budget} work units: give at least 1")
    try:
        policy = Policy(policy)
    except ValueError:
        names = ", ".join(Policy)
        raise PlacementError(f"policy {str(policy)[:32]!r} is not one of: {names}") from None
    given = list(range(len(topology.gpus)) if available is None else available)
    pool = sorted(set(given))
    _check_indices(topology, pool, "available GPUs")
    required = list(dict.fromkeys(must_include))
    must = sorted(required)
    _check_indices(topology, must, "must-include GPUs")
    missing = [i for i in must if i not in set(pool)]
    if missing:
        raise PlacementError(
            f"must-include GPU {missing[0]} is not among the available GPUs: add it to them"
        )
    _check_not_lost(topology, must)
    if len(must) > k:
        raise PlacementError(
            f"{len(must)} must-include GPUs do not fit in a set of {k}: "
            f"ask for at least {len(must)}"
        )
    candidates = [i for i in pool if not topology.gpus[i].lost]
    if k > len(candidates):
        lost = len(pool) - len(candidates)
        why = f" ({lost} of them lost)" if lost else ""
        raise PlacementError(
            f"asked for {k} GPUs but only {len(candidates)} of {len(pool)} available GPUs are "
            f"usable{why}: ask for fewer or free more"
        )
    spent = _Budget(budget)
    if policy is Policy.NVIDIA_BESTEFFORT:
        order = [i for i in dict.fromkeys(given) if not topology.gpus[i].lost]
        gpus, exact = _nvidia_besteffort(topology, order, required, k, spent)
        best = score_gpu_set(topology, gpus)
        return replace(best, exact=exact, work=spent.spent)
    weights = _Weights.of(topology, candidates)
    must_pos = [candidates.index(i) for i in must]
    if policy is Policy.PACKING:
        positions, exact = _pack(weights, k, must_pos, spent)
    else:
        positions, exact = _Search(weights, k, must_pos, spent).run()
    best = score_gpu_set(topology, (candidates[i] for i in positions))
    return replace(best, exact=exact, work=spent.spent)


def _nvidia_besteffort(
    topology: Topology, order: list[int], required: list[int], k: int, spent: _Budget
) -> tuple[tuple[int, ...], bool]:
    """go-gpuallocator's answer (reporter.gpuallocator); raises PlacementError where it answers
    a set with empty places, which NVIDIA's device plugin cannot hand out."""
    search = BestEffort(pair_points_matrix(topology), order, required, k, spent.spend)
    with contextlib.suppress(_BudgetSpentError):
        search.run()
    answer = search.answer()
    if answer.padded:
        held = ",".join(map(str, sorted(answer.gpus)))
        raise PlacementError(
            f"nvidia-besteffort: go-gpuallocator {GO_GPUALLOCATOR_VERSION} answers GPUs {held} "
            f"and {k - len(answer.gpus)} empty place(s) for {k} GPUs here, which NVIDIA's device "
            "plugin cannot hand out (it fails the request)"
        )
    assert len(answer.gpus) == k  # best_gpu_set checked everything go-gpuallocator refuses
    return answer.gpus, answer.exact


def nvlink_reach(
    topology: Topology, free: Iterable[int], *, budget: int = DEFAULT_BUDGET
) -> tuple[dict[int, int], bool]:
    """Per free GPU (lost ones dropped), its reach: the size of the largest set of free GPUs, all
    pairwise NVLink-connected, that holds it; and whether every reach is exact (where `budget`
    runs out, the GPU's free NVLink island size stands in, which is never smaller).

    Raises PlacementError for an index that is not a GPU of the topology.
    """
    pool = sorted(set(free))
    _check_indices(topology, pool, "free GPUs")
    usable = [i for i in pool if not topology.gpus[i].lost]
    reach, exact = _reach(_nvlinked(_Weights.of(topology, usable)), _Budget(max(budget, 1)))
    return dict(zip(usable, reach, strict=True)), exact


def _check_indices(topology: Topology, indices: Sequence[int], what: str) -> None:
    n = len(topology.gpus)
    unknown = [
        i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n
    ]
    if unknown:
        has = f" (it has GPUs 0..{n - 1})" if n else ", which has no GPU"
        raise PlacementError(f"{what}: GPU {excerpt(unknown[0])} is not on this node{has}")


def _check_not_lost(topology: Topology, indices: Sequence[int]) -> None:
    lost = [i for i in indices if topology.gpus[i].lost]
    if lost:
        raise PlacementError(f"GPU {lost[0]} is lost (fell off the bus): it cannot be scheduled")


def _closest_nic(topology: Topology, chosen: Sequence[int]) -> tuple[str | None, Link | None]:
    best: tuple[str | None, Link | None] = (None, None)
    for nic in topology.nics:
        farthest = max((nic.links[i] for i in chosen), key=lambda c: c.closeness)
        if best[1] is None or farthest.closeness < best[1].closeness:
            best = (nic.name, farthest)
    return best


_SMALL_TREE = 1000
"""Below this many k-subsets the search runs without a heuristic seed: the seed would cost more
than it saves."""


class _BudgetSpentError(Exception):
    """The search spent its budget: unwind and settle for the best set known."""


class _Budget:
    """Work units left to a search; shared by the searches of one request."""

    def __init__(self, units: int) -> None:
        self.units = units
        self.left = units

    @property
    def spent(self) -> int:
        """Units spent so far (the last step may overrun the budget by its own cost)."""
        return self.units - self.left

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise _BudgetSpentError


def _top_prefix(rows: list[list[int]]) -> list[list[int]]:
    """prefix[c][r]: the sum of the r largest pair weights of c: no r partners give c more."""
    out = []
    for a, row in enumerate(rows):
        ordered = sorted((w for b, w in enumerate(row) if b != a), reverse=True)
        prefix = [0]
        for w in ordered:
            prefix.append(prefix[-1] + w)
        out.append(prefix)
    return out


class _Weights:
    """Everything the searches read, by candidate position (0..m-1) rather than GPU index."""

    def __init__(
        self,
        links: list[list[int]],
        pcie: list[list[int]],
        home: list[int],
        nic_points: list[list[int]],
    ) -> None:
        self.m = len(links)
        self.links = links
        self.pcie = pcie
        self.top_links = _top_prefix(links)
        self.top_pcie = _top_prefix(pcie)
        self.home = home
        self.homes = len(set(home))
        self.nic_points = nic_points
        self.has_pcie = any(any(row) for row in pcie)
        """False without a `pcie` matrix: the searches then skip the (all-zero) PCIe points."""

    @classmethod
    def of(cls, topology: Topology, candidates: list[int]) -> _Weights:
        """The weights of `candidates` (GPU indexes) on `topology`."""
        homes = [topology.home_numa(c) for c in candidates]
        ids = {h: i for i, h in enumerate(dict.fromkeys(homes))}
        m = len(candidates)
        links = [[0] * m for _ in range(m)]
        pcie = [[0] * m for _ in range(m)]
        for a, ca in enumerate(candidates):
            for b in range(a + 1, m):
                cb = candidates[b]
                links[a][b] = links[b][a] = link_points(pair_link(topology, ca, cb))
                pcie[a][b] = pcie[b][a] = pcie_points(topology, ca, cb)
        return cls(
            links=links,
            pcie=pcie,
            home=[ids[h] for h in homes],
            nic_points=[
                [PCIE_POINTS[nic.links[c].kind] for c in candidates] for nic in topology.nics
            ],
        )

    def subset(self, positions: list[int]) -> _Weights:
        """The weights of some of the candidates, renumbered 0..len(positions)-1."""
        ids = {h: i for i, h in enumerate(dict.fromkeys(self.home[p] for p in positions))}
        return _Weights(
            links=[[self.links[a][b] for b in positions] for a in positions],
            pcie=[[self.pcie[a][b] for b in positions] for a in positions],
            home=[ids[self.home[p]] for p in positions],
            nic_points=[[pts[p] for p in positions] for pts in self.nic_points],
        )

    def penalised(self, adjacent: Sequence[int]) -> _Weights:
        """These weights with every pair not joined by NVLink worth less than all the linked
        pairs of any set together: the best set is then connected whenever a connected set
        exists."""
        penalty = 1 + sum(max(v, 0) for row in self.links for v in row)
        return _Weights(
            links=[
                [v if adjacent[a] >> b & 1 or a == b else -penalty for b, v in enumerate(row)]
                for a, row in enumerate(self.links)
            ],
            pcie=self.pcie,
            home=self.home,
            nic_points=self.nic_points,
        )

    def score(self, chosen: Sequence[int]) -> Score:
        """The score of a set of candidate positions (what score_gpu_set gives, without text)."""
        pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
        return Score(
            links=sum(self.links[a][b] for a, b in pairs),
            numa=-len({self.home[c] for c in chosen}),
            nic=max((min(pts[c] for c in chosen) for pts in self.nic_points), default=0),
            pcie=sum(self.pcie[a][b] for a, b in pairs),
        )


class _Search:
    """The best single k-set: a heuristic answer first, then budgeted branch and bound.

    Branch and bound visits the k-subsets holding the must-include GPUs in lexicographic order and
    only a strictly better score replaces its incumbent, so ties resolve to the lexicographically
    smallest set, as an exhaustive search with the same rule would. The heuristic's score is only a
    threshold: a subtree whose upper bound (every component of the score, over all completions) is
    below it is cut, and the first set reaching it is taken, so seeding never changes the answer.
    """

    def __init__(self, w: _Weights, k: int, must: list[int], budget: _Budget) -> None:
        self.w = w
        self.k = k
        self.must = must
        self.budget = budget
        must_set = set(must)
        self.rest = [c for c in range(w.m) if c not in must_set]
        self.best: tuple[Score, tuple[int, ...]] | None = None
        self.threshold: Score | None = None
        # The state of the current branch, updated incrementally on the way down and back up.
        self.chosen: list[int] = []
        self.links = 0
        self.pcie = 0
        self.gain = [0] * w.m  # link points of each candidate with the chosen GPUs
        self.pcie_gain = [0] * w.m
        self.homes_used = [0] * w.homes
        self.spanned = 0
        self.nic_now = [_BEST_NIC_POINTS] * len(w.nic_points)  # per NIC: to the farthest chosen
        self.nic_stack: list[list[int]] = []

    def run(self) -> tuple[tuple[int, ...], bool]:
        """The chosen candidate positions, ascending, and whether they are proven optimal."""
        for c in self.must:
            self._push(c)
        heuristic: tuple[Score, tuple[int, ...]] | None = None
        try:
            # A tree small enough to walk whole needs no seed (a real 8-GPU node's never does).
            if math.comb(len(self.rest), self.k - len(self.must)) > _SMALL_TREE:
                heuristic = self._heuristic()
                self.threshold = heuristic[0]
            self._descend(0)
        except _BudgetSpentError:
            found = [x for x in (self.best, heuristic) if x is not None]
            if not found:  # the budget ran out before even the greedy set: take the first k
                return self._first(), False
            score = max(s for s, _ in found)
            return min(gpus for s, gpus in found if s == score), False
        assert self.best is not None  # the heuristic's set, if any, reaches the threshold
        return self.best[1], True

    def greedy(self) -> tuple[int, ...]:
        """The heuristic's set alone (no proof); the first k candidates if the budget runs out."""
        try:
            return self._heuristic()[1]
        except _BudgetSpentError:
            return self._first()

    def _first(self) -> tuple[int, ...]:
        return tuple(sorted([*self.must, *self.rest[: self.k - len(self.must)]]))

    def _descend(self, start: int) -> None:
        self.budget.spend(self.w.m)
        r = self.k - len(self.chosen)
        if r == 0:
            score = Score(self.links, -self.spanned, max(self.nic_now, default=0), self.pcie)
            if self.best is None:
                if self.threshold is None or score >= self.threshold:
                    self.best = (score, tuple(sorted(self.chosen)))
            elif score > self.best[0]:
                self.best = (score, tuple(sorted(self.chosen)))
            return
        bound = self._bound(start, r)
        if self.best is not None:
            if bound <= self.best[0]:
                return
        elif self.threshold is not None and bound < self.threshold:
            return
        for i in range(start, len(self.rest) - r + 1):
            c = self.rest[i]
            self._push(c)
            self._descend(i + 1)
            self._pop(c)

    def _push(self, c: int) -> None:
        w = self.w
        self.chosen.append(c)
        self.links += self.gain[c]
        self.gain = [g + lw for g, lw in zip(self.gain, w.links[c], strict=True)]
        if w.has_pcie:
            self.pcie += self.pcie_gain[c]
            self.pcie_gain = [g + pw for g, pw in zip(self.pcie_gain, w.pcie[c], strict=True)]
        self.homes_used[w.home[c]] += 1
        self.spanned += self.homes_used[w.home[c]] == 1
        self.nic_stack.append(self.nic_now)
        self.nic_now = [
            min(now, pts[c]) for now, pts in zip(self.nic_now, w.nic_points, strict=True)
        ]

    def _pop(self, c: int) -> None:
        w = self.w
        self.nic_now = self.nic_stack.pop()
        self.spanned -= self.homes_used[w.home[c]] == 1
        self.homes_used[w.home[c]] -= 1
        self.gain = [g - lw for g, lw in zip(self.gain, w.links[c], strict=True)]
        self.links -= self.gain[c]
        if w.has_pcie:
            self.pcie_gain = [g - pw for g, pw in zip(self.pcie_gain, w.pcie[c], strict=True)]
            self.pcie -= self.pcie_gain[c]
        self.chosen.pop()

    def _bound(self, start: int, r: int) -> Score:
        rest = self.rest[start:]
        w, used = self.w, self.homes_used
        # Each added GPU brings its pairs with the chosen ones, plus half of its pairs with the
        # other added ones, which are at most its r-1 best pairs: doubled to stay in integers.
        doubled = sorted((2 * self.gain[c] + w.top_links[c][r - 1] for c in rest), reverse=True)
        links_bound = self.links + sum(doubled[:r]) // 2
        pcie_bound = 0
        if w.has_pcie:
            doubled = sorted(
                (2 * self.pcie_gain[c] + w.top_pcie[c][r - 1] for c in rest), reverse=True
            )
            pcie_bound = self.pcie + sum(doubled[:r]) // 2
        # NUMA nodes: fill from nodes already spanned first, then from the fullest others.
        extra, need = 0, r - sum(1 for c in rest if used[w.home[c]])
        if need > 0:
            others = Counter(w.home[c] for c in rest if not used[w.home[c]])
            for size in sorted(others.values(), reverse=True):
                extra += 1
                need -= size
                if need <= 0:
                    break
        return Score(links_bound, -(self.spanned + extra), max(self.nic_now, default=0), pcie_bound)

    def _heuristic(self) -> tuple[Score, tuple[int, ...]]:
        """Greedy growth from a few seeds, then one-for-one swaps while the score improves."""
        w, k = self.w, self.k
        seeds: list[list[int]] = [list(self.must)] if self.must else [[c] for c in self.rest]
        # The seeds most likely to grow a good set first: the best connected candidates.
        seeds.sort(key=lambda s: -sum(w.top_links[c][min(k - 1, w.m - 1)] for c in s))
        best: tuple[Score, tuple[int, ...]] | None = None
        for seed in seeds[: max(1, 8 if w.m > 16 else w.m)]:
            chosen = self._grow(seed)
            found = (w.score(chosen), tuple(sorted(chosen)))
            if best is None or found[0] > best[0] or (found[0] == best[0] and found[1] < best[1]):
                best = found
        assert best is not None
        return self._improve(best)

    def _grow(self, seed: list[int]) -> list[int]:
        w = self.w
        chosen = list(seed)
        gain = [sum(w.links[x][c] for c in chosen) for x in range(w.m)]
        homes = {w.home[c] for c in chosen}
        while len(chosen) < self.k:
            self.budget.spend(w.m)
            taken = set(chosen)
            pick = max(
                (c for c in self.rest if c not in taken),
                key=lambda c: (gain[c], w.home[c] in homes, -c),
            )
            chosen.append(pick)
            homes.add(w.home[pick])
            for x in range(w.m):
                gain[x] += w.links[pick][x]
        return chosen

    def _improve(self, start: tuple[Score, tuple[int, ...]]) -> tuple[Score, tuple[int, ...]]:
        w = self.w
        score, chosen = start
        must = set(self.must)
        improved = True
        while improved:
            improved = False
            members = set(chosen)
            gain = [sum(w.links[x][c] for c in chosen) for x in range(w.m)]
            for out in (c for c in chosen if c not in must):
                for into in (c for c in self.rest if c not in members):
                    self.budget.spend(1)
                    links = score.links - gain[out] + gain[into] - w.links[out][into]
                    if links < score.links:
                        continue
                    self.budget.spend(self.k)
                    trial = tuple(sorted([c for c in chosen if c != out] + [into]))
                    trial_score = w.score(trial)
                    if trial_score > score:
                        score, chosen, improved = trial_score, trial, True
                        break
                if improved:
                    break
        return score, chosen


def _nvlinked(w: _Weights) -> list[int]:
    """Per candidate, a bit mask of the candidates it shares an NVLink with."""
    return [
        sum(1 << b for b in range(w.m) if b != a and w.links[a][b] >= NVLINK_POINTS)
        for a in range(w.m)
    ]


def _largest_clique(within: int, adjacent: Sequence[int], budget: _Budget) -> int:
    """The size of the largest set of candidates in the mask `within`, pairwise adjacent.

    Branch and bound in candidate order: each clique is grown from its lowest member, and a branch
    whose members plus everything still addable cannot beat the best is cut.
    """
    best = 0

    def grow(size: int, rest: int) -> None:
        nonlocal best
        budget.spend(1)
        if not rest:
            best = max(best, size)
            return
        while rest:
            if size + rest.bit_count() <= best:
                return
            low = rest & -rest
            rest ^= low
            grow(size + 1, rest & adjacent[low.bit_length() - 1])

    grow(0, within)
    return best


def _islands(adjacent: Sequence[int]) -> list[int]:
    """Per candidate, the size of its free NVLink island (connected component), itself included."""
    sizes = [0] * len(adjacent)
    for start in range(len(adjacent)):
        if sizes[start]:
            continue
        seen, frontier = 1 << start, 1 << start
        while frontier:
            low = frontier & -frontier
            frontier ^= low
            new = adjacent[low.bit_length() - 1] & ~seen
            seen |= new
            frontier |= new
        for member in range(len(adjacent)):
            if seen >> member & 1:
                sizes[member] = seen.bit_count()
    return sizes


def _reach(adjacent: Sequence[int], budget: _Budget) -> tuple[list[int], bool]:
    """Per candidate, the largest NVLink-connected set of candidates holding it (see the module
    docstring), and whether that is exact: where the budget runs out, each candidate's island
    size, which is never smaller, stands in."""
    try:
        return [1 + _largest_clique(peers, adjacent, budget) for peers in adjacent], True
    except _BudgetSpentError:
        return _islands(adjacent), False


def _all_linked(chosen: Sequence[int], adjacent: Sequence[int]) -> bool:
    return all(adjacent[a] >> b & 1 for i, a in enumerate(chosen) for b in chosen[i + 1 :])


def _pack(w: _Weights, k: int, must: list[int], budget: _Budget) -> tuple[tuple[int, ...], bool]:
    """The `packing` policy: a connected set of the smallest fit, then the best score; without a
    connected set, the smallest fit, then the best score (see the module docstring).

    Candidates are admitted by reach, smallest first: the first pool holding a connected k-set
    (searched with every unlinked pair made worse than any linked set could make up) gives a set
    whose fit is that pool's reach, and no smaller fit exists.
    """
    adjacent = _nvlinked(w)
    share = _Budget(max(budget.left // 4, 1))
    reach, exact = _reach(adjacent, share)
    budget.left -= share.spent
    floor = max((reach[c] for c in must), default=1)
    levels = sorted({r for r in reach if r >= floor})
    wanted = set(must)
    pools = [
        pool
        for pool in (
            [c for c in range(w.m) if reach[c] <= level or c in wanted] for level in levels
        )
        if len(pool) >= k
    ]
    linked_only = w.penalised(adjacent)
    for pool in pools:
        found, found_exact = _Search(
            linked_only.subset(pool), k, [pool.index(c) for c in must], budget
        ).run()
        chosen = tuple(pool[i] for i in found)
        if _all_linked(chosen, adjacent):
            return chosen, exact and found_exact
    # No connected set: the smallest fit, then the best score.
    pool = pools[0]
    found, found_exact = _Search(w.subset(pool), k, [pool.index(c) for c in must], budget).run()
    return tuple(pool[i] for i in found), exact and found_exact
