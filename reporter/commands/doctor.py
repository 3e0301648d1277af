"""`topo-reporter doctor`: why GPU pods stay Pending or run slow, node by node, from the cluster."""

from __future__ import annotations

import argparse
import os
import sys

from reporter import doctor, settings, terminal
from reporter.commands import EXIT_FAILURE, EXIT_OK, add_output_arguments


def handle(args: argparse.Namespace) -> int:
    """Print the findings on one node or every GPU node; 1 when one is an error (the exit status
    of a cluster out of reach too, as run_guarded maps it)."""
    # An operator's tool: the official client, for every kubeconfig kubectl takes.
    from reporter.publish import kube  # noqa: PLC0415  # keeps kubernetes out of the other commands

    config = settings.resolve_as(settings.ReaderSettings, vars(args), os.environ)
    reader = doctor.ApiClusterReader(
        kube.operator_client(config.kubeconfig),
        agent_selector=args.agent_selector,
    )
    if args.node:
        nodes = [reader.get_node(args.node)]
    else:
        nodes = [n for n in reader.list_nodes() if doctor.is_gpu_node(n, args.prefix)]
    by_node = {
        str(node["metadata"]["name"]): doctor.examine(reader, node, args.prefix) for node in nodes
    }
    if args.all:
        # Racks are judged together: a partition short of its peers, a clique ID in two domains.
        for name, findings in doctor.fabric_cluster_findings(nodes, args.prefix).items():
            by_node[name] = sorted([*by_node[name], *findings], key=lambda f: -f.severity)
        # The network tiers: Topograph's grouping against ours, NVLink domains across leaf groups.
        by_node |= doctor.network_findings(nodes, args.prefix)
        # Pod groups that must stay in one partition, against every partition's room.
        by_node |= doctor.pod_group_findings(reader.workloads() or [], nodes, args.prefix)
        # dra-template's templates, against the wirings the nodes publish now and the gate.
        templates = reader.dra_templates(args.prefix) or []
        slices = reader.resource_slices() if templates else None
        by_node |= doctor.dra_template_findings(templates, nodes, args.prefix, slices)
    if args.format == "json":
        terminal.write(sys.stdout, doctor.report_json(by_node))
    else:
        terminal.write(sys.stdout, doctor.report_text(by_node, summary=args.all))
    worst = doctor.worst(by_node)
    return EXIT_FAILURE if worst is not None and worst >= doctor.Severity.ERROR else EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """--node or --all, the reader's settings, --format and --prefix, the agent's selector."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", metavar="NAME", help="examine one node")
    which.add_argument(
        "--all", action="store_true", help="examine every GPU node and summarize, worst first"
    )
    settings.add_arguments(parser, settings.ReaderSettings)
    add_output_arguments(parser, formats=("text", "json"), default="text")
    parser.add_argument(
        "--agent-selector",
        default=doctor.AGENT_POD_SELECTOR,
        metavar="SELECTOR",
        help="label selector of the agent's pods (default: %(default)s)",
    )
