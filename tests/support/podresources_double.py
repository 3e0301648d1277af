"""A test double of the kubelet's PodResources v1 server, for the faults the real one cannot show.

It serves on a unix socket from a state in the same JSON shape as the Go harness's
`podresources --state FILE` (see HELPERS.md), so one test can run against either:

    {"devices": [{"resource": "nvidia.com/gpu", "id": "GPU-…", "numa": [0], "healthy": true}],
     "pods": [{"namespace": "ns", "name": "p", "containers": [
         {"name": "c", "devices": [{"resource": "nvidia.com/gpu", "ids": ["GPU-…"]}]}]}]}

A container may also name `"cpus": [2, 3]`, its exclusive CPUs (the harness serves none: it has no
CPU manager), and `"claims"`, its ResourceClaims with the devices DRA drivers prepared for them, as
both serve them (`claim_state`):

    "claims": [{"namespace": "ns", "name": "claim", "devices": [{"driver": "gpu.nvidia.com",
        "pool": "node-1", "device": "gpu-0", "cdi": ["k8s.gpu.nvidia.com/device=gpu-0"]}]}]
 Like the kubelet, GetAllocatableResources answers only healthy devices, one entry
per device.
Faults: `fail[method] = StatusCode` aborts that method; `hang` holds methods until `stop()`;
`padding` pads List with a pod of that many bytes of names, for the message size limit.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from reporter.collect.podresources_v1 import api_pb2, api_pb2_grpc

State = dict[str, Any]
# Bounds the hang fault: a handler never outlives a test by more than this.
_HANG_LIMIT_S = 30.0


def devices_state(
    resource: str, ids: list[str], *, unhealthy: tuple[str, ...] = (), numa: int | None = 0
) -> list[dict[str, Any]]:
    """The `devices` entries of a state: one per ID, healthy unless listed."""
    return [
        {
            "resource": resource,
            "id": i,
            "numa": [] if numa is None else [numa],
            "healthy": i not in unhealthy,
        }
        for i in ids
    ]


def pod_state(name: str, resource: str, ids: list[str], namespace: str = "default") -> State:
    """One pod with one container holding `ids` of `resource`."""
    return {
        "namespace": namespace,
        "name": name,
        "containers": [{"name": "main", "devices": [{"resource": resource, "ids": ids}]}],
    }


def claim_state(
    name: str,
    devices: list[str],
    pool: str,
    driver: str = "gpu.nvidia.com",
    namespace: str = "default",
) -> State:
    """One ResourceClaim holding `devices` of `driver` in `pool`, each with its CDI device."""
    return {
        "namespace": namespace,
        "name": name,
        "devices": [
            {"driver": driver, "pool": pool, "device": d, "cdi": [f"k8s.{driver}/device={d}"]}
            for d in devices
        ],
    }


def claim_pod_state(name: str, claims: list[State], namespace: str = "default") -> State:
    """One pod with one container holding `claims` (and no device plugin device)."""
    return {
        "namespace": namespace,
        "name": name,
        "containers": [{"name": "main", "devices": [], "claims": claims}],
    }


def _dynamic_resources(claims: list[State]) -> list[api_pb2.DynamicResource]:
    return [
        api_pb2.DynamicResource(
            claim_name=c["name"],
            claim_namespace=c["namespace"],
            claim_resources=[
                api_pb2.ClaimResource(
                    cdi_devices=[api_pb2.CDIDevice(name=n) for n in d.get("cdi", [])],
                    driver_name=d["driver"],
                    pool_name=d["pool"],
                    device_name=d["device"],
                )
                for d in c.get("devices", [])
            ],
        )
        for c in claims
    ]


def _topology(numa: list[int]) -> api_pb2.TopologyInfo | None:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa]) if numa else None


@dataclass
class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    double: PodResourcesDouble
    calls: list[str] = field(default_factory=list)

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        self.calls.append(method)
        if method in self.double.hang:
            self.double.released.wait(_HANG_LIMIT_S)
        code = self.double.fail.get(method)
        if code is not None:
            context.abort(code, f"{method} refused by the test double")

    def GetAllocatableResources(  # noqa: N802 (the service's name)
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        self._enter("GetAllocatableResources", context)
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(
                    resource_name=d["resource"],
                    device_ids=[d["id"]],
                    topology=_topology(d.get("numa", [])),
                )
                for d in self.double.state.get("devices", [])
                if d.get("healthy", True)
            ]
        )

    def List(  # noqa: N802 (the service's name)
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self._enter("List", context)
        pods = [
            api_pb2.PodResources(
                name=p["name"],
                namespace=p["namespace"],
                containers=[
                    api_pb2.ContainerResources(
                        name=c["name"],
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name=d["resource"], device_ids=d["ids"]
                            )
                            for d in c.get("devices", [])
                        ],
                        cpu_ids=c.get("cpus", []),
                        dynamic_resources=_dynamic_resources(c.get("claims", [])),
                    )
                    for c in p.get("containers", [])
                ],
            )
            for p in self.double.state.get("pods", [])
        ]
        if self.double.padding:
            pods.append(api_pb2.PodResources(name="x" * self.double.padding, namespace="pad"))
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)


class PodResourcesDouble:
    """A PodResources server double on `socket`: `start()`, `stop()`, as a kubelet restarts."""

    def __init__(self, socket: Path, state: State | None = None) -> None:
        self.socket = socket
        self.state: State = state if state is not None else {"devices": [], "pods": []}
        self.fail: dict[str, grpc.StatusCode] = {}
        self.hang: set[str] = set()
        self.padding = 0
        self.released = threading.Event()
        self.servicer = _Servicer(self)
        self._server: grpc.Server | None = None

    def start(self) -> PodResourcesDouble:
        self.released.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket, as a kubelet does when it goes down."""
        self.released.set()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if os.path.lexists(self.socket):
            self.socket.unlink()

    def __enter__(self) -> PodResourcesDouble:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
