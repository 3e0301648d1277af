"""topo-reporter: publish a Kubernetes node's GPU topology, and read it back for scheduling.

The public API for scheduler authors (a scheduler extender, a Volcano plugin):

    from reporter import decode_node, best_gpu_set
    topology = decode_node(node)                  # a Node dict or a kubernetes V1Node
    best = best_gpu_set(topology, 4, available=[0, 1, 2, 3, 5], must_include=[5])
    best.gpus, best.score, best.exact, best.explain()
    fabric = node_fabric(topology)                # the NVLink domain and partition, if agreed
    fabric.domain, fabric.partition, fabric.withheld, fabric.health, fabric.problems

Everything else in the package is the agent's and may change. This module must stay light to
import: every `reporter.*` import runs it first (each CLI call, the agent's startup). So it
imports none of these names until one is asked for; then their module loads (the schema's
validator, the placement search), never kubernetes or NVML.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parsers.links import Link, LinkKind
    from reporter.errors import InputError, PlacementError, SchemaError, TopoReporterError
    from reporter.placement import GpuSet, Policy, Score, best_gpu_set, score_gpu_set
    from reporter.schema.codec import decode, encode
    from reporter.schema.fabric import NodeFabric, node_fabric, own_domain
    from reporter.schema.model import Topology
    from reporter.schema.node import decode_node
else:
    _HOMES = {
        "parsers.links": ("Link", "LinkKind"),
        "reporter.errors": ("InputError", "PlacementError", "SchemaError", "TopoReporterError"),
        "reporter.placement": ("GpuSet", "Policy", "Score", "best_gpu_set", "score_gpu_set"),
        "reporter.schema.codec": ("decode", "encode"),
        "reporter.schema.fabric": ("NodeFabric", "node_fabric", "own_domain"),
        "reporter.schema.model": ("Topology",),
        "reporter.schema.node": ("decode_node",),
    }
    _HOME = {name: module for module, names in _HOMES.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in _HOME:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(_HOME[name]), name)

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOME})


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
