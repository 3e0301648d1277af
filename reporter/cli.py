"""The `topo-reporter` command: argv in, exit status out.

Each subcommand parses its flags, builds the objects it needs and runs; every error a user can
cause ends here as one line on stderr (what happened, what to do) and a non-zero exit status:
1 for a failure, 2 for bad usage. Tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeAlias

import structlog

from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter import assembly, doctor, logs, settings, terminal
from reporter.agent import run_until_signalled
from reporter.availability import CONNECTED_WAIT_S
from reporter.collect import BACKENDS, build_scanner, list_profiles
from reporter.errors import (
    CollectError,
    ConfigError,
    InputError,
    PublishError,
    TopoReporterError,
)
from reporter.extender.protocol import MAX_REQUEST_BYTES, duration_text
from reporter.gpuallocator import GO_GPUALLOCATOR_VERSION
from reporter.inputs import (
    read_input,
    size_text,
    topology_from_any_text,
    topology_from_document_text,
    topology_from_text,
)
from reporter.placement import DEFAULT_BUDGET, Policy, best_gpu_set
from reporter.publish.prune import Pruner
from reporter.publish.rest import LeanClientUnsupportedError, RestApiClient, load_rest_config
from reporter.publish.retry import Backoff
from reporter.schema import dra_template, keys
from reporter.schema.formats import FORMATS, format_topology
from reporter.schema.model import Topology
from reporter.schema.node import decode_node, node_name
from reporter.serve.metrics import api_error_kind

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]
"""A subcommand: its parsed arguments in, the exit status out."""
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What add_subparsers() returns: each subcommand's function adds its parser to it."""


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
    terminal.write(sys.stdout, format_topology(topology, args.format, args.prefix))
    return EXIT_OK


def _file_command(
    commands: Commands, name: str, help_text: str, description: str, handler: Handler
) -> None:
    """A subcommand that reads one FILE and prints a topology in --format."""
    reader = commands.add_parser(name, help=help_text, description=description)
    reader.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    _add_format(reader)
    reader.set_defaults(handler=handler)


def _parse_command(commands: Commands) -> None:
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


def _render_command(commands: Commands) -> None:
    _file_command(
        commands,
        "render",
        "read a topology annotation or a Node object and print it",
        "Read a topology annotation value, or a whole Node as `kubectl get node NAME -o json` "
        "(or -o yaml) prints it, validate it, and print it.",
        _cmd_render,
    )


def _gpu_count(value: str) -> int:
    try:
        count = parse_decimal(value, field="--gpus")
    except ParseError:
        raise argparse.ArgumentTypeError(f"{excerpt(value)} is not a number of GPUs") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count}: ask for at least 1 GPU")
    return count


def _gpu_indices(value: str) -> list[int]:
    """A comma-separated list of GPU indexes; empty means none (no GPU free, nothing forced)."""
    try:
        return [
            parse_decimal(part.strip(), field="GPU") for part in value.split(",") if part.strip()
        ]
    except ParseError:
        raise argparse.ArgumentTypeError(
            f"{excerpt(value)} is not a comma-separated list of GPU indices (0,1,5)"
        ) from None


def _work_units(value: str) -> int:
    try:
        units = parse_decimal(value, field="--budget")
    except ParseError:
        raise argparse.ArgumentTypeError(f"{value[:64]!r} is not a number of work units") from None
    if units < 1:
        raise argparse.ArgumentTypeError(f"{units}: give at least 1 work unit")
    return units


def _cmd_best_set(args: argparse.Namespace) -> int:
    topology = topology_from_any_text(read_input(args.file), args.file, args.prefix)
    best = best_gpu_set(
        topology,
        args.gpus,
        args.available,
        must_include=args.must_include,
        policy=args.policy,
        budget=args.budget,
    )
    if args.format == "json":
        document = best.to_document()
        document["policy"] = str(args.policy)
        terminal.write(sys.stdout, json.dumps(document) + "\n")
        return EXIT_OK
    links, numa, nic, pcie = best.score
    policy = {
        Policy.BEST: "",
        Policy.PACKING: "policy: packing (connected where it can be, cutting into the smallest "
        "connected set: the largest stay whole)\n",
        Policy.NVIDIA_BESTEFFORT: f"policy: nvidia-besteffort (go-gpuallocator "
        f"{GO_GPUALLOCATOR_VERSION}'s best-effort choice, as NVIDIA's device plugin makes it; "
        "ties go to the order of --available)\n",
    }[args.policy]
    inexact = (
        ""
        if best.exact
        else f"note: not proven optimal: the search budget of {args.budget} work units ran out "
        "first; this is the best set found (raise --budget to search further)\n"
    )
    terminal.write(
        sys.stdout,
        f"GPUs: {','.join(map(str, best.gpus))}\n"
        f"score: {links} {numa} {nic} {pcie} (link points, minus NUMA nodes spanned, NIC points, "
        f"PCIe points; larger is better; {best.points_per_pair:.1f} points per pair)\n"
        f"why: {best.explain()}\n{policy}{inexact}",
    )
    return EXIT_OK


def _best_set_command(commands: Commands) -> None:
    best_set = commands.add_parser(
        "best-set",
        help="the K best-connected GPUs of a node, with their score and why",
        description="Read a topology annotation, a Node object (JSON or YAML) or `nvidia-smi topo "
        "-m` text, and print the K GPUs (out of --available) with the best interconnect: pairs "
        "joined by more NVLinks first, then PIX, PXB, PHB, NODE, SYS; ties go to fewer NUMA nodes, "
        "then to a closer RDMA NIC, then to the closer PCIe path beneath NVLink pairs. The score "
        "ranks nodes for the same K. Exits 1 when the request cannot be met.",
    )
    best_set.add_argument("file", metavar="FILE", help="a file, or - for stdin")
    best_set.add_argument(
        "--gpus", type=_gpu_count, required=True, metavar="K", help="how many GPUs to choose"
    )
    best_set.add_argument(
        "--available",
        type=_gpu_indices,
        metavar="I,J,...",
        help="the GPU indices free to choose from (default: every GPU that is not lost; an empty "
        "list means none is free)",
    )
    best_set.add_argument(
        "--must-include",
        type=_gpu_indices,
        default=[],
        metavar="I,J,...",
        help="GPU indices the set must hold (the kubelet's mustInclude); each must be available",
    )
    best_set.add_argument(
        "--policy",
        type=Policy,
        choices=list(Policy),
        default=Policy.BEST,
        help="best: the best single set (default); packing: keep the largest NVLink-connected "
        "sets whole; nvidia-besteffort: what NVIDIA's device plugin takes (go-gpuallocator)",
    )
    best_set.add_argument(
        "--budget",
        type=_work_units,
        default=DEFAULT_BUDGET,
        metavar="UNITS",
        help=f"search work units before settling for the best set found, reported as not proven "
        f"optimal (default: {DEFAULT_BUDGET})",
    )
    best_set.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default: text)"
    )
    best_set.add_argument(
        "--prefix",
        default=keys.DEFAULT_PREFIX,
        help=f"annotation prefix of a Node object (default: {keys.DEFAULT_PREFIX})",
    )
    best_set.set_defaults(handler=_cmd_best_set)


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
        terminal.write(sys.stderr, f"topo-reporter: warning: {status.name}: {status.error}\n")
    node = args.node or socket.gethostname().lower()
    terminal.write(sys.stdout, format_topology(result.topology, args.format, args.prefix, node))
    return EXIT_OK


def _collect_command(commands: Commands) -> None:
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
    collect.add_argument(
        "--node",
        metavar="NAME",
        default=os.environ.get("TOPO_REPORTER_NODE") or os.environ.get("NODE_NAME"),
        help="the Node's name, which a node without a multi-node NVLink fabric names its "
        "nvlink-domain after (default: TOPO_REPORTER_NODE, NODE_NAME, else the lower-cased "
        "hostname, as `run` uses)",
    )
    _add_format(collect)
    collect.set_defaults(handler=_cmd_collect)


def _cmd_profiles(args: argparse.Namespace) -> int:
    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for profile in profiles:
        terminal.write(sys.stdout, f"{profile.name:<{width}}  {profile.description}\n")
    return EXIT_OK


def _profiles_command(commands: Commands) -> None:
    profiles = commands.add_parser(
        "profiles",
        help="list the simulated machines",
        description="List the machine profiles that `--simulate` accepts.",
    )
    profiles.set_defaults(handler=_cmd_profiles)


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


def _run_command(commands: Commands) -> None:
    run = commands.add_parser(
        "run",
        help="run the agent: scan, publish on the Node, serve health and metrics",
        description="Scan the GPU topology every --interval and publish it on this Node's labels "
        "and annotations when it changes. Settings: flags > TOPO_REPORTER_* environment > "
        "--config YAML file > defaults.",
    )
    settings.add_arguments(run)
    run.set_defaults(handler=_cmd_run)


def _wait_for_signal(stop: threading.Event, log: structlog.typing.FilteringBoundLogger) -> None:
    """Block until SIGTERM or SIGINT (or `stop`); must run on the main thread."""

    def handle(signum: int, _: Any) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _log_arguments(parser: argparse.ArgumentParser, *, default_level: str) -> None:
    """--log-format and --log-level, with their environment defaults, for a command of its own."""
    parser.add_argument(
        "--log-format",
        choices=settings.LOG_FORMATS,
        default=os.environ.get("TOPO_REPORTER_LOG_FORMAT", "auto"),
        help="auto (JSON unless stderr is a terminal), json or console",
    )
    parser.add_argument(
        "--log-level",
        choices=settings.LOG_LEVELS,
        default=os.environ.get("TOPO_REPORTER_LOG_LEVEL", default_level),
        help=f"debug, info, warning or error (default: {default_level})",
    )


def _cmd_extender(args: argparse.Namespace) -> int:
    from reporter.extender import cache, heartbeat, protocol, server  # noqa: PLC0415  # extender-only
    from reporter.publish.lease import LeaseWatch  # noqa: PLC0415
    from reporter.publish.watch import NodeWatch  # noqa: PLC0415
    from reporter.serve.tls import ServingCertificate  # noqa: PLC0415

    logs.configure(log_format=args.log_format, level=args.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.extender")
    address = settings.listen_address(args.listen)
    if address is None:
        raise ConfigError("the extender needs --listen HOST:PORT (e.g. 0.0.0.0:8888)")
    if args.max_request_bytes < 1:
        raise ConfigError("--max-request-bytes must be at least 1")
    connected_wait_s = settings.check_duration(
        settings.parse_duration(args.connected_wait, name="--connected-wait"),
        name="--connected-wait",
        minimum=0.0,
    )
    protocol.check_resource_name(args.resource)
    if args.heartbeat_namespace and not settings.is_namespace(args.heartbeat_namespace):
        raise ConfigError(
            f"--heartbeat-namespace {excerpt(args.heartbeat_namespace)} is not a namespace name "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )
    tls = None
    if args.tls_cert_file or args.tls_key_file or args.tls_client_ca_file:
        if not (args.tls_cert_file and args.tls_key_file):
            raise ConfigError("TLS needs both --tls-cert-file and --tls-key-file")
        tls = ServingCertificate(
            args.tls_cert_file, args.tls_key_file, client_ca_file=args.tls_client_ca_file, log=log
        ).context
    try:
        config = load_rest_config(args.kubeconfig)
    except LeanClientUnsupportedError as e:
        raise ConfigError(
            f"the extender reads Nodes with the lean client only, which cannot use these "
            f"credentials ({e}): run it in a pod, or pass a kubeconfig with a token or a client "
            "certificate"
        ) from None
    stop = threading.Event()
    api = RestApiClient(config, request_timeout_s=(5.0, 30.0))
    # With heartbeats, a node's availability counts only while its agent's Lease is fresh.
    beats = heartbeat.Heartbeats() if args.heartbeat_namespace else None
    nodes = cache.NodeCache(
        args.prefix, args.resource, vouched=beats.vouched if beats else lambda node: True
    )
    metrics = server.ExtenderMetrics(nodes)

    def on_error(e: PublishError) -> None:
        metrics.api_errors.labels(kind=api_error_kind(e)).inc()

    watcher = cache.NodeWatcher(NodeWatch(api), nodes, stop=stop, log=log, on_error=on_error)
    leases = None
    if beats is not None:
        beats.on_change = nodes.revise
        heartbeat.heartbeat_metrics(metrics.registry, beats)
        leases = heartbeat.HeartbeatWatcher(
            LeaseWatch(api, namespace=args.heartbeat_namespace, prefix=args.prefix),
            beats,
            stop=stop,
            log=log,
            on_error=on_error,
        )
    limits = dataclasses.replace(server.LIMITS, max_body_bytes=args.max_request_bytes)
    try:
        http = server.ExtenderServer(
            address,
            cache=nodes,
            metrics=metrics,
            resource=args.resource,
            connected_wait_s=connected_wait_s,
            limits=limits,
            tls=tls,
            watching=lambda: watcher.alive and (leases is None or leases.alive),
            problem=lambda: watcher.problem or (leases.problem if leases else None),
            log=log,
        )
    except OSError as e:
        raise ConfigError(f"cannot listen on {args.listen}: {e.strerror}") from e
    if leases is not None:
        leases.start()
    watcher.start()
    http.start()
    log.info(
        "serving",
        address=f"{http.address[0]}:{http.address[1]}",
        resource=args.resource,
        connected_wait_s=connected_wait_s,
        tls=tls is not None,
        # What the memory limit must hold with these bounds (the chart's 320 MiB, by default).
        memory_needed_mib=round(server.peak_bytes(limits) / 2**20),
    )
    try:
        _wait_for_signal(stop, log)
    finally:
        stop.set()
        http.stop()
    return EXIT_OK


def _extender_command(commands: Commands) -> None:
    extender = commands.add_parser(
        "extender",
        help="serve kube-scheduler's extender verbs: filter and rank nodes by free GPUs",
        description="A kube-scheduler extender (POST /filter, POST /prioritize; GET /healthz, "
        "/readyz, /metrics). It drops nodes that cannot give a pod its GPUs and ranks the others "
        "by their best free GPU set, from the availability the agents publish. It watches Nodes "
        "itself, so the scheduler can send node names only (nodeCacheCapable: true).",
    )
    extender.add_argument(
        "--listen",
        default=os.environ.get("TOPO_REPORTER_LISTEN", "0.0.0.0:8888"),
        metavar="HOST:PORT",
        help="address to serve on (default: 0.0.0.0:8888; env TOPO_REPORTER_LISTEN)",
    )
    extender.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: KUBECONFIG, in-cluster, then ~/.kube/config)",
    )
    extender.add_argument(
        "--prefix",
        default=os.environ.get("TOPO_REPORTER_PREFIX", keys.DEFAULT_PREFIX),
        help=f"annotation prefix the agents publish under (default: {keys.DEFAULT_PREFIX})",
    )
    extender.add_argument(
        "--resource",
        default=os.environ.get("TOPO_REPORTER_GPU_RESOURCE", "nvidia.com/gpu"),
        help="the extended resource whose pods it judges (default: nvidia.com/gpu; env "
        "TOPO_REPORTER_GPU_RESOURCE); other pods pass with every node and score 0",
    )
    extender.add_argument(
        "--connected-wait",
        default=os.environ.get("TOPO_REPORTER_CONNECTED_WAIT", duration_text(CONNECTED_WAIT_S)),
        metavar="DURATION",
        help="hold a pod of 2 or more GPUs up to this long from its creation for an "
        "NVLink-connected set, while no candidate node gives one and some node could (default: "
        f"{duration_text(CONNECTED_WAIT_S)}; 0: never; at most 24h; env "
        "TOPO_REPORTER_CONNECTED_WAIT); a pod's own PREFIX/connected-wait annotation replaces it",
    )
    extender.add_argument(
        "--heartbeat-namespace",
        default=os.environ.get("TOPO_REPORTER_HEARTBEAT_NAMESPACE", ""),
        metavar="NAMESPACE",
        help="trust a node's availability only while its agent's heartbeat Lease in NAMESPACE is "
        "fresh (the agents' namespace, run with --heartbeat); empty: off (default; env "
        "TOPO_REPORTER_HEARTBEAT_NAMESPACE)",
    )
    extender.add_argument(
        "--max-request-bytes",
        type=int,
        default=MAX_REQUEST_BYTES,
        metavar="N",
        help=f"largest request body it reads (default: {size_text(MAX_REQUEST_BYTES)}, which the "
        "chart's 320 MiB memory limit holds); larger ones are answered 413",
    )
    extender.add_argument(
        "--tls-cert-file",
        default=os.environ.get("TOPO_REPORTER_TLS_CERT_FILE"),
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (chain), read again when it changes (env "
        "TOPO_REPORTER_TLS_CERT_FILE); kube-scheduler: enableHTTPS: true",
    )
    extender.add_argument(
        "--tls-key-file",
        default=os.environ.get("TOPO_REPORTER_TLS_KEY_FILE"),
        metavar="FILE",
        help="the certificate's PEM private key (env TOPO_REPORTER_TLS_KEY_FILE)",
    )
    extender.add_argument(
        "--tls-client-ca-file",
        default=os.environ.get("TOPO_REPORTER_TLS_CLIENT_CA_FILE"),
        metavar="FILE",
        help="require a client certificate this CA signed (kube-scheduler's tlsConfig.certFile); "
        "read at start (env TOPO_REPORTER_TLS_CLIENT_CA_FILE)",
    )
    _log_arguments(extender, default_level="info")
    extender.set_defaults(handler=_cmd_extender)


def _cmd_doctor(args: argparse.Namespace) -> int:
    # An operator's tool: the official client, for every kubeconfig kubectl takes.
    from reporter.publish import kube  # noqa: PLC0415  # keeps kubernetes out of the other commands

    reader = doctor.ApiClusterReader(
        kube.KubeApiClient(kube.load_configuration(args.kubeconfig), request_timeout_s=(5.0, 30.0)),
        agent_selector=args.agent_selector,
    )
    if args.node:
        nodes = [reader.get_node(args.node)]
    else:
        nodes = [n for n in reader.list_nodes() if doctor.is_gpu_node(n, args.prefix)]
    by_node = {
        str(node["metadata"]["name"]): doctor.examine(reader, node, args.prefix) for node in nodes
    }
    if args.all:
        # Racks are judged together: a partition short of its peers, a clique ID in two domains.
        for name, findings in doctor.fabric_cluster_findings(nodes, args.prefix).items():
            by_node[name] = sorted([*by_node[name], *findings], key=lambda f: -f.severity)
    if args.format == "json":
        terminal.write(sys.stdout, doctor.report_json(by_node))
    else:
        terminal.write(sys.stdout, doctor.report_text(by_node, summary=args.all))
    worst = doctor.worst(by_node)
    return EXIT_FAILURE if worst is not None and worst >= doctor.Severity.ERROR else EXIT_OK


def _doctor_command(commands: Commands) -> None:
    diagnose = commands.add_parser(
        "doctor",
        help="explain why GPU pods stay Pending or run slow, node by node",
        description="Read Nodes (and, where allowed, the agent's pods and the Nodes' Events) and "
        "report each finding with its severity, the evidence and the fix. Exit status: 0 when "
        "no finding is an error, 1 otherwise, 2 on bad usage.",
    )
    which = diagnose.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", metavar="NAME", help="examine one node")
    which.add_argument(
        "--all", action="store_true", help="examine every GPU node and summarize, worst first"
    )
    diagnose.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: KUBECONFIG, in-cluster, then ~/.kube/config)",
    )
    diagnose.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default: text)"
    )
    diagnose.add_argument(
        "--prefix",
        default=keys.DEFAULT_PREFIX,
        help=f"label and annotation prefix (default: {keys.DEFAULT_PREFIX})",
    )
    diagnose.add_argument(
        "--agent-selector",
        default=doctor.AGENT_POD_SELECTOR,
        help=f"label selector of the agent's pods (default: {doctor.AGENT_POD_SELECTOR})",
    )
    diagnose.set_defaults(handler=_cmd_doctor)


def _cmd_prune(args: argparse.Namespace) -> int:
    settings.check_prefix(args.prefix)
    if not settings.is_namespace(args.namespace):
        raise ConfigError(
            f"--namespace {excerpt(args.namespace)} is not a namespace name (lower-case letters, "
            "digits and '-', at most 63 characters)"
        )
    logs.configure(log_format=args.log_format, level=args.log_level, node=None)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("topo_reporter.prune")
    api = assembly.cluster_client(args.kubeconfig, log)
    pruner = Pruner(api, prefix=args.prefix, namespace=args.namespace, log=log, backoff=Backoff())
    plan = pruner.find()
    for kind in plan.not_served:
        terminal.write(sys.stdout, f"{kind}: not served by this cluster, none to remove\n")
    removed = 0
    if args.dry_run:
        for line in plan.lines():
            terminal.write(sys.stdout, f"would remove {line}\n")
            removed += 1
    else:

        def said(line: str) -> None:
            nonlocal removed
            terminal.write(sys.stdout, f"removed {line}\n")
            removed += 1

        pruner.remove(plan, said)
    verb = "would remove" if args.dry_run else "removed"
    terminal.write(sys.stdout, f"{verb} {removed} of {args.prefix}/: nothing else touched\n")
    return EXIT_OK


def _prune_command(commands: Commands) -> None:
    prune = commands.add_parser(
        "prune",
        help="remove everything the agents under a prefix wrote to the cluster",
        description="Remove what the agents under --prefix wrote, and nothing else: on every "
        "Node the labels and annotations its PREFIX/owned annotation lists, that annotation, and "
        "the PREFIX/fabric-health taint; our DeviceTaintRules and NodeResourceTopology objects; "
        "the heartbeat Leases and NodeFeature objects in --namespace. The chart runs it from its "
        "pre-delete hook; run it by hand with --prefix OLD after changing the prefix.",
    )
    prune.add_argument(
        "--prefix",
        default=os.environ.get("TOPO_REPORTER_PREFIX", keys.DEFAULT_PREFIX),
        help=f"the agents' key prefix (default: {keys.DEFAULT_PREFIX}; env TOPO_REPORTER_PREFIX)",
    )
    prune.add_argument(
        "--namespace",
        default=os.environ.get("TOPO_REPORTER_NAMESPACE")
        or os.environ.get("POD_NAMESPACE")
        or "default",
        help="the agents' namespace, of their Leases and NodeFeature objects (default: "
        "TOPO_REPORTER_NAMESPACE, POD_NAMESPACE, else default)",
    )
    prune.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: KUBECONFIG, in-cluster, then ~/.kube/config)",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="print what would be removed; change nothing"
    )
    _log_arguments(prune, default_level="warning")
    prune.set_defaults(handler=_cmd_prune)


def _claim_gpus(value: str) -> int:
    # Any count reads; the template's builder refuses one it cannot serve in one line of its own.
    try:
        return parse_decimal(value, field="--gpus")
    except ParseError:
        raise argparse.ArgumentTypeError(f"{excerpt(value)} is not a number of GPUs") from None


def _simulated_machines(profiles: Sequence[str]) -> list[dra_template.Machine]:
    machines = []
    for profile in dict.fromkeys(profiles):
        topology = build_scanner("auto", Path("/"), profile).scan().topology
        if topology is None:
            raise ConfigError(f"profile {profile!r} simulates no GPU: pick one that has GPUs")
        machines.append(dra_template.Machine(profile, (topology,)))
    return machines


def _cluster_machines(kubeconfig: str | None, prefix: str) -> list[dra_template.Machine]:
    """The Nodes' published topologies, nodes of one wiring as one machine kind."""
    # An operator's tool: the official client, for every kubeconfig kubectl takes.
    from reporter.publish import kube  # noqa: PLC0415  # keeps kubernetes out of the other commands
    from reporter.publish.api import NODES  # noqa: PLC0415  # beside the client it serves

    api = kube.KubeApiClient(kube.load_configuration(kubeconfig), request_timeout_s=(5.0, 30.0))
    kinds: dict[str, list[tuple[str, Topology]]] = {}
    query: dict[str, str] = {"limit": "500"}
    while True:
        page = api.list(NODES, query=query)
        for node in page["items"]:
            try:
                topology = decode_node(node, prefix)
            except InputError as e:
                # A node without the annotation runs no agent (no GPUs); one that does not decode
                # is said, since the template then leaves its GPUs out.
                if keys.key(prefix, keys.TOPOLOGY) in (node["metadata"].get("annotations") or {}):
                    terminal.write(
                        sys.stderr,
                        f"topo-reporter: warning: left out: node {node_name(node)}: {e}\n",
                    )
                continue
            digest = dra_template.wiring_digest(topology)
            kinds.setdefault(digest, []).append((node_name(node), topology))
        token = page.get("metadata", {}).get("continue")
        if not token:
            break
        query = {"limit": "500", "continue": token}
    if not kinds:
        raise ConfigError(
            f"no Node publishes a {keys.key(prefix, keys.TOPOLOGY)} annotation: run the agent on "
            "the GPU nodes first, or pass --simulate PROFILE"
        )
    return [
        dra_template.Machine(
            nodes[0][0] + (f" (+{len(nodes) - 1} alike)" if len(nodes) > 1 else ""),
            tuple(t for _, t in nodes),
        )
        for nodes in sorted(kinds.values(), key=lambda n: n[0][0])
    ]


def _cmd_dra_template(args: argparse.Namespace) -> int:
    _logs_to_stderr()
    try:
        if args.simulate and args.kubeconfig:
            raise ConfigError(
                "--simulate and --kubeconfig both given: pass profiles, or read the cluster"
            )
        if args.simulate:
            machines = _simulated_machines(args.simulate)
        else:
            machines = _cluster_machines(args.kubeconfig, args.prefix)
        template = dra_template.build(
            machines,
            args.gpus,
            fallback=args.fallback,
            device_class=args.device_class,
            name=args.name,
            namespace=args.namespace,
            prefix=args.prefix,
            uuids_known=not args.simulate,
        )
    except ConfigError as e:
        terminal.write(sys.stderr, f"topo-reporter: error: {e}\n")
        return EXIT_USAGE
    terminal.write(sys.stdout, dra_template.to_yaml(template, machines))
    return EXIT_OK


def _dra_template_command(commands: Commands) -> None:
    template = commands.add_parser(
        "dra-template",
        help="a ResourceClaimTemplate for K NVLink-connected GPUs (Kubernetes 1.37 DRA)",
        description="Print a resource.k8s.io/v1 ResourceClaimTemplate whose claims the DRA "
        "allocator can meet only with K GPUs joined to each other by NVLink: a derived attribute "
        "gives each GPU its NVLink cliques, and matchAttribute keeps them common. Needs the "
        f"{' and '.join(dra_template.GATES)} feature gates (alpha in 1.37) on kube-apiserver and "
        "kube-scheduler. Exit status 2 when no such template can be made (the reason on stderr).",
    )
    template.add_argument(
        "--gpus",
        type=_claim_gpus,
        required=True,
        metavar="K",
        help="GPUs per claim, 2 or more (one GPU needs no NVLink)",
    )
    template.add_argument(
        "--simulate",
        metavar="PROFILE",
        action="append",
        help="a machine kind the cluster has: a name from `topo-reporter profiles` or a profile "
        "YAML file; repeat it for each kind (without it, the Nodes' published topologies)",
    )
    template.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read the Nodes with this kubeconfig (default: KUBECONFIG, in-cluster, then "
        "~/.kube/config)",
    )
    template.add_argument(
        "--fallback",
        action="store_true",
        help="add a firstAvailable alternative: K connected GPUs, else any K",
    )
    template.add_argument(
        "--device-class",
        default=dra_template.DEFAULT_DEVICE_CLASS,
        metavar="NAME",
        help=f"the DeviceClass to request (default: {dra_template.DEFAULT_DEVICE_CLASS})",
    )
    template.add_argument("--name", metavar="NAME", help="the template's name")
    template.add_argument("--namespace", metavar="NS", help="the template's namespace")
    template.add_argument(
        "--prefix",
        default=keys.DEFAULT_PREFIX,
        help=f"annotation prefix (default: {keys.DEFAULT_PREFIX})",
    )
    template.set_defaults(handler=_cmd_dra_template)


COMMANDS: tuple[Callable[[Commands], None], ...] = (
    _parse_command,
    _render_command,
    _collect_command,
    _profiles_command,
    _run_command,
    _doctor_command,
    _best_set_command,
    _extender_command,
    _prune_command,
    _dra_template_command,
)
"""Each subcommand's parser, in the order `--help` lists them; a new subcommand is one function
beside its handler, named here."""


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
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except TopoReporterError as e:
        terminal.write(sys.stderr, f"topo-reporter: error: {e}\n")
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
