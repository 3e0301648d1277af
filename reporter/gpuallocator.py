"""NVIDIA's best-effort GPU choice, re-implemented: what the device plugin will take on a node.

On a real node the GPUs a pod gets are chosen by the device plugin's GetPreferredAllocation, and
NVIDIA's k8s-device-plugin answers it with go-gpuallocator's best-effort policy
(`gpuallocator/besteffort_policy.go` of go-gpuallocator v0.6.0, the version the plugin pins). The
cluster simulation and the availability annotation need to know what that policy will take, so it
is re-implemented here decision for decision, and checked against go-gpuallocator's own test cases
and its own code (`tests/placement/test_gpuallocator.py`).

How it decides:
- Pair points, as go-gpuallocator sees the machine through NVML: 100 per NVLink joining the two
  GPUs, plus their PCIe path (`GetTopologyCommonAncestor`): PIX 50 (NVML's SINGLE; its INTERNAL,
  two GPUs on one board, scores 60 there but reads as PIX in the topology), PXB 40, PHB 30, NODE
  20, SYS 10. Through an NVSwitch, NVML names the switch and not the peer GPU as the far end of
  each NVLink, and go-gpuallocator counts no NVLink at all (its source leaves NVSwitch semantics
  as a to-do): on an NVSwitch machine only the PCIe points remain. Where the topology does not
  know the PCIe path beneath an NVLink (parsed `nvidia-smi topo -m` text), that part is 0.
- The available GPUs, padded with empty places to a multiple of k, are split into sets of k in
  go-gpuallocator's order (the first GPU left starts a set, its partners in combination order of
  the list; a set holds no empty place or all of them); the split with the most points summed
  (the padded set's own pairs count too) wins, the first in that order on a tie. It must hold a
  set with every required GPU and no empty place.
- Of that split, the set with the most points among those holding the required GPUs is returned,
  the first on a tie. k = 1: the first available GPU that is the required one, if any.

The order of `available` decides every tie, as in go-gpuallocator; the kubelet passes the device
IDs in Go map order (`sets.Set.UnsortedList`), so on a real node ties fall at random.

One answer of go-gpuallocator is not a GPU set: where no GPU is required, the split is padded and
its padded set scores highest, it returns that set, empty places included (a DGX A100 with GPUs
0, 2, 4, 5 and 6 free, k = 3: GPUs 4 and 5 and an empty place). The device plugin then reads the
UUID of an empty place and fails the request. `Answer.padded` says so.

It must never do I/O: it reads only the Topology and the numbers it is given.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parsers.links import Link, LinkKind
from reporter.schema.model import Topology

__all__ = [
    "GO_GPUALLOCATOR_VERSION",
    "Answer",
    "BestEffort",
    "pair_points",
    "pair_points_matrix",
]

GO_GPUALLOCATOR_VERSION = "v0.6.0"
"""The go-gpuallocator release re-implemented here: the one NVIDIA's k8s-device-plugin pins."""

NVLINK_POINTS = 100
"""Points per NVLink of a pair (go-gpuallocator: SingleNVLINKLink 100 ... EighteenNVLINKLinks
1800)."""

PCIE_POINTS = {
    LinkKind.PIX: 50,
    LinkKind.PXB: 40,
    LinkKind.PHB: 30,
    LinkKind.NODE: 20,
    LinkKind.SYS: 10,
}
"""Points of a pair's PCIe path (go-gpuallocator: P2PLinkSingleSwitch 50, MultiSwitch 40,
HostBridge 30, SameCPU 20, CrossCPU 10)."""

_SMALL_TREE = 1000
"""Below this many splits the search runs without a greedy seed, as in reporter.placement."""


def _closer(ab: Link, ba: Link) -> Link:
    return ab if ab == ba else min(ab, ba, key=lambda c: c.closeness)


def pair_points(topology: Topology, a: int, b: int) -> int:
    """Points of the pair a, b as go-gpuallocator scores it (see the module docstring)."""
    link = _closer(topology.links[a][b], topology.links[b][a])
    points = 0
    if link.is_nvlink and not topology.nvswitch:
        points += NVLINK_POINTS * link.nvlinks
    if topology.pcie is not None:
        points += PCIE_POINTS[_closer(topology.pcie[a][b], topology.pcie[b][a]).kind]
    elif not link.is_nvlink:
        points += PCIE_POINTS[link.kind]
    return points


def pair_points_matrix(topology: Topology) -> list[list[int]]:
    """points[a][b] for every pair of the topology's GPUs (0 on the diagonal)."""
    n = len(topology.gpus)
    out = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            out[a][b] = out[b][a] = pair_points(topology, a, b)
    return out


@dataclass(frozen=True, slots=True)
class Answer:
    """What go-gpuallocator's Allocate returns."""

    gpus: tuple[int, ...]
    """The GPU indexes it returned, in its order, without empty places; () when it returns none."""
    padded: bool = False
    """It returned a set with empty places (see the module docstring): the device plugin fails."""
    exact: bool = True
    """False when the search budget ran out first: the best split found, not proven the first
    best."""


Split = list[tuple[int | None, ...]]


class BestEffort:
    """go-gpuallocator's `bestEffortPolicy.Allocate` on a pair-points matrix (GPU indexes).

    `spend(units)` is called as the search works and may raise to stop it; `answer()` then gives
    the best split found so far (or a greedy one), with `exact` False. The search is branch and
    bound in go-gpuallocator's own order: a subtree is cut only when it cannot beat the incumbent
    strictly, so the first best split in that order is the one kept, as go-gpuallocator keeps it.
    """

    def __init__(
        self,
        points: Sequence[Sequence[int]],
        available: Sequence[int],
        required: Sequence[int],
        size: int,
        spend: Callable[[int], None],
    ) -> None:
        self.points = points
        self.available = list(available)
        self.required = list(required)
        self.required_set = frozenset(required)
        self.size = size
        self.spend = spend
        self.padding = (-len(self.available)) % size if size > 0 else 0
        self.best: tuple[int, Split] | None = None
        self.threshold: int | None = None
        self.seed: tuple[int, Split] | None = None
        self.finished = False

    def answer(self) -> Answer:
        """The policy's answer (after `run`, or after `run` was stopped by `spend`)."""
        if not self._possible():
            return Answer(())
        if self.size == 1:
            return Answer(self._first_single())
        found = self.best or self.seed or self._greedy()
        chosen = self._best_set(found[1])
        return Answer(
            tuple(g for g in chosen if g is not None),
            padded=None in chosen,
            exact=self.finished,
        )

    def run(self) -> None:
        """Search the splits; `spend` may stop it (its exception propagates)."""
        if not self._possible() or self.size == 1:
            self.finished = True
            return
        devices: list[int | None] = [*self.available, *([None] * self.padding)]
        if self._splits(len(devices)) > _SMALL_TREE:
            self.seed = self._greedy()
            self.threshold = self.seed[0]
        self._descend(devices, 0, [])
        self.finished = True

    def _possible(self) -> bool:
        # go-gpuallocator's early answers: nothing for these requests.
        return (
            self.size > 0
            and len(self.available) >= self.size
            and len(self.required) <= self.size
            and self.required_set <= set(self.available)
        )

    def _first_single(self) -> tuple[int, ...]:
        return next(((g,) for g in self.available if self.required_set <= {g}), ())

    def _set_points(self, group: Sequence[int | None]) -> int:
        real = [g for g in group if g is not None]
        return sum(self.points[a][b] for a, b in itertools.combinations(real, 2))

    def _splits(self, places: int) -> int:
        """How many splits go-gpuallocator's enumeration visits, ignoring the padding rule."""
        sets = places // self.size
        return math.factorial(places) // (
            math.prod([math.factorial(self.size)] * sets) * math.factorial(sets)
        )

    def _valid(self, group: Sequence[int | None]) -> bool:
        """Whether a set may stand in a split that holds the required GPUs in one unpadded set."""
        held = self.required_set.intersection(g for g in group if g is not None)
        if not held:
            return True
        return held == self.required_set and None not in group

    def _descend(self, devices: list[int | None], value: int, sets: Split) -> None:
        # Units priced to cost about the time they do in reporter.placement (a microsecond or so):
        # one per device left here, one per combination tried, and for a set kept its pairs and
        # the copy of the rest.
        self.spend(len(devices))
        if len(devices) == self.size:
            group = tuple(devices)
            if not self._valid(group):
                return
            self._offer(value + self._set_points(group), [*sets, group])
            return
        bound = value + self._bound(devices)
        if self.best is not None:
            if bound <= self.best[0]:
                return
        elif self.threshold is not None and bound < self.threshold:
            return
        first, rest = devices[0], devices[1:]
        for picks in itertools.combinations(range(len(rest)), self.size - 1):
            group = (first, *(rest[i] for i in picks))
            empty = group.count(None)
            self.spend(1)
            if (empty and empty != self.padding) or not self._valid(group):
                continue
            self.spend(self.size * (self.size - 1) // 2 + len(rest))
            taken = set(picks)
            remaining = [d for i, d in enumerate(rest) if i not in taken]
            if empty:  # the set holds every empty place: none stays behind
                remaining = [d for d in remaining if d is not None]
            self._descend(remaining, value + self._set_points(group), [*sets, group])

    def _offer(self, value: int, sets: Split) -> None:
        if not self._holds_required(sets):
            return
        if self.best is None:
            if self.threshold is None or value >= self.threshold:
                self.best = (value, sets)
        elif value > self.best[0]:
            self.best = (value, sets)

    def _holds_required(self, sets: Split) -> bool:
        return any(self.required_set <= set(group) and None not in group for group in sets)

    def _bound(self, devices: list[int | None]) -> int:
        # Each GPU gets at most its size-1 best partners among those left; each pair is counted
        # from both ends, so half of the sum bounds what the rest of the split can add.
        real = [d for d in devices if d is not None]
        total = 0
        for a in real:
            weights = sorted((self.points[a][b] for b in real if b != a), reverse=True)
            total += sum(weights[: self.size - 1])
        return total // 2

    def _best_set(self, sets: Split) -> tuple[int | None, ...]:
        held = [group for group in sets if self.required_set <= set(group)]
        best = held[0]
        best_points = self._set_points(best)
        for group in held[1:]:
            points = self._set_points(group)
            if points > best_points:
                best, best_points = group, points
        return best

    def _greedy(self) -> tuple[int, Split]:
        """A valid split to seed the threshold: the required GPUs' set first, each set grown from
        its first GPU by the partner adding the most points, the rest as the padded set."""
        left = list(self.available)
        sets: Split = []
        for n in range(len(left) // self.size):
            group = list(self.required) if n == 0 and self.required else [left[0]]
            pool = [g for g in left if g not in group]
            while len(group) < self.size:
                pick = max(pool, key=lambda g: sum(self.points[g][m] for m in group))
                group.append(pick)
                pool.remove(pick)
            sets.append(tuple(group))
            left = pool
        if left:
            sets.append((*left, *([None] * self.padding)))
        return sum(self._set_points(group) for group in sets), sets
