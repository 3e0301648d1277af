"""`topo-reporter run`: the agent, built by reporter.assembly from its resolved Settings."""

from __future__ import annotations

import argparse
import os

from reporter import assembly, logs, settings
from reporter.agent import run_until_signalled
from reporter.commands import EXIT_FAILURE, EXIT_OK, Commands


def _cmd_run(args: argparse.Namespace) -> int:
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


def run_command(commands: Commands) -> None:
    """Add `run`'s parser, which names its handler, to `commands`."""
    run = commands.add_parser(
        "run",
        help="run the agent: scan, publish on the Node, serve health and metrics",
        description="Scan the GPU topology every --interval and publish it on this Node's labels "
        "and annotations when it changes. Settings: flags > TOPO_REPORTER_* environment > "
        "--config YAML file > defaults.",
    )
    settings.add_arguments(run)
    run.set_defaults(handler=_cmd_run)
