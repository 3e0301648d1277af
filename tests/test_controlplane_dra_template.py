"""`topo-reporter dra-template` reading the wiring from the Nodes of the real kube-apiserver.

What is tested here is the reading (the template's claims on the real scheduler:
tests/test_controlplane_dra_connected.py): the Nodes' published topology annotations (decoded by
reporter/schema/codec.py through the official client the doctor uses), nodes of one wiring taken
as one kind, and nodes that share GPU product and PCI bus IDs but are wired differently keyed by
their UUIDs. Each test's Nodes
carry a prefix of their own, so nodes other tests publish are not read.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from reporter.collect import build_scanner
from reporter.schema import dra_template, keys
from reporter.schema.codec import encode
from reporter.schema.dra_template import Machine
from reporter.schema.model import Topology
from tests.controlplane_fixtures import RealApiServer, unique
from tests.dra_cel import evaluate, nvidia_attributes
from tests.test_agent_cli import CLI, env
from tests.test_dra_template import SHIPPED

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
    kinds = [
        (pair_nodes[0], [by_node[n] for n in pair_nodes]),
        (names[2], [other]),
        (names[3], [h100]),
    ]
    want = dra_template.build(
        [
            Machine(n + (f" (+{len(t) - 1} alike)" if len(t) > 1 else ""), tuple(t))
            for n, t in sorted(kinds)
        ],
        2,
        prefix=prefix,
        uuids_known=True,
    )
    assert template == want.document
    assert "Keyed by GPU UUID" in done.stdout
    # The 24 GPUs whose bus keys collide go by UUID; the H100s keep their bus keys.
    assert sum(k.startswith("uuid:") for k in want.values) == 24
    # And Kubernetes' own CEL gives each node's GPUs exactly their pairs.
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    (derived,) = request["exactly"]["derivedAttributes"]
    devices: list[tuple[dict[str, Any], list[str]]] = []
    pairs_of: dict[str, list[set[int]]] = {}
    for name, topology in by_node.items():
        ids = [
            want.values.get(f"uuid:{g.uuid}") or want.values[f"bus:{g.model}/{g.pci}"]
            for g in topology.gpus
        ]
        devices += [
            (nvidia_attributes(g), list(i)) for g, i in zip(topology.gpus, ids, strict=True)
        ]
        shared = {c for i in ids for c in i}
        held = [{n for n, i in enumerate(ids) if c in i} for c in shared]
        pairs_of[name] = sorted(held, key=min)
    evaluation = evaluate(dracel_bin, derived["expression"], devices)
    assert evaluation.outcomes == [(True, None)] * len(devices)
    assert pairs_of[names[0]] == pairs_of[names[1]] == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert pairs_of[names[2]] == [{0, 2}, {1, 3}, {4, 6}, {5, 7}]
    assert pairs_of[names[3]] == [set(range(8))]


def test_colliding_nodes_without_uuids_are_refused_naming_them(
    real_apiserver: RealApiServer, real_node_factory: Make, prefix: str, tmp_path: Path
) -> None:
    first, second = publish(
        real_node_factory,
        prefix,
        [own_uuids(scanned("pcie-8x-nvlink-pairs")), own_uuids(crossed(tmp_path), published=False)],
    )

    done = dra_template_cli(real_apiserver, prefix)

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1
    assert f"{second} published no GPU UUIDs" in done.stderr
    assert first in done.stderr


def test_no_published_node_is_one_line_and_exit_2(
    real_apiserver: RealApiServer, prefix: str
) -> None:
    done = dra_template_cli(real_apiserver, prefix)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"topo-reporter: error: no Node publishes a {prefix}/topology annotation: run the agent "
        "on the GPU nodes first, or pass --simulate PROFILE\n"
    )
