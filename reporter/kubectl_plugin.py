"""`kubectl gpu-topology`: how a node's GPUs are wired, from an operator's terminal.

kubectl runs any executable named `kubectl-gpu_topology` on PATH for `kubectl gpu-topology`,
handing it the arguments and the environment (KUBECONFIG included); the package installs one. Like
other kubectl plugins it takes `--kubeconfig`, `--context` and `-n/--namespace` itself. It only
reads: Nodes, and where the credentials allow, the agent's pods and Events for the doctor's
findings. Every error a user can cause is one line on stderr, with the exit statuses every
`topo-reporter` command has (reporter.commands): 1 where the node cannot be shown, 2 for bad usage.

This module is the console script's: the arguments. What reads and prints is
reporter.commands.gpu_topology, imported only once the arguments parse.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from reporter import settings
from reporter.commands import PLUGIN_PROG, run_guarded
from reporter.schema import keys

FORMATS = ("text", "json", "dot", "mermaid")


def build_parser() -> argparse.ArgumentParser:
    """The plugin's arguments: kubectl's connection flags, a node, a format."""
    parser = argparse.ArgumentParser(
        prog=PLUGIN_PROG,
        description="Show how a node's GPUs are wired, as topo-reporter published it: the link "
        "matrix, the NVLink islands, the free GPUs and the doctor's findings. Without NODE, one "
        "line per GPU node. Exit status: 0 when shown, 1 when it could not be, 2 on bad usage.",
    )
    parser.add_argument("node", nargs="?", metavar="NODE", help="the node to show")
    parser.add_argument(
        "--partitions",
        action="store_true",
        help="the cluster's free capacity instead: per NVLink partition its nodes and its whole "
        "free nodes, and the nodes that can host a connected set of 2, 4 and 8 GPUs now (what "
        "the extender's capacity gauges count)",
    )
    parser.add_argument(
        "--network",
        action="store_true",
        help="the cluster's free capacity per network group instead: for each value of each "
        "network-tier-<N> label (tier 0 the leaf group) its nodes and its whole free nodes (what "
        "the extender's network gauges count)",
    )
    # kubectl's connection flags: --kubeconfig is topo-reporter's own setting, said the same way.
    kubernetes = settings.add_arguments(parser, settings.ReaderSettings)[settings.Group.KUBERNETES]
    kubernetes.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use (default: its current)"
    )
    kubernetes.add_argument(
        "-n",
        "--namespace",
        metavar="NAMESPACE",
        help="the namespace topo-reporter runs in: its pods are looked up there (default: every "
        "namespace); its Events are read in default, where it posts them",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default), json, or a picture of NODE: dot or mermaid",
    )
    parser.add_argument(
        "--prefix",
        default=keys.DEFAULT_PREFIX,
        help=f"label and annotation prefix (default: {keys.DEFAULT_PREFIX})",
    )
    parser.add_argument(
        "--agent-selector",
        default=keys.AGENT_POD_SELECTOR,
        metavar="SELECTOR",
        help=f"label selector of the agent's pods (default: {keys.AGENT_POD_SELECTOR})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kubectl-gpu_topology` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.partitions and (args.node is not None or args.format in ("dot", "mermaid")):
        parser.error("--partitions counts every node: give no NODE, and --format text or json")
    if args.network and (
        args.partitions or args.node is not None or args.format in ("dot", "mermaid")
    ):
        parser.error(
            "--network counts every node: give no NODE nor --partitions, and --format text or json"
        )
    if args.node is None and args.format in ("dot", "mermaid"):
        parser.error(f"--format {args.format} draws one node: name it")
    # What reads the cluster and prints loads once the arguments parse: `--help` does without it.
    from reporter.commands import gpu_topology  # noqa: PLC0415

    return run_guarded(PLUGIN_PROG, gpu_topology.run, args)


if __name__ == "__main__":
    raise SystemExit(main())
