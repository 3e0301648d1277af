"""The extender's parts, built from ExtenderSettings in one place (the agent's are in
reporter.assembly).

`topo-reporter extender` builds here: the lean API client, the Node cache and its watcher, the
heartbeat Leases and their watcher where the agents renew them, the metrics, the TLS context and
the HTTP server with its bounds. What it must never do: talk to the cluster while building; the
watchers' first list does, once started.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass

import structlog

from reporter.errors import ConfigError, CredentialsError, PublishError
from reporter.extender import cache, fresh, heartbeat, server
from reporter.publish.lease import LeaseWatch
from reporter.publish.rest import LeanClientUnsupportedError, RestApiClient, load_rest_config
from reporter.publish.watch import NodeWatch
from reporter.serve.httpserver import Limits
from reporter.serve.metrics import api_error_kind
from reporter.serve.tls import ServingCertificate
from reporter.settings import ExtenderSettings
from reporter.signals import stop_on_signals, wait_until_stopped

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class Extender:
    """The extender's running parts: what `serve_until_signalled` starts and stops."""

    http: server.ExtenderServer
    nodes: cache.NodeWatcher
    leases: heartbeat.HeartbeatWatcher | None
    limits: Limits
    tls: bool
    """Whether it serves HTTPS."""
    stop: threading.Event
    log: Log


def build_extender(config: ExtenderSettings, log: Log) -> Extender:
    """The extender's parts from `config`, nothing started. Raises ConfigError for a resource
    name or an address it cannot use, CredentialsError for credentials."""
    tls = None
    if config.tls_cert_file and config.tls_key_file:
        tls = ServingCertificate(
            config.tls_cert_file,
            config.tls_key_file,
            client_ca_file=config.tls_client_ca_file,
            log=log,
        ).context
    try:
        rest = load_rest_config(config.kubeconfig)
    except LeanClientUnsupportedError as e:
        raise CredentialsError(
            f"the extender reads Nodes with the lean client only, which cannot use these "
            f"credentials ({e}): run it in a pod, or pass a kubeconfig with a token or a client "
            "certificate"
        ) from None
    stop = threading.Event()
    api = RestApiClient(rest, request_timeout_s=(5.0, 30.0))
    # With heartbeats, a node's availability counts only while its agent's Lease is fresh.
    beats = heartbeat.Heartbeats() if config.heartbeat_namespace else None
    nodes = cache.NodeCache(
        config.prefix, config.resource, vouched=beats.vouched if beats else lambda node: True
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
            LeaseWatch(api, namespace=config.heartbeat_namespace, prefix=config.prefix),
            beats,
            stop=stop,
            log=log,
            on_error=on_error,
        )
    # Its own pool and short timeouts: a call waits on it, never on the watch's connection.
    reads = NodeWatch(RestApiClient(rest, request_timeout_s=fresh.READ_TIMEOUT_S))
    fresh_reads = fresh.FreshReads(
        functools.partial(reads.read_node, nodes.annotation),
        nodes,
        counted=lambda result: metrics.fresh_reads.labels(result=result).inc(),
        log=log,
    )
    limits = dataclasses.replace(server.LIMITS, max_body_bytes=config.max_request_bytes)
    try:
        http = server.ExtenderServer(
            config.address(),
            cache=nodes,
            metrics=metrics,
            resource=config.resource,
            connected_wait_s=config.connected_wait_s(),
            limits=limits,
            tls=tls,
            watching=lambda: watcher.alive and (leases is None or leases.alive),
            problem=lambda: watcher.problem or (leases.problem if leases else None),
            log=log,
            fresh=fresh_reads,
        )
    except OSError as e:
        raise ConfigError(f"cannot listen on {config.listen}: {e.strerror}") from e
    return Extender(
        http=http,
        nodes=watcher,
        leases=leases,
        limits=limits,
        tls=tls is not None,
        stop=stop,
        log=log,
    )


def serve_until_signalled(extender: Extender, config: ExtenderSettings) -> None:
    """Start the watchers and the server, serve until SIGTERM or SIGINT, then stop serving.

    Must be called from the main thread (signal handlers).
    """
    log = extender.log
    with stop_on_signals(extender.stop, log):
        try:
            if extender.leases is not None:
                extender.leases.start()
            extender.nodes.start()
            extender.http.start()
            host, port = extender.http.address
            log.info(
                "serving",
                address=f"{host}:{port}",
                resource=config.resource,
                connected_wait_s=config.connected_wait_s(),
                tls=extender.tls,
                # What the memory limit must hold with these bounds (the chart's 320 MiB, by
                # default).
                memory_needed_mib=round(server.peak_bytes(extender.limits) / 2**20),
            )
            wait_until_stopped(extender.stop)
        finally:
            extender.stop.set()
            extender.http.stop()
