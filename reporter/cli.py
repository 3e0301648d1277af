"""The `topo-reporter` command: argv in, exit status out.

Each subcommand parses its flags, builds the objects it needs and runs; every error a user can
cause ends here as one line on stderr (what happened, what to do) and a non-zero exit status:
1 for a failure, 2 for bad usage. Tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import structlog
import yaml

from parsers.errors import ParseError
from parsers.nvsmi import parse_topo
from reporter import logs, settings
from reporter.agent import Agent, SchemaProjection, run_until_signalled
from reporter.collect import BACKENDS, build_scanner, list_profiles
from reporter.errors import (
    CollectError,
    ConfigError,
    InputError,
    PublishError,
    TopoReporterError,
)
from reporter.publish.kube import KubeNodeClient, KubeNodeFeatureClient, load_configuration
from reporter.publish.nodefeature import NodeFeatureDryRunSink, NodeFeatureSink
from reporter.publish.retry import Backoff
from reporter.publish.sink import DryRunSink, NodePatchSink, Sink
from reporter.schema import keys
from reporter.schema.codec import from_document
from reporter.schema.formats import FORMATS, format_topology
from reporter.schema.model import Topology
from reporter.schema.normalize import topology_from_matrix
from reporter.serve.http import HealthServer
from reporter.serve.metrics import Metrics, api_error_kind
from reporter.serve.state import AgentState

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Inputs are a few kilobytes; a Node object with every annotation is at most a few hundred.
MAX_INPUT_BYTES = 4 * 1024 * 1024


def read_input(source: str) -> str:
    """The text of FILE, or of stdin for `-`. Raises InputError with the reason."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with Path(source).open("rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read {source}: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{source} is larger than {MAX_INPUT_BYTES} bytes: not a topology")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source} is not UTF-8 text") from None


def topology_from_text(text: str, source: str) -> Topology:
    """Parse `nvidia-smi topo -m` text. Raises InputError naming the file and line."""
    try:
        return topology_from_matrix(parse_topo(text))
    except ParseError as e:
        raise InputError(f"{source}: {e}") from None


def topology_from_document_text(text: str, source: str, prefix: str) -> Topology:
    """Decode an annotation value, or the annotation of a Node (JSON or YAML, as kubectl prints).

    Raises InputError (SchemaError for a document that does not validate) naming the field.
    """
    doc: Any
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            raise InputError(
                f"{source} is neither JSON nor YAML: expected a topology annotation or a Node "
                "object (`kubectl get node NAME -o json`)"
            ) from None
    if isinstance(doc, dict) and doc.get("kind") in ("NodeList", "List"):
        items = doc.get("items") or []
        if len(items) != 1:
            raise InputError(
                f"{source} holds {len(items)} nodes: pass one (`kubectl get node NAME -o json`)"
            )
        doc = items[0]
    if isinstance(doc, dict) and doc.get("kind") == "Node":
        name = (doc.get("metadata") or {}).get("name", "?")
        annotation = ((doc.get("metadata") or {}).get("annotations") or {}).get(
            keys.key(prefix, keys.TOPOLOGY)
        )
        if annotation is None:
            raise InputError(
                f"node {name} has no {keys.key(prefix, keys.TOPOLOGY)} annotation: is "
                "topo-reporter running on it, with this --prefix?"
            )
        try:
            doc = json.loads(annotation)
        except (ValueError, RecursionError) as e:
            raise InputError(f"node {name}: the topology annotation is not JSON: {e}") from None
    return from_document(doc)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=FORMATS, default="json", help="output format (default: json)"
    )
    parser.add_argument(
        "--prefix",
        default=keys.DEFAULT_PREFIX,
        help=f"label and annotation prefix (default: {keys.DEFAULT_PREFIX})",
    )


def _cmd_parse(args: argparse.Namespace) -> int:
    topology = topology_from_text(read_input(args.file), args.file)
    sys.stdout.write(format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def _cmd_render(args: argparse.Namespace) -> int:
    topology = topology_from_document_text(read_input(args.file), args.file, args.prefix)
    sys.stdout.write(format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def _logs_to_stderr() -> None:
    """Keep stdout for the topology: warnings (sources disagreeing, lost GPUs) go to stderr."""
    structlog.configure(
        # Looked up at each write, so a replaced sys.stderr (tests, redirection) is honoured.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def _cmd_collect(args: argparse.Namespace) -> int:
    _logs_to_stderr()
    scanner = build_scanner(args.backend, Path(args.sysfs_root), args.simulate or None)
    result = scanner.scan()
    if result.topology is None:
        if result.failed:
            raise CollectError(
                f"no topology: {'; '.join(f'{s.name}: {s.error}' for s in result.failed)}"
            )
        raise CollectError(
            f"no NVIDIA GPU found (backend {args.backend}, sysfs root {args.sysfs_root}): "
            "is this a GPU node, and is the host's /sys mounted there?"
        )
    for status in result.failed:
        print(f"topo-reporter: warning: {status.name}: {status.error}", file=sys.stderr)
    sys.stdout.write(format_topology(result.topology, args.format, args.prefix))
    return EXIT_OK


def _cmd_profiles(args: argparse.Namespace) -> int:
    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for profile in profiles:
        sys.stdout.write(f"{profile.name:<{width}}  {profile.description}\n")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    config = settings.resolve(vars(args), os.environ)
    logs.configure(log_format=config.log_format, level=config.log_level, node=config.node)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter").bind(
        node=config.node
    )
    scanner = build_scanner(config.backend, Path(config.sysfs_root), config.simulate)
    stop = threading.Event()
    metrics = Metrics()
    state = AgentState(
        stall_after_s=max(3 * config.interval_s, 300.0),
        stale_after_s=max(3 * config.interval_s, config.resync_s + config.interval_s),
    )
    sink: Sink

    def on_error(e: PublishError) -> None:
        metrics.api_errors.labels(kind=api_error_kind(e)).inc()

    if config.dry_run and config.sink == "nodefeature":
        # The object is named after the node; without --node, the kubelet's default node name.
        sink = NodeFeatureDryRunSink(
            node=config.node or socket.gethostname().lower(),
            namespace=config.namespace,
            prefix=config.prefix,
            out=sys.stdout,
            log=log,
        )
    elif config.dry_run:
        sink = DryRunSink(node=config.node or "", prefix=config.prefix, out=sys.stdout, log=log)
    elif config.sink == "node":
        assert config.node is not None  # validate() requires it unless dry-run
        sink = NodePatchSink(
            KubeNodeClient(load_configuration(config.kubeconfig)),
            node=config.node,
            prefix=config.prefix,
            namespace=config.namespace,
            stop=stop,
            backoff=Backoff(),
            log=log,
            on_error=on_error,
        )
    else:
        assert config.node is not None  # validate() requires it unless dry-run
        sink = NodeFeatureSink(
            KubeNodeFeatureClient(load_configuration(config.kubeconfig)),
            node=config.node,
            prefix=config.prefix,
            namespace=config.namespace,
            stop=stop,
            backoff=Backoff(),
            log=log,
            on_error=on_error,
        )
    agent = Agent(
        scanner=scanner,
        sink=sink,
        projection=SchemaProjection(config.prefix),
        state=state,
        metrics=metrics,
        log=log,
        stop=stop,
        interval_s=config.interval_s,
        resync_s=config.resync_s,
    )
    if config.once:
        return EXIT_OK if agent.step() else EXIT_FAILURE
    address = settings.listen_address(config.listen)
    server = None
    if address is not None:
        try:
            server = HealthServer(address, state, metrics).start()
        except OSError as e:
            raise ConfigError(f"cannot listen on {config.listen}: {e.strerror}") from e
        log.info("serving", address=f"{server.address[0]}:{server.address[1]}")
    try:
        run_until_signalled(agent, stop, log)
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="topo-reporter",
        description="Publish the GPU topology of a Kubernetes node as labels and annotations.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version('topo-reporter')}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    parse = commands.add_parser(
        "parse",
        help="turn `nvidia-smi topo -m` text into the schema",
        description="Read `nvidia-smi topo -m` (or `-mp`) output, as pasted anywhere, and print it "
        "in the v1 schema. Fields the text does not carry (UUIDs, PCI addresses) are null.",
    )
    parse.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    _add_format(parse)
    parse.set_defaults(handler=_cmd_parse)

    render = commands.add_parser(
        "render",
        help="read a topology annotation or a Node object and print it",
        description="Read a topology annotation value, or a whole Node as `kubectl get node NAME "
        "-o json` (or -o yaml) prints it, validate it, and print it.",
    )
    render.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    _add_format(render)
    render.set_defaults(handler=_cmd_render)

    collect = commands.add_parser(
        "collect",
        help="read this machine's topology (or a simulated one's) and print it",
        description="Scan this machine with NVML and sysfs, or a simulated machine, and print the "
        "topology the agent would publish. `auto` uses NVML where it loads and sysfs otherwise.",
    )
    collect.add_argument(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("TOPO_REPORTER_BACKEND", "auto"),
        help="where to read from (default: auto; env TOPO_REPORTER_BACKEND)",
    )
    collect.add_argument(
        "--sysfs-root",
        metavar="DIR",
        default=os.environ.get("TOPO_REPORTER_SYSFS_ROOT", "/sys"),
        help="where the host's /sys is mounted (default: /sys; env TOPO_REPORTER_SYSFS_ROOT)",
    )
    collect.add_argument(
        "--simulate",
        metavar="PROFILE",
        default=os.environ.get("TOPO_REPORTER_SIMULATE"),
        help="scan a simulated machine instead: a name from `topo-reporter profiles`, or a "
        "profile YAML file (env TOPO_REPORTER_SIMULATE)",
    )
    _add_format(collect)
    collect.set_defaults(handler=_cmd_collect)

    profiles = commands.add_parser(
        "profiles",
        help="list the simulated machines",
        description="List the machine profiles that `--simulate` accepts.",
    )
    profiles.set_defaults(handler=_cmd_profiles)
    run = commands.add_parser(
        "run",
        help="run the agent: scan, publish on the Node, serve health and metrics",
        description="Scan the GPU topology every --interval and publish it on this Node's labels "
        "and annotations when it changes. Settings: flags > TOPO_REPORTER_* environment > "
        "--config YAML file > defaults.",
    )
    settings.add_arguments(run)
    run.set_defaults(handler=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except TopoReporterError as e:
        print(f"topo-reporter: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `topo-reporter parse x | head`: the reader left, which is not our failure.
        sys.stderr.close()
        return EXIT_OK
    return status


if __name__ == "__main__":
    raise SystemExit(main())
