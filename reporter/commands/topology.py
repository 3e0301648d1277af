"""The topology commands: `parse` and `render` print what a FILE holds, `collect` what this machine
(or a simulated one) has, `profiles` the simulated machines."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from reporter import settings, terminal
from reporter.collect import build_scanner, list_profiles
from reporter.commands import (
    EXIT_OK,
    PROG,
    Commands,
    Handler,
    add_output_arguments,
    logs_to_stderr,
)
from reporter.errors import CollectError
from reporter.inputs import read_input, topology_from_document_text, topology_from_text
from reporter.schema.formats import FORMATS, format_topology


def _cmd_parse(args: argparse.Namespace) -> int:
    topology = topology_from_text(read_input(args.file), args.file)
    terminal.write(sys.stdout, format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def _file_command(
    commands: Commands, name: str, help_text: str, description: str, handler: Handler
) -> None:
    """A subcommand that reads one FILE and prints a topology in --format."""
    reader = commands.add_parser(name, help=help_text, description=description)
    reader.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    add_output_arguments(reader, formats=FORMATS, default="json")
    reader.set_defaults(handler=handler)


def parse_command(commands: Commands) -> None:
    """Add `parse`'s parser, which names its handler, to `commands`."""
    _file_command(
        commands,
        "parse",
        "turn `nvidia-smi topo -m` text into the schema",
        "Read `nvidia-smi topo -m` (or `-mp`) output, as pasted anywhere, and print it in the "
        "v1 schema. Fields the text does not carry (UUIDs, PCI addresses) are null.",
        _cmd_parse,
    )


def _cmd_render(args: argparse.Namespace) -> int:
    topology = topology_from_document_text(read_input(args.file), args.file, args.prefix)
    terminal.write(sys.stdout, format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def render_command(commands: Commands) -> None:
    """Add `render`'s parser, which names its handler, to `commands`."""
    _file_command(
        commands,
        "render",
        "read a topology annotation or a Node object and print it",
        "Read a topology annotation value, or a whole Node as `kubectl get node NAME -o json` "
        "(or -o yaml) prints it, validate it, and print it.",
        _cmd_render,
    )


def _cmd_collect(args: argparse.Namespace) -> int:
    logs_to_stderr()
    config = settings.resolve_as(settings.CollectSettings, vars(args), os.environ)
    scanner = build_scanner(config.backend, Path(config.sysfs_root), config.simulate)
    result = scanner.scan()
    if result.topology is None:
        if result.failed:
            raise CollectError(
                f"no topology: {'; '.join(f'{s.name}: {s.error}' for s in result.failed)}"
            )
        raise CollectError(
            f"no NVIDIA GPU found (backend {config.backend}, sysfs root {config.sysfs_root}): "
            "is this a GPU node, and is the host's /sys mounted there?"
        )
    for status in result.failed:
        terminal.write(sys.stderr, f"{PROG}: warning: {status.name}: {status.error}\n")
    node = config.node or socket.gethostname().lower()
    terminal.write(sys.stdout, format_topology(result.topology, args.format, args.prefix, node))
    return EXIT_OK


def collect_command(commands: Commands) -> None:
    """Add `collect`'s parser, which names its handler, to `commands`."""
    collect = commands.add_parser(
        "collect",
        help="read this machine's topology (or a simulated one's) and print it",
        description="Scan this machine with NVML and sysfs, or a simulated machine, and print the "
        "topology the agent would publish. `auto` uses NVML where it loads and sysfs otherwise.",
    )
    settings.add_arguments(collect, settings.CollectSettings)
    add_output_arguments(collect, formats=FORMATS, default="json")
    collect.set_defaults(handler=_cmd_collect)


def _cmd_profiles(args: argparse.Namespace) -> int:
    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for profile in profiles:
        terminal.write(sys.stdout, f"{profile.name:<{width}}  {profile.description}\n")
    return EXIT_OK


def profiles_command(commands: Commands) -> None:
    """Add `profiles`'s parser, which names its handler, to `commands`."""
    profiles = commands.add_parser(
        "profiles",
        help="list the simulated machines",
        description="List the machine profiles that `--simulate` accepts.",
    )
    profiles.set_defaults(handler=_cmd_profiles)
