"""The operator's checklist for GPU pods that stay Pending or run slow, walked automatically.

Pure: it judges a topology, the kubelet's policies and a Node object (as the API returns it, a
dict) and says what is wrong, with the evidence and the fix, in the operator's words. It reads
nothing itself; the agent (node-local findings, as Warning Events) and `topo-reporter doctor`
(every finding, from an operator's machine) feed it.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from parsers.errors import ParseError
from parsers.integers import parse_decimal
from parsers.kubelet import KubeletPolicies
from reporter.availability import ALLOCATION_KEY, AVAILABILITY_KEY, decode_allocation
from reporter.errors import ApiPermanentError, SchemaError
from reporter.publish.api import (
    DRA_VERSIONS,
    EVENTS,
    NODES,
    PODS,
    ApiClient,
    Resource,
    resource_claims,
    resource_slices,
)
from reporter.publish.client import COMPONENT, NODE_EVENT_NAMESPACE
from reporter.schema import dra, keys
from reporter.schema.codec import decode
from reporter.schema.fabric import HEALTHY, TAINTED, UNHEALTHY, gpu_health, node_fabric
from reporter.schema.labels import gpus_per_numa
from reporter.schema.model import Topology

AGENT_POD_SELECTOR = "app.kubernetes.io/name=topo-reporter"
"""The label the chart puts on the agent's pods (charts/topo-reporter/templates/_helpers.tpl)."""

GPU_RESOURCE = keys.GPU_RESOURCE
"""The device plugin's resource whose capacity marks a GPU node (written once, in schema.keys)."""
DEGRADED_REASON = "GPUTopologyDegraded"
"""The Event reason the agent uses when a source fails; the doctor looks for it."""
FINDING_REASONS = {
    "gpu-lost": "GPULost",
    "nvlink-degraded": "NVLinkDegraded",
    "numa-unknown": "GPUNUMAUnknown",
    "numa-alignment-limit": "TopologyManagerLimit",
    "kubelet-policy-unknown": "KubeletPolicyUnknown",
}
"""Event reasons of the node-local findings the agent reports itself."""
GFD_CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""GPU Feature Discovery's partition label, `<clusterUUID>.<cliqueId>`: ours must say the same."""


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong on a node: what, the evidence that shows it, and what to do."""

    code: str
    severity: Severity
    summary: str
    evidence: tuple[str, ...]
    fix: str


@dataclass(frozen=True, slots=True)
class AgentObservation:
    """What the operator's view of the cluster says about the agent on one node; None is unknown."""

    pod_found: bool | None = None
    pod_ready: bool | None = None
    degraded_reason: str | None = None
    """The message of the agent's latest `TopologyDegraded` Warning Event, if any."""


@dataclass(frozen=True, slots=True)
class DraObservation:
    """What the cluster's DRA objects say of one node's GPUs; None where they cannot be read
    (a cluster before 1.32 serves none; an operator may not be allowed to list them)."""

    slices: int | None = None
    """ResourceSlices of NVIDIA's GPU driver (`gpu.nvidia.com`) for the node."""
    claims: tuple[tuple[str, str], ...] | None = None
    """(`namespace/name`, device) of each device of that driver in the node's pool that an
    allocated ResourceClaim holds."""


def local_findings(
    topology: Topology, policies: KubeletPolicies | None, kubelet_problem: str | None = None
) -> list[Finding]:
    """Findings the agent can see on its own node: alignment limits, NVLink damage, NUMA gaps,
    and, with `kubelet_problem` (why the kubelet's policies are unknown), that they are unknown."""
    findings = [*_lost_gpus(topology), *_nvlink_degraded(topology), *_numa_unknown(topology)]
    if policies is not None:
        findings += _alignment_limit(topology, policies)
    elif kubelet_problem is not None:
        findings.append(_policy_unknown(kubelet_problem))
    return findings


def _policy_unknown(problem: str) -> Finding:
    return Finding(
        code="kubelet-policy-unknown",
        severity=Severity.WARNING,
        summary="the kubelet's Topology Manager policy is unknown: no topology-manager-policy "
        "labels, and no NodeResourceTopology unless the policy is stated (one without it would "
        "let NodeResourceTopologyMatch admit pods the kubelet rejects)",
        evidence=(problem,),
        fix="mount the kubelet's config file (chart: kubeletConfig.enabled and "
        "kubeletConfig.hostPath; run: --kubelet-config), or state the policy (chart: "
        "kubeletConfig.topologyManagerPolicy; run: --topology-manager-policy)",
    )


def _lost_gpus(topology: Topology) -> list[Finding]:
    lost = [f"GPU{g.index}" for g in topology.gpus if g.lost]
    if not lost:
        return []
    return [
        Finding(
            code="gpu-lost",
            severity=Severity.ERROR,
            summary=f"{', '.join(lost)} fell off the bus (NVML reports the GPU lost)",
            evidence=tuple(
                f"GPU{g.index} {g.pci or ''} {g.uuid or ''}: lost".replace("  ", " ")
                for g in topology.gpus
                if g.lost
            ),
            fix="drain the node, check `dmesg` for Xid 79 (GPU has fallen off the bus) and the "
            "GPU's power and seating, then reset the GPU or reboot the node",
        )
    ]


def _nvlink_degraded(topology: Topology) -> list[Finding]:
    if not topology.nvlink_observed:
        return []
    n = len(topology.gpus)
    evidence: list[str] = []
    for a in range(n):
        for b in range(a + 1, n):
            ab, ba = topology.links[a][b], topology.links[b][a]
            if ab != ba:
                evidence.append(f"GPU{a}→GPU{b} is {ab.token} but GPU{b}→GPU{a} is {ba.token}")
    by_model: dict[str | None, list[int]] = {}
    for gpu in topology.gpus:
        if not gpu.lost:
            by_model.setdefault(gpu.model, []).append(gpu.index)
    for model, members in by_model.items():
        # Through NVSwitches every pair shows the GPU's whole bond (NV18), so a GPU's link count
        # is its largest bond; wired directly, its links are split among peers and add up.
        count = max if topology.nvswitch else sum
        total = {i: count(c.nvlinks for c in topology.links[i]) for i in members}
        best = max(total.values(), default=0)
        if best == 0:
            continue
        name = model or "GPU"
        for i in members:
            if total[i] == 0:
                evidence.append(f"GPU{i} has no NVLink while other {name}s have {best}")
            elif total[i] < best:
                evidence.append(f"GPU{i} has {total[i]} NVLinks where other {name}s have {best}")
    healthy = n - sum(1 for g in topology.gpus if g.lost)
    largest = max((len(i) for i in topology.islands), default=1)
    if topology.nvswitch and largest < healthy:
        evidence.append(f"NVSwitch system split into islands {[list(i) for i in topology.islands]}")
    if not evidence:
        return []
    return [
        Finding(
            code="nvlink-degraded",
            severity=Severity.WARNING,
            summary="NVLinks are missing: multi-GPU jobs on the affected GPUs run slower",
            evidence=tuple(evidence),
            fix="check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` on the node for inactive "
            "links and errors, the fabric manager service on NVSwitch systems, and bridges on "
            "workstations; a reset or a reseat usually follows",
        )
    ]


def _numa_unknown(topology: Topology) -> list[Finding]:
    cpu_nodes = [node.id for node in topology.numa_nodes if node.cpus]
    # A lost GPU answers nothing, its NUMA node included: that is the gpu-lost finding, not this.
    unknown = [f"GPU{g.index}" for g in topology.gpus if not g.numa and not g.lost]
    if len(cpu_nodes) < 2 or not unknown:
        return []
    return [
        Finding(
            code="numa-unknown",
            severity=Severity.WARNING,
            summary=f"the NUMA node of {', '.join(unknown)} is unknown on a host with "
            f"{len(cpu_nodes)} NUMA nodes: Topology Manager cannot align them",
            evidence=(f"numa_node is -1 for {', '.join(unknown)}", f"NUMA nodes {cpu_nodes}"),
            fix="enable PCIe locality reporting in the firmware (ACPI _PXM / SRAT; on some "
            "boards 'NUMA nodes per socket' or 'ACPI SRAT L3 cache as NUMA'), or pin jobs by hand",
        )
    ]


def _alignment_limit(topology: Topology, policies: KubeletPolicies) -> list[Finding]:
    per_numa = gpus_per_numa(topology)
    if not policies.aligns_numa or len(per_numa) < 2:
        return []
    most = max(per_numa.values())
    return [
        Finding(
            code="numa-alignment-limit",
            severity=Severity.WARNING,
            summary=f"Topology Manager policy {policies.topology_manager_policy} admits at most "
            f"{most} GPUs per pod here: pods asking for more are rejected with "
            "TopologyAffinityError",
            evidence=(
                f"topologyManagerPolicy={policies.topology_manager_policy}, "
                f"scope={policies.topology_manager_scope}",
                "GPUs per NUMA node: "
                + ", ".join(f"node {k}: {v}" for k, v in sorted(per_numa.items())),
            ),
            fix=f"request at most {most} GPUs per pod on this node (select it with "
            f"`{keys.DEFAULT_PREFIX}/{keys.MAX_GPUS_PER_NUMA}`), or use policy best-effort if "
            "cross-NUMA placement is acceptable",
        )
    ]


def policies_from_labels(labels: Mapping[str, str], prefix: str) -> KubeletPolicies | None:
    """The kubelet policies the agent published, or None when it did not (file not readable)."""
    policy = labels.get(keys.key(prefix, keys.TOPOLOGY_MANAGER_POLICY))
    if policy is None:
        return None
    return KubeletPolicies(
        topology_manager_policy=policy,
        topology_manager_scope=labels.get(
            keys.key(prefix, keys.TOPOLOGY_MANAGER_SCOPE), "container"
        ),
        cpu_manager_policy=labels.get(keys.key(prefix, keys.CPU_MANAGER_POLICY), "none"),
    )


def _quantity(value: Any) -> int | None:
    try:
        return parse_decimal(str(value), field="quantity")
    except ParseError:
        return None


def node_findings(
    node: Mapping[str, Any],
    topology: Topology | None,
    prefix: str,
    agent: AgentObservation,
    dra_seen: DraObservation = DraObservation(),
) -> list[Finding]:
    """Every finding for one Node object (as the API returns it) and its decoded topology.

    `topology` None with the annotation present means it does not decode: `examine` reports that
    (topology-unreadable); here it is not "no topology data", whose evidence would be false.
    """
    name = node.get("metadata", {}).get("name", "?")
    status = node.get("status") or {}
    allocatable = _quantity((status.get("allocatable") or {}).get(GPU_RESOURCE))
    capacity = _quantity((status.get("capacity") or {}).get(GPU_RESOURCE))
    findings: list[Finding] = []
    if topology is None:
        if _annotations(node).get(keys.key(prefix, keys.TOPOLOGY)) is not None:
            # Its fix (delete it, the agent republishes) needs an agent: say where there is none.
            if agent.pod_found is False or agent.pod_ready is False:
                findings.append(_agent_not_ready(name, agent))
        elif capacity or allocatable:
            findings.append(_no_data(name, capacity or allocatable or 0, agent))
        return findings
    seen = len(topology.gpus)
    mig = any(g.mig for g in topology.gpus)
    dra_node = bool(dra_seen.slices)
    if seen and allocatable is None and not mig and not dra_node:
        findings.append(
            Finding(
                code="device-plugin-missing",
                severity=Severity.ERROR,
                summary=f"{seen} GPUs seen, but {GPU_RESOURCE} is not allocatable: GPU pods stay "
                f"Pending with 'Insufficient {GPU_RESOURCE}'",
                evidence=(
                    f"{prefix}/{keys.COUNT}={seen}",
                    f"status.allocatable has no {GPU_RESOURCE}",
                ),
                fix=f"the NVIDIA device plugin is not registered on {name}: check its pod "
                "(`kubectl get pods -A -o wide --field-selector spec.nodeName="
                f"{name} | grep device-plugin`), the kubelet's "
                "/var/lib/kubelet/device-plugins/ socket (a stale nvidia.sock after a crash), and "
                "that the node runs the NVIDIA container runtime",
            )
        )
    elif allocatable is not None and allocatable < seen and not mig:
        lost = [f"GPU{g.index}" for g in topology.gpus if g.lost]
        findings.append(
            Finding(
                code="gpus-unallocatable",
                severity=Severity.ERROR,
                summary=f"only {allocatable} of {seen} GPUs are allocatable",
                evidence=(
                    f"{prefix}/{keys.COUNT}={seen}",
                    f"status.allocatable[{GPU_RESOURCE}]={allocatable}",
                    f"lost: {', '.join(lost)}" if lost else "no GPU is reported lost",
                ),
                fix="the device plugin marked GPUs unhealthy (Xid errors): check its logs and "
                "`nvidia-smi -q` on the node; a lost GPU needs a reset or a reboot",
            )
        )
    if agent.degraded_reason is not None:
        findings.append(
            Finding(
                code="agent-degraded",
                severity=Severity.ERROR,
                summary="topo-reporter cannot read the GPUs: the published topology may be stale",
                evidence=(agent.degraded_reason,),
                fix="check the NVIDIA driver on the node (`nvidia-smi`), that the agent's pod runs "
                "with the NVIDIA runtime (runtimeClassName), NVIDIA_VISIBLE_DEVICES=all and "
                "NVIDIA_DRIVER_CAPABILITIES including utility",
            )
        )
    if agent.pod_found is False or agent.pod_ready is False:
        findings.append(_agent_not_ready(name, agent))
    policies = policies_from_labels(_labels(node), prefix)
    unlabelled = f"no {keys.key(prefix, keys.TOPOLOGY_MANAGER_POLICY)} label on the Node"
    findings += local_findings(topology, policies, None if policies else unlabelled)
    findings += dra_findings(node, topology, prefix, dra_seen)
    findings += fabric_node_findings(topology)
    findings += _partition_label_mismatch(_labels(node), prefix)
    return sorted(findings, key=lambda f: -f.severity)


def dra_findings(
    node: Mapping[str, Any], topology: Topology, prefix: str, seen: DraObservation
) -> list[Finding]:
    """Claims on GPUs the agent sees lost; DRA slices that availability does not count, and the
    reverse (availability counting on DRA alone where no DRA driver publishes the GPUs)."""
    name = str((node.get("metadata") or {}).get("name", "?"))
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    findings = _claims_on_lost(
        name, topology, seen, annotations.get(keys.key(prefix, ALLOCATION_KEY))
    )
    if keys.key(prefix, AVAILABILITY_KEY) not in annotations or seen.slices is None:
        return findings
    allocation_text = annotations.get(keys.key(prefix, ALLOCATION_KEY))
    try:
        sources = (
            ("device-plugin",)
            if allocation_text is None
            else decode_allocation(allocation_text).sources
        )
    except SchemaError:
        return findings
    if seen.slices and "dra" not in sources:
        findings.append(
            Finding(
                code="dra-not-counted",
                severity=Severity.ERROR,
                summary=f"{dra.DRIVER} publishes this node's GPUs, but availability counts only "
                "the device plugin's allocations: GPUs that ResourceClaims hold look free to the "
                "extender",
                evidence=(
                    f"{seen.slices} ResourceSlice(s) of {dra.DRIVER} for {name}",
                    f"{keys.key(prefix, ALLOCATION_KEY)}: {allocation_text or '(absent)'}",
                ),
                fix="run the agent with its DRA drivers on (`--dra-drivers gpu.nvidia.com`, the "
                "default; chart `dra.drivers`) and the kubelet's gate "
                "KubeletPodResourcesDynamicResources on (beta, on by default since 1.34)",
            )
        )
    elif not seen.slices and sources == ("dra",):
        findings.append(
            Finding(
                code="dra-slices-missing",
                severity=Severity.WARNING,
                summary=f"availability counts DRA claims alone (no device plugin offers a GPU), "
                f"but no ResourceSlice of {dra.DRIVER} describes this node's GPUs: every GPU no "
                "claim holds is published free",
                evidence=(
                    f"no ResourceSlice of {dra.DRIVER} for {name}",
                    f"{keys.key(prefix, ALLOCATION_KEY)}: {allocation_text}",
                ),
                fix="check NVIDIA's DRA driver's kubelet plugin on the node; on a device plugin "
                "node, check that the agent's --pod-resources-resource names match what the "
                "device plugin advertises",
            )
        )
    return findings


def _claims_on_lost(
    name: str, topology: Topology, seen: DraObservation, allocation_text: Any
) -> list[Finding]:
    lost = {g.minor: g.index for g in topology.gpus if g.lost and g.minor is not None}
    if not lost:
        return []
    evidence: list[str] = []
    if seen.claims is not None:
        for claim, device in seen.claims:
            minor = dra.gpu_minor(device)
            if minor in lost:
                evidence.append(f"ResourceClaim {claim} holds {device} (GPU{lost[minor]}, lost)")
    elif isinstance(allocation_text, str):
        # Claims not readable here: what the agent published of them says which GPUs.
        try:
            claimed = set(decode_allocation(allocation_text).claimed)
        except SchemaError:
            claimed = set()
        evidence += [
            f"a ResourceClaim holds GPU{i} (lost)" for i in sorted(claimed & set(lost.values()))
        ]
    if not evidence:
        return []
    return [
        Finding(
            code="dra-claims-on-lost-gpus",
            severity=Severity.ERROR,
            summary="ResourceClaims hold GPUs that NVML reports lost: their pods cannot use them",
            evidence=tuple(evidence),
            fix="delete the pods (their claims are deallocated and allocated again elsewhere), "
            "then reset the GPU or reboot the node; with --dra-device-taints the agent taints "
            "a lost GPU so that no new claim gets it",
        )
    ]


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _annotations(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _no_data(name: str, gpus: int, agent: AgentObservation) -> Finding:
    evidence = [f"status.capacity[{GPU_RESOURCE}]={gpus}", "no topology annotation"]
    if agent.pod_found is False:
        evidence.append(f"no topo-reporter pod on {name}")
    elif agent.pod_ready is False:
        evidence.append(f"the topo-reporter pod on {name} is not ready")
    return Finding(
        code="no-topology-data",
        severity=Severity.ERROR,
        summary=f"the node has {gpus} GPUs but no topology data: topo-reporter is not running "
        "there or cannot publish",
        evidence=tuple(evidence),
        fix="check that the DaemonSet's nodeSelector and tolerations match this node, then the "
        "agent's logs (`kubectl logs -n <namespace> <pod>`): RBAC or admission errors are "
        "logged once with the fix",
    )


def _agent_not_ready(name: str, agent: AgentObservation) -> Finding:
    what = "no topo-reporter pod runs" if agent.pod_found is False else "topo-reporter is not ready"
    return Finding(
        code="agent-not-ready",
        severity=Severity.WARNING,
        summary=f"{what} on {name}: the published topology is not being kept fresh",
        evidence=(what,),
        fix="check the DaemonSet's nodeSelector and tolerations for this node and the pod's logs",
    )


# --- The multi-node NVLink fabric ---------------------------------------------------------------

_FABRIC_CHECK = (
    "`nvidia-smi -q | grep -A12 Fabric` on the node (State, Status, ClusterUUID, CliqueId, Health)"
)


def fabric_node_findings(topology: Topology) -> list[Finding]:
    """What the node's own GPUs say about its multi-node fabric: not completed, GPUs that
    disagree (either way no partition label, so Kueue and Volcano leave the node out), a degraded
    or unhealthy fabric, values the driver answered that could not be taken."""
    fabric = node_fabric(topology)
    findings: list[Finding] = []
    problems = list(fabric.problems)
    if fabric.withheld is not None:
        problems.remove(fabric.withheld)
        disagree = fabric.withheld.startswith("GPUs disagree")
        findings.append(
            Finding(
                code="fabric-gpus-disagree" if disagree else "fabric-not-ready",
                severity=Severity.ERROR if disagree else Severity.WARNING,
                summary="no nvlink-partition label: "
                + (
                    "the node's GPUs name different NVLink partitions"
                    if disagree
                    else "the node's multi-node NVLink fabric is not up"
                )
                + "; topology-aware schedulers leave the node out of partition-bound jobs",
                evidence=(fabric.withheld,),
                fix="a tray whose GPUs disagree is cabled or configured wrong, or one GPU's "
                f"fabric probe is stale: check {_FABRIC_CHECK} for every GPU, then the IMEX and "
                "NVLink switch tray configuration of the rack"
                if disagree
                else "the GPUs join the fabric at boot (in-progress for a few minutes is normal); "
                f"one that stays not-started or in-progress: check {_FABRIC_CHECK}, the "
                "nvidia-imex service and the rack's NVLink switch trays",
            )
        )
    if fabric.health in TAINTED:
        worse = [
            f"GPU{g.index}: {gpu_health(g.fabric)}"
            + (f" ({', '.join(g.fabric.conditions)})" if g.fabric.conditions else "")
            for g in topology.gpus
            if g.fabric is not None and not g.lost and gpu_health(g.fabric) != HEALTHY
        ]
        findings.append(
            Finding(
                code="fabric-degraded",
                severity=Severity.ERROR if fabric.health == UNHEALTHY else Severity.WARNING,
                summary=f"the node's NVLink fabric is {fabric.health}: multi-node jobs on its "
                "partition run slower" + (" or fail" if fabric.health == UNHEALTHY else ""),
                evidence=(f"fabric-health={fabric.health}", *worse),
                fix=f"check {_FABRIC_CHECK} and the rack's NVLink switch trays; with "
                "`fabric.taintUnhealthy` the agent keeps new pods off the node until it is "
                "healthy again"
                if fabric.health == UNHEALTHY
                else f"bandwidth is reduced or routes are recovering: check {_FABRIC_CHECK}; it "
                "often clears by itself, a persistent one needs the rack's NVLink switch trays "
                "checked",
            )
        )
    if problems:
        findings.append(
            Finding(
                code="fabric-values-invalid",
                severity=Severity.WARNING,
                summary="the driver answered fabric or rack values that cannot be taken: they "
                "are left out of the labels",
                evidence=tuple(problems),
                fix="a driver or NVML binding that returns garbage: update the NVIDIA driver, and "
                f"compare with {_FABRIC_CHECK}",
            )
        )
    return findings


def _partition_label_mismatch(labels: Mapping[str, str], prefix: str) -> list[Finding]:
    ours = labels.get(keys.key(prefix, keys.NVLINK_PARTITION))
    theirs = labels.get(GFD_CLIQUE_LABEL)
    if ours is None or theirs is None or ours == theirs:
        return []
    return [
        Finding(
            code="partition-label-mismatch",
            severity=Severity.ERROR,
            summary=f"{prefix}/{keys.NVLINK_PARTITION} and {GFD_CLIQUE_LABEL} name different "
            "NVLink partitions: a scheduler keyed on either can split a job across partitions",
            evidence=(
                f"{prefix}/{keys.NVLINK_PARTITION}={ours}",
                f"{GFD_CLIQUE_LABEL}={theirs}",
            ),
            fix="one of the two is stale (GPU Feature Discovery relabels on its own interval, "
            f"the agent each scan): compare {_FABRIC_CHECK}, then restart the one that is wrong",
        )
    ]


def fabric_cluster_findings(
    nodes: Sequence[Mapping[str, Any]], prefix: str
) -> dict[str, list[Finding]]:
    """Cluster-wide NVLink fabric findings, by node name, from the Nodes' labels alone:
    - `partition-short`: a partition with fewer nodes than its peers, the partitions of domains
      split the same way (a tray missing from a rack, or its node not publishing);
    - `clique-id-shared`: one clique ID under two or more cluster UUIDs (not wrong: clique IDs
      are per rack; wrong is keying on the ID alone).
    Nodes that are their own domain (no multi-node fabric) take no part."""
    domain_key = keys.key(prefix, keys.NVLINK_DOMAIN)
    partition_key = keys.key(prefix, keys.NVLINK_PARTITION)
    tray_key = keys.key(prefix, keys.RACK_TRAY)
    members: dict[str, list[str]] = {}
    domain_of: dict[str, str] = {}
    trays: dict[str, list[int]] = {}
    for node in nodes:
        labels = _labels(node)
        domain, partition = labels.get(domain_key), labels.get(partition_key)
        if domain is None or partition is None or not partition.startswith(domain + "."):
            continue
        name = str((node.get("metadata") or {}).get("name", "?"))
        members.setdefault(partition, []).append(name)
        domain_of[partition] = domain
        tray = labels.get(tray_key, "")
        if tray.isdigit():
            trays.setdefault(partition, []).append(int(tray))
    out: dict[str, list[Finding]] = {}
    for partition, finding in _short_partitions(members, domain_of, trays, prefix):
        for name in members[partition]:
            out.setdefault(name, []).append(finding)
    for partitions, finding in _shared_cliques(members, domain_of, prefix):
        for partition in partitions:
            for name in members[partition]:
                out.setdefault(name, []).append(finding)
    return out


def _short_partitions(
    members: Mapping[str, list[str]],
    domain_of: Mapping[str, str],
    trays: Mapping[str, list[int]],
    prefix: str,
) -> list[tuple[str, Finding]]:
    split: Counter[str] = Counter(domain_of.values())
    classes: dict[int, list[str]] = {}
    for partition, domain in domain_of.items():
        classes.setdefault(split[domain], []).append(partition)
    out: list[tuple[str, Finding]] = []
    for parts, partitions in sorted(classes.items()):
        if len(partitions) < 2:
            continue
        sizes = Counter(len(members[p]) for p in partitions)
        # The size most partitions of this split have; a tie goes to the larger.
        usual = max(sizes, key=lambda size: (sizes[size], size))
        peers = f"{sizes[usual]} partitions" + ("" if parts == 1 else f" of racks split in {parts}")
        for partition in sorted(partitions):
            count = len(members[partition])
            if count >= usual:
                continue
            evidence = [f"{partition}: {count} nodes", f"its peers ({peers}): {usual} nodes"]
            present = sorted(set(trays.get(partition, ())))
            if present:
                gaps = sorted(set(range(present[0], present[-1] + 1)) - set(present))
                evidence.append(
                    f"trays present: {_ranges(present)}"
                    + (f"; missing between them: {_ranges(gaps)}" if gaps else "")
                )
            out.append(
                (
                    partition,
                    Finding(
                        code="partition-short",
                        severity=Severity.WARNING,
                        summary=f"NVLink partition {partition} has {count} nodes where its "
                        f"peers have {usual}: a job sized for a full partition waits",
                        evidence=tuple(evidence),
                        fix="a compute tray is missing from the rack, or its node has not "
                        "joined or not published: list the partition's nodes (`kubectl get "
                        f"nodes -l {keys.key(prefix, keys.NVLINK_PARTITION)}={partition}`), "
                        "check the missing tray's node, its topo-reporter pod and its fabric "
                        f"({_FABRIC_CHECK})",
                    ),
                )
            )
    return out


def _shared_cliques(
    members: Mapping[str, list[str]], domain_of: Mapping[str, str], prefix: str
) -> list[tuple[list[str], Finding]]:
    by_clique: dict[str, list[str]] = {}
    for partition, domain in domain_of.items():
        by_clique.setdefault(partition[len(domain) + 1 :], []).append(partition)
    out: list[tuple[list[str], Finding]] = []
    for clique, partitions in sorted(by_clique.items()):
        if len(partitions) < 2:
            continue
        partitions.sort()
        out.append(
            (
                partitions,
                Finding(
                    code="clique-id-shared",
                    severity=Severity.INFO,
                    summary=f"clique ID {clique} names partitions of {len(partitions)} "
                    "different NVLink domains: never select or group nodes by the clique ID "
                    "alone",
                    evidence=tuple(
                        f"domain {domain_of[p]}: {len(members[p])} nodes" for p in partitions
                    ),
                    fix="nothing to repair: clique IDs are assigned per rack. Group by "
                    f"{keys.key(prefix, keys.NVLINK_PARTITION)} (or {GFD_CLIQUE_LABEL}), which "
                    "include the cluster UUID; a job split across these racks has no NVLink "
                    "between them",
                ),
            )
        )
    return out


def _ranges(numbers: Sequence[int]) -> str:
    """`0-16,18`: sorted integers as ranges."""
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if start is None:
            start = prev = n
        elif prev is not None and n == prev + 1:
            prev = n
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def summarize(
    findings_by_node: Mapping[str, list[Finding]],
) -> list[tuple[str, Severity, list[str]]]:
    """Nodes by finding, worst first: (code, severity, nodes), for `doctor --all`."""
    nodes: dict[str, list[str]] = {}
    severity: dict[str, Severity] = {}
    for node, findings in findings_by_node.items():
        for f in findings:
            nodes.setdefault(f.code, []).append(node)
            severity[f.code] = f.severity
    counts = Counter({code: len(n) for code, n in nodes.items()})
    order = sorted(nodes, key=lambda c: (-severity[c], -counts[c], c))
    return [(code, severity[code], sorted(nodes[code])) for code in order]


class ClusterReader(Protocol):
    """What the doctor reads from the API: nodes, the agent's pods, and Events on a node.

    Each returns plain dicts as the API serves them; a read the caller may not make returns None
    (RBAC lets many operators read nodes but not pods or events).
    """

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None: ...

    def node_events(self, node: str) -> list[dict[str, Any]] | None: ...

    def dra(self, node: str) -> DraObservation: ...


def _field(obj: Any, name: str) -> Mapping[str, Any]:
    """`obj[name]` where both are objects, else empty: a list item of any shape reads safely."""
    value = obj.get(name) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def dra_observation(
    node: str, slices: list[dict[str, Any]] | None, claims: list[dict[str, Any]] | None
) -> DraObservation:
    """What the cluster's ResourceSlices and ResourceClaims (as the API lists them) say of
    NVIDIA's GPUs on `node`."""
    mine = None
    if slices is not None:
        mine = sum(
            1
            for s in slices
            if (spec := _field(s, "spec")).get("driver") == dra.DRIVER
            and node in (spec.get("nodeName"), _field(spec, "pool").get("name"))
        )
    held = None
    if claims is not None:
        found: list[tuple[str, str]] = []
        for claim in claims:
            meta = _field(claim, "metadata")
            devices = _field(_field(_field(claim, "status"), "allocation"), "devices")
            results = devices.get("results")
            for result in results if isinstance(results, list) else ():
                if (
                    isinstance(result, dict)
                    and result.get("driver") == dra.DRIVER
                    and result.get("pool") == node
                ):
                    found.append(
                        (f"{meta.get('namespace')}/{meta.get('name')}", str(result.get("device")))
                    )
        held = tuple(sorted(found))
    return DraObservation(slices=mine, claims=held)


class ApiClusterReader:
    """ClusterReader over the ApiClient seam (reporter.publish.api). Pods and Events are optional
    reads: where the operator's credentials may not list them, the answer is None (unknown)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        agent_selector: str = AGENT_POD_SELECTOR,
        namespace: str | None = None,
        tool: str = "topo-reporter doctor",
    ) -> None:
        """`namespace`: where the agent runs, to look up its pods there only (None: every
        namespace); its Events are read where it posts them (NODE_EVENT_NAMESPACE) only. `tool`:
        the command that 403 messages say needs the permission."""
        self._api = api
        self._agent_selector = agent_selector
        self._namespace = namespace
        self._tool = tool
        self._dra_lists: dict[str, list[dict[str, Any]] | None] = {}

    def _forbidden(self, what: str, resource: Resource) -> ApiPermanentError:
        return ApiPermanentError(
            f"{what}: forbidden (403): `{self._tool}` needs get and list on `{resource.plural}` "
            "(the built-in `view` ClusterRole does not cover nodes: bind one that does)",
            status=403,
        )

    def list_nodes(self) -> list[dict[str, Any]]:
        try:
            return list(self._api.list(NODES)["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                raise self._forbidden("list nodes", NODES) from e
            raise

    def get_node(self, name: str) -> dict[str, Any]:
        try:
            node = self._api.get(NODES, name)
        except ApiPermanentError as e:
            if e.status == 403:
                raise self._forbidden(f"node {name}", NODES) from e
            raise
        if node is None:
            raise ApiPermanentError(f"node {name}: not found (404)", status=404)
        return node

    def _optional(
        self, resource: Resource, namespace: str | None, query: Mapping[str, str]
    ) -> list[dict[str, Any]] | None:
        try:
            return list(self._api.list(resource, namespace, query=query)["items"])
        except ApiPermanentError as e:
            if e.status == 403:
                return None
            raise

    def agent_pods(self, node: str) -> list[dict[str, Any]] | None:
        query = {"labelSelector": self._agent_selector, "fieldSelector": f"spec.nodeName={node}"}
        return self._optional(PODS, self._namespace, query)

    def node_events(self, node: str) -> list[dict[str, Any]] | None:
        selector = f"involvedObject.kind=Node,involvedObject.name={node}"
        return self._optional(EVENTS, NODE_EVENT_NAMESPACE, {"fieldSelector": selector})

    def _dra_list(self, kind: str) -> list[dict[str, Any]] | None:
        """Every ResourceSlice or ResourceClaim, listed once per reader in the newest version
        served; None where none is served (404) or the operator may not list them (403)."""
        if kind not in self._dra_lists:
            self._dra_lists[kind] = None
            make = resource_slices if kind == "slices" else resource_claims
            for version in DRA_VERSIONS:
                try:
                    self._dra_lists[kind] = list(self._api.list(make(version))["items"])
                except ApiPermanentError as e:
                    if e.status == 404:
                        continue
                    if e.status != 403:
                        raise
                break
        return self._dra_lists[kind]

    def dra(self, node: str) -> DraObservation:
        return dra_observation(node, self._dra_list("slices"), self._dra_list("claims"))


def is_agent_event(event: Mapping[str, Any], node: str) -> bool:
    """An Event the agent on `node` could have posted about it: in NODE_EVENT_NAMESPACE, from
    COMPONENT, about the cluster-scoped Node (no involvedObject namespace), reported by `node`
    itself (reportingInstance and source.host), as reporter.publish.client writes it.

    The API server takes an Event about a Node in any namespace whose name the involvedObject
    repeats, so whoever may create Events there can write any reason, source and message about
    any Node. The chart's `<fullname>-own-events` policy lets an agent post only Events about
    its own Node that name no other reporter; so another node's agent cannot have written one
    that passes here (an operator with `create events` still could)."""
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return (
        (event.get("metadata") or {}).get("namespace") == NODE_EVENT_NAMESPACE
        and source.get("component") == COMPONENT
        and source.get("host") == node
        and event.get("reportingComponent") == COMPONENT
        and event.get("reportingInstance") == node
        and involved.get("kind") == "Node"
        and involved.get("name") == node
        and not involved.get("namespace")
    )


def observe_agent(reader: ClusterReader, node: str) -> AgentObservation:
    """What the cluster says about the agent on `node` (unknown parts stay None)."""
    pods = reader.agent_pods(node)
    ready: bool | None = None
    if pods:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for pod in pods
            for c in (pod.get("status") or {}).get("conditions") or []
        )
    events = reader.node_events(node)
    degraded = [
        e for e in events or [] if e.get("reason") == DEGRADED_REASON and is_agent_event(e, node)
    ]
    degraded.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return AgentObservation(
        pod_found=None if pods is None else bool(pods),
        pod_ready=ready,
        degraded_reason=str(degraded[-1].get("message")) if degraded else None,
    )


def examine(reader: ClusterReader, node: dict[str, Any], prefix: str) -> list[Finding]:
    """Every finding for one Node: its annotation decoded, its agent observed."""
    annotation = _annotations(node).get(keys.key(prefix, keys.TOPOLOGY))
    topology: Topology | None = None
    findings: list[Finding] = []
    if annotation is not None:
        try:
            topology = decode(annotation)
        except SchemaError as e:
            findings.append(
                Finding(
                    code="topology-unreadable",
                    severity=Severity.ERROR,
                    summary="the topology annotation does not validate: schedulers ignore it",
                    evidence=(str(e),),
                    fix="someone edited it by hand or another tool wrote it: delete the annotation "
                    "and the agent republishes within one resync",
                )
            )
    name = str((node.get("metadata") or {}).get("name", "?"))
    agent = observe_agent(reader, name)
    return findings + node_findings(node, topology, prefix, agent, reader.dra(name))


def is_gpu_node(node: Mapping[str, Any], prefix: str) -> bool:
    """A Node the kubelet gives GPUs to, or one our agent published on."""
    status = node.get("status") or {}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return (
        GPU_RESOURCE in (status.get("capacity") or {})
        or keys.key(prefix, keys.TOPOLOGY) in annotations
    )


def report_text(findings_by_node: Mapping[str, list[Finding]], summary: bool) -> str:
    """The report an operator reads in a terminal."""
    out: list[str] = []
    if summary:
        rows = summarize(findings_by_node)
        healthy = [n for n, f in findings_by_node.items() if not f]
        out.append(f"{len(findings_by_node)} nodes, {len(healthy)} without findings")
        out += [
            f"  {sev!s:7} {code}: {len(nodes)} ({', '.join(nodes)})" for code, sev, nodes in rows
        ]
        out.append("")
    for node, findings in findings_by_node.items():
        if not findings:
            if not summary:
                out.append(f"node {node}: no findings")
            continue
        out.append(f"node {node}: {len(findings)} finding{'s' if len(findings) > 1 else ''}")
        for f in findings:
            out.append(f"  {f.severity!s} {f.code}: {f.summary}")
            out += [f"    evidence: {line}" for line in f.evidence]
            out.append(f"    fix: {f.fix}")
    return "\n".join(out) + "\n"


def report_json(findings_by_node: Mapping[str, list[Finding]]) -> str:
    """The same report for scripts: nodes with their findings, and the summary."""
    doc = {
        "nodes": [
            {
                "node": node,
                "findings": [
                    {
                        "code": f.code,
                        "severity": str(f.severity).lower(),
                        "summary": f.summary,
                        "evidence": list(f.evidence),
                        "fix": f.fix,
                    }
                    for f in findings
                ],
            }
            for node, findings in findings_by_node.items()
        ],
        "summary": [
            {"code": code, "severity": str(sev).lower(), "nodes": nodes}
            for code, sev, nodes in summarize(findings_by_node)
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def worst(findings_by_node: Mapping[str, list[Finding]]) -> Severity | None:
    """The most severe finding of the report, None when there is none."""
    return max((f.severity for fs in findings_by_node.values() for f in fs), default=None)


def event_text(finding: Finding) -> str:
    """A finding as one Event message: what, the evidence, the fix (kept under 1 KiB)."""
    text = f"{finding.summary}. Evidence: {'; '.join(finding.evidence)}. Fix: {finding.fix}"
    return text if len(text) <= 1024 else text[:1021] + "..."
