"""The subcommands of `topo-reporter`, one module by job, and what every command shares: how one
is declared (Command), the exit statuses and the one place an error a user can cause becomes a
line on stderr.

Each module holds, for each of its subcommands, the handler and beside it the function adding its
arguments; `reporter.cli` names them, with what `--help` says of each, in its COMMANDS table of
`Command`s. A handler builds what it needs from settings (reporter.settings resolves them), runs,
and returns an exit status. The kubectl plugin (reporter.kubectl_plugin) shares the statuses and
`run_guarded`.

The exit statuses, for every command (docs/cli.md, "Exit status"): 0 success; 1 a failure the
user did not cause by how they called us (the cluster out of reach or its credentials not loading,
no GPU, an input that does not read, a request the topology cannot meet, doctor's error finding);
2 bad usage, argparse's errors and every ConfigError: a bad value from a flag, an environment
variable or a settings file alike.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from reporter import terminal
from reporter.errors import ConfigError, TopoReporterError
from reporter.schema import keys

PROG = "topo-reporter"
"""The command's name, as its errors and warnings begin."""
PLUGIN_PROG = "kubectl gpu-topology"
"""The kubectl plugin's name, as its errors begin (reporter.kubectl_plugin, whose handler is
reporter.commands.gpu_topology)."""
EXIT_OK = 0
EXIT_FAILURE = 1
"""A failure the user did not cause by how they called the command."""
EXIT_USAGE = 2
"""Bad usage: argparse's own errors, and a ConfigError from any origin."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a command ended by Ctrl-C."""

Handler = Callable[[argparse.Namespace], int]
"""A subcommand: its parsed arguments in, the exit status out."""
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What add_subparsers() returns: each Command adds its parser to it."""
Arguments = Callable[[argparse.ArgumentParser], None]
"""A subcommand's arguments, added to its parser."""


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a subcommand that takes none."""


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: what `--help` says of it, its arguments, and the handler they go to.

    The handler and the arguments are named, not imported: a subcommand's module loads only when
    its parser is built whole, so `topo-reporter --help` and every other subcommand do without it.
    """

    name: str
    help: str
    """One line, in the list `topo-reporter --help` prints."""
    description: str
    """The paragraph atop `topo-reporter NAME --help`."""
    handler: str
    """The Handler, as `module:function`."""
    arguments: str
    """The function adding its Arguments, as `module:function`."""

    def add_to(self, commands: Commands, *, whole: bool = True) -> None:
        """Add this subcommand's parser to `commands`: its name, help and description, and when
        `whole` its arguments and its handler (which imports their module); what it parses names
        the handler."""
        parser = commands.add_parser(self.name, help=self.help, description=self.description)
        if whole:
            arguments: Arguments = _named(self.arguments)
            arguments(parser)
            parser.set_defaults(handler=_named(self.handler))


def _named(target: str) -> Any:
    """The function `module:function` names, its module imported."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def run_guarded(prog: str, handler: Handler, args: argparse.Namespace) -> int:
    """`handler(args)`'s exit status; an error a user can cause is one line on stderr, and 2
    for a ConfigError (bad usage), 1 for any other."""
    try:
        return handler(args)
    except TopoReporterError as e:
        terminal.write(sys.stderr, f"{prog}: error: {e}\n")
        return EXIT_USAGE if isinstance(e, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `topo-reporter parse x | head`: the reader left, which is not our failure.
        sys.stderr.close()
        return EXIT_OK


def logs_to_stderr() -> None:
    """Keep stdout for the output: warnings (sources disagreeing, lost GPUs) go to stderr."""
    # structlog (with rich, which it loads where installed) takes longer to import than all the
    # rest of `topo-reporter --help`: it loads for the commands that log, not at every start.
    import structlog  # noqa: PLC0415

    structlog.configure(
        # Looked up at each write, so a replaced sys.stderr (tests, redirection) is honoured.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def add_output_arguments(
    parser: argparse.ArgumentParser,
    *,
    formats: tuple[str, ...],
    default: str,
    prefix_help: str = "label and annotation prefix",
) -> None:
    """--format and --prefix, as every command printing what it read takes them: --prefix of the
    keys it reads is a request of its own, not a setting (no env var)."""
    parser.add_argument(
        "--format", choices=formats, default=default, help="output format (default: %(default)s)"
    )
    parser.add_argument(
        "--prefix", default=keys.DEFAULT_PREFIX, help=f"{prefix_help} (default: %(default)s)"
    )
