"""NVIDIA's DRA driver's names for GPUs, and DeviceTaintRules for this node's unhealthy GPUs.

NVIDIA's DRA driver (`gpu.nvidia.com`) names a GPU `gpu-<minor>` and a MIG device
`gpu-<minor>-mig-<profile>-<profile id>-<placement start>` (its `canonicalMigNameRegex`,
`^gpu-(\\d+)-mig-(.+)-(\\d+)-(\\d+)$`), in one pool per node named after the node: the minor number
joins a DRA device to a GPU of the topology, for availability (claims), the doctor and the rules.

A `DeviceTaintRule` (KEP-5055, resource.k8s.io) puts one taint on the devices its selector names;
the scheduler's DRA allocator then leaves a device with a `NoSchedule` taint to claims that
tolerate it. It is how a component other than the driver marks one device: NVIDIA's DRA driver
taints a GPU only for XID errors and lost GPUs, and nothing of its marks NVLinks that failed.

The agent marks each GPU that NVML reports lost, or whose NVLinks are degraded or down, or whose
multi-node fabric is not healthy, with one rule naming NVIDIA's driver, the node's pool (NVIDIA's
driver names the pool after the node) and the device `gpu-<minor>`. The rule carries our
`app.kubernetes.io/managed-by` label and `<prefix>/node` naming the node: the agent lists and
deletes only those of its node, never another's.

Pure: no I/O. `reporter.publish.devicetaints` keeps the cluster's rules equal to these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from parsers.integers import parse_decimal
from reporter.errors import ConfigError
from reporter.schema import fabric, keys
from reporter.schema.model import Topology
from reporter.schema.nrt import MANAGED_BY, MANAGER

DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver: its slices name a GPU `gpu-<minor>`, in a pool named after the node."""
GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")
"""Newest first; the agent writes the first one its cluster serves (v1alpha3 on 1.34 and 1.35,
behind the DRADeviceTaints gate and `--runtime-config=resource.k8s.io/v1alpha3=true`)."""
DRY_RUN_VERSION = "v1alpha3"
"""What a dry run prints, which asks no server: the version 1.34 and 1.35 serve."""
EFFECT = "NoSchedule"
NAME_PREFIX = "topo-reporter"

REASON_LOST = "lost"
REASON_NVLINK_DOWN = "nvlink-down"
REASON_NVLINK_DEGRADED = "nvlink-degraded"
REASON_FABRIC = "fabric-"
"""Followed by the fabric's health (`fabric-degraded`, `fabric-unhealthy`)."""

# A DRA device name is a DNS label of at most 63 characters, so a minor has a few digits at most;
# no sign, no leading zero.
_MAX_DEVICE_NAME = 63
_WHOLE_GPU = re.compile(r"gpu-(0|[1-9][0-9]{0,5})")
"""The device name of a whole GPU, the only kind of device a rule of ours names (the admission
policy's pattern too)."""
_GPU_DEVICE = re.compile(r"gpu-(0|[1-9][0-9]{0,5})(?:-mig-[a-z0-9][a-z0-9-]*-[0-9]+-[0-9]+)?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE_MAX = 63
_MAX_DRIVER_NAME = 63
"""resource.k8s.io validates a driver name as a DNS subdomain of at most 63 characters."""


def check_driver_name(driver: str) -> None:
    """Raises ConfigError for a name that cannot be a DRA driver's."""
    if len(driver) > _MAX_DRIVER_NAME or not _DNS1123_SUBDOMAIN.fullmatch(driver):
        raise ConfigError(
            f"DRA driver name {driver[:80]!r} is not a driver name: a DNS subdomain of at most "
            f"{_MAX_DRIVER_NAME} characters, such as {DRIVER}"
        )


def gpu_device(minor: int) -> str:
    """The DRA device name of the whole GPU with this minor number."""
    return f"gpu-{minor}"


def gpu_minor(device: str) -> int | None:
    """The minor number of the GPU that a device of NVIDIA's DRA driver is, or is carved from
    (MIG); None for a name of any other shape."""
    if len(device) > _MAX_DEVICE_NAME:
        return None
    match = _GPU_DEVICE.fullmatch(device)
    return None if match is None else parse_decimal(match.group(1), field="device")


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One GPU to mark: its index (for logs), its DRA device name and why."""

    gpu: int
    device: str
    reason: str


def gpu_health_reason(topology: Topology, index: int) -> str | None:
    """Why GPU `index` should not take new claims, or None when it is healthy: lost; NVLinks down
    (all of them: `nvlink-down`, some: `nvlink-degraded`); a multi-node fabric that completed but
    is degraded or unhealthy (`fabric-<health>`). A fabric still forming (in progress, not
    started) is not marked: it is a state the GPU leaves by itself, and the fabric-health label
    says so."""
    gpu = topology.gpus[index]
    if gpu.lost:
        return REASON_LOST
    if gpu.nvlink is not None and gpu.nvlink.state == "down":
        return REASON_NVLINK_DOWN
    if gpu.nvlink is not None and gpu.nvlink.state == "degraded":
        return REASON_NVLINK_DEGRADED
    if gpu.fabric is not None:
        health = fabric.gpu_health(gpu.fabric)
        if health in (fabric.DEGRADED, fabric.UNHEALTHY):
            return REASON_FABRIC + health
    return None


def device_taints(topology: Topology) -> tuple[tuple[DeviceTaint, ...], tuple[int, ...]]:
    """The GPUs to mark, and the unhealthy GPUs that cannot be named (their minor is unknown)."""
    taints: list[DeviceTaint] = []
    unnamed: list[int] = []
    for gpu in topology.gpus:
        reason = gpu_health_reason(topology, gpu.index)
        if reason is None:
            continue
        if gpu.minor is None:
            unnamed.append(gpu.index)
        else:
            taints.append(DeviceTaint(gpu.index, gpu_device(gpu.minor), reason))
    return tuple(taints), tuple(unnamed)


def check_node_name(node: str) -> None:
    """Raises ConfigError when `node` cannot name its rules: a label value holds 63 characters."""
    if not _DNS1123_SUBDOMAIN.fullmatch(node) or len(node) > _LABEL_VALUE_MAX:
        raise ConfigError(
            f"node name {node[:80]!r} cannot be the value of the {keys.OWNER_NODE} label "
            f"that marks this agent's DeviceTaintRules (a DNS name of at most {_LABEL_VALUE_MAX} "
            "characters): turn --dra-device-taints off on this node"
        )


def rule_name(node: str, device: str) -> str:
    """`topo-reporter.<node>.<device>`: one per device, never the same for two nodes."""
    return f"{NAME_PREFIX}.{node}.{device}"


def owned_selector(node: str, prefix: str) -> str:
    """The label selector of this node's rules (ours, naming this node)."""
    return f"{MANAGED_BY}={MANAGER},{keys.key(prefix, keys.OWNER_NODE)}={node}"


def rule(
    taint: DeviceTaint, *, node: str, prefix: str, version: str, driver: str = DRIVER
) -> dict[str, Any]:
    """The DeviceTaintRule marking `taint.device` of `driver` in the node's pool."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, taint.device),
            "labels": {MANAGED_BY: MANAGER, keys.key(prefix, keys.OWNER_NODE): node},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": node, "device": taint.device},
            "taint": {
                "key": keys.key(prefix, keys.DEVICE_TAINT),
                "value": taint.reason,
                "effect": EFFECT,
            },
        },
    }


def _object(value: Any) -> dict[str, Any]:
    """`value` where it is a JSON object, else empty: a listed rule of any shape reads safely."""
    return value if isinstance(value, dict) else {}


def rule_content(obj: Any) -> tuple[Any, ...]:
    """What decides whether a rule as stored is the one we want: the selector and the taint
    (not `timeAdded`, which the API server sets). Any shape reads: what is missing is None."""
    spec = _object(_object(obj).get("spec"))
    selector = _object(spec.get("deviceSelector"))
    taint = _object(spec.get("taint"))
    return (
        selector.get("driver"),
        selector.get("pool"),
        selector.get("device"),
        selector.get("deviceClassName"),
        selector.get("selectors"),
        taint.get("key"),
        taint.get("value"),
        taint.get("effect"),
    )


def listed_name(obj: Any) -> str:
    """The name of a listed object as text, `?` where it has none."""
    name = _object(_object(obj).get("metadata")).get("name")
    return "?" if name is None else str(name)


def own_rule(
    obj: Any, node: str, prefix: str, driver: str = DRIVER
) -> tuple[str, tuple[Any, ...]] | None:
    """(name, content) of a listed rule that is one this node's agent writes, as `rule` builds
    it: named `topo-reporter.<node>.<device>` for the one whole GPU it selects of `driver` in the
    node's own pool, nothing else selected, our taint key, effect NoSchedule. None for any other,
    whatever labels it carries: our labels are anyone's to write, and deleting what they mark
    would delete another node's rule or an administrator's (a NoExecute quarantine), or (the
    admission policy refusing, as it refuses every rule of another shape) stop the sink."""
    name = _object(_object(obj).get("metadata")).get("name")
    content = rule_content(obj)
    sel_driver, pool, device, device_class, selectors, key, _, effect = content
    own = (
        isinstance(device, str)
        and _WHOLE_GPU.fullmatch(device) is not None
        and name == rule_name(node, device)
        and (sel_driver, pool, device_class, selectors) == (driver, node, None, None)
        and (key, effect) == (keys.key(prefix, keys.DEVICE_TAINT), EFFECT)
    )
    return (name, content) if own and isinstance(name, str) else None
