"""The extender's protocol: ExtenderArgs in (both forms), filter and prioritize answers out."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.availability import (
    NEUTRAL_SCORE,
    Availability,
    can_fit,
    compute_availability,
    encode_availability,
    node_score,
)
from reporter.collect import build_scanner
from reporter.errors import ConfigError
from reporter.extender.protocol import (
    DEFAULT_RESOURCE,
    KEPT_SIZES,
    BadRequestError,
    NodeRank,
    RankTable,
    check_resource_name,
    filter_answer,
    gpus_requested,
    parse_args,
    prioritize_answer,
    rank,
)
from reporter.schema.model import Topology

KEY = "gpu.topology.io/availability"
GPU = "nvidia.com/gpu"


@cache
def profile(name: str) -> Topology:
    topology = build_scanner("auto", Path("/nonexistent"), name).scan().topology
    assert topology is not None
    return topology


def availability(name: str, free: tuple[int, ...]) -> Availability:
    return compute_availability(profile(name), free)


def ranked(name: str, free: tuple[int, ...]) -> NodeRank:
    return NodeRank.of(availability(name, free))


def table(ranks: Mapping[str, NodeRank | None]) -> RankTable:
    built = RankTable(GPU)
    for name, r in ranks.items():
        built.set(name, r)
    return built


def filtered(raw: bytes, ranks: RankTable) -> Any:
    args = parse_args(raw)
    return json.loads(filter_answer(args, ranks.verdicts(args.gpus))[0])


def prioritized(raw: bytes, ranks: RankTable) -> Any:
    args = parse_args(raw)
    return json.loads(prioritize_answer(args, ranks.verdicts(args.gpus)))


def pod(*gpus: int | str, init: tuple[tuple[int, str | None], ...] = ()) -> dict[str, Any]:
    """A pod whose containers ask for `gpus` each (limits only, as users write it)."""
    return {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {GPU: g}}} for i, g in enumerate(gpus)
            ],
            "initContainers": [
                {"name": f"i{i}", "resources": {"requests": {GPU: g}}}
                | ({"restartPolicy": policy} if policy else {})
                for i, (g, policy) in enumerate(init)
            ],
        },
    }


def node(name: str, annotation: str | None) -> dict[str, Any]:
    annotations = {} if annotation is None else {KEY: annotation}
    return {"metadata": {"name": name, "annotations": annotations}, "status": {"capacity": {}}}


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (pod(), 0),
        (pod(2), 2),
        (pod(2, "4"), 6),
        (pod(1, init=((8, None),)), 8),
        (pod(4, init=((2, None),)), 4),
        (pod(2, init=((1, "Always"), (2, None))), 3),
        (pod(1, init=((2, None), (1, "Always"))), 2),
        ({"spec": {"containers": [{"resources": {"requests": {GPU: 1}, "limits": {GPU: 3}}}]}}, 1),
        ({"spec": {"containers": [{"resources": {"limits": {"cpu": "4"}}}]}}, 0),
        ({"metadata": {}}, 0),
    ],
    ids=[
        "a pod without GPUs asks for none",
        "one container's limit is the request",
        "containers add up, numbers or strings",
        "an init container needs its GPUs alone, so the largest counts",
        "containers outweigh a smaller init container",
        "a sidecar init container keeps its GPUs while the containers run",
        "a sidecar started after an init container does not add to it",
        "requests win over limits",
        "other resources are not counted",
        "a pod without spec asks for nothing",
    ],
)
def test_gpus_requested_counts_as_kube_scheduler_does(spec: dict[str, Any], expected: int) -> None:
    assert gpus_requested(spec, GPU) == expected


def test_gpus_requested_counts_only_the_managed_resource() -> None:
    assert gpus_requested(pod(2), "amd.com/gpu") == 0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not an ExtenderArgs"),
        (body(NodeNames=["a"]), "Pod is missing"),
        (body(Pod=[], NodeNames=["a"]), "Pod is missing or not an object"),
        (body(Pod=pod(1)), "exactly one of Nodes"),
        (body(Pod=pod(1), Nodes={"items": []}, NodeNames=["a"]), "exactly one of Nodes"),
        (body(Pod=pod(1), NodeNames="a"), "NodeNames is not a list"),
        (body(Pod=pod(1), NodeNames=["a", 3]), "NodeNames[1] is not a node name"),
        (body(Pod=pod(1), NodeNames=["x" * 254]), "NodeNames[0] is not a node name"),
        (body(Pod=pod(1), Nodes=[]), "Nodes is not a NodeList"),
        (body(Pod=pod(1), Nodes={"items": [{"kind": "Node"}]}), "Nodes.items[0] is not a Node"),
        (body(Pod=pod(1), Nodes={"items": [{"metadata": {}}]}), "Nodes.items[0] is not a node"),
        (body(Pod=pod("500m"), NodeNames=[]), "not a whole number of devices"),
        (body(Pod=pod(-1), NodeNames=[]), "not a whole number of devices"),
        (body(Pod=pod(True), NodeNames=[]), "not a whole number of devices"),
        (body(Pod={"spec": {"containers": {}}}, NodeNames=[]), "containers is not a list"),
        (body(Pod={"spec": {"containers": [1]}}, NodeNames=[]), "containers[0] is not an object"),
        (
            body(Pod={"spec": {"containers": [{"resources": {"limits": [1]}}]}}, NodeNames=[]),
            "resources.limits is not an object",
        ),
        (body(Pod=pod(*[999_999] * 3), NodeNames=[]), "more than any node has"),
        (b"[" * 100_000, "not JSON"),
    ],
    ids=[
        "text that is not JSON",
        "JSON that is not an object",
        "no Pod",
        "a Pod that is not an object",
        "neither Nodes nor NodeNames",
        "both Nodes and NodeNames",
        "NodeNames not a list",
        "a node name that is not a string",
        "a node name longer than Kubernetes allows",
        "Nodes not a NodeList",
        "a Node without metadata",
        "a Node without a name",
        "a fractional GPU count",
        "a negative GPU count",
        "a boolean GPU count",
        "containers not a list",
        "a container not an object",
        "limits not a map",
        "an absurd GPU count",
        "nesting deep enough to exhaust the parser",
    ],
)
def test_a_malformed_request_is_one_line_naming_the_problem(raw: bytes, reason: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        parse_args(raw, GPU)
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_node_names_form_filters_by_free_gpus_and_answers_with_node_names() -> None:
    cached = {
        "all-free": ranked("dgx-a100", tuple(range(8))),
        "two-free": ranked("dgx-a100", (0, 1)),
        "damaged": rank("1;0-3;not/the/format"),
    }
    raw = body(Pod=pod(4), NodeNames=["all-free", "two-free", "damaged", "unseen"])
    assert filtered(raw, table(cached)) == {
        "Nodes": None,
        "NodeNames": ["all-free", "damaged", "unseen"],
        "FailedNodes": {"two-free": "topo-reporter: 2 free nvidia.com/gpu, the pod needs 4"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_nodes_form_answers_with_the_kept_nodes_as_sent() -> None:
    free8 = encode_availability(availability("dgx-a100", tuple(range(8))))
    free1 = encode_availability(availability("dgx-a100", (3,)))
    nodes = {
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7"},
        "items": [node("a", free8), node("b", free1), node("c", "1;0-99;garbage"), node("d", None)],
    }
    raw = body(Pod=pod(2), Nodes=nodes)
    answer = filtered(raw, RankTable.of_nodes(nodes, KEY, GPU))
    assert answer["NodeNames"] is None
    assert answer["Nodes"] == {**nodes, "items": [nodes["items"][0], *nodes["items"][2:]]}
    assert list(answer["FailedNodes"]) == ["b"]


def test_prioritize_ranks_by_node_score_and_gives_unreadable_nodes_the_neutral_score() -> None:
    free = {
        "nvswitch-all-free": availability("dgx-a100", tuple(range(8))),
        "pcie-all-free": availability("pcie-8x", tuple(range(8))),
        "too-few": availability("dgx-a100", (0,)),
    }
    ranks = {name: NodeRank.of(a) for name, a in free.items()}
    names = [*free, "no-annotation"]
    answer = prioritized(body(Pod=pod(2), NodeNames=names), table(ranks))
    assert answer == [
        {"Host": "nvswitch-all-free", "Score": node_score(free["nvswitch-all-free"], 2)},
        {"Host": "pcie-all-free", "Score": node_score(free["pcie-all-free"], 2)},
        {"Host": "too-few", "Score": 0},
        {"Host": "no-annotation", "Score": NEUTRAL_SCORE},
    ]
    assert answer[0]["Score"] > answer[1]["Score"]


def test_a_pod_without_gpus_passes_every_node_with_no_opinion() -> None:
    full = table({"busy": ranked("dgx-a100", ())})
    raw = body(Pod=pod(), NodeNames=["busy", "other"])
    assert filtered(raw, full)["NodeNames"] == ["busy", "other"]
    assert prioritized(raw, full) == [
        {"Host": "busy", "Score": 0},
        {"Host": "other", "Score": 0},
    ]


def test_an_empty_node_names_list_is_answered_with_an_empty_list_not_null() -> None:
    # kube-scheduler reads a null NodeNames as "no answer" and then filters every node out.
    assert filtered(body(Pod=pod(1), NodeNames=[]), RankTable(GPU))["NodeNames"] == []


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "amd.com/gpu", "gpu", "nvidia.com/mig-1g.10gb"])
def test_resource_names_kubernetes_accepts_are_accepted(name: str) -> None:
    assert check_resource_name(name) == name


@pytest.mark.parametrize("name", ["", "nvidia.com/", "/gpu", "Nvidia.com/gpu", "a b", "x/y/z"])
def test_a_resource_name_kubernetes_refuses_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="is not a resource name"):
        check_resource_name(name)


@given(
    machine=st.sampled_from(["dgx-a100", "pcie-8x", "dgx-1-v100", "workstation-nvlink-bridge"]),
    data=st.data(),
)
def test_filter_and_prioritize_answer_exactly_as_can_fit_and_node_score(
    machine: str, data: st.DataObject
) -> None:
    n = len(profile(machine).gpus)
    free = data.draw(st.sets(st.integers(0, n - 1)))
    a = availability(machine, tuple(sorted(free)))
    ranks = table({"node": rank(encode_availability(a))})
    for k in range(1, n + 3):
        raw = body(Pod=pod(k), NodeNames=["node"])
        assert filtered(raw, ranks)["NodeNames"] == (["node"] if can_fit(a, k) else [])
        assert prioritized(raw, ranks) == [{"Host": "node", "Score": node_score(a, k)}]


@pytest.mark.parametrize(
    "name", ["plain", 'with"quote', "back\\slash", "ünïcode", "tab\there", "</script>"]
)
def test_answers_are_valid_json_whatever_the_node_names(name: str) -> None:
    ranks = table({name: ranked("dgx-a100", (0,)), "b": ranked("dgx-a100", (0, 1))})
    raw = body(Pod=pod(2), NodeNames=[name, "b", f"unseen {name}"])
    assert prioritized(raw, ranks) == [
        {"Host": name, "Score": 0},
        {"Host": "b", "Score": node_score(availability("dgx-a100", (0, 1)), 2)},
        {"Host": f"unseen {name}", "Score": NEUTRAL_SCORE},
    ]
    answer = filtered(raw, ranks)
    assert answer["NodeNames"] == ["b", f"unseen {name}"]
    assert list(answer["FailedNodes"]) == [name]


def test_answers_follow_node_changes_for_every_kept_size_and_forget_the_oldest() -> None:
    ranks = table({"a": ranked("dgx-a100", tuple(range(8)))})
    raw = {k: body(Pod=pod(k), NodeNames=["a"]) for k in range(1, KEPT_SIZES + 2)}
    for k in raw:
        assert filtered(raw[k], ranks)["NodeNames"] == (["a"] if k <= 8 else [])
    assert ranks.sizes() == list(range(2, KEPT_SIZES + 2))  # size 1 was asked first: dropped
    ranks.set("a", ranked("dgx-a100", (0, 1)))
    ranks.set("b", None)
    for k in raw:
        assert filtered(raw[k], ranks)["NodeNames"] == (["a"] if k <= 2 else [])
    assert prioritized(body(Pod=pod(2), NodeNames=["b", "a"]), ranks) == [
        {"Host": "b", "Score": NEUTRAL_SCORE},
        {"Host": "a", "Score": node_score(availability("dgx-a100", (0, 1)), 2)},
    ]
    ranks.drop("a")
    assert prioritized(raw[2], ranks) == [{"Host": "a", "Score": NEUTRAL_SCORE}]


def test_values_refused_are_not_remembered() -> None:
    # Issue 19: the rank memo kept every text it was handed, refused ones too; 60 calls carrying
    # distinct 4 MiB annotations took the extender from 43 to 298 MB, for good.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(16):
            text = f"1;{i};" + "0" * (1 << 20)
            nodes = {"items": [{"metadata": {"name": "a", "annotations": {KEY: text}}}]}
            assert RankTable.of_nodes(nodes, KEY, DEFAULT_RESOURCE).ranks == {"a": None}
            del text, nodes
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"{kept} bytes kept after 16 refused values of 1 MiB"
