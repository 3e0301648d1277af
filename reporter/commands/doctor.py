"""`topo-reporter doctor`: why GPU pods stay Pending or run slow, node by node, from the cluster."""

from __future__ import annotations

import argparse
import os
import sys

from reporter import doctor, settings, terminal
from reporter.commands import EXIT_FAILURE, EXIT_OK, Commands, add_output_arguments


def _cmd_doctor(args: argparse.Namespace) -> int:
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
        # Pod groups that must stay in one partition, against every partition's room.
        by_node |= doctor.pod_group_findings(reader.workloads() or [], nodes, args.prefix)
    if args.format == "json":
        terminal.write(sys.stdout, doctor.report_json(by_node))
    else:
        terminal.write(sys.stdout, doctor.report_text(by_node, summary=args.all))
    worst = doctor.worst(by_node)
    return EXIT_FAILURE if worst is not None and worst >= doctor.Severity.ERROR else EXIT_OK


def doctor_command(commands: Commands) -> None:
    """Add `doctor`'s parser, which names its handler, to `commands`."""
    diagnose = commands.add_parser(
        "doctor",
        help="explain why GPU pods stay Pending or run slow, node by node",
        description="Read Nodes (and, where allowed, the agent's pods and the Nodes' Events) and "
        "report each finding with its severity, the evidence and the fix. Exit status: 0 when "
        "no finding is an error, 1 otherwise, 2 on bad usage.",
    )
    which = diagnose.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", metavar="NAME", help="examine one node")
    which.add_argument(
        "--all", action="store_true", help="examine every GPU node and summarize, worst first"
    )
    settings.add_arguments(diagnose, settings.ReaderSettings)
    add_output_arguments(diagnose, formats=("text", "json"), default="text")
    diagnose.add_argument(
        "--agent-selector",
        default=doctor.AGENT_POD_SELECTOR,
        help="label selector of the agent's pods (default: %(default)s)",
    )
    diagnose.set_defaults(handler=_cmd_doctor)
