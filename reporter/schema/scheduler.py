"""What kube-scheduler hands the extender, as more than the extender reads it: a pod's request of
an extended resource, the names such a resource takes, and how large one extender call may be.

The extender counts a pod's GPUs to filter and rank nodes (`reporter.extender.protocol`); the
doctor counts a Pending Workload's pods the same way to find the partitions they cannot fit
(`reporter.doctor.groups`); the extender's settings check `--resource` and bound the body. Each
reads it from here, so none of them imports another's package.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from parsers.errors import ParseError
from parsers.integers import parse_decimal
from reporter.errors import ConfigError, InputError
from reporter.schema.keys import GPU_RESOURCE

MAX_GPUS_PER_POD = 1 << 20
"""A request beyond this is not a GPU count (nothing fits it; it is refused as malformed)."""
MAX_REQUEST_BYTES = 2 * 1024 * 1024
"""The default largest extender call body: names of 50,000 nodes, or about 200 whole Nodes (the
form without nodeCacheCapable). Answering costs up to 40 times the body's size in memory (whole
Nodes about 7 times): `reporter.extender.server.peak_bytes`."""
_RESOURCE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


class PodRequestError(InputError):
    """A pod's resource requests do not read as kube-scheduler reads them; the message is one
    line naming the field."""


def check_resource_name(name: str) -> str:
    """`name` if it is a resource name (`nvidia.com/gpu`). Raises ConfigError otherwise."""
    prefix, _, _ = name.rpartition("/")
    if len(prefix) > 253 or not _RESOURCE.fullmatch(name):
        raise ConfigError(f"{name!r} is not a resource name such as nvidia.com/gpu")
    return name


def gpus_requested(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """The pod's effective request of `resource`, as kube-scheduler counts it.

    Regular containers add up; an init container runs alone, so the pod needs the largest of them
    (plus the restartable "sidecar" init containers started before it, which keep running). A
    container's request is its `requests` entry, or its `limits` entry when only that is set (the
    apiserver defaults extended-resource requests to limits). Raises PodRequestError for a count
    that is not a whole number.
    """
    spec = pod.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise PodRequestError("Pod.spec is not an object")
    regular = sum(
        _container_gpus(c, "containers", i, resource) for i, c in _list(spec, "containers")
    )
    sidecars, init_peak = 0, 0
    for i, container in _list(spec, "initContainers"):
        count = _container_gpus(container, "initContainers", i, resource)
        if container.get("restartPolicy") == "Always":
            sidecars += count
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + count)
    total = max(regular + sidecars, init_peak)
    if total > MAX_GPUS_PER_POD:
        raise PodRequestError(f"the pod requests {total} {resource}, more than any node has")
    return total


def _list(spec: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodRequestError(f"Pod.spec.{key} is not a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise PodRequestError(f"Pod.spec.{key}[{i}] is not an object")
    return list(enumerate(value))


def _container_gpus(container: Mapping[str, Any], key: str, i: int, resource: str) -> int:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise PodRequestError(f"Pod.spec.{key}[{i}].resources is not an object")
    for kind in ("requests", "limits"):
        values = resources.get(kind) or {}
        if not isinstance(values, dict):
            raise PodRequestError(f"Pod.spec.{key}[{i}].resources.{kind} is not an object")
        if resource in values:
            return _count(values[resource], f"Pod.spec.{key}[{i}].resources.{kind}[{resource}]")
    return 0


def _count(value: Any, where: str) -> int:
    # Extended resources are whole numbers (the apiserver refuses "500m" for them); JSON may carry
    # the Quantity as a string or as a number.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return parse_decimal(value, field=where, max_digits=7)
        except ParseError:
            pass
    raise PodRequestError(f"{where} is {str(value)[:32]!r}, not a whole number of devices")
