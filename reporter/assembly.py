"""The agent's parts, built from Settings in one place.

`topo-reporter run`, the agent tests and the benchmarks all build the agent here, so that what
they exercise is what ships: the API client, the Node or NodeFeature sink, the scanner, the node
sources (one tuple: `config_node_sources`), the live availability loop with its outputs
(NodeResourceTopology), the per-scan outputs (Koordinator's device file, DRA DeviceTaintRules),
the state, the metrics and the health server. A test or a benchmark hands in its doubles (a
scanner, an API client, a free source, node sources, a clock, a stop signal) through the
parameters; everything else comes from the Settings exactly as `run` resolves them.

What it must never do: talk to the cluster. Building reads no object; the agent's first step does.
"""

from __future__ import annotations

import functools
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from parsers.kubelet import KubeletPolicies
from reporter import settings
from reporter.agent import STALL_AFTER_S, Agent, SchemaProjection
from reporter.collect import NodeSource, Scanner, build_scanner
from reporter.collect.infiniband import InfinibandTierSource
from reporter.collect.kubelet import KubeletReading, nrt_policies, read_kubelet
from reporter.collect.kubelet_policies import KubeletSource
from reporter.collect.lldp import LldpTierSource
from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.collect.sysfs import numa_memory, pcie_root
from reporter.errors import ConfigError, PublishError
from reporter.hostfs import DirHostFS, HostFS
from reporter.live import AvailabilityLoop, FreeSource, SimulatedFreeSource, check_simulated_used
from reporter.outputs import LiveOutput, ScanOutput
from reporter.placement import Policy
from reporter.publish.api import NODES, ApiClient
from reporter.publish.availability import AvailabilitySink
from reporter.publish.devicetaints import DeviceTaintOutput, DeviceTaintSink
from reporter.publish.koordinator import DeviceInfoFile, DeviceInfoOutput
from reporter.publish.lease import LeaseHeartbeat
from reporter.publish.nodefeature import NodeFeatureSink, object_name
from reporter.publish.nrt import NrtOutput, NrtSink
from reporter.publish.printing import PrintingClient
from reporter.publish.rest import LeanClientUnsupportedError, RestApiClient, load_rest_config
from reporter.publish.retry import Backoff
from reporter.publish.sink import NodePatchSink
from reporter.schema import dra, keys
from reporter.serve.metrics import Metrics, api_error_kind
from reporter.serve.state import AgentState

if TYPE_CHECKING:
    from reporter.serve.http import HealthServer

Log = structlog.typing.FilteringBoundLogger
NodeSink = NodePatchSink | NodeFeatureSink
"""What the agent publishes its topology on: its Node, or NFD's NodeFeature (`--sink`)."""


def agent_node(config: settings.Settings) -> str:
    """The Node the agent publishes on. validate() lets only a dry run go without a node name; it
    prints the patch for this host's Node, named as the kubelet names it by default."""
    return config.node or socket.gethostname().lower()


# The official `kubernetes` client costs the agent ~33 MiB and 0.18 s to import: it is imported
# only where the lean client cannot serve (exec/auth-provider kubeconfigs, proxies) and by doctor.


def api_client(config: settings.Settings, log: Log) -> ApiClient:
    """The dry run's printing client; else the lean client, or the official one where only it can
    use these credentials. Raises CredentialsError for a kubeconfig neither can read."""
    if config.dry_run:
        # A dry run publishes to an empty Node, printing what it would send.
        node = agent_node(config)
        return PrintingClient(
            sys.stdout, log, objects={(NODES, node): {"metadata": {"name": node}}}
        )
    return cluster_client(config.kubeconfig, log)


def cluster_client(kubeconfig: str | None, log: Log) -> ApiClient:
    """The lean client, or the official one where only it can use these credentials (`run`,
    `prune`). Raises CredentialsError for a kubeconfig neither can read."""
    try:
        rest = load_rest_config(kubeconfig)
    except LeanClientUnsupportedError as e:
        log.info("api_client", api_client="official", reason=str(e))
        from reporter.publish import kube  # noqa: PLC0415  # loads kubernetes: see above

        return kube.KubeApiClient(kube.load_configuration(kubeconfig))
    log.info("api_client", api_client="lean", server=rest.server)
    return RestApiClient(rest)


def nrt_output(
    config: settings.Settings,
    client: ApiClient,
    log: Log,
    *,
    stop: threading.Event,
    metrics: Metrics,
) -> NrtOutput:
    """The live output of `run --nrt`: the node's NodeResourceTopology, from each allocation
    view, with NUMA memory from sysfs (or the simulated machine) and the kubelet's Topology
    Manager policies from its config file, else as the user states them (else no object). API
    errors and results go to `metrics`."""
    hostfs = host_sysfs(config)
    stated = (
        None
        if config.topology_manager_policy is None
        else KubeletPolicies(
            topology_manager_policy=config.topology_manager_policy,
            topology_manager_scope=config.topology_manager_scope,
        )
    )
    sink = NrtSink(
        client,
        stop=stop,
        backoff=Backoff(),
        log=log,
        on_error=lambda e: metrics.api_errors.labels(kind=api_error_kind(e)).inc(),
    )
    return NrtOutput(
        sink,
        node=agent_node(config),
        prefix=config.prefix,
        memory=lambda: numa_memory(hostfs),
        policies=lambda: nrt_policies(read_kubelet(Path(config.kubelet_config)), stated),
        log=log,
        resync_s=config.resync_s,
        on_result=lambda result: metrics.nrt_publishes.labels(result=result).inc(),
    )


def host_sysfs(config: settings.Settings) -> HostFS:
    """The sysfs the agent reads: the host's (`--sysfs-root`), or the simulated machine's."""
    if config.simulate is None:
        return DirHostFS(Path(config.sysfs_root))
    return memory_hostfs(load_machine(config.simulate))


def koordinator_output(config: settings.Settings, sink: NodeSink, log: Log) -> DeviceInfoOutput:
    """The output of `run --koordinator-dir`: koordlet's device-info file, each GPU's PCIe root
    complex from sysfs (or the simulated machine), a withheld file told on the Node."""
    assert config.koordinator_dir is not None
    return DeviceInfoOutput(
        DeviceInfoFile(Path(config.koordinator_dir)),
        log,
        pcie_root=functools.partial(pcie_root, host_sysfs(config)),
        event=sink.event,
    )


def free_source(config: settings.Settings) -> FreeSource:
    """Where availability learns which GPUs are allocated: --simulate-used, or the kubelet (its
    device plugin's allocations, and the claims of --dra-drivers in the node's pool)."""
    if config.simulate_used is not None:
        assert config.simulate is not None  # validate() requires it
        machine = load_machine(config.simulate)
        check_simulated_used(config.simulate_used, (g.index for g in machine.gpus), config.simulate)
        return SimulatedFreeSource(config.simulate_used)
    from reporter.collect.podresources import (  # noqa: PLC0415  # loads grpc
        DEFAULT_RESOURCES,
        DraScope,
        PodResourcesReader,
    )

    return PodResourcesReader(
        Path(config.pod_resources_socket),
        config.gpu_resources or DEFAULT_RESOURCES,
        dra=DraScope(config.dra_drivers, agent_node(config)) if config.dra_drivers else None,
    )


def scan_outputs(
    config: settings.Settings,
    api: ApiClient,
    sink: NodeSink,
    log: Log,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[ScanOutput, ...]:
    """Every scan output `config` turns on: Koordinator's device file, DeviceTaintRules (the
    Warning Events of both go through `sink`). A new one is added here, and only here.

    Raises ConfigError for a node name DeviceTaintRules cannot be labelled with."""
    outputs: list[ScanOutput] = []
    if config.koordinator_dir is not None:
        outputs.append(koordinator_output(config, sink, log))
    if config.dra_device_taints:
        taints = DeviceTaintSink(
            api,
            node=agent_node(config),
            prefix=config.prefix,
            resync_s=config.resync_s,
            log=log,
            # A dry run asks no server which version it serves: it prints 1.34's and 1.35's.
            versions=(dra.DRY_RUN_VERSION,) if config.dry_run else dra.VERSIONS,
            clock=clock,
        )
        outputs.append(DeviceTaintOutput(taints, log, sink.event))
    return tuple(outputs)


def config_node_sources(
    config: settings.Settings, kubelet: Callable[[], KubeletReading] | None = None
) -> tuple[NodeSource[Any], ...]:
    """Every node source the agent reads beside the topology, each with its labels; a new one
    is added here, and only here (a setting of its own turns it on). `kubelet`: a test's double
    of the kubelet config's reader."""
    kubelet_source = KubeletSource(
        kubelet
        if kubelet is not None
        else functools.partial(read_kubelet, Path(config.kubelet_config))
    )
    # Settings refuse both network sources at once: each would write network-tier-0.
    sysfs = None if config.simulate else DirHostFS(Path(config.sysfs_root))
    if config.network_infiniband:
        return (
            kubelet_source,
            InfinibandTierSource(
                config.simulate is not None,
                label_style=config.network_label_style,
                hcas=config.network_infiniband_hcas,
                sysfs=sysfs,
            ),
        )
    if config.network_lldp:
        lldp = LldpTierSource(
            sysfs, label_style=config.network_label_style, await_listen=config.once
        )
        return (kubelet_source, lldp)
    return (kubelet_source,)


def config_live_outputs(
    config: settings.Settings,
    api: ApiClient,
    log: Log,
    *,
    stop: threading.Event,
    metrics: Metrics,
) -> tuple[LiveOutput, ...]:
    """Every live output `config` turns on: NodeResourceTopology (`--nrt`). A new one is added
    here, and only here."""
    outputs: list[LiveOutput] = []
    if config.nrt:
        outputs.append(nrt_output(config, api, log, stop=stop, metrics=metrics))
    return tuple(outputs)


@dataclass(frozen=True, slots=True)
class AgentParts:
    """The agent and the objects around it, as `build_agent` joined them."""

    agent: Agent
    api: ApiClient
    sink: NodeSink
    live: AvailabilityLoop | None
    """The availability loop; None with the NodeFeature sink, and in a dry run without
    availability (no Node to keep our keys off)."""
    state: AgentState
    metrics: Metrics
    stop: threading.Event
    log: Log

    def serve(self, listen: str) -> HealthServer | None:
        """Start /healthz, /readyz and /metrics on `listen` (host:port; empty: no server).

        Raises ConfigError when the address is not host:port or cannot be listened on.
        """
        address = settings.listen_address(listen)
        if address is None:
            return None
        # Imported here: the HTTP server (uvicorn) is for the agent only, not the CLI's commands.
        from reporter.serve.http import HealthServer  # noqa: PLC0415

        try:
            server = HealthServer(address, self.state, self.metrics).start()
        except OSError as e:
            raise ConfigError(f"cannot listen on {listen}: {e.strerror}") from e
        self.log.info("serving", address=f"{server.address[0]}:{server.address[1]}")
        return server


def foreign_labels(config: settings.Settings) -> frozenset[str]:
    """The keys outside the prefix the agent writes on its Node, and so may delete: Topograph's
    tier labels with `--network-label-style topograph`, none otherwise (so an `owned` annotation
    someone edited to list them can never make the agent delete Topograph's own)."""
    if config.network_label_style == "topograph":
        return frozenset(keys.TOPOGRAPH_TIER_KEYS)
    return frozenset()


def build_agent(
    config: settings.Settings,
    *,
    api: ApiClient | None = None,
    scanner: Scanner | None = None,
    source: FreeSource | None = None,
    live_outputs: Sequence[LiveOutput] | None = None,
    kubelet: Callable[[], KubeletReading] | None = None,
    node_sources: Sequence[NodeSource[Any]] | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    backoff: Backoff | None = None,
    stall_after_s: float = STALL_AFTER_S,
    log: Log | None = None,
) -> AgentParts:
    """The agent `run` runs for `config`. Each parameter left None is built from `config`:
    `api` (api_client), `scanner` (its backend, sysfs root or simulated profile), `source` (with
    availability on: free_source), `live_outputs` (`--nrt`), `node_sources`
    (config_node_sources, whose kubelet config is read by `kubelet` where given), `stop`,
    `backoff`, `log` (bound to the node).

    Raises ConfigError (a profile, a NodeFeature name), CredentialsError (a kubeconfig that
    cannot be used).
    """
    node = agent_node(config)
    log = log if log is not None else structlog.get_logger("topo_reporter").bind(node=node)
    scanner = (
        scanner
        if scanner is not None
        else build_scanner(config.backend, Path(config.sysfs_root), config.simulate)
    )
    stop = stop if stop is not None else threading.Event()
    backoff = backoff if backoff is not None else Backoff()
    metrics = Metrics()
    state = AgentState(
        stall_after_s=stall_after_s,
        stale_after_s=max(3 * config.interval_s, config.resync_s + config.interval_s),
        clock=clock,
    )

    def on_error(e: PublishError) -> None:
        metrics.api_errors.labels(kind=api_error_kind(e)).inc()

    if config.sink == "nodefeature":
        object_name(node)  # a name NFD cannot take is the one line said, before anything
    api = api if api is not None else api_client(config, log)
    sink: NodeSink
    if config.sink == "node":
        sink = NodePatchSink(
            api,
            node=node,
            prefix=config.prefix,
            stop=stop,
            backoff=backoff,
            log=log,
            on_error=on_error,
            on_wait=state.waiting,
            foreign=foreign_labels(config),
        )
    else:
        sink = NodeFeatureSink(
            api,
            node=node,
            prefix=config.prefix,
            namespace=config.namespace,
            stop=stop,
            backoff=backoff,
            log=log,
            on_error=on_error,
            on_wait=state.waiting,
        )
    live = None
    # The availability keys go on the Node (validate() allows availability with the node sink
    # only); a dry run without availability has no Node to keep them off.
    if isinstance(sink, NodePatchSink) and (config.availability or not config.dry_run):
        if config.availability and source is None:
            source = free_source(config)
        if live_outputs is None:
            live_outputs = config_live_outputs(config, api, log, stop=stop, metrics=metrics)
        live = AvailabilityLoop(
            # Off: the loop only takes our keys off the Node, where an earlier run left them.
            source=source if config.availability else None,
            sink=AvailabilitySink(
                api, node=node, prefix=config.prefix, log=log, on_written=sink.observe
            ),
            state=state,
            metrics=metrics,
            log=log,
            interval_s=config.availability_interval_s if config.availability else config.interval_s,
            resync_s=config.resync_s,
            clock=clock,
            outputs=live_outputs,
            policy=Policy(config.on_node_policy),
            withdraw_after=config.availability_withdraw_after,
            heartbeat=LeaseHeartbeat(
                api,
                node=node,
                namespace=config.namespace,
                prefix=config.prefix,
                duration_s=config.heartbeat_duration_s,
                log=log,
            )
            if config.heartbeat and config.availability
            else None,
        )
    agent = Agent(
        scanner=scanner,
        sink=sink,
        projection=SchemaProjection(
            config.prefix, node, config.taint_unhealthy_fabric, foreign_labels(config)
        ),
        state=state,
        metrics=metrics,
        log=log,
        stop=stop,
        interval_s=config.interval_s,
        resync_s=config.resync_s,
        clock=clock,
        sources=node_sources if node_sources is not None else config_node_sources(config, kubelet),
        outputs=scan_outputs(config, api, sink, log, clock),
        live=live,
    )
    return AgentParts(agent, api, sink, live, state, metrics, stop, log)
