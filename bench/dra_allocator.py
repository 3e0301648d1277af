"""What kube-scheduler's DRA allocator does alone (issue 30, item 2): the share of plain claims for
2 and 4 GPUs that get an NVLink-connected set, on five wirings, with random GPUs already held; and
what it does with claims from `topo-reporter dra-template` (item 4): the same trials with the
template's claim, without and with `--fallback`, and the scheduling latency per pod with and
without the template.

Method. The real kube-apiserver and kube-scheduler of the tests (tests/controlplane, default
plugins, DRA on); per wiring and size, `--claims` trials at once, each one Node with its
ResourceSlice shaped as NVIDIA's driver publishes it (held GPUs left out) and one plain claim of
k GPUs with a pod pinned to the node (tests/support/dra_allocator.py). Every allocation is read back
and judged: connected (every pair NVLink-joined), and whether the node had a connected set free at
all; a template claim that no connected set can meet must stay Pending with the scheduler's reason.
The trials are drawn from `--seed`. Latency: `--latency` pods one at a time (nothing queued behind
another), on trials with a connected set free, from the pod's create until its claim shows the
allocation (polled every 2 ms).

    python bench/dra_allocator.py [--claims 200] [--seed 30] [--latency 50]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client as k8s

from bench.common import quiet_logs
from reporter.schema import dra_template
from tests.support import dra_allocator as alloc
from tests.support.controlplane_fixtures import (
    RealApiServer,
    build_harness,
    create_node,
    running_apiserver,
    stop_process,
)

HEADER = (
    "| wiring | GPUs | claims | a connected set was free | got a connected set | "
    "share of those it could |\n|---|---|---|---|---|---|"
)


TEMPLATE_HEADER = (
    "| wiring | GPUs | claims | a connected set was free | template: connected | "
    "template: Pending with the reason | --fallback: connected | --fallback: placed |\n"
    "|---|---|---|---|---|---|---|---|"
)
LATENCY_HEADER = (
    "| wiring | GPUs | pods | plain p50 ms | plain p99 ms | template p50 ms | template p99 ms |\n"
    "|---|---|---|---|---|---|---|"
)
LATENCY_CASES = (("dgx-1-v100", 4), ("pcie-8x-nvlink-pairs", 2), ("dgx-h100", 4))
"""The cube mesh (the longest clique map), NVLink pairs, and NVSwitch."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--latency", type=int, default=50)
    args = parser.parse_args()
    quiet_logs()
    binary = build_harness()
    with tempfile.TemporaryDirectory(prefix="dra-allocator-") as tmp:
        work = Path(tmp)
        with running_apiserver(binary, work) as server:
            scheduler = alloc.start_scheduler(binary, server.kubeconfig, work, "alloc")
            try:
                rows = run(server, work, args.claims, args.seed)
                templated = run_template(server, work, args.claims, args.seed)
                timed = run_latency(server, work, args.latency, args.seed)
            finally:
                stop_process(scheduler)
    print(HEADER)
    print("\n".join(rows))
    print()
    print(TEMPLATE_HEADER)
    print("\n".join(templated))
    print()
    print(LATENCY_HEADER)
    print("\n".join(timed))


def run(server: RealApiServer, work: Path, claims: int, seed: int) -> list[str]:
    core = server.core()
    api = k8s.CustomObjectsApi(server.api())
    alloc.ensure_device_class(api)
    rows = []
    for profile in alloc.WIRINGS:
        for k in alloc.sizes(profile):
            namespace = f"alloc-{profile}-{k}"
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
            core.create_namespaced_service_account(
                namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
            )
            started = time.monotonic()
            outcomes = alloc.allocate(
                api,
                core,
                namespace=namespace,
                scheduler="alloc",
                make_node=lambda: create_node(core, ready=True),
                batch=alloc.trials(profile, k, claims, seed),
                wait_s=600.0,
                logs=lambda: (work / "scheduler.log").read_text(errors="replace")[-3000:],
            )
            wrong = [o for o in outcomes if o.allocated != alloc.first_fit(o.trial)]
            if wrong:
                raise SystemExit(f"not the first free devices: {wrong[:3]}")
            rows.append(alloc.share(outcomes).text)
            print(f"{rows[-1]}  ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return rows


def _namespace(core: k8s.CoreV1Api, name: str) -> str:
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    core.create_namespaced_service_account(
        name, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
    )
    return name


def run_template(server: RealApiServer, work: Path, claims: int, seed: int) -> list[str]:
    core = server.core()
    api = k8s.CustomObjectsApi(server.api())
    rows = []
    for profile in alloc.WIRINGS:
        for k in alloc.sizes(profile):
            try:
                alloc.template(profile, k, False)
            except dra_template.TemplateError:
                rows.append(
                    f"| {profile} | {k} | {claims} | - | refused: no {k} connected GPUs | | | |"
                )
                continue
            batch = alloc.trials(profile, k, claims, seed)
            got = {}
            for fallback in (False, True):
                namespace = _namespace(core, f"tmpl-{profile}-{k}-{'any' if fallback else 'only'}")
                started = time.monotonic()
                got[fallback] = alloc.allocate(
                    api,
                    core,
                    namespace=namespace,
                    scheduler="alloc",
                    make_node=lambda: create_node(core, ready=True),
                    batch=batch,
                    wait_s=600.0,
                    logs=lambda: (work / "scheduler.log").read_text(errors="replace")[-3000:],
                    claim=alloc.template_claim(fallback),
                    may_wait=lambda t, f=fallback: not f and not alloc.connected_possible(t),
                )
                print(f"{profile} {k} fallback={fallback}: {time.monotonic() - started:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
            only, anyway = got[False], got[True]
            possible = sum(alloc.connected_possible(o.trial) for o in only)
            wrong = [
                o
                for o in only
                if alloc.connected_possible(o.trial)
                != (o.allocated is not None and alloc.connected(profile, o.allocated))
                or (o.allocated is None and alloc.REASON not in o.reason)
            ]
            if wrong:
                raise SystemExit(f"the template missed: {wrong[:3]}")
            rows.append(
                f"| {profile} | {k} | {claims} | {possible} | "
                f"{sum(o.allocated is not None for o in only)} | "
                f"{sum(o.allocated is None for o in only)} | "
                f"{alloc.share(anyway).connected} | "
                f"{sum(o.allocated is not None for o in anyway)} |"
            )
    return rows


def _ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.0f}"


def run_latency(server: RealApiServer, work: Path, pods: int, seed: int) -> list[str]:
    core = server.core()
    api = k8s.CustomObjectsApi(server.api())
    rows = []
    for profile, k in LATENCY_CASES:
        batch = [t for t in alloc.trials(profile, k, pods * 4, seed) if alloc.connected_possible(t)]
        batch = batch[:pods]
        timed = {}
        for name, claim in (
            ("plain", alloc.plain_claim),
            ("template", alloc.template_claim(False)),
        ):
            timed[name] = alloc.latencies(
                api,
                core,
                namespace=_namespace(core, f"lat-{profile}-{k}-{name}"),
                scheduler="alloc",
                make_node=lambda: create_node(core, ready=True),
                batch=batch,
                claim=claim,
                wait_s=60.0,
            )
        plain, templated = timed["plain"], timed["template"]
        rows.append(
            f"| {profile} | {k} | {len(batch)} | {_ms(plain, 0.5)} | {_ms(plain, 0.99)} | "
            f"{_ms(templated, 0.5)} | {_ms(templated, 0.99)} |"
        )
    return rows


if __name__ == "__main__":
    main()
