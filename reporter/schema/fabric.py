"""The node's place in the multi-node NVLink fabric, judged from its GPUs: domain, partition,
health.

Pure: a `Topology` (and, for a node without a fabric, the node's name) in, the values of the
`nvlink-domain`, `nvlink-partition`, `fabric-health` and rack labels out, with the reasons when a
value is withheld. A wrong domain is worse than none: the partition is published only when every
GPU of the node is attached to the same clique of the same cluster, byte for byte the value GPU
Feature Discovery writes as `nvidia.com/gpu.clique`. Every GPU node gets both domain labels (Kueue
drops a node that lacks a level): a node without a multi-node fabric is its own domain and
partition, named after the node (`own_domain`). It reads nothing and decides nothing about writes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from reporter.schema.model import FabricHealth, FabricState, Gpu, GpuFabric, RackPosition, Topology

UNHEALTHY = "unhealthy"
DEGRADED = "degraded"
HEALTHY = "healthy"

CONDITIONS: dict[str, str] = {
    "degraded-bandwidth": DEGRADED,
    "route-recovery": DEGRADED,
    "route-unhealthy": UNHEALTHY,
    "access-timeout-recovery": DEGRADED,
    "incorrect-sysguid": UNHEALTHY,
    "incorrect-chassis-serial": UNHEALTHY,
    "no-partition": UNHEALTHY,
    "insufficient-nvlinks": UNHEALTHY,
    "incompatible-gpu-firmware": UNHEALTHY,
    "invalid-location": UNHEALTHY,
    "gpu-state-invalid": UNHEALTHY,
    "partition-not-assigned": UNHEALTHY,
    "fabric-manager-disconnected": DEGRADED,
    "health-mask-invalid": DEGRADED,
}
"""Every condition a GPU's fabric health mask can name, in mask order, with how bad it is.

The names are NVML's health-mask fields (`NVML_GPU_FABRIC_HEALTH_MASK_*`, nvml.h): a route being
recovered or bandwidth lost lowers capacity (degraded); a route that is unhealthy, a
configuration NVML calls incorrect or a GPU in no partition cannot carry a multi-node job
(unhealthy). `health-mask-invalid` is ours: bits or values NVML does not define."""

_RANK = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}
_SUMMARY = {
    FabricHealth.HEALTHY: HEALTHY,
    FabricHealth.LIMITED_CAPACITY: DEGRADED,
    FabricHealth.UNHEALTHY: UNHEALTHY,
}
# While the fabric is not up, the label says how far it got: the least advanced GPU speaks.
_NOT_UP = (FabricState.UNKNOWN, FabricState.NOT_STARTED, FabricState.IN_PROGRESS)

OWN_DOMAIN_PREFIX = "node-"
_LABEL_VALUE_MAX = 63
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HASH_HEX = 16
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def own_domain(node: str) -> str:
    """The domain and partition of a node without a multi-node fabric: `node-<name>`.

    Always a valid label value, unique per node name: a DNS-subdomain name of at most 58
    characters (every Node name the API server accepts, up to that length) is kept whole; any
    other string is cut to 41 characters of `[a-z0-9.-]` (others become `-`) and followed by
    `-` and 16 hex digits of the SHA-256 of the whole name, 63 characters at most. The prefix
    keeps it apart from every cluster UUID.
    """
    room = _LABEL_VALUE_MAX - len(OWN_DOMAIN_PREFIX)
    if len(node) <= room and _DNS_SUBDOMAIN.fullmatch(node):
        return OWN_DOMAIN_PREFIX + node
    digest = hashlib.sha256(node.encode("utf-8", errors="surrogatepass")).hexdigest()[:_HASH_HEX]
    cleaned = re.sub(r"[^a-z0-9.-]", "-", node.lower())[: room - _HASH_HEX - 1]
    return f"{OWN_DOMAIN_PREFIX}{cleaned}-{digest}"


def is_label_value(text: str) -> bool:
    """A valid Kubernetes label value, not empty."""
    return _LABEL_VALUE.fullmatch(text) is not None


def gpu_health(fabric: GpuFabric) -> str:
    """One GPU's fabric in one word: the state while not completed, else healthy, degraded or
    unhealthy (the worse of NVML's summary and the mask's conditions; a failed probe is
    unhealthy)."""
    if fabric.state is not FabricState.COMPLETED:
        return str(fabric.state.value)
    if fabric.error is not None:
        return UNHEALTHY
    words = [CONDITIONS.get(c, DEGRADED) for c in fabric.conditions]
    if fabric.health is not None:
        words.append(_SUMMARY[fabric.health])
    return max(words, key=_RANK.__getitem__, default=HEALTHY)


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """What the node's GPUs say together about the fabric."""

    domain: str | None
    """The cluster UUID every attached GPU names; None: no multi-node fabric, or not one the GPUs
    agree on (the node is then its own domain)."""
    partition: str | None
    """`<clusterUUID>.<cliqueId>` when every GPU is attached to the same clique."""
    withheld: str | None
    """Why no partition is published although the GPUs have a fabric (not completed, GPUs that
    disagree); None when nothing is withheld."""
    health: str | None
    """The `fabric-health` word: the state while not completed, else the worst GPU's health;
    None when no GPU reports a fabric."""
    position: RackPosition | None
    """The rack position every GPU that reports one agrees on, field by field."""
    problems: tuple[str, ...]
    """Everything wrong, one line each: the withheld reason, values the driver answered as
    garbage, GPUs that disagree on the rack position. For the Warning Event and the doctor."""

    @property
    def multi_node(self) -> bool:
        return self.domain is not None


def node_fabric(topology: Topology) -> NodeFabric:
    """Judge the node's fabric from its GPUs; lost GPUs say nothing and are not counted."""
    gpus = [g for g in topology.gpus if not g.lost]
    with_fabric = [
        g for g in gpus if g.fabric is not None and g.fabric.state is not FabricState.NOT_SUPPORTED
    ]
    problems = _per_gpu_problems(gpus)
    if not with_fabric:
        return NodeFabric(None, None, None, None, None, tuple(problems))
    health = _node_health([g.fabric for g in with_fabric if g.fabric is not None])
    domain, partition, withheld = _membership(gpus, with_fabric)
    position, disagree = _position(with_fabric)
    if withheld is not None:
        problems.insert(0, withheld)
    problems += disagree
    return NodeFabric(domain, partition, withheld, health, position, tuple(problems))


def _per_gpu_problems(gpus: Sequence[Gpu]) -> list[str]:
    """Each GPU's problems, one line per distinct problem naming every GPU that has it
    (`GPU0,GPU2: ...`), in the order they first appear."""
    holders: dict[str, list[str]] = {}
    for gpu in gpus:
        for problem in gpu.fabric.problems if gpu.fabric is not None else ():
            holders.setdefault(problem, []).append(f"GPU{gpu.index}")
    return [f"{','.join(names)}: {problem}" for problem, names in holders.items()]


def _node_health(fabrics: Sequence[GpuFabric]) -> str:
    for state in _NOT_UP:
        if any(f.state is state for f in fabrics):
            return str(state.value)
    return max((gpu_health(f) for f in fabrics), key=_RANK.__getitem__)


def _describe(gpu: Gpu) -> str:
    fabric = gpu.fabric
    if fabric is None or fabric.state is FabricState.NOT_SUPPORTED:
        return f"GPU{gpu.index} no fabric"
    if fabric.state is not FabricState.COMPLETED:
        return f"GPU{gpu.index} {fabric.state.value}"
    if fabric.error is not None:
        return f"GPU{gpu.index} probe error {fabric.error}"
    cluster = fabric.cluster_uuid or "no cluster UUID"
    clique = "unknown clique" if fabric.clique is None else f"clique {fabric.clique}"
    return f"GPU{gpu.index} {cluster} {clique}"


def _membership(
    gpus: Sequence[Gpu], with_fabric: Sequence[Gpu]
) -> tuple[str | None, str | None, str | None]:
    """(domain, partition, why the partition is withheld)."""
    not_up = [
        g
        for g in with_fabric
        if g.fabric is not None and g.fabric.state is not FabricState.COMPLETED
    ]
    if not_up:
        states = ", ".join(_describe(g) for g in not_up)
        return None, None, f"fabric not completed: {states}"
    failed = [g for g in with_fabric if g.fabric is not None and g.fabric.error is not None]
    if failed:
        return None, None, "fabric probe failed: " + ", ".join(_describe(g) for g in failed)
    clusters = {g.fabric.cluster_uuid if g.fabric is not None else None for g in gpus}
    if clusters == {None}:
        unreadable = [g for g in with_fabric if g.fabric is not None and g.fabric.clique is None]
        if unreadable:
            return None, None, "fabric unreadable: " + ", ".join(_describe(g) for g in unreadable)
        # Completed without a cluster UUID: NVLink (an NVSwitch system) but no multi-node fabric.
        return None, None, None
    if len(clusters) > 1:
        return None, None, "GPUs disagree on the fabric: " + ", ".join(_describe(g) for g in gpus)
    (domain,) = clusters
    cliques = {g.fabric.clique if g.fabric is not None else None for g in gpus}
    if len(cliques) > 1 or None in cliques:
        return domain, None, "GPUs disagree on the clique: " + ", ".join(_describe(g) for g in gpus)
    partition = gpus[0].clique
    return domain, partition, None


def _position(with_fabric: Sequence[Gpu]) -> tuple[RackPosition | None, list[str]]:
    """The position the GPUs agree on, field by field; a field they disagree on is unknown."""
    positions = [
        (g.index, g.fabric.position)
        for g in with_fabric
        if g.fabric is not None and g.fabric.position is not None
    ]
    if not positions:
        return None, []
    problems: list[str] = []

    def agreed(name: str) -> object:
        values = {getattr(p, name) for _, p in positions}
        if len(values) == 1:
            return values.pop()
        shown = ", ".join(f"GPU{i} {getattr(p, name)}" for i, p in positions)
        problems.append(f"GPUs disagree on the rack {name.replace('_', ' ')}: {shown}")
        return None

    serial, slot, tray, host = (agreed(n) for n in ("chassis_serial", "slot", "tray", "host_id"))
    position = RackPosition(
        chassis_serial=serial if isinstance(serial, str) else None,
        slot=slot if isinstance(slot, int) else None,
        tray=tray if isinstance(tray, int) else None,
        host_id=host if isinstance(host, int) else None,
    )
    return position, problems


TAINTED = (DEGRADED, UNHEALTHY)
"""The fabric-health words that taint the Node, opted in: a fabric that is up but hurt. One
that is not up yet has no partition label, which already keeps partition-bound jobs off."""


def taint_value(fabric: NodeFabric) -> str | None:
    """The value of the agent's `fabric-health` taint for this fabric; None: no taint."""
    return fabric.health if fabric.health in TAINTED else None


def domain_labels(fabric: NodeFabric, node: str | None) -> dict[str, str]:
    """`nvlink-domain` and `nvlink-partition` values (names, not keys).

    A node without a multi-node fabric is its own domain and partition (`own_domain`) when its
    name is known; with a fabric it is the cluster UUID, or its own domain where the GPUs do not
    agree on one; the partition is left out whenever `withheld` says why.
    """
    out: dict[str, str] = {}
    own = None if node is None else own_domain(node)
    domain = fabric.domain or own
    if domain is not None:
        out["domain"] = domain
    if fabric.partition is not None:
        out["partition"] = fabric.partition
    elif fabric.withheld is None and not fabric.multi_node and own is not None:
        out["partition"] = own
    return out
