"""Findings about one node: what is wrong there, with the evidence and the fix, in the
operator's words.

Pure: it judges a decoded topology, the kubelet's policies, a Node object (a dict, as the API
serves it) and what was observed of the agent and of DRA. It reads nothing itself: the agent
feeds it its own topology (`local_findings`, posted as Warning Events), and
reporter.doctor.reader feeds it what the API serves (`node_findings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parsers.errors import ParseError
from parsers.integers import parse_decimal
from parsers.kubelet import KubeletPolicies
from reporter.doctor.model import (
    FABRIC_CHECK,
    GPU_RESOURCE,
    AgentObservation,
    Code,
    DraObservation,
    Finding,
    Severity,
    node_annotations,
    node_labels,
)
from reporter.doctor.racks import partition_label_mismatch
from reporter.doctor.report import event_parts
from reporter.errors import SchemaError
from reporter.schema import dra, keys
from reporter.schema.availability import decode_allocation
from reporter.schema.fabric import HEALTHY, TAINTED, UNHEALTHY, gpu_health, node_fabric
from reporter.schema.labels import gpus_per_numa
from reporter.schema.model import Topology


def local_findings(
    topology: Topology,
    policies: KubeletPolicies | None,
    kubelet_problem: str | None = None,
    silent_ports: Sequence[tuple[str, str]] = (),
) -> list[Finding]:
    """Findings the agent can see on its own node: alignment limits, NVLink damage, NUMA gaps,
    and, with `kubelet_problem` (why the kubelet's policies are unknown), that they are unknown;
    with `silent_ports` ((port, how it was asked) of each up RoCE port the LLDP source heard no
    neighbour on), that they hear none."""
    findings = [*_lost_gpus(topology), *_nvlink_degraded(topology), *_numa_unknown(topology)]
    if policies is not None:
        findings += _alignment_limit(topology, policies)
    elif kubelet_problem is not None:
        findings.append(_policy_unknown(kubelet_problem))
    if silent_ports:
        findings.append(
            roce_port_silent(
                f"RoCE ports {', '.join(p for p, _ in silent_ports)} are up but hear no LLDP "
                "neighbour: their switch is missing from network-tier-0 (there is no tier 0 "
                "where no port hears one)",
                tuple(f"{p}: up, {how}" for p, how in silent_ports),
            )
        )
    return findings


ROCE_SILENT_FIX = (
    "LLDP is off on the switch port, or the NIC's own firmware LLDP agent consumes the frames "
    "before the host sees them: on Intel 700-series (i40e) NICs `ethtool --set-priv-flags IFACE "
    "disable-fw-lldp on` (NVM 6.01 or newer; `ethtool --show-priv-flags IFACE` shows it); "
    "ConnectX firmware has LLDP settings too (mlxconfig `LLDP_NB_*`, not verified here); or run "
    "lldpd on the host. On the switch, `show lldp neighbors` should list the node"
)


def roce_port_silent(summary: str, evidence: tuple[str, ...]) -> Finding:
    """Up RoCE ports that hear no LLDP neighbour (docs/network.md, When nothing is heard)."""
    return Finding(
        code=Code.ROCE_PORT_SILENT,
        severity=Severity.WARNING,
        summary=summary,
        evidence=evidence,
        fix=ROCE_SILENT_FIX,
    )


def _policy_unknown(problem: str) -> Finding:
    return Finding(
        code=Code.KUBELET_POLICY_UNKNOWN,
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
            code=Code.GPU_LOST,
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
    if topology.nvswitch and topology.largest_island < healthy:
        evidence.append(f"NVSwitch system split into islands {[list(i) for i in topology.islands]}")
    if not evidence:
        return []
    return [
        Finding(
            code=Code.NVLINK_DEGRADED,
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
            code=Code.NUMA_UNKNOWN,
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
            code=Code.NUMA_ALIGNMENT_LIMIT,
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
        if node_annotations(node).get(keys.key(prefix, keys.TOPOLOGY)) is not None:
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
                code=Code.DEVICE_PLUGIN_MISSING,
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
                code=Code.GPUS_UNALLOCATABLE,
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
                code=Code.AGENT_DEGRADED,
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
    if agent.silent_ports is not None:
        # Only the agent hears LLDP: its latest word, and when it said it.
        when, message = agent.silent_ports
        summary, evidence = event_parts(message)
        said = f"the agent's RoCEPortSilent Event of {when or 'an unknown time'}"
        findings.append(roce_port_silent(summary, (f"{said}: {evidence or message}",)))
    policies = policies_from_labels(node_labels(node), prefix)
    unlabelled = f"no {keys.key(prefix, keys.TOPOLOGY_MANAGER_POLICY)} label on the Node"
    findings += local_findings(topology, policies, None if policies else unlabelled)
    findings += dra_findings(node, topology, prefix, dra_seen)
    findings += fabric_node_findings(topology)
    findings += partition_label_mismatch(node_labels(node), prefix)
    return sorted(findings, key=lambda f: -f.severity)


def dra_findings(
    node: Mapping[str, Any], topology: Topology, prefix: str, seen: DraObservation
) -> list[Finding]:
    """Claims on GPUs the agent sees lost; DRA slices that availability does not count, and the
    reverse (availability counting on DRA alone where no DRA driver publishes the GPUs)."""
    name = str((node.get("metadata") or {}).get("name", "?"))
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    findings = _claims_on_lost(
        name, topology, seen, annotations.get(keys.key(prefix, keys.ALLOCATION))
    )
    if keys.key(prefix, keys.AVAILABILITY) not in annotations or seen.slices is None:
        return findings
    allocation_text = annotations.get(keys.key(prefix, keys.ALLOCATION))
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
                code=Code.DRA_NOT_COUNTED,
                severity=Severity.ERROR,
                summary=f"{dra.DRIVER} publishes this node's GPUs, but availability counts only "
                "the device plugin's allocations: GPUs that ResourceClaims hold look free to the "
                "extender",
                evidence=(
                    f"{seen.slices} ResourceSlice(s) of {dra.DRIVER} for {name}",
                    f"{keys.key(prefix, keys.ALLOCATION)}: {allocation_text or '(absent)'}",
                ),
                fix="run the agent with its DRA drivers on (`--dra-drivers gpu.nvidia.com`, the "
                "default; chart `dra.drivers`) and the kubelet's gate "
                "KubeletPodResourcesDynamicResources on (beta, on by default since 1.34)",
            )
        )
    elif not seen.slices and sources == ("dra",):
        findings.append(
            Finding(
                code=Code.DRA_SLICES_MISSING,
                severity=Severity.WARNING,
                summary=f"availability counts DRA claims alone (no device plugin offers a GPU), "
                f"but no ResourceSlice of {dra.DRIVER} describes this node's GPUs: every GPU no "
                "claim holds is published free",
                evidence=(
                    f"no ResourceSlice of {dra.DRIVER} for {name}",
                    f"{keys.key(prefix, keys.ALLOCATION)}: {allocation_text}",
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
            code=Code.DRA_CLAIMS_ON_LOST_GPUS,
            severity=Severity.ERROR,
            summary="ResourceClaims hold GPUs that NVML reports lost: their pods cannot use them",
            evidence=tuple(evidence),
            fix="delete the pods (their claims are deallocated and allocated again elsewhere), "
            "then reset the GPU or reboot the node; with --dra-device-taints the agent taints "
            "a lost GPU so that no new claim gets it",
        )
    ]


def _no_data(name: str, gpus: int, agent: AgentObservation) -> Finding:
    evidence = [f"status.capacity[{GPU_RESOURCE}]={gpus}", "no topology annotation"]
    if agent.pod_found is False:
        evidence.append(f"no topo-reporter pod on {name}")
    elif agent.pod_ready is False:
        evidence.append(f"the topo-reporter pod on {name} is not ready")
    return Finding(
        code=Code.NO_TOPOLOGY_DATA,
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
        code=Code.AGENT_NOT_READY,
        severity=Severity.WARNING,
        summary=f"{what} on {name}: the published topology is not being kept fresh",
        evidence=(what,),
        fix="check the DaemonSet's nodeSelector and tolerations for this node and the pod's logs",
    )


# --- The multi-node NVLink fabric ---------------------------------------------------------------


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
                code=Code.FABRIC_GPUS_DISAGREE if disagree else Code.FABRIC_NOT_READY,
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
                f"fabric probe is stale: check {FABRIC_CHECK} for every GPU, then the IMEX and "
                "NVLink switch tray configuration of the rack"
                if disagree
                else "the GPUs join the fabric at boot (in-progress for a few minutes is normal); "
                f"one that stays not-started or in-progress: check {FABRIC_CHECK}, the "
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
                code=Code.FABRIC_DEGRADED,
                severity=Severity.ERROR if fabric.health == UNHEALTHY else Severity.WARNING,
                summary=f"the node's NVLink fabric is {fabric.health}: multi-node jobs on its "
                "partition run slower" + (" or fail" if fabric.health == UNHEALTHY else ""),
                evidence=(f"fabric-health={fabric.health}", *worse),
                fix=f"check {FABRIC_CHECK} and the rack's NVLink switch trays; with "
                "`fabric.taintUnhealthy` the agent keeps new pods off the node until it is "
                "healthy again"
                if fabric.health == UNHEALTHY
                else f"bandwidth is reduced or routes are recovering: check {FABRIC_CHECK}; it "
                "often clears by itself, a persistent one needs the rack's NVLink switch trays "
                "checked",
            )
        )
    if problems:
        findings.append(
            Finding(
                code=Code.FABRIC_VALUES_INVALID,
                severity=Severity.WARNING,
                summary="the driver answered fabric or rack values that cannot be taken: they "
                "are left out of the labels",
                evidence=tuple(problems),
                fix="a driver or NVML binding that returns garbage: update the NVIDIA driver, and "
                f"compare with {FABRIC_CHECK}",
            )
        )
    return findings
