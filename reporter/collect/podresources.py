"""The kubelet's PodResources v1 API: which of this node's GPUs containers hold right now.

One read asks the kubelet, over its unix socket, `GetAllocatableResources` (the healthy devices it
offers) and then `List` (the device IDs each container holds), keeps the devices of the managed
resource names, and maps every device ID to a GPU index of the topology through UUIDs:

- `GPU-<uuid>`: a whole GPU (NVIDIA's device plugin advertises GPU UUIDs whatever its
  `--device-id-strategy`, which changes only what the container runtime is told);
- `GPU-<uuid>::<n>`: replica n of a shared GPU (time-slicing, MPS): the GPU itself;
- `MIG-<uuid>`: a MIG device; its parent comes from the topology, which records each GPU's MIG
  device UUIDs (NVML knows the parent, the UUID does not say it);
- `MIG-GPU-<uuid>/<gi>/<ci>`: the MIG UUID of drivers before R470, which names its parent.

On a node where a DRA driver hands out GPUs (Kubernetes 1.34+, NVIDIA's `gpu.nvidia.com`), `List`
also reports, per container, the devices its ResourceClaims hold (`dynamic_resources`: driver,
pool, device). NVIDIA's driver names a GPU `gpu-<minor>` and a MIG device
`gpu-<minor>-mig-<profile>-<profile id>-<placement start>`, in a pool named after the node, so a
claimed device maps to a GPU through the minor numbers of the topology; a MIG device holds its
parent. Devices of other drivers are not GPUs of ours and are ignored. The kubelet's
`GetAllocatableResources` knows nothing of DRA: where it offers none of this node's GPUs, under any
resource name, and DRA drivers are configured, the node is taken as a DRA node and every GPU with a
known minor that NVML has not lost is offered (the driver's own health is in its ResourceSlices,
which the doctor reads). GPUs offered under names that are not managed are a device plugin named
otherwise, not DRA: that is `no_devices`, as without DRA. `AllocationView.sources` says which of the
two the view counts.

A GPU is *free* when it is offered (the kubelet offers at least one of its devices, so healthy, or
the node is a DRA node), no container holds any of its devices or a claim on it, and NVML has not
reported it lost. Everything else that can
go wrong has one rule: it is logged and counted, it never crashes the agent, and it never removes
a GPU from the free set silently.

- An ID that maps to no GPU is counted in `unknown_ids` and logged when the set changes; it changes
  no GPU's state. So is a claimed device of a configured DRA driver that is not one of this node's
  GPUs: another pool, a name of another shape (`gpu--1`, `gpu-0-mig-`), a minor no GPU has.
- A GPU the kubelet does not offer (an unhealthy device, or one its plugin does not advertise
  under a managed name) is not free, and is listed in `unhealthy`, logged when that set changes.
- A failed call, a missing socket, a kubelet offering no managed device at all, or offering only
  devices that match no GPU (a wrong resource name, a topology without UUIDs) raises
  `PodResourcesError`: the caller keeps the last good view rather than publishing a guess.

The socket's directory is mounted, not the socket: the kubelet replaces the socket when it restarts.
gRPC reconnects a channel whose server went away (tested with a kubelet killed and restarted);
the channel is also dropped after any failed call, so the next read starts afresh.

This module is the only one that imports `grpc`; it never writes anything.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import structlog

from reporter.collect.kubelet import POD_RESOURCES_SOCKET
from reporter.collect.podresources_v1 import api_pb2, api_pb2_grpc
from reporter.errors import CollectError, ConfigError
from reporter.placement_quality import HeldSet
from reporter.schema.dra import check_driver_name, gpu_minor
from reporter.schema.keys import GPU_RESOURCES
from reporter.schema.model import Topology
from reporter.schema.nrt import PodRef
from reporter.telling import Told

log = structlog.get_logger(__name__)

DEFAULT_SOCKET = Path(POD_RESOURCES_SOCKET)
DEFAULT_RESOURCES = GPU_RESOURCES
DEFAULT_TIMEOUT_S = 10.0
# The kubelet's own e2e clients and NFD use 16 MiB; a larger answer is refused, not read.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# sun_path holds 108 bytes with the terminating NUL.
_MAX_SOCKET_PATH = 107
_MAX_RESOURCE_PATTERNS = 32
_MAX_EXAMPLES = 8
_MAX_DETAIL = 200

_MAX_DRA_DRIVERS = 8

SOURCE_DEVICE_PLUGIN = "device-plugin"
SOURCE_DRA = "dra"

_Answer = tuple[api_pb2.AllocatableResourcesResponse, api_pb2.ListPodResourcesResponse]


class PodResourcesError(CollectError):
    """A read of the PodResources API failed; the caller keeps its last good view.

    `reason` is a closed vocabulary, for metrics labels: `missing`, `unavailable`, `timeout`,
    `throttled`, `too_large`, `refused`, `no_devices`, `unmatched`. `method` names the call.
    """

    def __init__(self, message: str, *, reason: str, method: str | None = None) -> None:
        self.reason = reason
        self.method = method
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class DraScope:
    """Which DRA allocations are GPUs of this node: devices of `drivers` in the pool `pool`."""

    drivers: tuple[str, ...]
    pool: str
    """The node's name: NVIDIA's driver publishes one pool per node, named after it."""

    def __post_init__(self) -> None:
        """Raises ConfigError for a driver name that is not one, or too many."""
        if not self.drivers or len(self.drivers) > _MAX_DRA_DRIVERS:
            raise ConfigError(
                f"give 1 to {_MAX_DRA_DRIVERS} DRA driver names (got {len(self.drivers)}), "
                "e.g. gpu.nvidia.com, or none to count device plugin allocations only"
            )
        for driver in self.drivers:
            check_driver_name(driver)
        if not self.pool:
            raise ConfigError("the DRA pool (the node's name) is empty")


@dataclass(frozen=True, slots=True)
class ClaimedDevice:
    """One device a container's ResourceClaim holds, as `List` reports it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        # DRA's own notation for a device (<driver>/<pool>/<device>), bounded for logs.
        return f"{self.driver[:64]}/{self.pool[:64]}/{self.device[:64]}"


@dataclass(frozen=True, slots=True)
class ContainerHold:
    """What one container holds, as `List` reports it: device IDs of managed resources and the
    devices of its ResourceClaims."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...] = ()
    claims: tuple[ClaimedDevice, ...] = ()


def gpu_minors(topology: Topology) -> dict[int, int]:
    """Minor number -> GPU index, for the GPUs whose minor the source observed."""
    return {g.minor: g.index for g in topology.gpus if g.minor is not None}


@dataclass(frozen=True, slots=True)
class AllocationView:
    """What the kubelet says of this node's GPUs, by GPU index."""

    allocatable: frozenset[int]
    """GPUs the kubelet offers: at least one of their devices is allocatable (healthy)."""
    allocated: frozenset[int]
    """GPUs of which some container holds at least one device (whole, replica or MIG)."""
    unhealthy: tuple[int, ...]
    """GPUs of the topology, not lost, that the kubelet does not offer, ascending."""
    unknown_ids: int
    """Distinct device IDs of a managed resource that match no GPU of the topology."""
    unknown_examples: tuple[str, ...]
    """A few of them (sorted, at most eight), for logs and `doctor`."""
    lost: frozenset[int] = frozenset()
    """GPUs NVML reports lost: never free, whatever the kubelet says."""
    pods: tuple[PodRef, ...] = ()
    """Every pod `List` returned, sorted, whatever it holds: the NodeResourceTopology's pods
    fingerprint covers them all, as NFD's topology-updater computes it (method `all`), so that
    it equals what scheduler-plugins recomputes from the pods it placed on the node."""
    exclusive_cpus: frozenset[int] = frozenset()
    """CPUs containers hold exclusively (the CPU manager's `static` policy; `List` names no
    shared-pool CPU): not available in the NodeResourceTopology's zones."""
    claimed: frozenset[int] = frozenset()
    """GPUs a DRA ResourceClaim holds (the GPU, or a MIG device of it); part of `allocated`."""
    sources: tuple[str, ...] = (SOURCE_DEVICE_PLUGIN,)
    """What the view counts: `device-plugin` (the kubelet offers GPUs and containers hold them),
    `dra` (claims hold GPUs), or both."""
    held_sets: tuple[HeldSet, ...] = ()
    """Every container holding two or more of the node's GPUs (devices and claims together),
    sorted: what `reporter.placement_quality` judges."""

    @property
    def free(self) -> tuple[int, ...]:
        """Free GPU indexes, ascending: offered, held by no container, not lost."""
        return tuple(sorted(self.allocatable - self.allocated - self.lost))


def device_gpu_keys(topology: Topology) -> dict[str, int]:
    """Every device ID a plugin may advertise for a GPU (its UUID, its MIG UUIDs) -> GPU index.

    Keys are lower case: UUIDs are hex, and plugins copy NVML's spelling, but case is no identity.
    """
    keys: dict[str, int] = {}
    for gpu in topology.gpus:
        if gpu.uuid:
            keys[gpu.uuid.lower()] = gpu.index
        for mig in gpu.mig_devices:
            keys[mig.lower()] = gpu.index
    return keys


def device_key(device_id: str) -> str:
    """The identity a device ID names: replicas (`::n`) stripped, an old MIG UUID's parent."""
    base = device_id.split("::", 1)[0]
    if base.startswith("MIG-GPU-"):
        # Before R470, MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>.
        base = base[len("MIG-") :].split("/", 1)[0]
    return base.lower()


def _claimed_gpus(
    topology: Topology, claims: Iterable[ClaimedDevice], dra: DraScope, unknown: set[str]
) -> set[int]:
    """GPU indexes the claimed devices of `dra`'s drivers hold; the rest of theirs in `unknown`."""
    minors = gpu_minors(topology)
    found: set[int] = set()
    for device in claims:
        if device.driver not in dra.drivers:
            continue  # another driver's device (a NIC, an FPGA): not a GPU of ours
        minor = gpu_minor(device.device) if device.pool == dra.pool else None
        index = None if minor is None else minors.get(minor)
        if index is None:
            unknown.add(str(device))
        else:
            found.add(index)
    return found


def allocation_view(
    topology: Topology,
    offered: Iterable[str],
    held: Iterable[str],
    pods: Iterable[PodRef] = (),
    exclusive_cpus: Iterable[int] = (),
    *,
    claims: Iterable[ClaimedDevice] = (),
    dra: DraScope | None = None,
    containers: Iterable[ContainerHold] = (),
) -> AllocationView:
    """The view of `topology` given the device IDs the kubelet offers, those containers hold,
    the devices their ResourceClaims hold, and the pods the kubelet lists; `containers` says the
    same per container, for the sets of two or more GPUs they hold (`held_sets`).

    Pure: the reader passes the IDs of the managed resources. Claims count only with `dra`; with
    it and nothing offered, the node is a DRA node (see the module docstring). Raises
    PodResourcesError (`unmatched`) when IDs are offered but none is a GPU of the topology, or
    on a DRA node whose topology has no minor numbers.
    """
    keys = device_gpu_keys(topology)
    unknown: set[str] = set()

    def gpus(ids: Iterable[str]) -> set[int]:
        found: set[int] = set()
        for device_id in ids:
            index = keys.get(device_key(device_id))
            if index is None:
                unknown.add(device_id)
            else:
                found.add(index)
        return found

    offered_ids = list(offered)
    allocatable = gpus(offered_ids)
    sources: tuple[str, ...] = (SOURCE_DEVICE_PLUGIN,) if offered_ids else ()
    if dra is not None:
        sources += (SOURCE_DRA,)
        if not offered_ids:
            allocatable = {g.index for g in topology.gpus if g.minor is not None}
            if topology.gpus and not allocatable:
                raise PodResourcesError(
                    "no device plugin offers a GPU, and DRA claims name GPUs by minor number, "
                    "which this node's topology does not have (availability needs the NVML source)",
                    reason="unmatched",
                    method="List",
                )
    if offered_ids and not allocatable and topology.gpus:
        hint = (
            "the topology has no GPU UUIDs (availability needs the NVML source)"
            if not keys
            else "are they another vendor's, or is this node's topology stale?"
        )
        raise PodResourcesError(
            f"none of the {len(offered_ids)} devices the kubelet offers is a GPU of this "
            f"node's topology: {hint}",
            reason="unmatched",
            method="GetAllocatableResources",
        )
    allocated = gpus(held)
    claimed = set() if dra is None else _claimed_gpus(topology, claims, dra, unknown)
    lost = frozenset(g.index for g in topology.gpus if g.lost)
    held_sets = []
    for c in containers:
        held_gpus = gpus(c.device_ids)
        if dra is not None:
            held_gpus |= _claimed_gpus(topology, c.claims, dra, unknown)
        if len(held_gpus) >= 2:
            held_sets.append(HeldSet(c.namespace, c.pod, c.container, tuple(sorted(held_gpus))))
    return AllocationView(
        allocatable=frozenset(allocatable),
        allocated=frozenset(allocated | claimed),
        unhealthy=tuple(g.index for g in topology.gpus if g.index not in allocatable | lost),
        unknown_ids=len(unknown),
        unknown_examples=tuple(sorted(d[:96] for d in unknown)[:_MAX_EXAMPLES]),
        lost=lost,
        pods=tuple(sorted(pods, key=lambda p: (p.namespace, p.name))),
        exclusive_cpus=frozenset(exclusive_cpus),
        claimed=frozenset(claimed),
        sources=sources,
        held_sets=tuple(sorted(held_sets)),
    )


class PodResourcesReader:
    """Reads which GPUs are allocated from the kubelet's PodResources socket; reconnects itself.

    Not meant for concurrent readers: calls are serialised by a lock. `close()` (or a `with`
    block) releases the connection.
    """

    def __init__(
        self,
        socket: Path = DEFAULT_SOCKET,
        resources: Iterable[str] = DEFAULT_RESOURCES,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        dra: DraScope | None = None,
    ) -> None:
        """Raises ConfigError for a socket path too long for a unix socket, or bad resources.

        `dra`: count the devices of these DRA drivers in this node's pool that claims hold
        (None: device plugin allocations only)."""
        self.socket = socket
        self.resources = tuple(resources)
        self.dra = dra
        if len(os.fsencode(socket)) > _MAX_SOCKET_PATH:
            raise ConfigError(
                f"PodResources socket path {socket} is longer than {_MAX_SOCKET_PATH} bytes, "
                "the limit of a unix socket: mount the kubelet's pod-resources directory higher up"
            )
        if not self.resources or len(self.resources) > _MAX_RESOURCE_PATTERNS:
            raise ConfigError(
                f"give 1 to {_MAX_RESOURCE_PATTERNS} PodResources resource names "
                f"(got {len(self.resources)}), e.g. nvidia.com/gpu"
            )
        for pattern in self.resources:
            if not pattern or len(pattern) > 253 or any(c.isspace() for c in pattern):
                raise ConfigError(
                    f"PodResources resource name {pattern!r} is not a resource name: use names "
                    "such as nvidia.com/gpu, with * for a family (nvidia.com/mig-*)"
                )
        if not timeout_s > 0:
            raise ConfigError(f"PodResources timeout must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._last_unknown: Told[tuple[str, ...]] = Told(())
        self._last_unhealthy: Told[tuple[int, ...]] = Told(())
        self._last_sources: Told[tuple[str, ...]] = Told(())
        self._last_failure: Told[str | None] = Told(None)

    def __enter__(self) -> PodResourcesReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Drop the connection; the next read opens a new one."""
        with self._lock:
            self._drop()

    def manages(self, resource_name: str) -> bool:
        """Whether devices of `resource_name` are GPUs this reader accounts for."""
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.resources)

    def allocated(self, topology: Topology) -> AllocationView:
        """Which GPUs of `topology` the kubelet offers and containers hold, right now.

        Raises PodResourcesError when the socket is missing, a call fails, or the kubelet's
        answer cannot say anything about this topology (see the module docstring).
        """
        with self._lock:
            try:
                allocatable, listed = self._read()
                view = self._view(topology, allocatable, listed)
            except PodResourcesError as e:
                self._failed(e)
                raise
            previous = self._last_failure.last
            if self._last_failure.changed(None):
                log.info("podresources_recovered", previous=previous)
        return view

    # --- the calls -----------------------------------------------------------------------------

    def _read(self) -> _Answer:
        self._check_socket()
        stub = self._connect()
        allocatable: api_pb2.AllocatableResourcesResponse = self._call(
            "GetAllocatableResources",
            lambda: stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_s
            ),
        )
        listed: api_pb2.ListPodResourcesResponse = self._call(
            "List", lambda: stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        )
        return allocatable, listed

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self.socket).st_mode
        except OSError as e:
            self._drop()
            raise PodResourcesError(
                f"no PodResources socket at {self.socket} ({e.strerror}): check that the kubelet "
                "runs and that its pod-resources directory is mounted "
                "(chart: availability.enabled)",
                reason="missing",
            ) from None
        if not stat.S_ISSOCK(mode):
            self._drop()
            raise PodResourcesError(
                f"{self.socket} is not a socket: point --pod-resources-socket at the kubelet's "
                "pod-resources/kubelet.sock",
                reason="missing",
            )

    def _connect(self) -> Any:
        if self._channel is None:
            # A larger answer fails the call (too_large) before it is read into memory.
            options = [("grpc.max_receive_message_length", self.max_message_bytes)]
            self._channel = grpc.insecure_channel(f"unix:{self.socket}", options=options)
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def _call(self, method: str, call: Any) -> Any:
        try:
            return call()
        except grpc.RpcError as e:
            self._drop()
            raise _rpc_error(method, e, self.socket) from None

    # --- the answer ----------------------------------------------------------------------------

    def _managed_ids(self, groups: Iterable[api_pb2.ContainerDevices]) -> Iterator[str]:
        for group in groups:
            if self.manages(group.resource_name):
                yield from group.device_ids

    def _view(
        self,
        topology: Topology,
        allocatable: api_pb2.AllocatableResourcesResponse,
        listed: api_pb2.ListPodResourcesResponse,
    ) -> AllocationView:
        offered = list(self._managed_ids(allocatable.devices))
        if not offered:
            # A DRA node offers no GPU at all; GPUs offered under other names are a device plugin
            # whose names are not managed here: counting it as DRA would publish them all free.
            keys = device_gpu_keys(topology)
            named = sorted(
                {
                    group.resource_name[:64]
                    for group in allocatable.devices
                    if any(device_key(i) in keys for i in group.device_ids)
                }
            )
            if self.dra is None or named:
                hint = (
                    f": it offers this node's GPUs as {', '.join(named[:4])} (--gpu-resource)"
                    if named
                    else ": is the device plugin running, and do these names match the "
                    "resources it advertises?"
                )
                raise PodResourcesError(
                    f"the kubelet offers no device named {', '.join(self.resources)}{hint}",
                    reason="no_devices",
                    method="GetAllocatableResources",
                )
        containers = [
            ContainerHold(
                pod.namespace,
                pod.name,
                container.name,
                tuple(self._managed_ids(container.devices)),
                tuple(
                    ClaimedDevice(r.driver_name, r.pool_name, r.device_name)
                    for claim in container.dynamic_resources
                    for r in claim.claim_resources
                ),
            )
            for pod in listed.pod_resources
            for container in pod.containers
        ]
        held = (device_id for c in containers for device_id in c.device_ids)
        claims = (device for c in containers for device in c.claims)
        pods = (PodRef(pod.namespace, pod.name) for pod in listed.pod_resources)
        cpus = (
            cpu
            for pod in listed.pod_resources
            for container in pod.containers
            for cpu in container.cpu_ids
        )
        view = allocation_view(
            topology, offered, held, pods, cpus, claims=claims, dra=self.dra, containers=containers
        )
        self._note(view)
        return view

    # --- logs, once per change -------------------------------------------------------------------

    def _note(self, view: AllocationView) -> None:
        examples, unhealthy = view.unknown_examples, view.unhealthy
        if self._last_sources.changed(view.sources):
            # DRA alone: the kubelet offers no managed device, so no device plugin runs here.
            log.info("podresources_counting", sources=list(view.sources))
        if self._last_unknown.changed(examples) and view.unknown_ids:
            log.warning(
                "podresources_unknown_devices",
                count=view.unknown_ids,
                examples=list(examples),
                hint="these IDs match no GPU UUID or MIG UUID of the topology, nor these DRA "
                "devices a GPU minor of this node's pool; no GPU changed",
            )
        if self._last_unhealthy.changed(unhealthy) and unhealthy:
            log.warning(
                "podresources_gpus_not_offered",
                gpus=list(unhealthy),
                hint="unhealthy, or not advertised under a managed resource name: not free",
            )

    def _failed(self, error: PodResourcesError) -> None:
        if self._last_failure.changed(error.reason):
            log.warning(
                "podresources_read_failed",
                reason=error.reason,
                method=error.method,
                error=str(error),
            )


def _rpc_error(method: str, error: grpc.RpcError, socket: Path) -> PodResourcesError:
    """One clear error for a failed call, with its reason."""
    code = error.code() if isinstance(error, grpc.Call) else None
    detail = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    detail = " ".join(detail.split())[:_MAX_DETAIL]
    name = code.name if code is not None else "UNKNOWN"
    where = f"PodResources {method} on {socket} failed ({name}: {detail})"
    if code is grpc.StatusCode.UNAVAILABLE:
        return PodResourcesError(
            f"{where}: the kubelet is not answering (restarting?); the next read reconnects",
            reason="unavailable",
            method=method,
        )
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError(f"{where}: no answer in time", reason="timeout", method=method)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" in detail:
            return PodResourcesError(
                f"{where}: the answer exceeds the message limit", reason="too_large", method=method
            )
        return PodResourcesError(
            f"{where}: over the kubelet's rate limit (100 per second)",
            reason="throttled",
            method=method,
        )
    hint = ""
    if code is grpc.StatusCode.UNIMPLEMENTED or "disabled" in detail:
        hint = ": GetAllocatableResources needs Kubernetes 1.23 or later (GA in 1.28)"
    return PodResourcesError(f"{where}{hint}", reason="refused", method=method)
