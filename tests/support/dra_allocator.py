"""What kube-scheduler's DRA allocator does alone: plain ResourceClaims for k GPUs on Nodes whose
ResourceSlices are shaped as NVIDIA's `gpu.nvidia.com` driver publishes them (issue 30, item 2).

Each trial is one Node of a simulated machine with some GPUs already held, its ResourceSlice
(devices `gpu-<minor>` in minor order, pool named after the node,
`tests.support.dra_cel.nvidia_attributes`) and one claim of `ExactCount` k with a pod pinned to the
node. Held GPUs are left out of the slice: the allocator skips an allocated device exactly as it
skips a missing one, and keeps the others' order. A batch of trials runs at once (one node each), so
200 claims cost one scheduling burst. Used by tests/controlplane/test_dra_allocator.py and
bench/dra_allocator.py.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from reporter.placement import pair_link
from reporter.schema import dra, dra_template
from reporter.schema.model import Topology
from tests.controlplane.test_dra import claim_pod
from tests.controlplane.test_scheduler import simulated
from tests.support.controlplane_fixtures import SCHEDULER_FEATURE_GATES, start_harness
from tests.support.dra_cel import nvidia_attributes

GROUP = "resource.k8s.io"
API = "v1"
DEVICE_CLASS = "gpu.nvidia.com"
DEVICE_CLASS_SELECTOR = (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
)
WIRINGS = (
    "pcie-8x-nvlink-pairs",
    "workstation-nvlink-bridge",
    "dgx-1-v100",
    "pcie-8x",
    "dgx-h100",
)
"""NVLink pairs (dra-driver-nvidia-gpu#214), an NVLink bridge, the hybrid cube mesh (an island that
is not a clique), PCIe only, NVSwitch."""
SIZES = (2, 4)
REASON = "cannot allocate all claims"
"""The DRA plugin's message for every allocation that fails (tests/controlplane/test_dra.py)."""


@cache
def topology(profile: str) -> Topology:
    return simulated(profile)


def sizes(profile: str) -> tuple[int, ...]:
    """The claim sizes the machine can serve at all (the bridge workstation has 3 GPUs)."""
    return tuple(k for k in SIZES if k <= len(topology(profile).gpus))


@dataclass(frozen=True, slots=True)
class Trial:
    profile: str
    k: int
    free: tuple[int, ...]
    """GPU indexes the node's slice publishes (the others are held)."""
    uuids: tuple[str, ...] | None = None
    """The GPUs' UUIDs in the slice, by index; None: the profile's."""


def trials(profile: str, k: int, count: int, seed: int) -> list[Trial]:
    """`count` trials of k GPUs: each holds a uniform number 0..n-k of GPUs, chosen uniformly."""
    rng = random.Random(f"{seed}:{profile}:{k}")
    gpus = [g.index for g in topology(profile).gpus]
    out = []
    for _ in range(count):
        held = set(rng.sample(gpus, rng.randint(0, len(gpus) - k)))
        out.append(Trial(profile, k, tuple(g for g in gpus if g not in held)))
    return out


def by_minor(profile: str, gpus: Sequence[int]) -> list[int]:
    """GPU indexes in the order NVIDIA's driver names them (`gpu-<minor>`)."""
    minors = {g.index: g.minor if g.minor is not None else g.index for g in topology(profile).gpus}
    return sorted(gpus, key=lambda g: minors[g])


def first_fit(trial: Trial) -> tuple[int, ...]:
    """The allocator's choice for a plain claim, as the test checks it: the first k devices of
    the slice, in its order."""
    return tuple(sorted(by_minor(trial.profile, trial.free)[: trial.k]))


def connected(profile: str, gpus: Sequence[int]) -> bool:
    """Every pair NVLink-joined."""
    t = topology(profile)
    return all(pair_link(t, a, b).is_nvlink for a, b in combinations(gpus, 2))


def connected_possible(trial: Trial) -> bool:
    """Whether some k of the free GPUs are a connected set."""
    return any(connected(trial.profile, s) for s in combinations(trial.free, trial.k))


def resource_slice(node: str, trial: Trial) -> dict[str, Any]:
    t = topology(trial.profile)
    gpus = {
        g.index: g if trial.uuids is None else replace(g, uuid=trial.uuids[g.index]) for g in t.gpus
    }
    devices = [
        {
            "name": dra.gpu_device(gpus[i].minor if gpus[i].minor is not None else i),
            "attributes": nvidia_attributes(gpus[i]),
        }
        for i in by_minor(trial.profile, trial.free)
    ]
    return {
        "apiVersion": f"{GROUP}/{API}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def plain_claim(name: str, trial: Trial) -> dict[str, Any]:
    """k GPUs of NVIDIA's class and nothing else: what a user writes without a template."""
    exactly = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": trial.k}
    return {
        "apiVersion": f"{GROUP}/{API}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


ClaimMaker = Callable[[str, Trial], dict[str, Any]]
"""A trial's ResourceClaim under a name."""


@cache
def template(profile: str, k: int, fallback: bool) -> dra_template.Template:
    """What `topo-reporter dra-template --gpus K --machine PROFILE [--fallback]` prints, for one
    machine kind; TemplateError where the wiring has no k connected GPUs (PCIe only)."""
    machine = dra_template.Machine(profile, (topology(profile),))
    return dra_template.build([machine], k, fallback=fallback)


def template_claim(fallback: bool) -> ClaimMaker:
    """The claim the resourceclaim controller makes from the template: its `spec.spec`."""

    def claim(name: str, trial: Trial) -> dict[str, Any]:
        spec = template(trial.profile, trial.k, fallback).document["spec"]["spec"]
        return {
            "apiVersion": f"{GROUP}/{API}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        }

    return claim


def start_scheduler(
    binary: Path, kubeconfig: Path, work: Path, name: str
) -> subprocess.Popen[bytes]:
    """A kube-scheduler of its own scheduler name with the default plugins (DRA included), its
    log in `work`."""
    config = work / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": name}],
            }
        )
    )
    args = ["scheduler", "--config", str(config), "--kubeconfig", str(kubeconfig)]
    return start_harness(binary, [*args, "--", SCHEDULER_FEATURE_GATES], work / "scheduler.log")


def ensure_device_class(api: k8s.CustomObjectsApi) -> None:
    """NVIDIA's DeviceClass for whole GPUs (its chart's), once for the whole run."""
    try:
        api.create_cluster_custom_object(
            GROUP,
            API,
            "deviceclasses",
            {
                "apiVersion": f"{GROUP}/{API}",
                "kind": "DeviceClass",
                "metadata": {"name": DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression": DEVICE_CLASS_SELECTOR}}]},
            },
        )
    except k8s.ApiException as e:
        if e.status != 409:
            raise


@dataclass(frozen=True, slots=True)
class Outcome:
    trial: Trial
    allocated: tuple[int, ...] | None
    """The GPU indexes the allocator gave the claim; None: the pod is unschedulable."""
    reason: str = ""
    """The scheduler's message on an unschedulable pod."""


def stage(
    api: k8s.CustomObjectsApi,
    namespace: str,
    node: str,
    trial: Trial,
    name: str,
    claim: ClaimMaker,
) -> str:
    """The trial's slice on `node` and its claim `name`, created: the slice's name."""
    body = resource_slice(node, trial)
    api.create_cluster_custom_object(GROUP, API, "resourceslices", body)
    api.create_namespaced_custom_object(GROUP, API, namespace, "resourceclaims", claim(name, trial))
    return str(body["metadata"]["name"])


def allocate(
    api: k8s.CustomObjectsApi,
    core: k8s.CoreV1Api,
    *,
    namespace: str,
    scheduler: str,
    make_node: Callable[[], str],
    batch: Sequence[Trial],
    wait_s: float,
    logs: Callable[[], str],
    claim: ClaimMaker = plain_claim,
    may_wait: Callable[[Trial], bool] = lambda _: False,
) -> list[Outcome]:
    """Run `batch` at once: a Node, its slice, a claim and a pod per trial; each claim's
    allocation read back as GPU indexes. A trial `may_wait` says its claim cannot be met ends
    instead when the scheduler finds the pod unschedulable for the claim (REASON): a first
    attempt may come before the scheduler has seen the new Node or slice, and says otherwise.
    Slices are deleted afterwards (Nodes by `make_node`'s owner); claims and pods stay in
    `namespace`."""
    names = []
    slices = []
    for i, trial in enumerate(batch):
        name = f"c{i}"
        node = make_node()
        slices.append(stage(api, namespace, node, trial, name, claim))
        core.create_namespaced_pod(namespace, claim_pod(name, name, node=node, scheduler=scheduler))
        names.append(name)
    deadline = time.monotonic() + wait_s
    outcomes: dict[str, Outcome] = {}
    try:
        while len(outcomes) < len(names):
            for name, trial in zip(names, batch, strict=True):
                if name in outcomes:
                    continue
                claim = api.get_namespaced_custom_object(
                    GROUP, API, namespace, "resourceclaims", name
                )
                results = ((claim.get("status") or {}).get("allocation") or {}).get(
                    "devices", {}
                ).get("results") or []
                if results:
                    outcomes[name] = Outcome(trial, _indexes(trial.profile, results))
                elif may_wait(trial) and REASON in (reason := unschedulable(core, namespace, name)):
                    outcomes[name] = Outcome(trial, None, reason)
            assert time.monotonic() < deadline, (
                f"{len(names) - len(outcomes)} of {len(names)} claims never allocated\n{logs()}"
            )
            if len(outcomes) < len(names):
                time.sleep(0.2)
    finally:
        for name in slices:
            try:
                api.delete_cluster_custom_object(GROUP, API, "resourceslices", name)
            except k8s.ApiException as e:
                if e.status != 404:
                    raise
    return [outcomes[n] for n in names]


def unschedulable(core: k8s.CoreV1Api, namespace: str, pod: str) -> str:
    """The scheduler's message where it last marked the pod unschedulable, else ""."""
    status = core.read_namespaced_pod_status(pod, namespace).status
    for condition in (status.conditions if status else None) or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return str(condition.message or "")
    return ""


def _indexes(profile: str, results: list[dict[str, Any]]) -> tuple[int, ...]:
    by_device = {
        dra.gpu_device(g.minor if g.minor is not None else g.index): g.index
        for g in topology(profile).gpus
    }
    return tuple(sorted(by_device[r["device"]] for r in results))


@dataclass(frozen=True, slots=True)
class Share:
    profile: str
    k: int
    claims: int
    possible: int
    """Claims whose node had a connected set of k free."""
    connected: int
    """Claims the allocator gave a connected set."""

    @property
    def text(self) -> str:
        of_possible = f"{self.connected / self.possible:.0%}" if self.possible else "n/a"
        return (
            f"| {self.profile} | {self.k} | {self.claims} | {self.possible} | "
            f"{self.connected} | {of_possible} |"
        )


def share(outcomes: Sequence[Outcome]) -> Share:
    first = outcomes[0].trial
    return Share(
        first.profile,
        first.k,
        len(outcomes),
        sum(connected_possible(o.trial) for o in outcomes),
        sum(o.allocated is not None and connected(o.trial.profile, o.allocated) for o in outcomes),
    )


def latencies(
    api: k8s.CustomObjectsApi,
    core: k8s.CoreV1Api,
    *,
    namespace: str,
    scheduler: str,
    make_node: Callable[[], str],
    batch: Sequence[Trial],
    claim: ClaimMaker,
    wait_s: float,
) -> list[float]:
    """Seconds from each pod's creation until its claim shows the allocation, one trial at a
    time (so that no pod waits behind another): the node, its slice and the claim are in place
    first. Every trial must be one its claim can meet."""
    out = []
    for i, trial in enumerate(batch):
        name = f"l{i}"
        node = make_node()
        made = stage(api, namespace, node, trial, name, claim)
        started = time.monotonic()
        core.create_namespaced_pod(namespace, claim_pod(name, name, node=node, scheduler=scheduler))
        while True:
            got = api.get_namespaced_custom_object(GROUP, API, namespace, "resourceclaims", name)
            if (got.get("status") or {}).get("allocation"):
                out.append(time.monotonic() - started)
                break
            assert time.monotonic() - started < wait_s, f"claim {name} not allocated: {trial}"
            time.sleep(0.002)
        api.delete_cluster_custom_object(GROUP, API, "resourceslices", made)
    return out
