"""`topo-reporter extender`: the scheduler extender, built by reporter.extender.assembly from its
resolved ExtenderSettings."""

from __future__ import annotations

import argparse
import os

import structlog

from reporter import logs, settings
from reporter.commands import EXIT_OK, Commands


def _cmd_extender(args: argparse.Namespace) -> int:
    # The extender's modules (its server, cache and watchers) load for this command only.
    from reporter.extender import assembly  # noqa: PLC0415

    config = settings.resolve_as(settings.ExtenderSettings, vars(args), os.environ)
    logs.configure(log_format=config.log_format, level=config.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.extender")
    assembly.serve_until_signalled(assembly.build_extender(config, log), config)
    return EXIT_OK


def extender_command(commands: Commands) -> None:
    """Add `extender`'s parser, which names its handler, to `commands`."""
    extender = commands.add_parser(
        "extender",
        help="serve kube-scheduler's extender verbs: filter and rank nodes by free GPUs",
        description="A kube-scheduler extender (POST /filter, POST /prioritize; GET /healthz, "
        "/readyz, /metrics). It drops nodes that cannot give a pod its GPUs and ranks the others "
        "by their best free GPU set, from the availability the agents publish. It watches Nodes "
        "itself, so the scheduler can send node names only (nodeCacheCapable: true).",
    )
    settings.add_arguments(extender, settings.ExtenderSettings)
    extender.set_defaults(handler=_cmd_extender)
