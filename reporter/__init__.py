"""topo-reporter: publish a Kubernetes node's GPU topology, and read it back for scheduling.

The public API for scheduler authors (a scheduler extender, a Volcano plugin):

    from reporter import decode_node, best_gpu_set
    topology = decode_node(node)                  # a Node dict or a kubernetes V1Node
    best = best_gpu_set(topology, 4, available=[0, 1, 2, 3, 5], must_include=[5])
    best.gpus, best.score, best.exact, best.explain()
    fabric = node_fabric(topology)                # the NVLink domain and partition, if agreed
    fabric.domain, fabric.partition, fabric.withheld, fabric.health, fabric.problems

Everything else in the package is the agent's and may change. This module must stay light to
import: no kubernetes, no NVML (the agent's startup and every CLI call pay for it).
"""

from parsers.links import Link, LinkKind
from reporter.errors import InputError, PlacementError, SchemaError, TopoReporterError
from reporter.placement import GpuSet, Policy, Score, best_gpu_set, score_gpu_set
from reporter.schema.codec import decode, encode
from reporter.schema.fabric import NodeFabric, node_fabric, own_domain
from reporter.schema.model import Topology
from reporter.schema.node import decode_node

__all__ = [
    "GpuSet",
    "InputError",
    "Link",
    "LinkKind",
    "NodeFabric",
    "PlacementError",
    "Policy",
    "SchemaError",
    "Score",
    "TopoReporterError",
    "Topology",
    "best_gpu_set",
    "decode",
    "decode_node",
    "encode",
    "node_fabric",
    "own_domain",
    "score_gpu_set",
]
