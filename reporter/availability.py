"""How the extender reads a node's availability: whether it fits a pod of k GPUs, how it ranks
for it (`node_score`), and when a pod waits for an NVLink-connected set (the hold rule,
`holds_for_connected`).

The extender (`reporter.extender`) and the simulated cluster of `bench/placement.py` both decide
by these functions, so what the benchmark measures is what the extender does. It must never do
I/O or import kubernetes.
"""

from __future__ import annotations

from reporter.schema.availability import Availability, FreeSet

NEUTRAL_SCORE = 5
"""`node_score` of a node whose availability is missing or damaged: neither for nor against."""

CONNECTED_WAIT_S = 7200.0
"""How long, from its creation, the extender holds back a pod of k >= 2 GPUs for an NVLink-connected
set by default (`holds_for_connected`), where taking a set that is not connected now is all it
could do. Two hours: in the simulated cluster at 80% offered load beside MostAllocated, the least
any of 40 seeds kept connected rose from 93.9% to 96.4%, mean waits 12.3 to 12.6 minutes, 1% of
those pods held; one hour left a seed at 93.3% (bench/README.md: holding leaves the unconnected
GPUs to one-GPU pods, which then stay off the NVLink nodes)."""


def can_fit(a: Availability | None, k: int) -> bool:
    """Whether the node has k free GPUs; True when we cannot read it (never filter blindly)."""
    return a is None or k <= len(a.free)


def connected_now(a: Availability | None, k: int) -> bool:
    """Whether the node hands a pod of k GPUs an NVLink-connected set now: k free GPUs, and the
    k-set its on-node policy takes is connected (not a set the policy fails to hand out, fit 0).
    False when we cannot read it."""
    if a is None or not 1 <= k <= len(a.free):
        return False
    chosen = a.best[k - 1]
    return chosen.connected and chosen.fit != 0


def connected_capacity(a: Availability | None) -> int:
    """The largest connected set of the whole node, free or not, that one of its free GPUs
    belongs to (the largest whole-node reach among the sets its policy takes; a version-1 or 2
    value's fit or island stands in, never smaller); 0 with no free GPU or when we cannot read
    it. A node of capacity >= k can give a pod of k GPUs a connected set once the pods beside
    its free GPUs end: a reason to wait for it."""
    if a is None:
        return 0
    return max(
        (
            s.whole if s.whole is not None else s.fit if s.fit is not None else s.island
            for s in a.best
        ),
        default=0,
    )


def holds_for_connected(
    k: int, waited_s: float, limit_s: float, *, connected: bool, capable: bool
) -> bool:
    """Whether the extender holds a pod of k GPUs back for an NVLink-connected set: a pod of
    k >= 2 GPUs that has waited less than `limit_s`, when no candidate node hands it a connected
    set now (`connected`: some candidate does, `connected_now`) but some node of the cluster
    could once its pods end (`capable`: some node's `connected_capacity` is >= k). A cluster
    without such a node never holds a pod (it would wait for nothing); a limit of 0 never holds.
    `waited_s` comes from two clocks (the pod's creation by the API server's, now by ours): a
    negative wait is skew and counts as none, a skew past the limit holds nothing. The default
    limit and what holding buys and costs: CONNECTED_WAIT_S."""
    return k >= 2 and -limit_s < waited_s < limit_s and not connected and capable


def node_score(a: Availability | None, k: int) -> int:
    """kube-scheduler extender score 0..10 of a node for a pod of k GPUs; larger is better.

    None (no or damaged annotation) and k < 1 give NEUTRAL_SCORE; a node that cannot fit k gives 0.
    Otherwise, by the k-set the node's on-node policy takes (`Availability.best[k-1]`), read twice
    in this table: with its whole-node fit `whole` (the largest connected set of the node, free or
    not, that it cuts into) and with its free fit `fit` (the same among the free GPUs alone):

    | the set                                               | class                        |
    |-------------------------------------------------------|------------------------------|
    | NVLink-connected, fit k (a connected set used whole)  | 10 on one NUMA node, else 9  |
    | NVLink-connected, fit up to 2k                        | 7 on one NUMA node, else 6   |
    | NVLink-connected, a larger fit                        | 4                            |
    | not connected, cutting into no connected set (fit 1)  | 2                            |
    | not connected otherwise; the on-node policy fails (0) | 1                            |

    The score is two parts the whole-node class and one part the free class, rounded up:
    ceil((2 * whole class + free class) / 3). Connected means at full bond: a set with a GPU whose
    NVLinks are down is not connected.

    Fit first: the pod takes from the node where it cuts into the smallest connected sets (best
    fit), so that the nodes whose GPUs can form large connected sets stay for the pods that need
    them, and so the policy that will run matters. The whole-node fit keeps small pods off the
    NVSwitch nodes: one GPU of an NVSwitch node, however full, scores 6 or less for a 1-GPU pod, a
    lone PCIe GPU 10. The free fit still prefers, among nodes of one wiring, the one whose free
    GPUs the set uses up (a pair on a DGX with 2 free: 6, on an empty one: 4), which the
    kube-scheduler's default LeastAllocated would otherwise undo (bench/README.md measures the
    weights against each fit alone). Older values stand in: a version-2 value has no whole and
    scores its free class (the ranking before version 3); a version-1 value has no fit either,
    its island, never smaller, stands in.
    """
    if a is None or k < 1:
        return NEUTRAL_SCORE
    if not can_fit(a, k):
        return 0
    chosen = a.best[k - 1]
    free = _fit_class(chosen, k, chosen.island if chosen.fit is None else chosen.fit)
    if chosen.whole is None:
        return free
    # Two parts the whole-node fit, one part the free fit, rounded up (bench/README.md measures
    # the weights against each alone, beside MostAllocated and LeastAllocated).
    return (2 * _fit_class(chosen, k, chosen.whole) + free + 2) // 3


def _fit_class(chosen: FreeSet, k: int, fit: int) -> int:
    """`node_score`'s table, read with one fit."""
    if fit == 0:
        return 1
    if not chosen.connected:
        return 2 if fit == 1 else 1
    if fit > 2 * k:
        return 4
    base = 9 if fit == k else 6
    return base + (chosen.numa == 1)
