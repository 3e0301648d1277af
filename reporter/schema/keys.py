"""Every label, annotation, taint and DRA attribute name topo-reporter writes or reads under its
prefix, in one place (docs/schema.md lists each; tests/docs/test_catalogues.py checks it).

A full key is `<prefix>/<name>`; the prefix is configurable (default `gpu.topology.io`). Labels are
stable derivations of the topology (counts and classes), never timestamps.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_PREFIX = "gpu.topology.io"
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises: a Node's capacity, a pod's limits."""
GPU_RESOURCES = (GPU_RESOURCE, f"{GPU_RESOURCE}.shared", "nvidia.com/mig-*")
"""NVIDIA's whole GPUs, its shared-GPU name (`renameByDefault`), and its MIG names (`mixed`): the
resources whose PodResources devices are GPUs unless told otherwise."""
SCHEMA_VERSION = 2
"""The version the agent writes (`"v":2` in `topology`, label `schema=v2`); the decoder also reads
v1 (docs/schema.md says what changed)."""

# Labels
COUNT = "count"
INTERCONNECT = "interconnect"
NVLINK_ISLAND_SIZE = "nvlink-island-size"
NVLINK_ISLANDS = "nvlink-islands"
NUMA_NODES = "numa-nodes"
MAX_GPUS_PER_NUMA = "max-gpus-per-numa"
RDMA_NICS = "rdma-nics"
SCHEMA = "schema"
# Labels of the free GPUs, written with availability (reporter.schema.availability).
GPU_FREE = "gpu-free"
GPU_FREE_NVLINK_MAX = "gpu-free-nvlink-max"
# Labels from the kubelet's configuration: what Topology Manager will do with a GPU request.
TOPOLOGY_MANAGER_POLICY = "topology-manager-policy"
TOPOLOGY_MANAGER_SCOPE = "topology-manager-scope"
CPU_MANAGER_POLICY = "cpu-manager-policy"
# Labels of the multi-node NVLink fabric (GB200/GB300 NVL72): every GPU node carries both domain
# labels, a node without a fabric being its own domain (reporter.schema.fabric.own_domain).
NVLINK_DOMAIN = "nvlink-domain"
NVLINK_PARTITION = "nvlink-partition"
FABRIC_HEALTH = "fabric-health"
RACK_SERIAL = "rack-serial"
RACK_SLOT = "rack-slot"
RACK_TRAY = "rack-tray"
RACK_HOST = "rack-host"
# The network tiers above the node (reporter.schema.network), closest first: tier 0 the group of
# top-of-rack switches its compute NICs hear by LLDP (`--network-lldp`), or their InfiniBand leaf
# group (`--network-infiniband`); tier 1 the InfiniBand spine group; tier 2 the top of the
# InfiniBand fabric (its subnet, or its cores).
NETWORK_TIER_0 = "network-tier-0"
NETWORK_TIER_1 = "network-tier-1"
NETWORK_TIER_2 = "network-tier-2"
NETWORK_TIERS = (NETWORK_TIER_0, NETWORK_TIER_1, NETWORK_TIER_2)
"""Every tier's key, closest first: `NETWORK_TIERS[n]` is tier n's."""
TOPOGRAPH_TIER_DOMAIN = "fabric.topograph.run"
"""The prefix of NVIDIA Topograph's tier labels (`fabric.topograph.run/tier-<N>`, tier 0 the
switch closest to the node, as ours), which `--network-label-style topograph` writes instead of
NETWORK_TIERS: the one foreign key family the agent may write, list in `owned` and prune."""
TOPOGRAPH_TIER_KEYS = tuple(f"{TOPOGRAPH_TIER_DOMAIN}/tier-{n}" for n in range(len(NETWORK_TIERS)))
# The GPUs' NVLinks against their own link counts: ok, degraded, down.
NVLINK_HEALTH = "nvlink-health"

# Taint (opt-in, `--taint-unhealthy-fabric`): `<prefix>/fabric-health=<degraded|unhealthy>` with
# effect NoSchedule, on the agent's own Node while its multi-node fabric is degraded or unhealthy.
FABRIC_TAINT = "fabric-health"
FABRIC_TAINT_EFFECT = "NoSchedule"

# The label of the agent's heartbeat Lease (reporter.publish.lease), not of the Node: the
# extender selects the Leases with `<prefix>/heartbeat=availability`.
HEARTBEAT = "heartbeat"
HEARTBEAT_AVAILABILITY = "availability"

# DRA DeviceTaintRules (reporter.schema.devicetaints): the taint's key on a GPU.
DEVICE_TAINT = "gpu-unhealthy"
NVLINK_CLIQUE_ATTRIBUTE = "nvlinkClique"
"""The DRA derived attribute `dra-template` defines on each GPU: a domain no DRA driver publishes
under, so it shadows nothing (types.go: a derived name equal to a driver's attribute replaces
it)."""

# The label naming the node on every object an agent writes besides its Node (its DeviceTaintRules,
# NodeResourceTopology and NodeFeature): `<prefix>/node=<node>`. Its key carries the prefix, so
# prune under one prefix tells its own objects from those an install under another prefix wrote.
OWNER_NODE = "node"

# Annotations
TOPOLOGY = "topology"
MATRIX = "matrix"
OWNED = "owned"
# Annotations of the availability loop (reporter.live): the best free set per k, what it counted
# and which GPUs DRA claims hold (reporter.schema.availability), the GPU sets running containers
# hold (reporter.placement_quality).
AVAILABILITY = "availability"
ALLOCATION = "allocation"
GPU_SETS = "gpu-sets"
# Annotations of the ResourceClaimTemplate `dra-template` prints (reporter.schema.dra_template):
# the feature gates it needs, and what the doctor reads to tell a stale template.
DRA_TEMPLATE_GATES = "dra-template-gates"
DRA_TEMPLATE_MACHINES = "dra-template-machines"
"""The wirings whose cliques the template holds, one digest each: the doctor compares them with
the Nodes'."""
DRA_TEMPLATE_SELECTION = "dra-template-selection"
"""The `--selector` and `--exclude` arguments it was made with, as a shell would take them: the
doctor's command to make it again repeats them."""
# A pod's annotation, read by the extender: how long that pod may be held for an NVLink-connected
# set (`0`: never; a duration up to 24h), in place of the extender's --connected-wait.
CONNECTED_WAIT = "connected-wait"

AGENT_POD_SELECTOR = "app.kubernetes.io/name=topo-reporter"
"""The label the chart puts on the agent's pods (charts/topo-reporter/templates/_helpers.tpl): the
doctor and the kubectl plugin find the agents by it."""


RESERVED_DOMAINS = ("kubernetes.io", "k8s.io")
"""Kubernetes reserves these key prefixes and every subdomain of them (`node.kubernetes.io`,
`node-role.kubernetes.io`) for its own components: a prefix in them would let the agent overwrite
or delete the kubelet's and the controllers' labels (`kubernetes.io/hostname`)."""


def reserved_domain(prefix: str) -> str | None:
    """The Kubernetes-reserved domain `prefix` (a key's part before the slash) lies in, or None."""
    folded = prefix.lower()
    for domain in RESERVED_DOMAINS:
        if folded == domain or folded.endswith("." + domain):
            return domain
    return None


def key(prefix: str, name: str) -> str:
    """The full label or annotation key for `name` under `prefix`."""
    return f"{prefix}/{name}"


def owner_keys(labels: Mapping[str, object]) -> frozenset[str]:
    """The keys of `labels` that are some prefix's OWNER_NODE label (`<any prefix>/node`), whatever
    they name: the prefixes whose agents wrote the object. Empty on an object of ours that a
    version before the label wrote."""
    return frozenset(k for k in labels if k.endswith("/" + OWNER_NODE))
