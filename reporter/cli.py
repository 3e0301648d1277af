"""The `topo-reporter` command: argv in, exit status out.

The subcommands' handlers live in reporter/commands/, one module by job, each beside the function
adding its arguments; COMMANDS names them, with what `--help` says of each, in the order it lists
them. Every error a user can cause ends in reporter.commands.run_guarded as one line on stderr
(what happened, what to do) and a non-zero exit status: 1 for a failure the user did not cause by
how they called us, 2 for bad usage (a bad value from a flag, a variable or a file alike).
Tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib.metadata import version

from reporter.commands import (
    PROG,
    Command,
    best_set,
    doctor,
    dra_template,
    extender,
    no_arguments,
    prune,
    run,
    run_guarded,
    topology,
)
from reporter.schema.dra_template import GATES

COMMANDS: tuple[Command, ...] = (
    Command(
        "parse",
        help="turn `nvidia-smi topo -m` text into the schema",
        description="Read `nvidia-smi topo -m` (or `-mp`) output, as pasted anywhere, and print it "
        "in the v1 schema. Fields the text does not carry (UUIDs, PCI addresses) are null.",
        handler=topology.handle_parse,
        arguments=topology.file_arguments,
    ),
    Command(
        "render",
        help="read a topology annotation or a Node object and print it",
        description="Read a topology annotation value, or a whole Node as `kubectl get node NAME "
        "-o json` (or -o yaml) prints it, validate it, and print it.",
        handler=topology.handle_render,
        arguments=topology.file_arguments,
    ),
    Command(
        "collect",
        help="read this machine's topology (or a simulated one's) and print it",
        description="Scan this machine with NVML and sysfs, or a simulated machine, and print the "
        "topology the agent would publish. `auto` uses NVML where it loads and sysfs otherwise.",
        handler=topology.handle_collect,
        arguments=topology.collect_arguments,
    ),
    Command(
        "profiles",
        help="list the simulated machines",
        description="List the machine profiles that `--simulate` (and dra-template's `--machine`) "
        "accept.",
        handler=topology.handle_profiles,
        arguments=no_arguments,
    ),
    Command(
        "run",
        help="run the agent: scan, publish on the Node, serve health and metrics",
        description="Scan the GPU topology every --interval and publish it on this Node's labels "
        "and annotations when it changes. Settings: flags > TOPO_REPORTER_* environment > "
        "--config YAML file > defaults.",
        handler=run.handle,
        arguments=run.arguments,
    ),
    Command(
        "doctor",
        help="explain why GPU pods stay Pending or run slow, node by node",
        description="Read Nodes (and, where allowed, the agent's pods and the Nodes' Events) and "
        "report each finding with its severity, the evidence and the fix. Exit status: 0 when "
        "no finding is an error, 1 when one is or the cluster cannot be read, 2 on bad usage.",
        handler=doctor.handle,
        arguments=doctor.arguments,
    ),
    Command(
        "best-set",
        help="the K best-connected GPUs of a node, with their score and why",
        description="Read a topology annotation, a Node object (JSON or YAML) or `nvidia-smi topo "
        "-m` text, and print the K GPUs (out of --available) with the best interconnect: pairs "
        "joined by more NVLinks first, then PIX, PXB, PHB, NODE, SYS; ties go to fewer NUMA nodes, "
        "then to a closer RDMA NIC, then to the closer PCIe path beneath NVLink pairs. The score "
        "ranks nodes for the same K. Exits 1 when the request cannot be met.",
        handler=best_set.handle,
        arguments=best_set.arguments,
    ),
    Command(
        "extender",
        help="serve kube-scheduler's extender verbs: filter and rank nodes by free GPUs",
        description="A kube-scheduler extender (POST /filter, POST /prioritize; GET /healthz, "
        "/readyz, /metrics). It drops nodes that cannot give a pod its GPUs and ranks the others "
        "by their best free GPU set, from the availability the agents publish. It watches Nodes "
        "itself, so the scheduler can send node names only (nodeCacheCapable: true).",
        handler=extender.handle,
        arguments=extender.arguments,
    ),
    Command(
        "prune",
        help="remove everything the agents under a prefix wrote to the cluster",
        description="Remove what the agents under --prefix wrote, and nothing else: on every "
        "Node the labels and annotations its PREFIX/owned annotation lists, that annotation, and "
        "the PREFIX/fabric-health taint; our DeviceTaintRules and NodeResourceTopology objects "
        "labelled PREFIX/node; the heartbeat Leases and the NodeFeature objects labelled "
        "PREFIX/node in --namespace. The chart runs it from its pre-delete hook; run it by hand "
        "with --prefix OLD after changing the prefix: the current install's objects carry the new "
        "prefix's label and stay.",
        handler=prune.handle,
        arguments=prune.arguments,
    ),
    Command(
        "dra-template",
        help="a ResourceClaimTemplate for K NVLink-connected GPUs (Kubernetes 1.37 DRA)",
        description="Print a resource.k8s.io/v1 ResourceClaimTemplate whose claims the DRA "
        "allocator can meet only with K GPUs joined to each other by NVLink: a derived attribute "
        "gives each GPU its NVLink cliques, and matchAttribute keeps them common. Needs the "
        f"{' and '.join(GATES)} feature gates (alpha in 1.37) on kube-apiserver and "
        "kube-scheduler. Exit status 1 when the machines or the cluster cannot give such a "
        "template, 2 on bad usage (the reason on stderr).",
        handler=dra_template.handle,
        arguments=dra_template.arguments,
    ),
)
"""Every subcommand, in the order `--help` lists them: what it says of each, and the handler and
arguments in reporter/commands/. A new subcommand is one row here."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Publish the GPU topology of a Kubernetes node as labels and annotations.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version('topo-reporter')}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_to(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_guarded(PROG, args.handler, args)


if __name__ == "__main__":
    raise SystemExit(main())
