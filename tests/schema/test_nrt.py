"""The NodeResourceTopology we build: zones, costs, attributes, the pods fingerprint, and the
upstream CRD's schema and podfingerprint's test vectors (both from the Go module cache)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import jsonschema
import pytest
import yaml

from parsers.errors import ParseError
from parsers.kubelet import KubeletPolicies
from parsers.sysfs import parse_node_memtotal
from reporter.collect.sysfs import numa_memory
from reporter.errors import InputError
from reporter.hostfs import MemoryHostFS
from reporter.schema.nrt import (
    NodeState,
    PodRef,
    node_resource_topology,
    pods_fingerprint,
)
from tests.support.agent_support import PREFIX, topology
from tests.support.controlplane_fixtures import (
    NRT_API_MODULE,
    NRT_API_VERSION,
    NRT_CRD,
    go_module_dir,
)

NRT_API = (NRT_API_MODULE, NRT_API_VERSION)
PODFINGERPRINT = ("github.com/k8stopologyawareschedwg/podfingerprint", "v0.2.2")
GIB = 1 << 30
MEMORY = {0: 256 * GIB, 1: 256 * GIB}
POLICIES = KubeletPolicies("single-numa-node", "container")


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((go_module_dir(*NRT_API) / NRT_CRD).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


PODS = (
    PodRef("ns1", "n1"),
    PodRef("ns1", "n2"),
    PodRef("ns2", "n1"),
    PodRef("ns3", "n1"),
    PodRef("ns3", "n2"),
)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        (PODS, "pfp0v001b92008c14168b3a6"),
        (tuple(reversed(PODS)), "pfp0v001b92008c14168b3a6"),
        (
            (
                PodRef("production", "jaeger-dpgjk"),
                PodRef("production", "nginx-rt684"),
                PodRef("production", "envoy-g9m22"),
            ),
            "pfp0v001607b76a0e9d3aeb4",
        ),
    ],
    ids=[
        "podfingerprint's tracing_test.go vector",
        "the order of the pods does not matter",
        "podfingerprint's compat-tiny-3pods-1ns vector",
    ],
)
def test_pods_fingerprint_matches_upstream_vectors(pods: tuple[PodRef, ...], expected: str) -> None:
    assert pods_fingerprint(pods) == expected


def test_pods_fingerprint_matches_the_upstream_259_pod_vector() -> None:
    data = json.loads((go_module_dir(*PODFINGERPRINT) / "testdata" / "pods.json").read_text())
    pods = [PodRef(p["namespace"], p["name"]) for p in data]
    assert len(pods) == 259
    # podfingerprint_test.go, "correct fingerprint": precomputed and validated upstream.
    assert pods_fingerprint(pods) == "pfp0v001e477a4e3b2fc0ec6"


def test_zones_carry_gpus_cpus_and_memory_per_numa_node_with_distances_as_costs() -> None:
    state = NodeState(pods=PODS, free_gpus=frozenset({0, 1, 5}), exclusive_cpus=frozenset({0, 1}))
    nrt = node_resource_topology(
        "dgx-01",
        topology(8, lost=(3,)),
        state,
        MEMORY,
        policies=KubeletPolicies("single-numa-node", "pod"),
        prefix=PREFIX,
        node_uid="uid-1",
    )
    assert nrt["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert nrt["kind"] == "NodeResourceTopology"
    assert nrt["metadata"] == {
        "name": "dgx-01",
        # The prefix's owner label says which install wrote it (prune judges by it).
        "labels": {"app.kubernetes.io/managed-by": "topo-reporter", f"{PREFIX}/node": "dgx-01"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "dgx-01", "uid": "uid-1"}],
    }
    zero, one = nrt["zones"]
    assert zero == {
        "name": "node-0",
        "type": "Node",
        "resources": [
            {"name": "cpu", "capacity": "48", "allocatable": "48", "available": "46"},
            {
                "name": "memory",
                "capacity": str(256 * GIB),
                "allocatable": str(256 * GIB),
                "available": str(256 * GIB),
            },
            # GPU 3 is lost: not allocatable; 0 and 1 are free on this NUMA node.
            {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "3", "available": "2"},
        ],
        "costs": [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}],
    }
    assert one["resources"][2] == {
        "name": "nvidia.com/gpu",
        "capacity": "4",
        "allocatable": "4",
        "available": "1",
    }
    assert one["costs"] == [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}]
    assert nrt["attributes"] == [
        {"name": "topologyManagerPolicy", "value": "single-numa-node"},
        {"name": "topologyManagerScope", "value": "pod"},
        {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v001b92008c14168b3a6"},
        {"name": "nodeTopologyPodsFingerprintMethod", "value": "all"},
    ]


def test_unknown_free_gpus_leave_every_allocatable_gpu_available() -> None:
    nrt = node_resource_topology(
        "n",
        topology(4),
        NodeState(pods=()),
        MEMORY,
        policies=POLICIES,
        prefix=PREFIX,
        resource="gpu",
    )
    assert [z["resources"][2] for z in nrt["zones"]] == [
        {"name": "gpu", "capacity": "2", "allocatable": "2", "available": "2"},
    ] * 2
    assert "ownerReferences" not in nrt["metadata"]
    assert [a["name"] for a in nrt["attributes"]] == [
        "topologyManagerPolicy",
        "topologyManagerScope",
        "nodeTopologyPodsFingerprint",
        "nodeTopologyPodsFingerprintMethod",
    ]


def test_a_distance_row_that_does_not_cover_every_node_gives_no_costs() -> None:
    t = topology(4)
    t = replace(t, numa_nodes=(replace(t.numa_nodes[0], distances=(10,)), t.numa_nodes[1]))
    zero, one = node_resource_topology(
        "n", t, NodeState(pods=()), MEMORY, policies=POLICIES, prefix=PREFIX
    )["zones"]
    assert "costs" not in zero
    assert "costs" in one


@pytest.mark.parametrize(
    ("node", "numa_nodes", "memory", "pods", "message"),
    [
        ("n", (), MEMORY, 0, "no NUMA node is known"),
        ("n", None, {0: GIB}, 0, "the memory of NUMA node 1 is unknown"),
        ("Not_A_Node", None, MEMORY, 0, "is not a node name"),
        ("n", None, MEMORY, 10_001, "more than a node runs"),
        ("n" * 64, None, MEMORY, 0, f"in the label {PREFIX}/node, whose value is at most 63"),
    ],
    ids=[
        "a VM without NUMA nodes",
        "memory unknown",
        "bad name",
        "too many pods",
        "a name no label value holds",
    ],
)
def test_what_would_make_a_harmful_object_is_refused_in_one_line(
    node: str, numa_nodes: tuple[()] | None, memory: dict[int, int], pods: int, message: str
) -> None:
    t = topology(4) if numa_nodes is None else replace(topology(4), numa_nodes=numa_nodes)
    state = NodeState(pods=tuple(PodRef("ns", f"p{i}") for i in range(pods)))
    with pytest.raises(InputError, match=message):
        node_resource_topology(node, t, state, memory, policies=POLICIES, prefix=PREFIX)


@pytest.mark.parametrize(
    "case",
    ["all known", "nothing free, policy none", "one NUMA node"],
)
def test_objects_validate_against_the_upstream_crd(case: str) -> None:
    t = topology(8)
    state = NodeState(pods=PODS, free_gpus=frozenset({2}))
    policies = KubeletPolicies("single-numa-node", "container")
    if case == "nothing free, policy none":
        state, policies = NodeState(pods=(), free_gpus=frozenset()), KubeletPolicies()
    if case == "one NUMA node":
        t = replace(topology(2), numa_nodes=topology(2).numa_nodes[:1])
    nrt = node_resource_topology(
        "dgx-01", t, state, MEMORY, policies=policies, prefix=PREFIX, node_uid="u"
    )
    jsonschema.validate(nrt, crd_schema())


def test_the_crd_schema_catches_a_broken_object() -> None:
    nrt = node_resource_topology(
        "n", topology(2), NodeState(pods=()), MEMORY, policies=POLICIES, prefix=PREFIX
    )
    del nrt["zones"][0]["resources"][0]["available"]
    with pytest.raises(jsonschema.ValidationError, match="'available' is a required property"):
        jsonschema.validate(nrt, crd_schema())


def test_numa_memory_reads_each_nodes_meminfo_in_bytes() -> None:
    fs = MemoryHostFS(
        {
            "devices/system/node/node0/meminfo": "Node 0 MemTotal:       1024 kB\n"
            "Node 0 MemFree:         512 kB\n",
            "devices/system/node/node1/meminfo": "Node 1 MemFree: 3 kB\n",
            "devices/system/node/possible": "0-1\n",
        },
        {},
    )
    assert numa_memory(fs) == {0: 1024 * 1024}


@pytest.mark.parametrize("text", ["", "Node 0 MemTotal: lots kB", "MemTotal: 5 kB"])
def test_a_meminfo_without_memtotal_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="MemTotal"):
        parse_node_memtotal(text)
