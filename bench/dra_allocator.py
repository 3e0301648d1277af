"""What kube-scheduler's DRA allocator does alone (issue 30, item 2): the share of plain claims for
2 and 4 GPUs that get an NVLink-connected set, on five wirings, with random GPUs already held.

Method. The real kube-apiserver and kube-scheduler of the tests (tests/controlplane, default
plugins, DRA on); per wiring and size, `--claims` trials at once, each one Node with its
ResourceSlice shaped as NVIDIA's driver publishes it (held GPUs left out) and one plain claim of
k GPUs with a pod pinned to the node (tests/dra_allocator.py). Every allocation is read back and
judged: connected (every pair NVLink-joined), and whether the node had a connected set free at
all. The trials are drawn from `--seed`.

    python bench/dra_allocator.py [--claims 200] [--seed 30]
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
from tests import dra_allocator as alloc
from tests.controlplane_fixtures import (
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    quiet_logs()
    binary = build_harness()
    with tempfile.TemporaryDirectory(prefix="dra-allocator-") as tmp:
        work = Path(tmp)
        with running_apiserver(binary, work) as server:
            scheduler = alloc.start_scheduler(binary, server.kubeconfig, work, "alloc")
            try:
                rows = run(server, work, args.claims, args.seed)
            finally:
                stop_process(scheduler)
    print(HEADER)
    print("\n".join(rows))


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


if __name__ == "__main__":
    main()
