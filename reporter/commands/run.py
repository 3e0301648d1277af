"""`topo-reporter run`: the agent, built by reporter.assembly from its resolved Settings."""

from __future__ import annotations

import argparse
import os

from reporter import settings
from reporter.commands import EXIT_FAILURE, EXIT_OK


def handle(args: argparse.Namespace) -> int:
    """Run the agent until a signal stops it (or for one scan, with --once)."""
    # The agent's parts load only to run it: `run --help` needs the settings' declarations alone.
    from reporter import assembly, logs  # noqa: PLC0415
    from reporter.agent import run_until_signalled  # noqa: PLC0415

    config = settings.resolve(vars(args), os.environ)
    logs.configure(
        log_format=config.log_format, level=config.log_level, node=assembly.agent_node(config)
    )
    parts = assembly.build_agent(config)
    if config.once:
        return EXIT_OK if parts.agent.step() else EXIT_FAILURE
    server = parts.serve(config.listen)
    try:
        run_until_signalled(parts.agent, parts.stop, parts.log)
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK


def arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each of the agent's settings."""
    settings.add_arguments(parser)
