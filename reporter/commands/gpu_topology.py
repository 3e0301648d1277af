"""`kubectl gpu-topology`'s reading and printing: a node's wiring, free GPUs, pod GPU sets and the
doctor's findings, one line per GPU node, or the cluster's free capacity per NVLink partition or
per network group.

It only reads: Nodes, and where the credentials allow, the agent's pods and Events for the
doctor's findings, through the official client (exec plugins, contexts: every kubeconfig kubectl
reads). reporter.kubectl_plugin parses the arguments and imports this module only to run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from typing import Any

from parsers.cpulist import format_cpulist
from reporter import doctor, settings, terminal
from reporter.commands import EXIT_FAILURE, EXIT_OK, PLUGIN_PROG
from reporter.errors import ApiPermanentError, InputError, SchemaError
from reporter.extender.cache import NodeCache
from reporter.placement_quality import decode_held_sets, judge
from reporter.publish.watch import node_annotation
from reporter.schema import dra, keys
from reporter.schema.availability import (
    DEVICE_PLUGIN_ONLY,
    Allocation,
    Availability,
    availability_labels,
    decode_allocation,
    decode_availability,
)
from reporter.schema.codec import decode, to_document
from reporter.schema.matrix import describe_matrix
from reporter.schema.model import Topology
from reporter.schema.pictures import to_dot, to_mermaid

LIST_COLUMNS = ("NAME", "GPUS", "INTERCONNECT", "NVLINK-ISLAND", "FREE")


def capacity(nodes: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, Any]:
    """The cluster's free capacity from its Nodes, counted by the extender's own cache: the
    nodes that hand a pod of k GPUs an NVLink-connected set now (k in CAPABLE_SIZES), and per
    multi-node NVLink partition (not a node's own `node-<name>`) its nodes and those whose GPUs
    are all free."""
    key = keys.key(prefix, keys.AVAILABILITY)
    cache = NodeCache(prefix)
    listed = [node_annotation(n, key) for n in nodes]
    cache.replace(listed)
    capable, free = cache.capacity()
    members = Tally(n.partition for n in listed if n.partition is not None)
    return {
        "connected_capable_nodes": {str(k): n for k, n in capable.items()},
        "partitions": [
            {"partition": p, "nodes": members[p], "free_nodes": free[p]} for p in sorted(free)
        ],
    }


def capacity_text(found: Mapping[str, Any]) -> str:
    """`capacity` as `kubectl get` lays out a table, then one line of connected capacity."""
    rows = [[r["partition"], str(r["nodes"]), str(r["free_nodes"])] for r in found["partitions"]]
    if rows:
        out = _table(("PARTITION", "NODES", "WHOLE-FREE"), rows)
    else:
        out = "No node carries an NVLink partition label.\n"
    sizes = ", ".join(f"{k} GPUs: {n}" for k, n in found["connected_capable_nodes"].items())
    return out + f"Nodes that can host an NVLink-connected set now: {sizes}\n"


def network_capacity(nodes: Sequence[Mapping[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """Per network group (each value of each `network-tier-<N>` label, tier 0 the leaf group) its
    nodes and those whose GPUs are all free, counted by the extender's own cache; by tier, then
    group."""
    cache = NodeCache(prefix)
    cache.replace(node_annotation(n, keys.key(prefix, keys.AVAILABILITY)) for n in nodes)
    return [
        {"tier": tier, "group": group, "nodes": n, "free_nodes": free}
        for (tier, group), (n, free) in sorted(cache.network_capacity().items())
    ]


def network_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """`network_capacity` as `kubectl get` lays out a table, or why there is none."""
    if not rows:
        return (
            "No node carries a network-tier-<N> label (docs/network.md says which of the "
            "agent's sources write them).\n"
        )
    return _table(
        ("TIER", "GROUP", "NODES", "WHOLE-FREE"),
        [[str(r["tier"]), r["group"], str(r["nodes"]), str(r["free_nodes"])] for r in rows],
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    table = [list(header), *rows]
    widths = [max(len(line[c]) for line in table) for c in range(len(header))]
    return "".join(
        "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in table
    )


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", "?"))


def _annotation(node: Mapping[str, Any], prefix: str, name: str) -> Any:
    return ((node.get("metadata") or {}).get("annotations") or {}).get(keys.key(prefix, name))


def availability(node: Mapping[str, Any], prefix: str) -> Availability | str:
    """The node's free GPUs as the agent published them, or why they are not known."""
    text = _annotation(node, prefix, keys.AVAILABILITY)
    if not isinstance(text, str):
        return "unknown: the agent does not publish availability on this node"
    try:
        return decode_availability(text)
    except SchemaError as e:
        return f"unknown: the {keys.key(prefix, keys.AVAILABILITY)} annotation is damaged ({e})"


def allocation(node: Mapping[str, Any], prefix: str) -> Allocation | None:
    """How the node's availability was counted and which GPUs DRA claims hold; None when the
    annotation is damaged (its absence means the device plugin's allocations only)."""
    text = _annotation(node, prefix, keys.ALLOCATION)
    if text is None:
        return DEVICE_PLUGIN_ONLY
    try:
        return decode_allocation(text)
    except SchemaError:
        return None


def pod_set_rows(
    node: Mapping[str, Any], prefix: str, topology: Topology
) -> list[dict[str, Any]] | str:
    """Each container holding two or more GPUs (the `gpu-sets` annotation) with its set's quality
    judged on the topology; or why they cannot be shown. Empty: no such container, or the agent
    does not publish availability."""
    text = _annotation(node, prefix, keys.GPU_SETS)
    if text is None:
        return []
    try:
        sets, left_out = decode_held_sets(text)
        if any(g >= len(topology.gpus) for s in sets for g in s.gpus):
            raise SchemaError(keys.GPU_SETS, "names a GPU the topology does not have")
    except SchemaError as e:
        return f"unknown: the {keys.key(prefix, keys.GPU_SETS)} annotation is damaged ({e})"
    rows: list[dict[str, Any]] = []
    for held in sets:
        quality = judge(topology, held.gpus)
        rows.append(
            {
                "namespace": held.namespace,
                "pod": held.pod,
                "container": held.container,
                "gpus": list(held.gpus),
                "connected": quality.connected,
                "worst": quality.worst_token,
                "numa": quality.numa,
            }
        )
    if left_out:
        rows.append({"left_out": left_out})
    return rows


def pod_sets_text(rows: list[dict[str, Any]] | str) -> str:
    """`POD  CONTAINER  GPUS  CONNECTED  WORST  NUMA`, `kubectl get`'s layout, or why not."""
    if isinstance(rows, str):
        return f"Pod GPU sets: {rows}"
    table = [["POD", "CONTAINER", "GPUS", "CONNECTED", "WORST", "NUMA"]]
    more = ""
    for row in rows:
        if "left_out" in row:
            more = f"  ... and {row['left_out']} more (the annotation lists the first ones)\n"
            continue
        table.append(
            [
                f"{row['namespace']}/{row['pod']}",
                row["container"],
                f"GPU{format_cpulist(frozenset(row['gpus']))}",
                "yes" if row["connected"] else "no",
                row["worst"],
                row["numa"],
            ]
        )
    widths = [max(len(line[c]) for line in table) for c in range(6)]
    lines = "".join(
        "  "
        + "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in table
    )
    return "Pod GPU sets (containers holding 2 or more GPUs):\n" + lines + more


def gpu_rows(
    topology: Topology, free: Availability | str, held: Allocation | None
) -> list[dict[str, Any]]:
    """One entry per GPU: its DRA device name, whether it is free, held by a claim or by a
    container, or lost, and its NVLinks' health."""
    rows: list[dict[str, Any]] = []
    for gpu in topology.gpus:
        if gpu.lost:
            state = "lost"
        elif not isinstance(free, Availability):
            state = "unknown"
        elif gpu.index in free.free:
            state = "free"
        elif held is not None and gpu.index in held.claimed:
            state = "claimed"
        else:
            state = "in use"
        health = gpu.nvlink
        rows.append(
            {
                "gpu": gpu.index,
                "device": None if gpu.minor is None else dra.gpu_device(gpu.minor),
                "state": state,
                "nvlink": None
                if health is None
                else {
                    "state": health.state,
                    "active": health.active,
                    "count": health.count,
                    "down": list(health.down),
                },
            }
        )
    return rows


def gpus_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The GPU table: `GPU  DRA DEVICE  STATE  NVLINK`, `kubectl get`'s layout."""
    table = [["GPU", "DRA DEVICE", "STATE", "NVLINK"]]
    for row in rows:
        health = row["nvlink"]
        links = "-"
        if health is not None:
            links = f"{health['state']} {health['active']}/{health['count']}"
            if health["down"]:
                links += f" (down: {format_cpulist(frozenset(health['down']))})"
        table.append([f"GPU{row['gpu']}", row["device"] or "-", row["state"], links])
    widths = [max(len(line[c]) for line in table) for c in range(4)]
    return "".join(
        "  "
        + "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in table
    )


def node_row(node: Mapping[str, Any], prefix: str) -> dict[str, str]:
    """One GPU node's line: GPUs, interconnect and largest NVLink island from its labels, and
    its free GPUs from the availability annotation."""
    labels = _labels(node)
    capacity = ((node.get("status") or {}).get("capacity") or {}).get(keys.GPU_RESOURCE)
    free = availability(node, prefix)
    return {
        "node": _name(node),
        "gpus": labels.get(keys.key(prefix, keys.COUNT)) or str(capacity or "<none>"),
        "interconnect": labels.get(keys.key(prefix, keys.INTERCONNECT), "<none>"),
        "nvlink_island": labels.get(keys.key(prefix, keys.NVLINK_ISLAND_SIZE), "<none>"),
        "free": str(len(free.free)) if isinstance(free, Availability) else "<unknown>",
    }


def list_text(rows: Sequence[Mapping[str, str]]) -> str:
    """The rows as `kubectl get` lays out a table: upper-case headers, columns three apart."""
    return _table(LIST_COLUMNS, [[*row.values()] for row in rows])


def islands_text(topology: Topology) -> str:
    """`NVLink islands: 0-3 (4 GPUs), 4-7 (4 GPUs)`, or why there are none."""
    if not topology.nvlink_observed:
        return "NVLink islands: unknown (NVLink not observed: the agent read sysfs only)"
    if not topology.islands:
        return "NVLink islands: none (no two GPUs joined by NVLink)"
    return "NVLink islands: " + ", ".join(
        f"GPU{format_cpulist(frozenset(i))} ({len(i)} GPUs)" for i in topology.islands
    )


def free_text(free: Availability | str, prefix: str) -> str:
    """`Free GPUs: GPU0-3,6 (5; up to 5 of them NVLink-connected)`, or why they are not known."""
    if not isinstance(free, Availability):
        return f"Free GPUs: {free}"
    if not free.free:
        return "Free GPUs: none"
    connected = availability_labels(free, prefix)[keys.key(prefix, keys.GPU_FREE_NVLINK_MAX)]
    nvlink = f"up to {connected} of them NVLink-connected" if connected != "0" else "no NVLink pair"
    return f"Free GPUs: GPU{format_cpulist(frozenset(free.free))} ({len(free.free)}; {nvlink})"


def _topology(node: Mapping[str, Any], prefix: str) -> Topology | None:
    text = _annotation(node, prefix, keys.TOPOLOGY)
    if not isinstance(text, str):
        return None
    try:
        return decode(text)
    except SchemaError:
        return None  # the doctor's `topology-unreadable` finding says why


def show_node(node: dict[str, Any], findings: list[doctor.Finding], fmt: str, prefix: str) -> str:
    """What the plugin prints for one node. Raises InputError for a picture of no topology."""
    name = _name(node)
    topology = _topology(node, prefix)
    free = availability(node, prefix)
    held = allocation(node, prefix)
    rows = [] if topology is None else gpu_rows(topology, free, held)
    pod_sets = [] if topology is None else pod_set_rows(node, prefix, topology)
    if fmt in ("dot", "mermaid"):
        if topology is None:
            raise InputError(
                f"node {name} has no readable {keys.key(prefix, keys.TOPOLOGY)} annotation to "
                f"draw: `{PLUGIN_PROG} {name}` says why"
            )
        return to_dot(topology) if fmt == "dot" else to_mermaid(topology)
    if fmt == "json":
        report = json.loads(doctor.report_json({name: findings}))["nodes"][0]
        doc = {
            "node": name,
            "topology": None if topology is None else to_document(topology),
            "islands": None if topology is None else [list(i) for i in topology.islands],
            "free": list(free.free) if isinstance(free, Availability) else None,
            "claimed": None if held is None else list(held.claimed),
            "counted": None if held is None else list(held.sources),
            "gpus": rows,
            "pod_sets": pod_sets if isinstance(pod_sets, list) else None,
            "findings": report["findings"],
        }
        return json.dumps(doc, indent=2) + "\n"
    out = [f"Node: {name}"]
    if topology is None:
        out.append(f"No readable {keys.key(prefix, keys.TOPOLOGY)} annotation: see the findings.")
    else:
        out += [describe_matrix(topology).rstrip("\n"), "", islands_text(topology)]
    out.append(free_text(free, prefix))
    if held is not None and held != DEVICE_PLUGIN_ONLY:
        claimed = f"GPU{format_cpulist(frozenset(held.claimed))}" if held.claimed else "none"
        out.append(f"Held by DRA claims: {claimed} (availability counts {', '.join(held.sources)})")
    if rows:
        out += ["", "GPUs:", gpus_text(rows).rstrip("\n")]
    if pod_sets:
        out += ["", pod_sets_text(pod_sets).rstrip("\n")]
    out += ["", doctor.report_text({name: findings}, summary=False).rstrip("\n")]
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    """Read the cluster and print; raises TopoReporterError for anything that stops it."""
    # The official client reads every kubeconfig kubectl reads (exec plugins, contexts).
    from reporter.publish import kube  # noqa: PLC0415  # kubernetes loads only for this command

    config = settings.resolve_as(settings.ReaderSettings, vars(args), os.environ)
    reader = doctor.ApiClusterReader(
        kube.operator_client(config.kubeconfig, args.context),
        agent_selector=args.agent_selector,
        namespace=args.namespace,
        tool=PLUGIN_PROG,
    )
    if args.partitions:
        found = capacity(reader.list_nodes(), args.prefix)
        text = json.dumps(found, indent=2) + "\n" if args.format == "json" else capacity_text(found)
        terminal.write(sys.stdout, text)
        return EXIT_OK
    if args.network:
        rows = network_capacity(reader.list_nodes(), args.prefix)
        text = json.dumps(rows, indent=2) + "\n" if args.format == "json" else network_text(rows)
        terminal.write(sys.stdout, text)
        return EXIT_OK
    if args.node is None:
        nodes = [n for n in reader.list_nodes() if doctor.is_gpu_node(n, args.prefix)]
        rows = [node_row(n, args.prefix) for n in nodes]
        if not rows:
            terminal.write(
                sys.stderr,
                f"No GPU nodes found: no node has {keys.GPU_RESOURCE} capacity or a "
                f"{keys.key(args.prefix, keys.TOPOLOGY)} annotation.\n",
            )
        elif args.format == "json":
            terminal.write(sys.stdout, json.dumps(rows, indent=2) + "\n")
        else:
            terminal.write(sys.stdout, list_text(rows))
        return EXIT_OK
    try:
        node = reader.get_node(args.node)
    except ApiPermanentError as e:
        if e.status == 404:
            raise InputError(
                f"node {args.node} not found: `kubectl get nodes` lists the node names"
            ) from None
        raise
    findings = doctor.examine(reader, node, args.prefix)
    terminal.write(sys.stdout, show_node(node, findings, args.format, args.prefix))
    return EXIT_OK if _topology(node, args.prefix) is not None else EXIT_FAILURE
