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
    add_output_arguments,
    logs_to_stderr,
)
from reporter.errors import CollectError
from reporter.inputs import read_input
from reporter.schema.formats import FORMATS, format_topology
from reporter.schema.reading import topology_from_document_text, topology_from_text


def handle_parse(args: argparse.Namespace) -> int:
    """Print the topology of `nvidia-smi topo -m` text in --format."""
    topology = topology_from_text(read_input(args.file), args.file)
    terminal.write(sys.stdout, format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def file_arguments(parser: argparse.ArgumentParser) -> None:
    """FILE, read for a topology printed in --format (`parse`, `render`)."""
    parser.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    add_output_arguments(parser, formats=FORMATS, default="json")


def handle_render(args: argparse.Namespace) -> int:
    """Print the topology of an annotation value or a Node object in --format."""
    topology = topology_from_document_text(read_input(args.file), args.file, args.prefix)
    terminal.write(sys.stdout, format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def handle_collect(args: argparse.Namespace) -> int:
    """Print the topology this machine (or a simulated one) has, in --format."""
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


def collect_arguments(parser: argparse.ArgumentParser) -> None:
    """The collect settings (backend, sysfs root, --simulate), --format and --prefix."""
    settings.add_arguments(parser, settings.CollectSettings)
    add_output_arguments(parser, formats=FORMATS, default="json")


def handle_profiles(args: argparse.Namespace) -> int:
    """List the simulated machines, a name and a description each."""
    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for profile in profiles:
        terminal.write(sys.stdout, f"{profile.name:<{width}}  {profile.description}\n")
    return EXIT_OK
