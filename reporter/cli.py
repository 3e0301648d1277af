"""The `topo-reporter` command: argv in, exit status out.

The subcommands live in reporter/commands/, one module by job, each a handler and beside it one
function adding its parser; COMMANDS names those functions in the order `--help` lists them. Every
error a user can cause ends in reporter.commands.run_guarded as one line on stderr (what happened,
what to do) and a non-zero exit status: 1 for a failure, 2 for bad usage. Tracebacks are for bugs
only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from importlib.metadata import version

from reporter.commands import PROG, Commands, run_guarded
from reporter.commands.best_set import best_set_command
from reporter.commands.doctor import doctor_command
from reporter.commands.dra_template import dra_template_command
from reporter.commands.extender import extender_command
from reporter.commands.prune import prune_command
from reporter.commands.run import run_command
from reporter.commands.topology import (
    collect_command,
    parse_command,
    profiles_command,
    render_command,
)

COMMANDS: tuple[Callable[[Commands], None], ...] = (
    parse_command,
    render_command,
    collect_command,
    profiles_command,
    run_command,
    doctor_command,
    best_set_command,
    extender_command,
    prune_command,
    dra_template_command,
)
"""Each subcommand's parser, in the order `--help` lists them; a new subcommand is one function
beside its handler, named here."""


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
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_guarded(PROG, args.handler, args)


if __name__ == "__main__":
    raise SystemExit(main())
