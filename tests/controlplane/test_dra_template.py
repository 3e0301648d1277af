"""`topo-reporter dra-template` reading the wiring from the Nodes of the real kube-apiserver.

What is tested here is the reading (the template's claims on the real scheduler:
tests/controlplane/test_dra_connected.py, and here the one repro of issue 41 that needs it): the
Nodes' published topology annotations (decoded by reporter/schema/codec.py through the official
client the doctor uses), nodes of one wiring taken as one kind, the GPUs of nodes that share GPU
product and PCI bus IDs with more nodes wired otherwise kept out by their UUIDs, `--selector` and
`--exclude`, and the ResourceSlices of NVIDIA's driver giving the UUIDs of nodes without a
readable topology. Each test's Nodes carry a prefix of their own, so nodes other tests publish are
not read; the slices other tests leave are, as the command reads them.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from bench.dra_template import nvlinks_down
from reporter.collect import build_scanner
from reporter.schema import dra_template, keys
from reporter.schema.codec import encode
from reporter.schema.dra_template import Machine
from reporter.schema.model import Topology
from tests.cli.test_dra_template import SHIPPED
from tests.cli.test_run import CLI, env
from tests.controlplane.test_dra_allocator import (  # noqa: F401  # the scheduler fixture
    logs_of,
    scheduler,
)
from tests.controlplane.test_scheduler import WAIT_S
from tests.support import dra_allocator as alloc
from tests.support.controlplane_fixtures import RealApiServer, unique
from tests.support.dra_cel import evaluate, nvidia_attributes

pytestmark = pytest.mark.controlplane

Make = Callable[..., str]


def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None
    return topology


def own_uuids(topology: Topology, *, published: bool = True) -> Topology:
    """The machine as one node of its kind: UUIDs of its own (or none published)."""
    return replace(
        topology,
        gpus=tuple(
            replace(g, uuid=f"GPU-{uuid.uuid4()}" if published else None) for g in topology.gpus
        ),
    )


def crossed(tmp_path: Path) -> Topology:
    """pcie-8x-nvlink-pairs with its bridges moved: same products, same bus IDs, other pairs."""
    data = yaml.safe_load((SHIPPED / "pcie-8x-nvlink-pairs.yaml").read_text(encoding="utf-8"))
    data["nvlink"] = [{"gpus": p, "links": 12} for p in ([0, 2], [1, 3], [4, 6], [5, 7])]
    path = tmp_path / "crossed.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return scanned(str(path))


def publish(make: Make, prefix: str, topologies: Sequence[Topology]) -> list[str]:
    return [
        make(annotations={keys.key(prefix, keys.TOPOLOGY): encode(t)}, name=unique("gpu"))
        for t in topologies
    ]


def dra_template_cli(
    server: RealApiServer, prefix: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "dra-template", "--gpus", "2", "--kubeconfig", str(server.kubeconfig),
         "--prefix", prefix, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        check=False,
    )  # fmt: skip


@pytest.fixture
def prefix() -> str:
    return f"{unique('t')}.example.com"


def test_the_template_is_the_one_the_nodes_published_wiring_gives(
    real_apiserver: RealApiServer,
    real_node_factory: Make,
    prefix: str,
    tmp_path: Path,
    dracel_bin: Path,
) -> None:
    pairs = [own_uuids(scanned("pcie-8x-nvlink-pairs")) for _ in range(2)]
    other = own_uuids(crossed(tmp_path))
    h100 = own_uuids(scanned("dgx-h100"))
    names = publish(real_node_factory, prefix, [*pairs, other, h100])
    real_node_factory(name=unique("cpu"))  # no GPU, no annotation: not a machine of the template
    broken = real_node_factory(
        annotations={keys.key(prefix, keys.TOPOLOGY): '{"v":2}'}, name=unique("broken")
    )

    done = dra_template_cli(real_apiserver, prefix)

    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"topo-reporter: warning: left out: node {broken}")
    assert done.stderr.count("\n") == 1
    template = yaml.safe_load(done.stdout)
    by_node = dict(zip(names, [*pairs, other, h100], strict=True))
    pair_nodes = sorted(names[:2])
    kinds = [(pair_nodes[0], pair_nodes), (names[2], [names[2]]), (names[3], [names[3]])]
    want = dra_template.build(
        [
            Machine(
                n + (f" (+{len(alike) - 1} alike)" if len(alike) > 1 else ""),
                tuple(by_node[a] for a in alike),
                tuple(alike),
            )
            for n, alike in sorted(kinds)
        ],
        2,
        prefix=prefix,
        uuids_known=True,
        left_out=foreign_slices(real_apiserver, names),
    )
    assert template == want.document
    assert "# No clique, by GPU UUID (wired otherwise at the same PCI bus IDs): " in done.stdout
    # The crossed node is outnumbered: its 8 GPUs go by UUID to no clique; the rest keep bus keys.
    assert names[2] in want.keyed_out
    assert all(want.values[f"uuid:{g.uuid}"] == () for g in other.gpus)
    # And Kubernetes' own CEL gives each node's GPUs exactly their pairs, the crossed one none.
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    (derived,) = request["exactly"]["derivedAttributes"]
    read = dra_template.clique_map(derived["expression"])
    assert read is not None
    devices: list[tuple[dict[str, Any], list[str]]] = []
    pairs_of: dict[str, list[set[int]]] = {}
    for name, topology in by_node.items():
        ids = [list(i) for i in dra_template.gpu_ids(topology, read)]
        devices += [(nvidia_attributes(g), i) for g, i in zip(topology.gpus, ids, strict=True)]
        shared = {c for i in ids for c in i}
        held = [{n for n, i in enumerate(ids) if c in i} for c in shared]
        pairs_of[name] = sorted(held, key=min)
    evaluation = evaluate(dracel_bin, derived["expression"], devices)
    assert evaluation.outcomes == [(True, None)] * len(devices)
    assert pairs_of[names[0]] == pairs_of[names[1]] == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert pairs_of[names[2]] == []
    assert pairs_of[names[3]] == [set(range(8))]


def foreign_slices(server: RealApiServer, names: Sequence[str]) -> list[dra_template.LeftOut]:
    """The GPUs other tests' ResourceSlices hold on nodes not `names`: the command keeps those
    from cliques not theirs too, so the template expected must know them."""
    listed: Any = k8s.CustomObjectsApi(server.api()).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices"
    )
    items = listed["items"]
    return [
        dra_template.LeftOut(n, devices=tuple(d))
        for n, d in dra_template.slice_devices(items).items()
        if n not in names
    ]


def test_a_node_without_uuids_outnumbered_at_its_keys_loses_them_with_one_warning(
    real_apiserver: RealApiServer, real_node_factory: Make, prefix: str, tmp_path: Path
) -> None:
    pairs = [own_uuids(scanned("pcie-8x-nvlink-pairs")) for _ in range(2)]
    _, _, nameless, _ = publish(
        real_node_factory,
        prefix,
        [*pairs, own_uuids(crossed(tmp_path), published=False), own_uuids(scanned("dgx-h100"))],
    )

    done = dra_template_cli(real_apiserver, prefix)

    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("topo-reporter: warning: no clique on any node for 8 GPU product and")
    assert line.endswith(
        f"and 5 more): {nameless} is wired otherwise there and published no GPU UUID to keep "
        "apart by"
    )
    (request,) = yaml.safe_load(done.stdout)["spec"]["spec"]["devices"]["requests"]
    read = dra_template.clique_map(request["exactly"]["derivedAttributes"][0]["expression"])
    assert read is not None
    assert not any(k[1] == "NVIDIA H100 NVL" for k in read)  # the pairs' keys are gone
    assert sum(k[0] == "bus" for k in read) == 8  # the H100s keep theirs


def nvidia_slice(node: str, topology: Topology) -> dict[str, Any]:
    """The node's GPUs in a ResourceSlice as NVIDIA's driver publishes them."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{g.index}", "attributes": nvidia_attributes(g)}
                for g in topology.gpus
            ],
        },
    }


@pytest.fixture
def slices(real_apiserver: RealApiServer) -> Iterator[Callable[[str, Topology], None]]:
    """Creates ResourceSlices of NVIDIA's driver; deletes them after the test."""
    api = k8s.CustomObjectsApi(real_apiserver.api())
    made: list[str] = []

    def create(node: str, topology: Topology) -> None:
        body = nvidia_slice(node, topology)
        api.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
        made.append(body["metadata"]["name"])

    yield create
    for name in made:
        with contextlib.suppress(k8s.ApiException):
            api.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)


def test_nodes_left_out_or_unreadable_are_kept_from_the_cliques_by_their_slices_uuids(
    real_apiserver: RealApiServer,
    real_node_factory: Make,
    prefix: str,
    slices: Callable[[str, Topology], None],
) -> None:
    h100 = scanned("dgx-h100")
    healthy = [own_uuids(h100) for _ in range(2)]
    annotation = keys.key(prefix, keys.TOPOLOGY)
    pool = {f"{prefix}/pool": "a"}
    kept, excluded = (
        real_node_factory(annotations={annotation: encode(t)}, labels=pool, name=unique("gpu"))
        for t in healthy
    )
    outside = real_node_factory(
        annotations={annotation: encode(own_uuids(nvlinks_down(h100)))}, name=unique("down")
    )
    broken = real_node_factory(annotations={annotation: '{"v":2}'}, name=unique("broken"))
    bare = real_node_factory(name=unique("bare"))  # no agent, but NVIDIA's driver
    in_slices = {node: own_uuids(h100) for node in (outside, broken, bare)}
    for node, topology in in_slices.items():
        slices(node, topology)  # the driver's UUIDs, not the annotation's, are the ones CEL reads

    done = dra_template_cli(
        real_apiserver, prefix, "--selector", f"{prefix}/pool=a", "--exclude", excluded
    )

    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"topo-reporter: warning: left out: node {broken}: ")
    template = yaml.safe_load(done.stdout)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    read = dra_template.clique_map(request["exactly"]["derivedAttributes"][0]["expression"])
    assert read is not None
    uuids = {k[1] for k, v in read.items() if k[0] == "uuid" and v == ()}
    for topology in in_slices.values():
        assert {g.uuid for g in topology.gpus} <= uuids
    # The excluded node is wired as the map says: its cliques are right, no UUID needed.
    assert not {g.uuid for g in healthy[1].gpus} & uuids
    assert template["metadata"]["annotations"][f"{prefix}/dra-template-selection"] == (
        f"--selector {prefix}/pool=a --exclude {excluded}"
    )
    assert f"# Cliques of: {kept}.\n" in done.stdout


def test_no_published_node_is_one_line_and_exit_1(
    real_apiserver: RealApiServer, prefix: str
) -> None:
    """The cluster cannot give the template, however it was asked for: a failure, not usage."""
    done = dra_template_cli(real_apiserver, prefix)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"topo-reporter: error: no Node publishes a {prefix}/topology annotation: run the agent "
        "on the GPU nodes first, or pass --machine PROFILE\n"
    )


def test_a_claim_for_2_connected_gpus_never_gets_the_down_nodes_gpus(
    real_apiserver: RealApiServer,
    real_namespace: str,
    real_node_factory: Make,
    scheduler: str,  # noqa: F811  # the fixture imported above
    prefix: str,
    tmp_path: Path,
) -> None:
    """Issue 41 on the real kube-scheduler 1.37.2: a template made over two DGX H100 nodes, the
    second's fabric manager stopped (every pair SYS). Its 28 pairs no longer share a clique: a
    claim pinned to it stays Pending with the scheduler's reason, one pinned to the first gets 2
    connected GPUs."""
    h100 = alloc.topology("dgx-h100")
    healthy, down = own_uuids(h100), own_uuids(nvlinks_down(h100))
    annotation = keys.key(prefix, keys.TOPOLOGY)
    nodes = [
        real_node_factory(ready=True, annotations={annotation: encode(t)}) for t in (healthy, down)
    ]
    done = dra_template_cli(real_apiserver, prefix, "--namespace", real_namespace)
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(done.stdout)["spec"]["spec"]
    api = k8s.CustomObjectsApi(real_apiserver.api())
    alloc.ensure_device_class(api)
    batch = [
        alloc.Trial("dgx-h100", 2, tuple(range(8)), tuple(str(g.uuid) for g in t.gpus))
        for t in (healthy, down)
    ]
    on = iter(nodes)

    first, second = alloc.allocate(
        api,
        real_apiserver.core(),
        namespace=real_namespace,
        scheduler=scheduler,
        make_node=lambda: next(on),
        batch=batch,
        wait_s=WAIT_S * 2,
        logs=logs_of(tmp_path),
        claim=lambda name, _: {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        },
        may_wait=lambda trial: trial == batch[1],
    )

    assert first.allocated is not None
    assert len(first.allocated) == 2, first
    assert second.allocated is None, second
    assert alloc.REASON in second.reason
