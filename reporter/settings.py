"""The agent's settings: one frozen value, resolved in one documented order, validated once.

Precedence, lowest first: built-in defaults → the YAML file named by `--config` or
`TOPO_REPORTER_CONFIG` → environment variables (`TOPO_REPORTER_*`, `NODE_NAME`, `POD_NAMESPACE`,
`KUBECONFIG`) → command-line flags. A bad value is one `ConfigError` line naming where it came from.
This module reads the file and the environment it is handed; it never touches the cluster.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from parsers import duration
from parsers.documents import DocumentBoundError, load_yaml
from parsers.duration import DURATION_MAX_S
from parsers.errors import ParseError, excerpt
from parsers.integers import parse_decimal
from reporter.errors import ConfigError
from reporter.inputs import read_bounded
from reporter.placement import Policy
from reporter.schema import dra, keys
from reporter.schema.keys import DEFAULT_PREFIX

BACKENDS = ("auto", "nvml", "sysfs")
SINKS = ("node", "nodefeature")
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
TOPOLOGY_MANAGER_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
"""The kubelet's topologyManagerPolicy values (KubeletConfiguration)."""
TOPOLOGY_MANAGER_SCOPES = ("container", "pod")
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""The kubelet's (reporter.collect.podresources.DEFAULT_SOCKET, which this module cannot import:
it loads grpc)."""
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


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything `topo-reporter run` needs to know, resolved and validated."""

    node: str | None = None
    """The Node to publish on (its own, from the downward API); required unless dry_run."""
    kubeconfig: str | None = None
    """Kubeconfig path(s); None: in-cluster config in a pod, else ~/.kube/config."""
    prefix: str = DEFAULT_PREFIX
    """Prefix of every label and annotation key the agent writes and owns."""
    interval_s: float = 60.0
    """Seconds between scans."""
    resync_s: float = 300.0
    """Seconds between reads of the Node that repair drift (our keys edited or deleted)."""
    backend: str = "auto"
    """Topology source: auto (NVML, sysfs when NVML is absent), nvml or sysfs."""
    sysfs_root: str = "/sys"
    """Where the host's sysfs is mounted (the chart mounts it at /host/sys)."""
    simulate: str | None = None
    """A simulated machine profile (`dgx-h100`) instead of the real hardware."""
    sink: str = "node"
    """Where to publish: node (patch the Node) or nodefeature (an NFD NodeFeature object)."""
    namespace: str = "default"
    """The agent's namespace: of the NodeFeature object (the nodefeature sink) and of the
    heartbeat Lease. Events about the Node go to `default` whatever this says: the API server
    takes them nowhere else."""
    listen: str = "0.0.0.0:8080"
    """host:port of the health and metrics server; empty disables it."""
    log_format: str = "auto"
    """auto (JSON when stderr is not a terminal), json or console."""
    log_level: str = "info"
    """debug, info, warning or error."""
    kubelet_config: str = "/var/lib/kubelet/config.yaml"
    """The kubelet's config file, read for its topology manager policy; absent means unknown."""
    topology_manager_policy: str | None = None
    """The kubelet's Topology Manager policy, as the user states it: used for the
    NodeResourceTopology only where the kubelet config cannot be read (it wins where it can)."""
    topology_manager_scope: str = "container"
    """The scope that goes with `topology_manager_policy` (the kubelet's default: container)."""
    koordinator_dir: str | None = None
    """koordlet's xpu-device-infos directory: write Koordinator's device-info file there."""
    availability: bool = False
    """Publish which GPUs are free (the availability annotation and two labels) on the Node."""
    availability_interval_s: float = 10.0
    """Seconds between reads of which GPUs are free; at most one Node write per interval."""
    availability_withdraw_after: int = WITHDRAW_AFTER
    """Failed PodResources reads in a row after which the availability keys are withdrawn from
    the Node (published again at the next good read): a value nobody can vouch for must not keep
    excluding the node from schedulers."""
    heartbeat: bool = False
    """Renew a heartbeat Lease (coordination.k8s.io/v1, named after the node, in `namespace`)
    while the Node carries the availability the agent decided; needs `availability`."""
    heartbeat_duration_s: float = 40.0
    """The Lease's leaseDurationSeconds, renewed every quarter of it (at the availability ticks);
    at least three availability intervals."""
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    """The kubelet's PodResources socket, where availability learns which GPUs are allocated."""
    on_node_policy: str = Policy.NVIDIA_BESTEFFORT.value
    """How the node's device plugin picks GPUs (GetPreferredAllocation), which the availability
    annotation describes for every request size: nvidia-besteffort (NVIDIA's device plugin), or
    best or packing (a device plugin answering with reporter.placement.best_gpu_set)."""
    simulate_used: tuple[int, ...] | None = None
    """With `simulate`: the GPU indexes taken as allocated, instead of asking a kubelet."""
    gpu_resources: tuple[str, ...] | None = None
    """Resource names whose PodResources devices are GPUs (`nvidia.com/mig-*` for a family);
    None: the reader's default (reporter.collect.podresources.DEFAULT_RESOURCES)."""
    dra_drivers: tuple[str, ...] = (dra.DRIVER,)
    """DRA drivers whose devices, held by ResourceClaims in this node's pool, availability counts
    as the node's GPUs (NVIDIA's `gpu.nvidia.com`); empty: the device plugin's allocations only."""
    dra_device_taints: bool = False
    """Mark each GPU that is lost, or whose NVLinks or fabric are degraded, with a DRA
    DeviceTaintRule (NoSchedule), and delete the rule when it is healthy again."""
    nrt: bool = False
    """Be the sole producer of the node's NodeResourceTopology (topology.node.k8s.io/v1alpha2)
    from each availability read; needs `availability`."""
    taint_unhealthy_fabric: bool = False
    """Put the NoSchedule taint `<prefix>/fabric-health=<degraded|unhealthy>` on the Node while
    its multi-node NVLink fabric is degraded or unhealthy, and take it off when healthy again;
    needs the node sink (the chart's admission policy must allow it: fabric.taintUnhealthy)."""
    once: bool = False
    """Scan and publish once, then exit (non-zero on failure)."""
    dry_run: bool = False
    """Print the patch as JSON instead of sending it; needs no cluster."""
    config_file: str | None = None
    """The YAML settings file that was read, if any."""

    def validate(self) -> Settings:
        """Return self, or raise ConfigError with one line saying which value is wrong and why."""
        if not self.dry_run and not self.node:
            raise ConfigError(
                "no node name: pass --node, or set TOPO_REPORTER_NODE or NODE_NAME (the chart "
                "sets NODE_NAME from spec.nodeName); --dry-run needs none"
            )
        check_prefix(self.prefix)
        # Every duration setting, present and future, gets the same bounds.
        for name, (_, kind) in _SOURCES.items():
            if kind == "duration":
                check_duration(getattr(self, name), name=_flag(name))
        for name, value, allowed in (
            ("backend", self.backend, BACKENDS),
            ("sink", self.sink, SINKS),
            ("log-format", self.log_format, LOG_FORMATS),
            ("log-level", self.log_level, LOG_LEVELS),
            ("on-node-policy", self.on_node_policy, tuple(Policy)),
            ("topology-manager-scope", self.topology_manager_scope, TOPOLOGY_MANAGER_SCOPES),
        ):
            if value not in allowed:
                raise ConfigError(f"{name} {excerpt(value)} is not one of {', '.join(allowed)}")
        if (
            self.topology_manager_policy is not None
            and self.topology_manager_policy not in TOPOLOGY_MANAGER_POLICIES
        ):
            raise ConfigError(
                f"topology-manager-policy {excerpt(self.topology_manager_policy)} is not one of "
                f"{', '.join(TOPOLOGY_MANAGER_POLICIES)} (the kubelet's topologyManagerPolicy)"
            )
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
    if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
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


# name -> (environment variables, most specific first; how the text becomes a value)
_Convert = Any
_SOURCES: dict[str, tuple[tuple[str, ...], _Convert]] = {
    "node": (("TOPO_REPORTER_NODE", "NODE_NAME"), str),
    "kubeconfig": (("KUBECONFIG",), str),
    "prefix": (("TOPO_REPORTER_PREFIX",), str),
    "interval_s": (("TOPO_REPORTER_INTERVAL",), "duration"),
    "resync_s": (("TOPO_REPORTER_RESYNC",), "duration"),
    "backend": (("TOPO_REPORTER_BACKEND",), str),
    "sysfs_root": (("TOPO_REPORTER_SYSFS_ROOT",), str),
    "simulate": (("TOPO_REPORTER_SIMULATE",), str),
    "sink": (("TOPO_REPORTER_SINK",), str),
    "namespace": (("TOPO_REPORTER_NAMESPACE", "POD_NAMESPACE"), str),
    "listen": (("TOPO_REPORTER_LISTEN",), str),
    "log_format": (("TOPO_REPORTER_LOG_FORMAT",), str),
    "log_level": (("TOPO_REPORTER_LOG_LEVEL",), str),
    "kubelet_config": (("TOPO_REPORTER_KUBELET_CONFIG",), str),
    "topology_manager_policy": (("TOPO_REPORTER_TOPOLOGY_MANAGER_POLICY",), str),
    "topology_manager_scope": (("TOPO_REPORTER_TOPOLOGY_MANAGER_SCOPE",), str),
    "koordinator_dir": (("TOPO_REPORTER_KOORDINATOR_DIR",), str),
    "availability": (("TOPO_REPORTER_AVAILABILITY",), "bool"),
    "availability_interval_s": (("TOPO_REPORTER_AVAILABILITY_INTERVAL",), "duration"),
    "availability_withdraw_after": (("TOPO_REPORTER_AVAILABILITY_WITHDRAW_AFTER",), "count"),
    "heartbeat": (("TOPO_REPORTER_HEARTBEAT",), "bool"),
    "heartbeat_duration_s": (("TOPO_REPORTER_HEARTBEAT_DURATION",), "duration"),
    "pod_resources_socket": (("TOPO_REPORTER_POD_RESOURCES_SOCKET",), str),
    "on_node_policy": (("TOPO_REPORTER_ON_NODE_POLICY",), str),
    "simulate_used": (("TOPO_REPORTER_SIMULATE_USED",), "indexes"),
    "gpu_resources": (("TOPO_REPORTER_GPU_RESOURCES",), "names"),
    "nrt": (("TOPO_REPORTER_NRT",), "bool"),
    "taint_unhealthy_fabric": (("TOPO_REPORTER_TAINT_UNHEALTHY_FABRIC",), "bool"),
    "dra_drivers": (("TOPO_REPORTER_DRA_DRIVERS",), "names-or-none"),
    "dra_device_taints": (("TOPO_REPORTER_DRA_DEVICE_TAINTS",), "bool"),
}
_FLAG_NAMES = {
    "interval_s": "interval",
    "resync_s": "resync",
    "availability_interval_s": "availability-interval",
    "heartbeat_duration_s": "heartbeat-duration",
    "gpu_resources": "gpu-resource",
}
_FLAGS_ONLY = ("once", "dry_run")


def _flag(name: str) -> str:
    return _FLAG_NAMES.get(name, name).replace("_", "-")


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


def parse_count(raw: object, *, name: str) -> int:
    """A whole number (text of ASCII digits, or a YAML integer), bounded to 6 digits; range
    checks are validate()'s. Raises ConfigError."""
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 10**6:
        return raw
    try:
        return parse_decimal(raw.strip() if isinstance(raw, str) else "", field=name, max_digits=6)
    except ParseError:
        raise ConfigError(f"{name} {excerpt(raw)} is not a whole number") from None


def _convert(name: str, raw: object, origin: str) -> object:
    kind = _SOURCES[name][1]
    if kind == "count":
        return parse_count(raw, name=f"{_flag(name)} ({origin})")
    if kind == "names":
        return parse_names(raw, name=f"{_flag(name)} ({origin})")
    if kind == "names-or-none":
        # Empty says "none" here: the chart renders `dra.drivers: []` as an empty variable.
        if raw == [] or (isinstance(raw, str) and not raw.strip()):
            return ()
        return parse_names(raw, name=f"{_flag(name)} ({origin})")
    if kind == "bool":
        return parse_bool(raw, name=f"{_flag(name)} ({origin})")
    if kind == "indexes":
        return parse_indexes(raw, name=f"{_flag(name)} ({origin})")
    if kind == "duration":
        where = f"{_flag(name)} ({origin})"
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            # A YAML integer can be too large for a float (10**400): that is out of range too.
            seconds = float(raw) if not isinstance(raw, int) or abs(raw) < 10**18 else math.inf
        else:
            seconds = parse_duration(str(raw), name=where)
        return check_duration(seconds, name=where)
    if not isinstance(raw, str):
        raise ConfigError(f"{_flag(name)} ({origin}) must be a string, not {excerpt(raw)}")
    return raw


def _read_file(path: str) -> dict[str, object]:
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
    by_flag = {_flag(n): n for n in _SOURCES}
    values: dict[str, object] = {}
    for key, raw in loaded.items():
        name = by_flag.get(str(key).replace("_", "-"))
        if name is None:
            raise ConfigError(
                f"settings file {path}: unknown setting {excerpt(key)} "
                f"(known: {', '.join(by_flag)})"
            )
        values[name] = _convert(name, raw, f"in {path}")
    return values


def resolve(flags: Mapping[str, object], environ: Mapping[str, str]) -> Settings:
    """Settings from defaults, the YAML file, the environment and flags, validated.

    `flags` maps field names to what the command line gave (None when not given).
    Raises ConfigError.
    """
    values: dict[str, object] = {}
    config_file = flags.get("config_file") or environ.get("TOPO_REPORTER_CONFIG") or None
    if config_file is not None:
        values.update(_read_file(str(config_file)))
    for name, (variables, _) in _SOURCES.items():
        for variable in variables:
            raw = environ.get(variable)
            # An empty variable is unset (charts render empty values), except for listen,
            # where empty is how the server is turned off.
            if raw is not None and (raw != "" or name == "listen"):
                values[name] = _convert(name, raw, f"from {variable}")
                break
    for name in _SOURCES:
        given = flags.get(name)
        if given is not None:
            values[name] = _convert(name, given, f"--{_flag(name)}")
    for name in _FLAGS_ONLY:
        values[name] = bool(flags.get(name))
    values["config_file"] = None if config_file is None else str(config_file)
    known = {f.name for f in fields(Settings)}
    # Each value was converted to its field's type by _convert above; mypy cannot follow that.
    chosen = {k: v for k, v in values.items() if k in known}
    return Settings(**chosen).validate()  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `run` flags; every default is None so that resolve() can tell "not given"."""
    add = parser.add_argument
    add("--config", dest="config_file", metavar="FILE", help="YAML settings file")
    add("--node", help="the Node to publish on (default: TOPO_REPORTER_NODE, NODE_NAME)")
    add("--kubeconfig", help="kubeconfig path (default: KUBECONFIG, in-cluster, ~/.kube/config)")
    add("--prefix", help=f"label and annotation key prefix (default {DEFAULT_PREFIX})")
    add("--interval", dest="interval_s", metavar="DURATION", help="between scans (default 60s)")
    add("--resync", dest="resync_s", metavar="DURATION", help="between Node re-reads (default 5m)")
    add("--backend", help="auto, nvml or sysfs (default auto)")
    add("--sysfs-root", dest="sysfs_root", help="host sysfs mount (default /sys)")
    add("--simulate", metavar="PROFILE", help="simulated machine instead of the hardware")
    add("--sink", help="node or nodefeature (default node)")
    add("--namespace", help="namespace of the NodeFeature object (default: POD_NAMESPACE)")
    add("--listen", help="health and metrics address (default 0.0.0.0:8080, '' disables)")
    add("--log-format", dest="log_format", help="auto, json or console (default auto)")
    add("--log-level", dest="log_level", help="debug, info, warning or error (default info)")
    add("--kubelet-config", dest="kubelet_config", help="kubelet config file")
    add(
        "--topology-manager-policy",
        dest="topology_manager_policy",
        metavar="POLICY",
        help="the kubelet's Topology Manager policy, for the NodeResourceTopology where the "
        "kubelet config cannot be read (default: none stated: no NodeResourceTopology then)",
    )
    add(
        "--topology-manager-scope",
        dest="topology_manager_scope",
        metavar="SCOPE",
        help="with --topology-manager-policy: container or pod (default container)",
    )
    add(
        "--koordinator-dir",
        dest="koordinator_dir",
        metavar="DIR",
        help="write Koordinator's device-info file (NVLink partitions) into koordlet's "
        "xpu-device-infos DIR (default: off)",
    )
    add(
        "--availability",
        action="store_true",
        default=None,
        help="also publish which GPUs are free, from the kubelet's PodResources (default: off)",
    )
    add(
        "--nrt",
        action="store_true",
        default=None,
        help="publish the node's NodeResourceTopology (needs --availability; the sole producer: "
        "refuses to write over NFD's topology-updater or resource-topology-exporter)",
    )
    add(
        "--availability-interval",
        dest="availability_interval_s",
        metavar="DURATION",
        help="between reads of the free GPUs; at most one Node write each (default 10s)",
    )
    add(
        "--on-node-policy",
        dest="on_node_policy",
        metavar="POLICY",
        help="how the node's device plugin picks GPUs, which the availability describes: "
        "nvidia-besteffort (NVIDIA's device plugin; default), best or packing",
    )
    add(
        "--availability-withdraw-after",
        dest="availability_withdraw_after",
        metavar="N",
        help=f"withdraw the availability keys after N failed PodResources reads in a row "
        f"(default {WITHDRAW_AFTER})",
    )
    add(
        "--heartbeat",
        action="store_true",
        default=None,
        help="renew a heartbeat Lease named after the node in --namespace while the availability "
        "is current, for the extender to judge it by (needs --availability; default: off)",
    )
    add(
        "--heartbeat-duration",
        dest="heartbeat_duration_s",
        metavar="DURATION",
        help="the Lease's duration, renewed every quarter of it (default 40s)",
    )
    add(
        "--pod-resources-socket",
        dest="pod_resources_socket",
        metavar="PATH",
        help=f"the kubelet's PodResources socket (default {DEFAULT_POD_RESOURCES_SOCKET})",
    )
    add(
        "--simulate-used",
        dest="simulate_used",
        metavar="I,J,...",
        help="with --simulate: the GPU indexes taken as allocated, instead of a kubelet's answer",
    )
    add(
        "--gpu-resource",
        dest="gpu_resources",
        action="append",
        metavar="NAME",
        help="a resource name whose PodResources devices are GPUs; repeat for several, * for a "
        "family (default: nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*)",
    )
    add(
        "--taint-unhealthy-fabric",
        dest="taint_unhealthy_fabric",
        action="store_true",
        default=None,
        help="taint the Node NoSchedule (<prefix>/fabric-health) while its multi-node NVLink "
        "fabric is degraded or unhealthy, untaint it when healthy (default: off)",
    )
    add(
        "--dra-drivers",
        dest="dra_drivers",
        metavar="NAMES",
        help="DRA drivers whose claimed devices in this node's pool availability counts as its "
        "GPUs, comma-separated; '' for none (default: gpu.nvidia.com)",
    )
    add(
        "--dra-device-taints",
        dest="dra_device_taints",
        action="store_true",
        default=None,
        help="mark each lost or NVLink/fabric-degraded GPU with a DRA DeviceTaintRule "
        "(NoSchedule) and delete it when healthy; needs a cluster serving DeviceTaintRules",
    )
    add("--once", action="store_true", default=None, help="scan and publish once, then exit")
    add("--dry-run", dest="dry_run", action="store_true", default=None, help="print the patch")
