"""`topo-reporter prune`: remove what the agents under a prefix wrote, and nothing else."""

from __future__ import annotations

import argparse
import os
import sys

import structlog

from reporter import assembly, logs, settings, terminal
from reporter.commands import EXIT_OK
from reporter.publish.prune import Pruner
from reporter.publish.retry import Backoff


def handle(args: argparse.Namespace) -> int:
    """Remove (or, with --dry-run, list) what the agents under the prefix wrote."""
    config = settings.resolve_as(settings.PruneSettings, vars(args), os.environ)
    logs.configure(log_format=config.log_format, level=config.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.prune")
    api = assembly.cluster_client(config.kubeconfig, log)
    pruner = Pruner(
        api,
        prefix=config.prefix,
        namespace=config.namespace,
        log=log,
        backoff=Backoff(),
        unlabelled=config.unlabelled,
    )
    plan = pruner.find()
    for kind in plan.not_served:
        terminal.write(sys.stdout, f"{kind}: not served by this cluster, none to remove\n")
    for left in plan.unlabelled:
        terminal.write(
            sys.stdout,
            f"left {left.describe()}: it carries no <prefix>/node label (an earlier version wrote "
            "it, under a prefix it cannot say); --unlabelled removes it\n",
        )
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


def arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each of prune's settings."""
    settings.add_arguments(parser, settings.PruneSettings)
