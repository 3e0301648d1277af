"""`topo-reporter extender`: the scheduler extender, built by reporter.extender.assembly from its
resolved ExtenderSettings."""

from __future__ import annotations

import argparse
import os

import structlog

from reporter import logs, settings
from reporter.commands import EXIT_OK


def handle(args: argparse.Namespace) -> int:
    """Serve the extender until a signal stops it."""
    # The extender's modules (its server, cache and watchers) load for this command only.
    from reporter.extender import assembly  # noqa: PLC0415

    config = settings.resolve_as(settings.ExtenderSettings, vars(args), os.environ)
    logs.configure(log_format=config.log_format, level=config.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.extender")
    assembly.serve_until_signalled(assembly.build_extender(config, log), config)
    return EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each of the extender's settings."""
    settings.add_arguments(parser, settings.ExtenderSettings)
