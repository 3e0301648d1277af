"""Every command's settings: frozen values, each setting declared once, resolved in one
documented order, validated once.

A setting is one dataclass field made by `setting()`: its default, and beside it its flag, its
environment variables, the chart value that sets it, its kind (with its choices, for a choice), its
`--help` group and its help. The command-line flags, the environment and settings-file readers and
`--help` (grouped, the choices in the usage line, with "(default: X; env Y)") are derived from
those declarations, so a new setting is one field.

Precedence, lowest first: built-in defaults → the YAML file named by `--config` or
`TOPO_REPORTER_CONFIG` (the agent's `run` only) → environment variables (`TOPO_REPORTER_*`,
`NODE_NAME`, `POD_NAMESPACE`, `KUBECONFIG`) → command-line flags. A bad value is one `ConfigError`
line naming where it came from (the flag, the variable, or the file), a choice's too; the commands
exit 2 for it. This module reads the file and the environment it is handed; it never touches the
cluster.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import math
import re
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, Protocol, Self, TypeVar

from parsers import duration
from parsers.documents import DocumentBoundError, load_yaml
from parsers.duration import DURATION_MAX_S, duration_text
from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter.availability import CONNECTED_WAIT_S
from reporter.collect import BACKENDS
from reporter.collect.kubelet import POD_RESOURCES_SOCKET
from reporter.errors import ConfigError
from reporter.inputs import read_bounded, size_text
from reporter.placement import Policy
from reporter.schema import dra, keys
from reporter.schema.keys import DEFAULT_PREFIX
from reporter.schema.network import NETWORK_LABEL_STYLES
from reporter.schema.scheduler import MAX_REQUEST_BYTES, check_resource_name

SINKS = ("node", "nodefeature")
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
TOPOLOGY_MANAGER_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
"""The kubelet's topologyManagerPolicy values (KubeletConfiguration)."""
TOPOLOGY_MANAGER_SCOPES = ("container", "pod")
WITHDRAW_AFTER = 2
"""Failed PodResources reads in a row after which the availability keys leave the Node: one
failure (a kubelet restart, a timeout) is ridden out; at the default 10 s interval the keys go
10 to 20 s after the last good read."""
MAX_WITHDRAW_AFTER = 100
"""More failed reads than this before withdrawing is keeping a stale value for good."""
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")

# A settings file is a dozen lines.
MAX_SETTINGS_BYTES = 64 * 1024
DURATION_MIN_S = 1.0
"""Shortest --interval or --resync: below a second the loop would spend a core on NVML and sysfs."""
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_DRA_DRIVERS = 8
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DECLARED = "topo_reporter_setting"
"""The key of a field's metadata under which `setting()` keeps its declaration."""
_CONFIG_FILE = "config_file"
"""The one setting read before the others: it names where some of them come from."""


_RDMA_DEVICE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""An RDMA device's name as the kernel allows it (IB_DEVICE_NAME_MAX is 64)."""


class Kind(enum.Enum):
    """How a setting's text (a flag, a variable, a YAML value) becomes its value."""

    TEXT = "text"
    CHOICE = "choice"
    """One of the declaration's `allowed` words, which the usage line lists."""
    DURATION = "duration"
    """`90`, `90s`, `5m`, `1h30m`, or a YAML number of seconds: from 1 s to a day."""
    SWITCH = "switch"
    """A flag without a value; true/false, yes/no, on/off, 1/0 as text."""
    COUNT = "count"
    """A whole number of up to 6 digits."""
    SIZE = "size"
    """A whole number of bytes, up to 12 digits."""
    INDEXES = "indexes"
    """`0,1,2` or a YAML list: sorted distinct GPU indexes."""
    NAMES = "names"
    """`a,b`, a YAML list, or a repeated flag: names in order, without repeats."""
    NAMES_OR_NONE = "names-or-none"
    """As NAMES, where empty says "none" (the chart renders `[]` as an empty variable)."""


class Group(enum.Enum):
    """A section of a command's `--help`, which lists them in this order after the command's own
    options (a setting of no group is one of those)."""

    KUBERNETES = "Kubernetes"
    SOURCES = "sources"
    AVAILABILITY = "availability"
    OUTPUTS = "outputs"
    SCHEDULING = "scheduling"
    SERVING = "serving"
    LOGGING = "logging"


@dataclass(frozen=True, slots=True)
class Declaration:
    """Everything about one setting but its value: where it comes from and how `--help` says it."""

    flag: str
    """`--interval`; its name without the dashes names the setting in the file and in errors."""
    env: tuple[str, ...]
    """Environment variables, the most specific first."""
    help: str
    """What it does, without its default or variables: `--help` derives those."""
    kind: Kind = Kind.TEXT
    allowed: tuple[str, ...] = ()
    """A choice's words, in the order the usage line lists them."""
    group: Group | None = None
    """Its section of `--help`; None: among the command's own options."""
    chart: str | None = None
    """The chart value that sets it (`availability.interval`), where one does."""
    metavar: str | None = None
    """What `--help` calls its value; a choice's is its words (`{auto,nvml,sysfs}`)."""
    shown: str | None = None
    """How `--help` says the default where the value is not what a person reads (None, a
    computed fallback); otherwise it is derived from the value."""
    empty_is_value: bool = False
    """An empty variable is a value (listen: the server off), not "unset" as charts render."""

    @property
    def name(self) -> str:
        """The setting's name in a settings file and in error messages: `interval`."""
        return self.flag.removeprefix("--")


_T = TypeVar("_T")


def setting(
    default: _T,
    *,
    flag: str,
    env: str | tuple[str, ...],
    help: str,
    kind: Kind = Kind.TEXT,
    allowed: tuple[str, ...] = (),
    group: Group | None = None,
    chart: str | None = None,
    metavar: str | None = None,
    shown: str | None = None,
    empty_is_value: bool = False,
) -> _T:
    """A settings field: `default`, declared with everything the readers and `--help` derive.
    A choice (`allowed` given) is of Kind.CHOICE, and `--help` names its value by its words."""
    if allowed:
        kind, metavar = Kind.CHOICE, "{" + ",".join(allowed) + "}"
    declared = Declaration(
        flag=flag,
        env=(env,) if isinstance(env, str) else env,
        help=help,
        kind=kind,
        allowed=allowed,
        group=group,
        chart=chart,
        metavar=metavar,
        shown=shown,
        empty_is_value=empty_is_value,
    )
    result: _T = field(default=default, metadata={_DECLARED: declared})
    return result


class Resolvable(Protocol):
    """A frozen settings dataclass whose fields come from `setting()`, with its own validate()."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def validate(self) -> Self: ...


_S = TypeVar("_S", bound=Resolvable)


def declared(of: type[Resolvable]) -> tuple[tuple[Field[Any], Declaration], ...]:
    """Each field of `of` with its declaration, in field order (how `--help` lists them)."""
    return tuple((f, f.metadata[_DECLARED]) for f in fields(of) if _DECLARED in f.metadata)


def shown_default(value: object, declaration: Declaration) -> str:
    """How `--help` writes a setting's default: `1m`, `off`, `gpu.nvidia.com`, `''`."""
    if declaration.shown is not None:
        return declaration.shown
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if declaration.kind is Kind.DURATION and isinstance(value, float):
        return duration_text(value)
    if declaration.kind is Kind.SIZE and isinstance(value, int):
        return size_text(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value) or "''"


def help_text(value: object, declaration: Declaration) -> str:
    """A setting's `--help` line: what it does, its default and its variables, all derived."""
    return (
        f"{declaration.help} (default: {shown_default(value, declaration)}; "
        f"env {', '.join(declaration.env)})"
    )


def _prefix(help: str = "the prefix of every label and annotation key") -> str:
    return setting(
        DEFAULT_PREFIX,
        flag="--prefix",
        env="TOPO_REPORTER_PREFIX",
        help=help,
        group=Group.KUBERNETES,
        chart="agent.prefix",
    )


def _kubeconfig() -> str | None:
    return setting(
        None,
        flag="--kubeconfig",
        env="KUBECONFIG",
        help="kubeconfig path(s)",
        group=Group.KUBERNETES,
        metavar="FILE",
        shown="in-cluster, then ~/.kube/config",
    )


def _log_format() -> str:
    return setting(
        "auto",
        flag="--log-format",
        env="TOPO_REPORTER_LOG_FORMAT",
        help="auto: JSON unless stderr is a terminal",
        allowed=LOG_FORMATS,
        group=Group.LOGGING,
        chart="agent.logFormat",
    )


def _log_level(default: str, chart: str | None) -> str:
    return setting(
        default,
        flag="--log-level",
        env="TOPO_REPORTER_LOG_LEVEL",
        help="the least severe events written",
        allowed=LOG_LEVELS,
        group=Group.LOGGING,
        chart=chart,
    )


def _node(shown: str) -> str | None:
    return setting(
        None,
        flag="--node",
        env=("TOPO_REPORTER_NODE", "NODE_NAME"),
        help="the Node's name (the chart sets NODE_NAME from spec.nodeName)",
        group=Group.KUBERNETES,
        metavar="NAME",
        shown=shown,
    )


def _backend() -> str:
    return setting(
        "auto",
        flag="--backend",
        env="TOPO_REPORTER_BACKEND",
        help="where the topology is read: auto is NVML, or sysfs where NVML does not load",
        allowed=BACKENDS,
        group=Group.SOURCES,
        chart="agent.backend",
    )


def _sysfs_root() -> str:
    return setting(
        "/sys",
        flag="--sysfs-root",
        env="TOPO_REPORTER_SYSFS_ROOT",
        help="where the host's /sys is mounted (the chart mounts it at /host/sys)",
        group=Group.SOURCES,
        metavar="DIR",
    )


def _simulate() -> str | None:
    return setting(
        None,
        flag="--simulate",
        env="TOPO_REPORTER_SIMULATE",
        help="scan a simulated machine instead: a name from `topo-reporter profiles`, or a profile "
        "YAML file",
        group=Group.SOURCES,
        chart="agent.simulate",
        metavar="PROFILE",
    )


def _check_namespace(flag: str, name: str) -> None:
    if not is_namespace(name):
        raise ConfigError(
            f"{flag} {excerpt(name)} is not a namespace name (lower-case letters, digits and '-', "
            "at most 63 characters)"
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything `topo-reporter run` needs to know, resolved and validated."""

    config_file: str | None = setting(
        None,
        flag="--config",
        env="TOPO_REPORTER_CONFIG",
        help="a YAML file of settings (setting: value, named as the flags are without --)",
        metavar="FILE",
    )
    """The YAML settings file that was read, if any."""
    node: str | None = _node(shown="none; needed unless --dry-run")
    """The Node to publish on (its own, from the downward API); required unless dry_run."""
    kubeconfig: str | None = _kubeconfig()
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""
    prefix: str = _prefix()
    """Prefix of every label and annotation key the agent writes and owns."""
    interval_s: float = setting(
        60.0,
        flag="--interval",
        env="TOPO_REPORTER_INTERVAL",
        help="between scans",
        kind=Kind.DURATION,
        chart="agent.interval",
        metavar="DURATION",
    )
    """Seconds between scans."""
    resync_s: float = setting(
        300.0,
        flag="--resync",
        env="TOPO_REPORTER_RESYNC",
        help="between reads of the Node that repair drift (our keys edited or deleted)",
        kind=Kind.DURATION,
        chart="agent.resync",
        metavar="DURATION",
    )
    """Seconds between reads of the Node that repair drift (our keys edited or deleted)."""
    backend: str = _backend()
    """Topology source: auto (NVML, sysfs when NVML is absent), nvml or sysfs."""
    sysfs_root: str = _sysfs_root()
    """Where the host's sysfs is mounted (the chart mounts it at /host/sys)."""
    simulate: str | None = _simulate()
    """A simulated machine profile (`dgx-h100`) instead of the real hardware."""
    sink: str = setting(
        "node",
        flag="--sink",
        env="TOPO_REPORTER_SINK",
        help="where to publish: node (patch the Node) or nodefeature (an NFD NodeFeature object)",
        allowed=SINKS,
        group=Group.OUTPUTS,
        chart="agent.sink",
    )
    """Where to publish: node (patch the Node) or nodefeature (an NFD NodeFeature object)."""
    namespace: str = setting(
        "default",
        flag="--namespace",
        env=("TOPO_REPORTER_NAMESPACE", "POD_NAMESPACE"),
        help="the agent's namespace: of the NodeFeature object and the heartbeat Lease (Events "
        "about the Node go to default)",
        group=Group.KUBERNETES,
    )
    """The agent's namespace: of the NodeFeature object (the nodefeature sink) and of the
    heartbeat Lease. Events about the Node go to `default` whatever this says: the API server
    takes them nowhere else."""
    listen: str = setting(
        "0.0.0.0:8080",
        flag="--listen",
        env="TOPO_REPORTER_LISTEN",
        help="host:port of the health and metrics server; '' disables it",
        group=Group.SERVING,
        chart="agent.port",
        metavar="HOST:PORT",
        empty_is_value=True,
    )
    """host:port of the health and metrics server; empty disables it."""
    log_format: str = _log_format()
    """auto (JSON when stderr is not a terminal), json or console."""
    log_level: str = _log_level("info", chart="agent.logLevel")
    """debug, info, warning or error."""
    kubelet_config: str = setting(
        "/var/lib/kubelet/config.yaml",
        flag="--kubelet-config",
        env="TOPO_REPORTER_KUBELET_CONFIG",
        help="the kubelet's config file, read for its Topology Manager policy",
        group=Group.SOURCES,
        chart="kubeletConfig.enabled",
        metavar="FILE",
    )
    """The kubelet's config file, read for its topology manager policy; absent means unknown."""
    network_lldp: bool = setting(
        False,
        flag="--network-lldp",
        env="TOPO_REPORTER_NETWORK_LLDP",
        help="publish network-tier-0, the group of top-of-rack switches the RDMA Ethernet NICs "
        "hear by LLDP, read every 10 minutes (needs hostNetwork and CAP_NET_RAW, or the host's "
        "lldpd socket)",
        kind=Kind.SWITCH,
        group=Group.SOURCES,
        chart="network.lldp.enabled",
    )
    """Publish the Ethernet/RoCE tier 0 heard by LLDP (reporter.collect.lldp.LldpTierSource)."""
    network_infiniband: bool = setting(
        False,
        flag="--network-infiniband",
        env="TOPO_REPORTER_NETWORK_INFINIBAND",
        help="publish network-tier-0, -1 and -2, the InfiniBand leaf group, spine group and "
        "fabric top the HCAs reach by SMPs and the subnet manager, read every 10 minutes "
        "(needs the umad devices /dev/infiniband/umad*)",
        kind=Kind.SWITCH,
        group=Group.SOURCES,
        chart="network.infiniband.enabled",
    )
    """Publish InfiniBand tiers 0, 1 and 2 (reporter.collect.infiniband.InfinibandTierSource)."""
    network_infiniband_hcas: tuple[str, ...] = setting(
        (),
        flag="--network-infiniband-hcas",
        env="TOPO_REPORTER_NETWORK_INFINIBAND_HCAS",
        help="with --network-infiniband: the compute HCAs to walk from (mlx5_0,mlx5_3), "
        "comma-separated or repeated, instead of those the topology pairs with a GPU",
        kind=Kind.NAMES,
        group=Group.SOURCES,
        chart="network.infiniband.hcas",
        metavar="NAMES",
    )
    """The HCAs (RDMA device names) InfiniBand discovery walks from; empty: those the topology
    pairs with a GPU (reporter.collect.infiniband.compute_hcas), so that a storage HCA does not
    group every node under its storage switch."""
    network_label_style: str = setting(
        "topo-reporter",
        flag="--network-label-style",
        env="TOPO_REPORTER_NETWORK_LABEL_STYLE",
        help="the keys of the network tiers: topo-reporter (<prefix>/network-tier-<N>) or "
        "topograph (fabric.topograph.run/tier-<N>, NVIDIA Topograph's)",
        allowed=NETWORK_LABEL_STYLES,
        group=Group.SOURCES,
        chart="network.labelStyle",
    )
    """Whose keys the network tiers are published under (reporter.schema.network)."""
    topology_manager_policy: str | None = setting(
        None,
        flag="--topology-manager-policy",
        env="TOPO_REPORTER_TOPOLOGY_MANAGER_POLICY",
        help="the kubelet's Topology Manager policy, for the NodeResourceTopology where the "
        "kubelet config cannot be read",
        allowed=TOPOLOGY_MANAGER_POLICIES,
        group=Group.SOURCES,
        chart="kubeletConfig.topologyManagerPolicy",
        shown="not stated: no NodeResourceTopology then",
    )
    """The kubelet's Topology Manager policy, as the user states it: used for the
    NodeResourceTopology only where the kubelet config cannot be read (it wins where it can)."""
    topology_manager_scope: str = setting(
        "container",
        flag="--topology-manager-scope",
        env="TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE",
        help="with --topology-manager-policy: the kubelet's Topology Manager scope",
        allowed=TOPOLOGY_MANAGER_SCOPES,
        group=Group.SOURCES,
        chart="kubeletConfig.topologyManagerScope",
    )
    """The scope that goes with `topology_manager_policy` (the kubelet's default: container)."""
    koordinator_dir: str | None = setting(
        None,
        flag="--koordinator-dir",
        env="TOPO_REPORTER_KOORDINATOR_DIR",
        help="write Koordinator's device-info file (NVLink partitions) into koordlet's "
        "xpu-device-infos DIR",
        group=Group.OUTPUTS,
        chart="koordinator.enabled",
        metavar="DIR",
        shown="off",
    )
    """koordlet's xpu-device-infos directory: write Koordinator's device-info file there."""
    availability: bool = setting(
        False,
        flag="--availability",
        env="TOPO_REPORTER_AVAILABILITY",
        help="also publish which GPUs are free, from the kubelet's PodResources",
        group=Group.AVAILABILITY,
        kind=Kind.SWITCH,
        chart="availability.enabled",
    )
    """Publish which GPUs are free (the availability annotation and two labels) on the Node."""
    availability_interval_s: float = setting(
        10.0,
        flag="--availability-interval",
        env="TOPO_REPORTER_AVAILABILITY_INTERVAL",
        help="between reads of the free GPUs; at most one Node write each",
        group=Group.AVAILABILITY,
        kind=Kind.DURATION,
        chart="availability.interval",
        metavar="DURATION",
    )
    """Seconds between reads of which GPUs are free; at most one Node write per interval."""
    availability_withdraw_after: int = setting(
        WITHDRAW_AFTER,
        flag="--availability-withdraw-after",
        env="TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER",
        help="withdraw the availability keys after N failed PodResources reads in a row",
        group=Group.AVAILABILITY,
        kind=Kind.COUNT,
        chart="availability.withdrawAfter",
        metavar="N",
    )
    """Failed PodResources reads in a row after which the availability keys are withdrawn from
    the Node (published again at the next good read): a value nobody can vouch for must not keep
    excluding the node from schedulers."""
    heartbeat: bool = setting(
        False,
        flag="--heartbeat",
        env="TOPO_REPORTER_HEARTBEAT",
        help="renew a heartbeat Lease named after the node in --namespace while the availability "
        "is current, for the extender to judge it by (needs --availability)",
        group=Group.AVAILABILITY,
        kind=Kind.SWITCH,
        chart="availability.heartbeat.enabled",
    )
    """Renew a heartbeat Lease (coordination.k8s.io/v1, named after the node, in `namespace`)
    while the Node carries the availability the agent decided; needs `availability`."""
    heartbeat_duration_s: float = setting(
        40.0,
        flag="--heartbeat-duration",
        env="TOPO_REPORTER_HEARTBEAT_DURATION",
        help="the Lease's duration, renewed every quarter of it",
        group=Group.AVAILABILITY,
        kind=Kind.DURATION,
        chart="availability.heartbeat.duration",
        metavar="DURATION",
    )
    """The Lease's leaseDurationSeconds, renewed every quarter of it (at the availability ticks);
    at least three availability intervals."""
    pod_resources_socket: str = setting(
        POD_RESOURCES_SOCKET,
        flag="--pod-resources-socket",
        env="TOPO_REPORTER_POD_RESOURCES_SOCKET",
        help="the kubelet's PodResources socket",
        group=Group.AVAILABILITY,
        metavar="PATH",
    )
    """The kubelet's PodResources socket, where availability learns which GPUs are allocated."""
    on_node_policy: str = setting(
        Policy.NVIDIA_BESTEFFORT.value,
        flag="--on-node-policy",
        env="TOPO_REPORTER_ON_NODE_POLICY",
        help="how the node's device plugin picks GPUs, which the availability describes: "
        "nvidia-besteffort (NVIDIA's device plugin), best or packing",
        allowed=tuple(Policy),
        group=Group.AVAILABILITY,
        chart="availability.onNodePolicy",
    )
    """How the node's device plugin picks GPUs (GetPreferredAllocation), which the availability
    annotation describes for every request size: nvidia-besteffort (NVIDIA's device plugin), or
    best or packing (a device plugin answering with reporter.placement.best_gpu_set)."""
    simulate_used: tuple[int, ...] | None = setting(
        None,
        flag="--simulate-used",
        env="TOPO_REPORTER_SIMULATE_USED",
        help="with --simulate: the GPU indexes taken as allocated, instead of a kubelet's answer",
        group=Group.AVAILABILITY,
        kind=Kind.INDEXES,
        metavar="I,J,...",
    )
    """With `simulate`: the GPU indexes taken as allocated, instead of asking a kubelet."""
    gpu_resources: tuple[str, ...] | None = setting(
        None,
        flag="--gpu-resource",
        env="TOPO_REPORTER_GPU_RESOURCES",
        help="a resource name whose PodResources devices are GPUs; repeat for several, * for a "
        "family",
        group=Group.AVAILABILITY,
        kind=Kind.NAMES,
        metavar="NAME",
        shown=", ".join(keys.GPU_RESOURCES),
    )
    """Resource names whose PodResources devices are GPUs (`nvidia.com/mig-*` for a family);
    None: the reader's default (reporter.schema.keys.GPU_RESOURCES)."""
    nrt: bool = setting(
        False,
        flag="--nrt",
        env="TOPO_REPORTER_NRT",
        help="publish the node's NodeResourceTopology (needs --availability; the sole producer: "
        "refuses to write over NFD's topology-updater or resource-topology-exporter)",
        group=Group.OUTPUTS,
        kind=Kind.SWITCH,
        chart="nrt.enabled",
    )
    """Be the sole producer of the node's NodeResourceTopology (topology.node.k8s.io/v1alpha2)
    from each availability read; needs `availability`."""
    taint_unhealthy_fabric: bool = setting(
        False,
        flag="--taint-unhealthy-fabric",
        env="TOPO_REPORTER_TAINT_UNHEALTHY_FABRIC",
        help="taint the Node NoSchedule (<prefix>/fabric-health) while its multi-node NVLink "
        "fabric is degraded or unhealthy, untaint it when healthy",
        group=Group.OUTPUTS,
        kind=Kind.SWITCH,
        chart="fabric.taintUnhealthy",
    )
    """Put the NoSchedule taint `<prefix>/fabric-health=<degraded|unhealthy>` on the Node while
    its multi-node NVLink fabric is degraded or unhealthy, and take it off when healthy again;
    needs the node sink (the chart's admission policy must allow it: fabric.taintUnhealthy)."""
    dra_drivers: tuple[str, ...] = setting(
        (dra.DRIVER,),
        flag="--dra-drivers",
        env="TOPO_REPORTER_DRA_DRIVERS",
        help="DRA drivers whose claimed devices in this node's pool availability counts as its "
        "GPUs, comma-separated; '' for none",
        group=Group.AVAILABILITY,
        kind=Kind.NAMES_OR_NONE,
        chart="dra.drivers",
        metavar="NAMES",
    )
    """DRA drivers whose devices, held by ResourceClaims in this node's pool, availability counts
    as the node's GPUs (NVIDIA's `gpu.nvidia.com`); empty: the device plugin's allocations only."""
    dra_device_taints: bool = setting(
        False,
        flag="--dra-device-taints",
        env="TOPO_REPORTER_DRA_DEVICE_TAINTS",
        help="mark each lost or NVLink/fabric-degraded GPU with a DRA DeviceTaintRule "
        "(NoSchedule) and delete it when healthy; needs a cluster serving DeviceTaintRules",
        group=Group.OUTPUTS,
        kind=Kind.SWITCH,
        chart="dra.deviceTaints",
    )
    """Mark each GPU that is lost, or whose NVLinks or fabric are degraded, with a DRA
    DeviceTaintRule (NoSchedule), and delete the rule when it is healthy again."""
    once: bool = setting(
        False,
        flag="--once",
        env="TOPO_REPORTER_ONCE",
        help="scan and publish once, then exit (non-zero on failure)",
        kind=Kind.SWITCH,
    )
    """Scan and publish once, then exit (non-zero on failure)."""
    dry_run: bool = setting(
        False,
        flag="--dry-run",
        env="TOPO_REPORTER_DRY_RUN",
        help="print the patch as JSON instead of sending it; needs no cluster",
        kind=Kind.SWITCH,
    )
    """Print the patch as JSON instead of sending it; needs no cluster."""

    def validate(self) -> Self:
        """Return self, or raise ConfigError with one line saying which value is wrong and why."""
        if not self.dry_run and not self.node:
            raise ConfigError(
                "no node name: pass --node, or set TOPO_REPORTER_NODE or NODE_NAME (the chart "
                "sets NODE_NAME from spec.nodeName); --dry-run needs none"
            )
        check_prefix(self.prefix)
        # Every duration setting, present and future, gets the same bounds.
        for declaration_field, declaration in declared(type(self)):
            if declaration.kind is Kind.DURATION:
                check_duration(getattr(self, declaration_field.name), name=declaration.name)
        listen_address(self.listen)
        if self.nrt and not self.availability:
            raise ConfigError(
                "--nrt needs --availability: the NodeResourceTopology's free GPUs and pods "
                "fingerprint come from the kubelet's PodResources socket (chart: "
                "availability.enabled)"
            )
        self._validate_availability()
        if self.taint_unhealthy_fabric and self.sink != "node":
            raise ConfigError(
                f"--taint-unhealthy-fabric taints the Node itself: it needs --sink node, not "
                f"{excerpt(self.sink)}"
            )
        if self.network_lldp and self.network_infiniband:
            raise ConfigError(
                "--network-lldp and --network-infiniband both publish network-tier-0: turn on "
                "the one of the fabric the GPUs' jobs talk over (chart: network.lldp.enabled, "
                "network.infiniband.enabled)"
            )
        if self.network_infiniband_hcas and not self.network_infiniband:
            raise ConfigError(
                "--network-infiniband-hcas names the HCAs InfiniBand discovery walks from: it "
                "needs --network-infiniband (chart: network.infiniband.enabled)"
            )
        for hca in self.network_infiniband_hcas:
            if not _RDMA_DEVICE_NAME.fullmatch(hca):
                raise ConfigError(
                    f"--network-infiniband-hcas: {excerpt(hca)} is not an RDMA device name "
                    "(letters, digits, _ . -, as in /sys/class/infiniband: mlx5_0)"
                )
        if self.network_label_style == "topograph" and self.sink != "node":
            raise ConfigError(
                f"--network-label-style topograph writes fabric.topograph.run/ labels on the Node "
                f"itself: it needs --sink node, not {excerpt(self.sink)}"
            )
        if len(self.dra_drivers) > _MAX_DRA_DRIVERS:
            raise ConfigError(f"dra-drivers: give at most {_MAX_DRA_DRIVERS} driver names")
        for driver in self.dra_drivers:
            dra.check_driver_name(driver)
        return self

    def _validate_availability(self) -> None:
        if self.simulate_used is not None and self.simulate is None:
            raise ConfigError(
                "--simulate-used needs --simulate PROFILE: on a real node the kubelet says which "
                "GPUs are allocated"
            )
        if self.simulate_used is not None and not self.availability:
            raise ConfigError("--simulate-used needs --availability: it says which GPUs are free")
        if self.availability and self.sink != "node":
            raise ConfigError(
                f"--availability publishes on the Node itself: it needs --sink node, not "
                f"{excerpt(self.sink)}"
            )
        if self.availability and not self.pod_resources_socket:
            raise ConfigError("pod-resources-socket is empty: give the kubelet's kubelet.sock path")
        if not 1 <= self.availability_withdraw_after <= MAX_WITHDRAW_AFTER:
            raise ConfigError(
                f"availability-withdraw-after must be a number of failed reads from 1 to "
                f"{MAX_WITHDRAW_AFTER}, not {self.availability_withdraw_after}"
            )
        if self.heartbeat and not self.availability:
            raise ConfigError(
                "--heartbeat needs --availability: the Lease vouches for the availability keys "
                "(chart: availability.enabled)"
            )
        if self.heartbeat and self.heartbeat_duration_s < 3 * self.availability_interval_s:
            raise ConfigError(
                f"heartbeat-duration {self.heartbeat_duration_s:g}s is shorter than three "
                f"availability intervals ({3 * self.availability_interval_s:g}s): the Lease is "
                "renewed at the availability ticks, and one late or lost renewal must not "
                "expire it"
            )


@dataclass(frozen=True, slots=True)
class CollectSettings:
    """What `topo-reporter collect` reads the machine with, as `run` would."""

    backend: str = _backend()
    """Topology source: auto (NVML, sysfs when NVML is absent), nvml or sysfs."""
    sysfs_root: str = _sysfs_root()
    """Where the host's sysfs is mounted."""
    simulate: str | None = _simulate()
    """A simulated machine profile instead of the real hardware."""
    node: str | None = _node(shown="the lower-cased hostname, as run uses")
    """The Node's name, which a node without a multi-node NVLink fabric names its nvlink-domain
    after."""

    def validate(self) -> Self:
        """Return self: its values were checked as they were read."""
        return self


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """Where `topo-reporter network` finds the compute NICs and lldpd."""

    sysfs_root: str = _sysfs_root()
    """Where the host's sysfs is mounted: its RDMA devices name the compute NICs."""
    lldpd_socket: str = setting(
        "/run/lldpd.socket",
        flag="--lldpd-socket",
        env="TOPO_REPORTER_LLDPD_SOCKET",
        help="lldpd's control socket, asked first (where no lldpd answers, the command listens "
        "for LLDP frames itself)",
        group=Group.SOURCES,
        metavar="PATH",
    )
    """lldpd's control socket, which lldpcli asks."""

    def validate(self) -> Self:
        """Return self: any path may name either; reading them says what is wrong."""
        return self


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    """Everything `topo-reporter extender` needs to know, resolved and validated."""

    listen: str = setting(
        "0.0.0.0:8888",
        flag="--listen",
        env="TOPO_REPORTER_LISTEN",
        help="address to serve on",
        group=Group.SERVING,
        chart="extender.port",
        metavar="HOST:PORT",
        empty_is_value=True,
    )
    """host:port the extender serves its verbs, health and metrics on."""
    kubeconfig: str | None = _kubeconfig()
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""
    prefix: str = _prefix("the annotation prefix the agents publish under")
    """The prefix of the agents' keys that the extender reads."""
    resource: str = setting(
        keys.GPU_RESOURCE,
        flag="--resource",
        env="TOPO_REPORTER_GPU_RESOURCE",
        help="the extended resource whose pods it judges; other pods pass with every node and "
        "score 0",
        group=Group.SCHEDULING,
        chart="extender.resource",
        metavar="NAME",
    )
    """The extended resource whose pods the extender judges."""
    connected_wait: str = setting(
        duration_text(CONNECTED_WAIT_S),
        flag="--connected-wait",
        env="TOPO_REPORTER_CONNECTED_WAIT",
        help="hold a pod of 2 or more GPUs up to this long from its creation for an "
        "NVLink-connected set, while no candidate node gives one and some node could (0: never; "
        "at most 24h); a pod's own PREFIX/connected-wait annotation replaces it",
        group=Group.SCHEDULING,
        chart="extender.connectedWait",
        metavar="DURATION",
    )
    """The hold for a connected set, as written: `connected_wait_s()` reads it (from 0 s, where
    the agent's durations start at 1 s)."""
    heartbeat_namespace: str = setting(
        "",
        flag="--heartbeat-namespace",
        env="TOPO_REPORTER_HEARTBEAT_NAMESPACE",
        help="trust a node's availability only while its agent's heartbeat Lease in NAMESPACE is "
        "fresh (the agents' namespace, run with --heartbeat); empty: off",
        group=Group.SCHEDULING,
        metavar="NAMESPACE",
    )
    """The agents' namespace, where their heartbeat Leases are; empty: no heartbeats."""
    max_request_bytes: int = setting(
        MAX_REQUEST_BYTES,
        flag="--max-request-bytes",
        env="TOPO_REPORTER_MAX_REQUEST_BYTES",
        help="largest request body it reads (the default is what the chart's 320 MiB memory limit "
        "holds); larger ones are answered 413",
        group=Group.SERVING,
        kind=Kind.SIZE,
        chart="extender.maxRequestBytes",
        metavar="N",
    )
    """The largest request body read; larger ones are answered 413."""
    tls_cert_file: str | None = setting(
        None,
        flag="--tls-cert-file",
        env="TOPO_REPORTER_TLS_CERT_FILE",
        help="serve HTTPS with this PEM certificate (chain), read again when it changes; "
        "kube-scheduler: enableHTTPS: true",
        group=Group.SERVING,
        chart="extender.tls.enabled",
        metavar="FILE",
        shown="plain HTTP",
    )
    """The serving certificate (chain), PEM."""
    tls_key_file: str | None = setting(
        None,
        flag="--tls-key-file",
        env="TOPO_REPORTER_TLS_KEY_FILE",
        help="the certificate's PEM private key",
        group=Group.SERVING,
        chart="extender.tls.enabled",
        metavar="FILE",
    )
    """The serving certificate's private key, PEM."""
    tls_client_ca_file: str | None = setting(
        None,
        flag="--tls-client-ca-file",
        env="TOPO_REPORTER_TLS_CLIENT_CA_FILE",
        help="require a client certificate this CA signed (kube-scheduler's tlsConfig.certFile); "
        "read at start",
        group=Group.SERVING,
        metavar="FILE",
        shown="no client certificate asked",
    )
    """The CA a client certificate must be signed by; None: none asked."""
    log_format: str = _log_format()
    """auto (JSON when stderr is not a terminal), json or console."""
    log_level: str = _log_level("info", chart="extender.logLevel")
    """debug, info, warning or error."""

    def address(self) -> tuple[str, int]:
        """The bind address of `listen`. Raises ConfigError for an empty or malformed one."""
        address = listen_address(self.listen)
        if address is None:
            raise ConfigError("the extender needs --listen HOST:PORT (e.g. 0.0.0.0:8888)")
        return address

    def connected_wait_s(self) -> float:
        """`connected_wait` in seconds, from 0 to a day. Raises ConfigError."""
        seconds = parse_duration(self.connected_wait, name="--connected-wait")
        return check_duration(seconds, name="--connected-wait", minimum=0.0)

    def validate(self) -> Self:
        """Return self, or raise ConfigError with one line saying which value is wrong and why."""
        self.address()
        if self.max_request_bytes < 1:
            raise ConfigError("--max-request-bytes must be at least 1")
        self.connected_wait_s()
        check_resource_name(self.resource)
        if self.heartbeat_namespace:
            _check_namespace("--heartbeat-namespace", self.heartbeat_namespace)
        if (self.tls_cert_file or self.tls_key_file or self.tls_client_ca_file) and not (
            self.tls_cert_file and self.tls_key_file
        ):
            raise ConfigError("TLS needs both --tls-cert-file and --tls-key-file")
        return self


@dataclass(frozen=True, slots=True)
class PruneSettings:
    """What `topo-reporter prune` removes, and with which credentials."""

    prefix: str = _prefix("the agents' key prefix")
    """The prefix whose keys and objects are removed."""
    namespace: str = setting(
        "default",
        flag="--namespace",
        env=("TOPO_REPORTER_NAMESPACE", "POD_NAMESPACE"),
        help="the agents' namespace, of their Leases and NodeFeature objects",
        group=Group.KUBERNETES,
    )
    """The agents' namespace, of their Leases and NodeFeature objects."""
    kubeconfig: str | None = _kubeconfig()
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""
    dry_run: bool = setting(
        False,
        flag="--dry-run",
        env="TOPO_REPORTER_DRY_RUN",
        help="print what would be removed; change nothing",
        kind=Kind.SWITCH,
    )
    """Print what would be removed, and change nothing."""
    unlabelled: bool = setting(
        False,
        flag="--unlabelled",
        env="TOPO_REPORTER_UNLABELLED",
        help="also remove our NodeResourceTopology and NodeFeature objects that carry no "
        "<prefix>/node label at all (an earlier version wrote them, under a prefix they cannot "
        "say)",
        kind=Kind.SWITCH,
    )
    """Also remove our NodeResourceTopology and NodeFeature objects that name no prefix."""
    log_format: str = _log_format()
    """auto (JSON when stderr is not a terminal), json or console."""
    log_level: str = _log_level("warning", chart=None)
    """debug, info, warning or error."""

    def validate(self) -> Self:
        """Return self, or raise ConfigError with one line saying which value is wrong and why."""
        check_prefix(self.prefix)
        _check_namespace("--namespace", self.namespace)
        return self


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    """What a command that only reads the cluster (`doctor`, the kubectl plugin) needs: its
    credentials."""

    kubeconfig: str | None = _kubeconfig()
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""

    def validate(self) -> Self:
        """Return self: any path may name a kubeconfig; loading it says what is wrong."""
        return self


@dataclass(frozen=True, slots=True)
class TemplateSettings:
    """Where `topo-reporter dra-template` reads the Nodes with, and the prefix of their keys."""

    kubeconfig: str | None = _kubeconfig()
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""
    prefix: str = _prefix(
        "the prefix of the agents' keys on the Nodes, and of the template's attribute and "
        "annotations"
    )
    """The prefix the Nodes' topologies are read under, which names the template's keys."""

    def validate(self) -> Self:
        """Return self, or raise ConfigError for a prefix that cannot name the template's keys."""
        check_prefix(self.prefix)
        return self


COMMAND_SETTINGS: tuple[type[Resolvable], ...] = (
    Settings,
    CollectSettings,
    NetworkSettings,
    ExtenderSettings,
    PruneSettings,
    ReaderSettings,
    TemplateSettings,
)
"""Every command's settings, for the tests that hold each declaration to its env var, its help
and the chart."""


def parse_duration(text: str, *, name: str) -> float:
    """`90`, `90s`, `5m`, `1h`, `1m30s` to seconds (parsers.duration). Raises ConfigError."""
    try:
        return duration.parse_duration(text, name=name)
    except ParseError as e:
        raise ConfigError(str(e)) from None


def check_duration(seconds: float, *, name: str, minimum: float = DURATION_MIN_S) -> float:
    """`seconds`, or ConfigError when it is not a finite duration from `minimum` (1 s unless
    said) to a day."""
    if not math.isfinite(seconds) or not minimum <= seconds <= DURATION_MAX_S:
        raise ConfigError(
            f"{name} must be a duration from {minimum:g}s to 24h (e.g. 60s, 5m), not "
            f"{seconds:g} seconds"
        )
    return seconds


def check_prefix(prefix: str) -> None:
    """Raises ConfigError unless `prefix` can be the domain of our keys: a DNS subdomain outside
    the Kubernetes-reserved ones."""
    if not is_subdomain(prefix):
        raise ConfigError(
            f"prefix {excerpt(prefix)} is not a DNS subdomain (lower-case letters, "
            "digits, '-' and '.', at most 253 characters), e.g. gpu.topology.io"
        )
    reserved = keys.reserved_domain(prefix)
    if reserved is not None:
        raise ConfigError(
            f"prefix {prefix!r} is in {reserved}, which Kubernetes reserves for its own "
            "labels and annotations (kubernetes.io/hostname, node-role.kubernetes.io/...): "
            "the agent would overwrite and delete them; use a domain you own, e.g. "
            "gpu.topology.io"
        )


def is_subdomain(name: str) -> bool:
    """Whether `name` can name most objects (a DNS-1123 subdomain)."""
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_namespace(name: str) -> bool:
    """Whether `name` can name a namespace (a DNS-1123 label)."""
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


def listen_address(text: str) -> tuple[str, int] | None:
    """`host:port` (IPv6 as `[::]:8080`) to a bind address; empty means no server."""
    if text == "":
        return None
    host, sep, port = text.rpartition(":")
    try:
        number = parse_decimal(port, field="port", max_digits=5)
    except ParseError:
        number = -1
    if not sep or not 0 <= number <= 65535:
        raise ConfigError(
            f"listen {excerpt(text)} is not host:port (e.g. 0.0.0.0:8080, or '' to disable)"
        )
    return host.strip("[]") or "0.0.0.0", number


def parse_bool(raw: object, *, name: str) -> bool:
    """A YAML boolean, or true/false, yes/no, on/off, 1/0 as text. Raises ConfigError."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower() if isinstance(raw, str | int) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name} {excerpt(raw)} is not true or false")


def parse_indexes(raw: object, *, name: str) -> tuple[int, ...]:
    """`0,1,2` (or a YAML list of integers) to sorted distinct GPU indexes; empty for none.

    Raises ConfigError.
    """
    parts: list[object] = []
    if isinstance(raw, list):
        parts.extend(raw)
    elif str(raw).strip():
        parts.extend(str(raw).split(","))
    indexes: set[int] = set()
    for part in parts:
        try:
            if isinstance(part, bool):
                raise ParseError("a boolean")
            indexes.add(parse_decimal(str(part).strip(), field=name, max_digits=4))
        except ParseError:
            raise ConfigError(
                f"{name} {excerpt(raw)} is not a comma-separated list of GPU indexes (0,1,2)"
            ) from None
    return tuple(sorted(indexes))


def parse_names(raw: object, *, name: str) -> tuple[str, ...]:
    """`a,b` (or a YAML list, or a repeated flag's list) to names, in order, without repeats.

    Raises ConfigError for an empty name; the reader checks the rest.
    """
    parts = raw if isinstance(raw, list) else str(raw).split(",")
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str) or not part.strip():
            raise ConfigError(f"{name} {excerpt(raw)} holds an empty or non-text resource name")
        if part.strip() not in names:
            names.append(part.strip())
    return tuple(names)


def parse_count(raw: object, *, name: str, max_digits: int = 6) -> int:
    """A whole number (text of ASCII digits, or a YAML integer), bounded to `max_digits` digits;
    range checks are validate()'s. Raises ConfigError."""
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 10**max_digits:
        return raw
    try:
        text = raw.strip() if isinstance(raw, str) else ""
        return parse_decimal(text, field=name, max_digits=max_digits)
    except ParseError:
        raise ConfigError(f"{name} {excerpt(raw)} is not a whole number") from None


def _convert(declaration: Declaration, raw: object, origin: str) -> object:
    kind = declaration.kind
    where = f"{declaration.name} ({origin})"
    if kind is Kind.CHOICE:
        if raw not in declaration.allowed:
            raise ConfigError(
                f"{where} {excerpt(raw)} is not one of {', '.join(declaration.allowed)}"
            )
        return raw
    if kind is Kind.COUNT:
        return parse_count(raw, name=where)
    if kind is Kind.SIZE:
        return parse_count(raw, name=where, max_digits=12)
    if kind is Kind.NAMES:
        return parse_names(raw, name=where)
    if kind is Kind.NAMES_OR_NONE:
        # Empty says "none" here: the chart renders `dra.drivers: []` as an empty variable.
        if raw == [] or (isinstance(raw, str) and not raw.strip()):
            return ()
        return parse_names(raw, name=where)
    if kind is Kind.SWITCH:
        return parse_bool(raw, name=where)
    if kind is Kind.INDEXES:
        return parse_indexes(raw, name=where)
    if kind is Kind.DURATION:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            # A YAML integer can be too large for a float (10**400): that is out of range too.
            seconds = float(raw) if not isinstance(raw, int) or abs(raw) < 10**18 else math.inf
        else:
            seconds = parse_duration(str(raw), name=where)
        return check_duration(seconds, name=where)
    if not isinstance(raw, str):
        raise ConfigError(f"{where} must be a string, not {excerpt(raw)}")
    return raw


def _setting_name(key: object) -> str:
    """A settings file's key as the flags name settings: `topologyManagerPolicy`,
    `topology_manager_policy` and `topology-manager-policy` alike (at most 64 characters)."""
    text = str(key)[:64]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", text).replace("_", "-").lower()


def _read_file(path: str, of: type[Resolvable]) -> dict[str, object]:
    text = read_bounded(path, limit=MAX_SETTINGS_BYTES, what="settings file", error=ConfigError)
    try:
        loaded = load_yaml(text)
    except DocumentBoundError as e:
        raise ConfigError(f"settings file {path}: {e}") from None
    except ParseError as e:
        raise ConfigError(f"settings file {path} is not YAML: {e}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"settings file {path} must be a mapping of setting: value")
    by_name = {d.name: (f.name, d) for f, d in declared(of) if f.name != _CONFIG_FILE}
    values: dict[str, object] = {}
    for key, raw in loaded.items():
        known = by_name.get(str(key).replace("_", "-"))
        if known is None:
            # The closest names, not all of them: the list outgrew one readable line.
            near = difflib.get_close_matches(_setting_name(key), by_name, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(near)}? " if near else ""
            raise ConfigError(
                f"settings file {path}: unknown setting {excerpt(key)} ({hint}every setting is "
                "a flag of the command without its --: see its --help)"
            )
        values[known[0]] = _convert(known[1], raw, f"in {path}")
    return values


def resolve_as(of: type[_S], flags: Mapping[str, object], environ: Mapping[str, str]) -> _S:
    """`of` from its defaults, the YAML file (where `of` declares `config_file`), the environment
    and flags, validated.

    `flags` maps field names to what the command line gave (None when not given), as the parser
    `add_arguments(parser, of)` built returns them. Raises ConfigError.
    """
    declarations = declared(of)
    values: dict[str, object] = {}
    if any(f.name == _CONFIG_FILE for f, _ in declarations):
        config_file = flags.get(_CONFIG_FILE) or environ.get("TOPO_REPORTER_CONFIG") or None
        if config_file is not None:
            values.update(_read_file(str(config_file), of))
        values[_CONFIG_FILE] = None if config_file is None else str(config_file)
    for declaration_field, declaration in declarations:
        if declaration_field.name == _CONFIG_FILE:
            continue
        for variable in declaration.env:
            raw = environ.get(variable)
            # An empty variable is unset (charts render empty values), except where empty is a
            # value of its own (listen: the server off).
            if raw is not None and (raw != "" or declaration.empty_is_value):
                values[declaration_field.name] = _convert(declaration, raw, f"from {variable}")
                break
        given = flags.get(declaration_field.name)
        if given is not None:
            values[declaration_field.name] = _convert(declaration, given, declaration.flag)
    # Each value was converted to its field's type by _convert above; mypy cannot follow that.
    return of(**values).validate()


def resolve(flags: Mapping[str, object], environ: Mapping[str, str]) -> Settings:
    """The agent's Settings from defaults, the YAML file, the environment and flags, validated.

    Raises ConfigError.
    """
    return resolve_as(Settings, flags, environ)


ArgumentGroup = argparse._ArgumentGroup
"""What add_argument_group() returns: a section of `--help`."""


def add_arguments(
    parser: argparse.ArgumentParser, of: type[Resolvable] = Settings
) -> dict[Group, ArgumentGroup]:
    """A flag for each setting of `of`, its help derived from the declaration, in its group's
    section of `--help`; every default is None so that resolve_as() can tell "not given".

    Returns the sections made, for a command to add flags of its own to one.
    """
    declarations = declared(of)
    used = {d.group for _, d in declarations}
    sections = {g: parser.add_argument_group(g.value) for g in Group if g in used}
    for declaration_field, declaration in declarations:
        options: dict[str, Any] = {
            "dest": declaration_field.name,
            "default": None,
            # argparse formats help with %: a literal one must be doubled.
            "help": help_text(declaration_field.default, declaration).replace("%", "%%"),
        }
        if declaration.kind is Kind.SWITCH:
            options["action"] = "store_true"
        else:
            options["metavar"] = declaration.metavar
            if declaration.kind is Kind.NAMES:
                options["action"] = "append"
        group = declaration.group
        (parser if group is None else sections[group]).add_argument(declaration.flag, **options)
    return sections
