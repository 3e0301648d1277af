"""The `topo-reporter` command: argv in, exit status out.

The subcommands' handlers live in reporter/commands/, one module by job, each beside the function
adding its arguments; COMMANDS names them, with what `--help` says of each, in the order it lists
them. Every error a user can cause ends in reporter.commands.run_guarded as one line on stderr
(what happened, what to do) and a non-zero exit status: 1 for a failure the user did not cause by
how they called us, 2 for bad usage (a bad value from a flag, a variable or a file alike).
Tracebacks are for bugs only.

A run imports the module of the subcommand it names and no other; `topo-reporter --help` imports
none.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reporter import terminal
from reporter.commands import PROG, Command, run_guarded
from reporter.schema.dra_template import GATES

COMMANDS: tuple[Command, ...] = (
    Command(
        "parse",
        help="turn `nvidia-smi topo -m` text into the schema",
        description="Read `nvidia-smi topo -m` (or `-mp`) output, as pasted anywhere, and print it "
        "in the v2 schema. Fields the text does not carry (UUIDs, PCI addresses) are null.",
        handler="reporter.commands.topology:handle_parse",
        arguments="reporter.commands.topology:file_arguments",
    ),
    Command(
        "render",
        help="read a topology annotation or a Node object and print it",
        description="Read a topology annotation value, or a whole Node as `kubectl get node NAME "
        "-o json` (or -o yaml) prints it, validate it, and print it.",
        handler="reporter.commands.topology:handle_render",
        arguments="reporter.commands.topology:file_arguments",
    ),
    Command(
        "collect",
        help="read this machine's topology (or a simulated one's) and print it",
        description="Scan this machine with NVML and sysfs, or a simulated machine, and print the "
        "topology the agent would publish. `auto` uses NVML where it loads and sysfs otherwise.",
        handler="reporter.commands.topology:handle_collect",
        arguments="reporter.commands.topology:collect_arguments",
    ),
    Command(
        "profiles",
        help="list the simulated machines",
        description="List the machine profiles that `--simulate` (and dra-template's `--machine`) "
        "accept.",
        handler="reporter.commands.topology:handle_profiles",
        arguments="reporter.commands:no_arguments",
    ),
    Command(
        "run",
        help="run the agent: scan, publish on the Node, serve health and metrics",
        description="Scan the GPU topology every --interval and publish it on this Node's labels "
        "and annotations when it changes. Settings: flags > TOPO_REPORTER_* environment > "
        "--config YAML file > defaults.",
        handler="reporter.commands.run:handle",
        arguments="reporter.commands.run:arguments",
    ),
    Command(
        "network",
        help="the network tiers above this node: top-of-rack by LLDP, InfiniBand leaf and spine",
        description="Read the network tiers above this node and print them: with --lldp, tier 0 "
        "is the group of top-of-rack switches its compute NICs hear by LLDP, a value equal on "
        "every node hearing the same switches. It asks lldpd where it runs, else listens on the "
        "interfaces for at most --wait seconds (CAP_NET_RAW, the host's network namespace). With "
        "--infiniband, tier 0 is the leaf group and tier 1 the spine group over the HCA ports, "
        "found by directed-route SMPs through /dev/infiniband/umad* within --timeout. Exit status "
        "1 when nothing answers, 2 on bad usage.",
        handler="reporter.commands.network:handle",
        arguments="reporter.commands.network:arguments",
    ),
    Command(
        "doctor",
        help="explain why GPU pods stay Pending or run slow, node by node",
        description="Read Nodes (and, where allowed, the agent's pods and the Nodes' Events) and "
        "report each finding with its severity, the evidence and the fix. Exit status: 0 when "
        "no finding is an error, 1 when one is or the cluster cannot be read, 2 on bad usage.",
        handler="reporter.commands.doctor:handle",
        arguments="reporter.commands.doctor:arguments",
    ),
    Command(
        "best-set",
        help="the K best-connected GPUs of a node, with their score and why",
        description="Read a topology annotation, a Node object (JSON or YAML) or `nvidia-smi topo "
        "-m` text, and print the K GPUs (out of --available) with the best interconnect: pairs "
        "joined by more NVLinks first, then PIX, PXB, PHB, NODE, SYS; ties go to fewer NUMA nodes, "
        "then to a closer RDMA NIC, then to the closer PCIe path beneath NVLink pairs. The score "
        "ranks nodes for the same K. Exits 1 when the request cannot be met.",
        handler="reporter.commands.best_set:handle",
        arguments="reporter.commands.best_set:arguments",
    ),
    Command(
        "extender",
        help="serve kube-scheduler's extender verbs: filter and rank nodes by free GPUs",
        description="A kube-scheduler extender (POST /filter, POST /prioritize; GET /healthz, "
        "/readyz, /metrics). It drops nodes that cannot give a pod its GPUs and ranks the others "
        "by their best free GPU set, from the availability the agents publish. It watches Nodes "
        "itself, so the scheduler can send node names only (nodeCacheCapable: true).",
        handler="reporter.commands.extender:handle",
        arguments="reporter.commands.extender:arguments",
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
        handler="reporter.commands.prune:handle",
        arguments="reporter.commands.prune:arguments",
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
        handler="reporter.commands.dra_template:handle",
        arguments="reporter.commands.dra_template:arguments",
    ),
)
"""Every subcommand, in the order `--help` lists them: what it says of each, and the handler and
arguments in reporter/commands/, named. A new subcommand is a row here and a module in
reporter/commands/ (its handler and arguments); then its line in docs/development.md's map (which
tests/project/test_layout_map.py requires) and its place in docs/cli.md; and where it reads
settings, its Settings class in reporter/settings.py, listed in COMMAND_SETTINGS."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; given the `argv` it will parse, only the
    subcommand `argv` names gets its arguments (its module imported), the others their line in
    `--help`."""
    # The parser itself takes no option with a value, so its first word that is no option is the
    # subcommand.
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Publish the GPU topology of a Kubernetes node as labels and annotations.",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="show program's version number and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_to(commands, whole=named in (None, command.name))
    return parser


class _Version(argparse.Action):
    """argparse's `version` action, reading the version only when asked for: importing
    importlib.metadata and finding the package in it would add to every start."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from importlib.metadata import version  # noqa: PLC0415  # see the class's docstring

        terminal.write(sys.stdout, f"{PROG} {version('topo-reporter')}\n")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return run_guarded(PROG, args.handler, args)


if __name__ == "__main__":
    raise SystemExit(main())
