"""The operator's checklist for GPU pods that stay Pending or run slow, walked automatically.

Eight modules, by job:
- reporter.doctor.model: a finding, what was observed, how a Node object is read (pure);
- reporter.doctor.node: findings about one node (pure; the agent runs `local_findings` itself);
- reporter.doctor.racks: findings across nodes and racks, from the Nodes' labels (pure);
- reporter.doctor.network: Topograph's tiers against ours, NVLink domains across leaf groups (pure);
- reporter.doctor.groups: Pending Kueue Workloads no NVLink partition has room for (pure);
- reporter.doctor.templates: `dra-template`'s templates against the wirings and the gate (pure);
- reporter.doctor.reader: the API reads (`ClusterReader`) and `examine`, the one part that reads;
- reporter.doctor.report: the report as text or JSON, and a finding as an Event message (pure).

This package re-exports what the commands (`topo-reporter doctor`, `kubectl gpu-topology`) use.
"""

from reporter.doctor.groups import pod_group_findings
from reporter.doctor.model import (
    GPU_RESOURCE,
    AgentObservation,
    DraObservation,
    Finding,
    Severity,
)
from reporter.doctor.network import network_findings
from reporter.doctor.racks import fabric_cluster_findings
from reporter.doctor.reader import (
    ApiClusterReader,
    ClusterReader,
    examine,
    is_gpu_node,
)
from reporter.doctor.report import report_json, report_text, worst
from reporter.doctor.templates import dra_template_findings
from reporter.schema.keys import AGENT_POD_SELECTOR

__all__ = [
    "AGENT_POD_SELECTOR",
    "GPU_RESOURCE",
    "AgentObservation",
    "ApiClusterReader",
    "ClusterReader",
    "DraObservation",
    "Finding",
    "Severity",
    "dra_template_findings",
    "examine",
    "fabric_cluster_findings",
    "is_gpu_node",
    "network_findings",
    "pod_group_findings",
    "report_json",
    "report_text",
    "worst",
]
