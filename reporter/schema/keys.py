"""Every label and annotation name topo-reporter writes, in one place.

A full key is `<prefix>/<name>`; the prefix is configurable (default `gpu.topology.io`). Labels are
stable derivations of the topology (counts and classes), never timestamps.
"""

from __future__ import annotations

DEFAULT_PREFIX = "gpu.topology.io"
SCHEMA_VERSION = 1

# Labels
COUNT = "count"
INTERCONNECT = "interconnect"
NVLINK_ISLAND_SIZE = "nvlink-island-size"
NVLINK_ISLANDS = "nvlink-islands"
NUMA_NODES = "numa-nodes"
MAX_GPUS_PER_NUMA = "max-gpus-per-numa"
RDMA_NICS = "rdma-nics"
SCHEMA = "schema"
# Labels from the kubelet's configuration: what Topology Manager will do with a GPU request.
TOPOLOGY_MANAGER_POLICY = "topology-manager-policy"
TOPOLOGY_MANAGER_SCOPE = "topology-manager-scope"
CPU_MANAGER_POLICY = "cpu-manager-policy"

# Annotations
TOPOLOGY = "topology"
MATRIX = "matrix"
OWNED = "owned"


def key(prefix: str, name: str) -> str:
    """The full label or annotation key for `name` under `prefix`."""
    return f"{prefix}/{name}"
