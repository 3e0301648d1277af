"""`run --availability` against the real kube-apiserver, through each API client: the Node carries
the availability annotation and its two labels, changes them when the allocation does, and loses
them when the agent runs with availability off."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from reporter.collect import build_scanner
from reporter.collect.podresources import PodResourcesReader
from reporter.free_sets import compute_availability
from reporter.schema.availability import decode_availability, encode_availability
from tests.cli.test_run import CLI, env
from tests.collect.test_podresources import GPU
from tests.collect.test_podresources_kubelet import (  # noqa: F401  # the kubelet fixture
    KubeletPodResources,
    converge,
    kubelet,
)
from tests.support.controlplane_fixtures import NodeFactory, RealApiServer
from tests.support.podresources_double import devices_state, pod_state

pytestmark = pytest.mark.controlplane

PREFIX = "gpu.topology.io"
AVAILABILITY = f"{PREFIX}/availability"
FREE = f"{PREFIX}/gpu-free"
NVLINK_MAX = f"{PREFIX}/gpu-free-nvlink-max"
SHARED = "nvidia.com/gpu.shared"


def run_agent(kubeconfig: str, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*CLI, "run", "--simulate", "dgx-h100", "--once", "--listen", "", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(KUBECONFIG=kubeconfig, NODE_NAME=node, TOPO_REPORTER_LOG_FORMAT="json"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def api_client(result: subprocess.CompletedProcess[str]) -> str:
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (line,) = [e for e in events if e["event"] == "api_client"]
    return str(line["api_client"])


def metadata(server: RealApiServer, node: str) -> tuple[dict[str, str], dict[str, str]]:
    meta = server.core().read_node(node).metadata
    return dict(meta.labels or {}), dict(meta.annotations or {})


@pytest.mark.parametrize("client", ["lean", "official"])
def test_availability_lands_changes_and_goes_on_the_real_node(
    real_apiserver: RealApiServer, real_node_factory: NodeFactory, client: str
) -> None:
    node = real_node_factory(labels={"team": "ml"})
    admin = str(real_apiserver.kubeconfig)
    # A list of kubeconfigs to merge is served by the official client only.
    kubeconfig = admin if client == "lean" else os.pathsep.join([admin, admin])
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None

    first = run_agent(kubeconfig, node, "--availability", "--simulate-used", "0,1")
    assert api_client(first) == client
    labels, annotations = metadata(real_apiserver, node)
    assert decode_availability(annotations[AVAILABILITY]) == compute_availability(
        scan.topology, range(2, 8)
    )
    assert (labels[FREE], labels[NVLINK_MAX]) == ("6", "6")
    assert labels[f"{PREFIX}/count"] == "8"
    assert "gpu-free" not in annotations[f"{PREFIX}/owned"].split(",")

    run_agent(kubeconfig, node, "--availability", "--simulate-used", "0,1,2,3,4,5,6")
    labels, annotations = metadata(real_apiserver, node)
    assert (labels[FREE], labels[NVLINK_MAX]) == ("1", "0")
    assert annotations[AVAILABILITY].startswith("3;7;")

    run_agent(kubeconfig, node)
    labels, annotations = metadata(real_apiserver, node)
    assert FREE not in labels
    assert NVLINK_MAX not in labels
    assert AVAILABILITY not in annotations
    assert labels["team"] == "ml"
    assert labels[f"{PREFIX}/count"] == "8"


def test_the_kubelets_own_podresources_server_decides_what_lands_on_the_node(
    real_apiserver: RealApiServer,
    real_node_factory: NodeFactory,
    kubelet: KubeletPodResources,  # noqa: F811  # the fixture imported above
) -> None:
    """The whole path: the kubelet's PodResources server code, the reader, the loop, the sink."""
    node = real_node_factory()
    scan = build_scanner("auto", Path("/sys"), "dgx-h100").scan()
    assert scan.topology is not None
    ids = [g.uuid for g in scan.topology.gpus if g.uuid is not None]
    replicas = [f"{ids[3]}::{r}" for r in range(2)]
    kubelet.write(
        {
            "devices": devices_state(GPU, ids[:3] + ids[4:]) + devices_state(SHARED, replicas),
            "pods": [
                pod_state("train", GPU, [ids[0], ids[5]], namespace="ml"),
                pod_state("notebook", SHARED, [replicas[1]]),
            ],
        }
    )
    with PodResourcesReader(kubelet.socket) as reader:
        converge(lambda: reader.allocated(scan.topology), lambda v: bool(v.allocated))
    run_agent(
        str(real_apiserver.kubeconfig),
        node,
        "--availability",
        "--pod-resources-socket",
        str(kubelet.socket),
    )
    labels, annotations = metadata(real_apiserver, node)
    # GPU 0 and 5 whole, GPU 3 by one replica: five free.
    free = [1, 2, 4, 6, 7]
    assert decode_availability(annotations[AVAILABILITY]).free == tuple(free)
    assert annotations[AVAILABILITY] == encode_availability(
        compute_availability(scan.topology, free)
    )
    assert labels[FREE] == "5"
