"""`topo-reporter prune`: remove what the agents under a prefix wrote, and nothing else."""

from __future__ import annotations

import argparse
import os
import sys

import structlog

from reporter import assembly, logs, settings, terminal
from reporter.commands import EXIT_OK, Commands
from reporter.publish.prune import Pruner
from reporter.publish.retry import Backoff


def _cmd_prune(args: argparse.Namespace) -> int:
    config = settings.resolve_as(settings.PruneSettings, vars(args), os.environ)
    logs.configure(log_format=config.log_format, level=config.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.prune")
    api = assembly.cluster_client(config.kubeconfig, log)
    pruner = Pruner(
        api, prefix=config.prefix, namespace=config.namespace, log=log, backoff=Backoff()
    )
    plan = pruner.find()
    for kind in plan.not_served:
        terminal.write(sys.stdout, f"{kind}: not served by this cluster, none to remove\n")
    removed = 0
    if config.dry_run:
        for line in plan.lines():
            terminal.write(sys.stdout, f"would remove {line}\n")
            removed += 1
    else:

        def said(line: str) -> None:
            nonlocal removed
            terminal.write(sys.stdout, f"removed {line}\n")
            removed += 1

        pruner.remove(plan, said)
    verb = "would remove" if config.dry_run else "removed"
    terminal.write(sys.stdout, f"{verb} {removed} of {config.prefix}/: nothing else touched\n")
    return EXIT_OK


def prune_command(commands: Commands) -> None:
    """Add `prune`'s parser, which names its handler, to `commands`."""
    prune = commands.add_parser(
        "prune",
        help="remove everything the agents under a prefix wrote to the cluster",
        description="Remove what the agents under --prefix wrote, and nothing else: on every "
        "Node the labels and annotations its PREFIX/owned annotation lists, that annotation, and "
        "the PREFIX/fabric-health taint; our DeviceTaintRules and NodeResourceTopology objects; "
        "the heartbeat Leases and NodeFeature objects in --namespace. The chart runs it from its "
        "pre-delete hook; run it by hand with --prefix OLD after changing the prefix.",
    )
    settings.add_arguments(prune, settings.PruneSettings)
    prune.set_defaults(handler=_cmd_prune)
