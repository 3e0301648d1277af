"""The extender's protocol: ExtenderArgs in (both forms), filter and prioritize answers out."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from collections.abc import Mapping
from functools import cache
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsers.duration import duration_text
from reporter.availability import (
    CONNECTED_WAIT_S,
    NEUTRAL_SCORE,
    can_fit,
    connected_capacity,
    connected_now,
    node_score,
)
from reporter.collect import build_scanner
from reporter.errors import ConfigError
from reporter.extender.cache import (
    DEFAULT_RESOURCE,
    KEPT_SIZES,
    NodeCache,
    NodeRank,
    RankTable,
    connected_whole,
    rank,
)
from reporter.extender.eligibility import node_facts
from reporter.extender.protocol import (
    BadRequestError,
    created_seconds,
    filter_answer,
    hold_reason,
    parse_args,
    parse_preemption_args,
    preempt_answer,
    prioritize_answer,
)
from reporter.free_sets import compute_availability
from reporter.publish.watch import NodeAnnotation, WatchEvent
from reporter.schema.availability import Availability, decode_availability, encode_availability
from reporter.schema.labels import labels
from reporter.schema.model import Topology
from reporter.schema.scheduler import check_resource_name, gpus_requested
from tests.extender.test_eligibility import repro_affinity

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


def table(ranks: Mapping[str, NodeRank | None], wholes: Mapping[str, int] = {}) -> RankTable:
    built = RankTable(GPU)
    for name, r in ranks.items():
        built.set(name, r, wholes.get(name, 0))
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


def node(
    name: str, annotation: str | None, node_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    annotations = {} if annotation is None else {KEY: annotation}
    meta = {"name": name, "annotations": annotations, "labels": dict(node_labels or {})}
    return {"metadata": meta, "status": {"capacity": {}}}


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
        # Issue 41, item 7: `"\ud800x"` in the JSON, which the standard decoder reads.
        (body(Pod=pod(1), NodeNames=["b", "\ud800x"]), "NodeNames[1] is not a node name: it"),
        (
            body(Pod=pod(1), Nodes={"items": [{"metadata": {"name": "\udfffx"}}]}),
            "Nodes.items[0] is not a node name: it holds a lone surrogate escape",
        ),
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
        "a node name holding a lone surrogate",
        "a Node whose name holds a lone surrogate",
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


# -- Holding a pod of k >= 2 GPUs for an NVLink-connected set ------------------------------------

CREATED = "2026-12-02T08:00:00Z"
CREATED_S = 1796198400.0
WAIT_KEY = "gpu.topology.io/connected-wait"
HOLDING = {
    # short name: (profile, free GPUs), the facts the hold rule reads for a pod of 4
    "pcie": ("pcie-8x", tuple(range(8))),  # 4 free, never connected: capacity 1
    "busy": ("dgx-a100", (0, 1)),  # 2 free, too few; capacity 8: could give 4 once pods end
    "quad": ("dgx-h100", (0, 1, 2, 3)),  # a connected 4-set now
}
HOLD_REASON = (
    "topo-reporter: no NVLink-connected set of 4 nvidia.com/gpu free here; holding the pod for "
    "one up to {limit} (waited {waited})"
)


def waiting_pod(gpus: int, created: Any = CREATED, wait: Any = None) -> dict[str, Any]:
    """pod(gpus) created at `created` (absent when None), with a connected-wait annotation."""
    made = pod(gpus)
    made["metadata"] |= {} if created is None else {"creationTimestamp": created}
    made["metadata"] |= {} if wait is None else {"annotations": {WAIT_KEY: wait}}
    return made


def hold_filter(
    spec: dict[str, Any],
    candidates: list[str],
    known: list[str] | None = None,
    *,
    waited_s: float = 720.0,
    limit_s: float = CONNECTED_WAIT_S,
    form: str = "NodeNames",
) -> Any:
    """The filter answer at `waited_s` after CREATED; `known`: the nodes the extender's cache
    holds in the NodeNames form (by default all of HOLDING); in the Nodes form the request's own
    nodes are all it knows."""
    texts = {n: encode_availability(availability(*HOLDING[n])) for n in HOLDING}
    # The labels each node's agent publishes: what the extender knows of its wiring.
    published = {n: labels(profile(HOLDING[n][0]), node=n) for n in HOLDING}
    if form == "NodeNames":
        raw = body(Pod=spec, NodeNames=candidates)
        names = list(HOLDING) if known is None else known
        ranks = table(
            {n: rank(texts[n]) for n in names},
            {n: connected_whole(published[n]) for n in names},
        )
    else:
        nodes = {"items": [node(n, texts.get(n), published.get(n)) for n in candidates]}
        raw = body(Pod=spec, Nodes=nodes)
        ranks = RankTable.of_nodes(nodes, KEY, GPU)
    args = parse_args(raw, GPU)
    verdicts = ranks.verdicts(args.gpus)
    held = hold_reason(args, verdicts, now=CREATED_S + waited_s, limit_s=limit_s)
    answer = json.loads(filter_answer(args, verdicts, held)[0])
    if answer["Nodes"] is not None:
        answer["NodeNames"] = [i["metadata"]["name"] for i in answer["Nodes"]["items"]]
    return answer


@pytest.mark.parametrize("form", ["NodeNames", "Nodes"])
def test_a_pod_of_4_is_held_off_a_node_whose_4_free_are_not_connected(form: str) -> None:
    answer = hold_filter(waiting_pod(4), ["pcie", "busy", "unseen"], form=form)
    # An unknown node is never filtered, held or not (in the Nodes form: no annotation).
    assert answer["NodeNames"] == ["unseen"]
    # Issue 28, item 1: evicting pods on the PCIe node can never give the pod a connected set,
    # so preemption must not try there; on the NVSwitch node it could, so it may.
    assert answer["FailedAndUnresolvableNodes"] == {
        "pcie": HOLD_REASON.format(limit="2h", waited="12m"),
    }
    assert answer["FailedNodes"] == {
        "busy": "topo-reporter: 2 free nvidia.com/gpu, the pod needs 4",  # its own reason
    }


def test_a_busy_node_the_cache_knows_is_worth_waiting_for_though_no_candidate() -> None:
    # kube-scheduler does not send a node its own count calls full: the cache still knows it.
    answer = hold_filter(waiting_pod(4), ["pcie"], waited_s=5400)
    held = {"pcie": HOLD_REASON.format(limit="2h", waited="1h30m")}
    assert answer["FailedAndUnresolvableNodes"] == held
    assert answer["NodeNames"] == []


# Each case changes one thing of the first test's pod or cluster, which holds the pod.
NOT_HELD = {
    "one GPU needs no link": ({"spec": waiting_pod(1)}, ["pcie", "busy"]),
    "waited past the limit": ({"spec": waiting_pod(4), "waited_s": 7201.0}, ["pcie", "busy"]),
    "a candidate gives a connected set now": ({"spec": waiting_pod(4)}, ["pcie", "quad"]),
    "no node could ever give one": ({"spec": waiting_pod(4), "known": ["pcie"]}, ["pcie"]),
    "the extender's limit is 0": ({"spec": waiting_pod(4), "limit_s": 0.0}, ["pcie", "busy"]),
    "the pod's annotation is 0": ({"spec": waiting_pod(4, wait="0")}, ["pcie", "busy"]),
    "the pod's annotation is shorter than its wait": (
        {"spec": waiting_pod(4, wait="10m")},
        ["pcie", "busy"],
    ),
    "no creationTimestamp": ({"spec": waiting_pod(4, created=None)}, ["pcie", "busy"]),
    "an unreadable creationTimestamp": (
        {"spec": waiting_pod(4, created="2026-12-02 08:00:00")},
        ["pcie", "busy"],
    ),
    "a creationTimestamp from the future beyond the limit (clock skew)": (
        {"spec": waiting_pod(4), "waited_s": -7300.0},
        ["pcie", "busy"],
    ),
}


@pytest.mark.parametrize("form", ["NodeNames", "Nodes"])
@pytest.mark.parametrize("case", list(NOT_HELD))
def test_a_pod_is_not_held_when(case: str, form: str) -> None:
    given_args, candidates = NOT_HELD[case]
    kwargs = dict(given_args)
    spec = kwargs.pop("spec")
    if form == "Nodes" and "known" in kwargs:
        kwargs.pop("known")  # the request's nodes are what it knows: the same here
    answer = hold_filter(spec, candidates, form=form, **kwargs)
    assert "pcie" in answer["NodeNames"]
    assert all("holding" not in reason for reason in answer["FailedNodes"].values())
    assert answer["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize(
    ("wait", "waited_s", "limit"),
    [("3h", 9000.0, "3h"), ("soon", 720.0, "2h"), (7200, 720.0, "2h"), ("25h", 720.0, "2h")],
    ids=[
        "the pod's annotation lengthens its own hold",
        "an unreadable annotation leaves the extender's limit",
        "a number, not a string, is unreadable",
        "beyond 24h is unreadable",
    ],
)
def test_the_pod_annotation_sets_its_own_limit_or_is_ignored(
    wait: Any, waited_s: float, limit: str
) -> None:
    answer = hold_filter(waiting_pod(4, wait=wait), ["pcie"], waited_s=waited_s)
    waited = duration_text(waited_s)
    held = {"pcie": HOLD_REASON.format(limit=limit, waited=waited)}
    assert answer["FailedAndUnresolvableNodes"] == held


def test_a_skewed_clock_within_the_limit_holds_and_says_waited_0s() -> None:
    answer = hold_filter(waiting_pod(4), ["pcie"], waited_s=-60.0)
    held = {"pcie": HOLD_REASON.format(limit="2h", waited="0s")}
    assert answer["FailedAndUnresolvableNodes"] == held


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2026-12-02T08:00:00Z", CREATED_S),
        ("2026-12-02T09:00:00.5+01:00", CREATED_S + 0.5),
        ("2026-12-02T07:30:00-00:30", CREATED_S),
        ("2026-12-02T08:00:00", None),
        ("2026-12-02t08:00:00z", None),
        ("2026-02-30T08:00:00Z", None),
        ("2026-12-02T08:00:60Z", None),
        ("2026-12-02T08:00:00+24:00", None),
        ("2026-12-02T08:00:00.1234567890Z", None),
        ("\u0662026-12-02T08:00:00Z", None),
        (1796198400, None),
    ],
)
def test_creation_timestamps_read_as_rfc_3339_or_not_at_all(text: Any, seconds: float) -> None:
    assert created_seconds(text) == seconds


# The kept sets against a from-scratch computation, across watch events and relists.
POOL = [
    *(
        encode_availability(availability(machine, free))
        for machine, free in [
            ("pcie-8x", tuple(range(8))),
            ("pcie-8x", (0, 1)),
            ("dgx-a100", (0, 1)),
            ("dgx-a100", tuple(range(8))),
            ("dgx-h100", (0, 1, 2, 3)),
            ("dgx-h100", (0, 1, 4, 5)),
            ("dgx-1-v100", tuple(range(8))),
        ]
    ),
    None,
    "1;0-3;damaged",
]
NAMES = ["a", "b", "c", "d"]
WIRINGS = [
    {},
    labels(profile("dgx-h100")),  # NVSwitch, every link up: any k of its 8 GPUs are connected
    labels(profile("dgx-1-v100")),  # NVLink, but not every pair: nothing is known for sure
    labels(profile("pcie-8x")),
]
NODE_STATES = st.tuples(st.sampled_from(POOL), st.sampled_from(range(len(WIRINGS))))
EVENTS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(NAMES), NODE_STATES),
    st.tuples(st.just("drop"), st.sampled_from(NAMES), st.none()),
    st.tuples(
        st.just("relist"),
        st.dictionaries(st.sampled_from(NAMES), NODE_STATES),
        st.none(),
    ),
    st.tuples(st.just("ask"), st.sampled_from([1, 2, 4, 8]), st.none()),
)


def watched(name: str, state: tuple[str | None, int]) -> NodeAnnotation:
    text, wiring = state
    return NodeAnnotation(name, text, {"metadata": {"labels": WIRINGS[wiring]}})


@given(st.lists(EVENTS, max_size=24))
def test_the_connected_and_capable_sets_follow_every_change(events: list[Any]) -> None:
    cache = NodeCache("gpu.topology.io", GPU)
    cache.replace([])
    nodes: dict[str, tuple[str | None, int]] = {}
    for kind, what, state in events:
        if kind == "set":
            nodes[what] = state
            cache.apply(WatchEvent("MODIFIED", watched(what, state), "1"))
        elif kind == "drop":
            nodes.pop(what, None)
            cache.apply(WatchEvent("DELETED", NodeAnnotation(what, None), "1"))
        elif kind == "relist":
            nodes = dict(what)
            cache.replace([watched(n, v) for n, v in nodes.items()])
        else:
            cache.table().verdicts(what)
        decoded = {n: None if t is None else rank(t) for n, (t, _) in nodes.items()}
        whole = {n: 8 if w == 1 else 0 for n, (_, w) in nodes.items()}
        assert cache.table().wholes == {n: w for n, w in whole.items() if w}
        for k in cache.table().sizes():
            verdicts = cache.table().verdicts(k)
            fresh = {n: r for n, r in decoded.items() if r is not None and k >= 2}
            a = {n: decode_availability(t) for n, (t, _) in nodes.items() if n in fresh and t}
            assert verdicts.connected == {n for n in a if connected_now(a[n], k)}
            assert verdicts.capable == {n for n in a if connected_capacity(a[n]) >= k}
            waiting = {n for n in a if not connected_now(a[n], k)}
            # Held, a node where evicting pods surely gives a connected set stays open to
            # preemption; every other is unresolvable (issue 28, item 1).
            assert set(verdicts.held) == {n for n in waiting if whole[n] >= k}
            assert set(verdicts.unresolvable) == {n for n in waiting if whole[n] < k}
            for n in waiting:
                member = verdicts.held.get(n) or verdicts.unresolvable[n]
                assert member == verdicts.failed.get(n, f"{encode_basestring_ascii(n)}:\x00")


# -- Preemption while a pod is held (issue 28, item 1) ------------------------------------------


def preempted(
    spec: dict[str, Any],
    victims: Mapping[str, list[str]],
    *,
    by_uid: bool = True,
    waited_s: float = 720.0,
    known: list[str] | None = None,
) -> Any:
    """The preempt answer for `victims` (node to victim UIDs) at `waited_s` after CREATED, the
    cache knowing `known` of HOLDING (all by default) with the labels their agents publish."""
    names = list(HOLDING) if known is None else known
    ranks = table(
        {n: rank(encode_availability(availability(*HOLDING[n]))) for n in names},
        {n: connected_whole(labels(profile(HOLDING[n][0]), node=n)) for n in names},
    )
    if by_uid:
        sent: Any = {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 1}
            for n, uids in victims.items()
        }
        raw = body(Pod=spec, NodeNameToMetaVictims=sent)
    else:
        sent = {
            n: {"Pods": [{"metadata": {"uid": u, "name": u}} for u in uids], "NumPDBViolations": 1}
            for n, uids in victims.items()
        }
        raw = body(Pod=spec, NodeNameToVictims=sent, NodeNameToMetaVictims=None)
    args = parse_preemption_args(raw, GPU)
    answer, vetoed = preempt_answer(args, ranks, now=CREATED_S + waited_s, limit_s=CONNECTED_WAIT_S)
    found = json.loads(answer)
    assert vetoed == len(victims) - len(found["NodeNameToMetaVictims"])
    return found["NodeNameToMetaVictims"]


@pytest.mark.parametrize("by_uid", [True, False], ids=["MetaVictims", "whole Pods"])
def test_a_held_pod_preempts_only_where_eviction_gives_a_connected_set(by_uid: bool) -> None:
    answer = preempted(
        waiting_pod(4), {"pcie": ["low-1"], "busy": ["low-2", "low-3"]}, by_uid=by_uid
    )
    # The PCIe node can never give a connected set: its victims are spared. Any 4 GPUs of the
    # NVSwitch node are connected: evicting there serves the pod now.
    assert answer == {"busy": {"Pods": [{"UID": "low-2"}, {"UID": "low-3"}], "NumPDBViolations": 1}}


@pytest.mark.parametrize(
    ("spec", "waited_s", "known"),
    [
        (waiting_pod(4), 7201.0, None),
        (waiting_pod(4, wait="0"), 720.0, None),
        (waiting_pod(1), 720.0, None),
        (waiting_pod(4), 720.0, ["pcie"]),
        (waiting_pod(4, created=None), 720.0, None),
    ],
    ids=[
        "past its limit",
        "a pod that says never to hold it",
        "a pod of one GPU",
        "no node could give a connected set once pods end",
        "no creationTimestamp",
    ],
)
def test_a_pod_not_held_preempts_as_the_scheduler_chose(
    spec: dict[str, Any], waited_s: float, known: list[str] | None
) -> None:
    answer = preempted(spec, {"pcie": ["low-1"], "busy": ["low-2"]}, waited_s=waited_s, known=known)
    assert answer == {
        "pcie": {"Pods": [{"UID": "low-1"}], "NumPDBViolations": 1},
        "busy": {"Pods": [{"UID": "low-2"}], "NumPDBViolations": 1},
    }


def test_a_candidate_without_victims_is_never_returned() -> None:
    # The scheduler drops it (ignorable) or fails preemption (not ignorable) if it comes back.
    assert preempted(waiting_pod(4, wait="0"), {"pcie": [], "busy": ["low"]}) == {
        "busy": {"Pods": [{"UID": "low"}], "NumPDBViolations": 1}
    }


def test_a_node_the_cache_does_not_know_is_spared_while_the_pod_is_held() -> None:
    assert preempted(waiting_pod(4), {"unseen": ["low"]}) == {}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"[]", "the body is not an ExtenderPreemptionArgs object"),
        (body(NodeNameToMetaVictims={}), "Pod is missing or not an object"),
        (
            body(Pod={}, NodeNameToMetaVictims={}, NodeNameToVictims={}),
            "send one of NodeNameToMetaVictims and NodeNameToVictims, not both",
        ),
        (body(Pod={}, NodeNameToMetaVictims=[]), "NodeNameToMetaVictims is not an object"),
        (body(Pod={}, NodeNameToMetaVictims={"a": []}), "NodeNameToMetaVictims['a'] is not a"),
        (
            body(Pod={}, NodeNameToMetaVictims={"a": {"Pods": [{"UID": 7}]}}),
            "NodeNameToMetaVictims['a'].Pods[0] has no pod UID",
        ),
        (
            body(Pod={}, NodeNameToVictims={"a": {"Pods": [{"metadata": {}}]}}),
            "NodeNameToVictims['a'].Pods[0] has no pod UID",
        ),
        (
            body(Pod={}, NodeNameToMetaVictims={"a": {"Pods": [], "NumPDBViolations": -1}}),
            "NodeNameToMetaVictims['a'].NumPDBViolations is not a count",
        ),
        (body(Pod={}, NodeNameToMetaVictims={"": {}}), "NodeNameToMetaVictims[0] is not a node"),
        (
            body(Pod={}, NodeNameToMetaVictims={"\ud800x": {}}),
            "NodeNameToMetaVictims[0] is not a node name: it holds a lone surrogate escape",
        ),
    ],
)
def test_a_malformed_preemption_request_is_one_line_naming_the_problem(
    raw: bytes, reason: str
) -> None:
    with pytest.raises(BadRequestError, match="^" + re.escape(reason)) as e:
        parse_preemption_args(raw, GPU)
    assert "\n" not in str(e.value)


# -- Holding only for a node the pod could use (issue 28, item 10) -------------------------------

BUSY_LABELS = {"zone": "a", "kubernetes.io/hostname": "busy"}
NOT_ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}
SICK = {"key": "gpu.topology.io/fabric-health", "value": "unhealthy", "effect": "NoSchedule"}
NOT_READY = {"conditions": [{"type": "Ready", "status": "False"}]}
HELD_FOR_BUSY = {
    # case: (the pod's spec beside its GPUs, the busy NVSwitch node as the watch sent it, held)
    "a pod that may use it": ({}, {}, True),
    "a nodeSelector the node does not match": ({"nodeSelector": {"zone": "b"}}, {}, False),
    "a required affinity the node does not match": (
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [NOT_ZONE_A]
                    }
                }
            }
        },
        {},
        False,
    ),
    "the node is cordoned": ({}, {"spec": {"unschedulable": True}}, False),
    "the node is tainted fabric-health=unhealthy": ({}, {"spec": {"taints": [SICK]}}, False),
    "the taint is tolerated": (
        {"tolerations": [{"key": SICK["key"], "operator": "Exists"}]},
        {"spec": {"taints": [SICK]}},
        True,
    ),
    "the node is not Ready": ({}, {"status": NOT_READY}, False),
    # Issue 41, item 3: 34,000 expressions the node fails, past the budget: read as anywhere.
    "an affinity past the hold check's budget": (repro_affinity(), {}, True),
}


@pytest.mark.parametrize("case", list(HELD_FOR_BUSY))
def test_the_pod_is_held_only_for_a_node_it_could_use(case: str) -> None:
    extra, busy, held = HELD_FOR_BUSY[case]
    spec = waiting_pod(4)
    spec["spec"] |= extra
    ranks = RankTable(GPU)
    for name in ("pcie", "busy"):
        facts = node_facts({"metadata": {"labels": BUSY_LABELS}, **busy} if name == "busy" else {})
        ranks.set(name, rank(encode_availability(availability(*HOLDING[name]))), 0, facts)
    args = parse_args(body(Pod=spec, NodeNames=["pcie"]), GPU)
    verdicts = ranks.verdicts(4)
    reason = hold_reason(
        args, verdicts, now=CREATED_S + 720.0, limit_s=CONNECTED_WAIT_S, facts=ranks.facts
    )
    assert (reason is not None) is held
    answer = json.loads(filter_answer(args, verdicts, reason)[0])
    assert answer["NodeNames"] == ([] if held else ["pcie"])


@given(
    st.lists(
        st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
        | st.sampled_from(['a"b', "a\\b", 'a","b', "\x7f", "\x00", "é", "gpu-01"]),
        max_size=8,
    )
)
def test_the_kept_names_are_written_as_json_dumps_writes_them(names: list[str]) -> None:
    """The filter answer joins node names in one go where none needs escaping; any other name
    (a quote, a backslash, a control character, DEL, non-ASCII) is escaped as json.dumps does."""
    args = parse_args(body(Pod=pod(1), NodeNames=names))
    answer = filter_answer(args, RankTable(GPU).verdicts(1))[0].decode()
    assert f'"NodeNames":{json.dumps(names, separators=(",", ":"))},' in answer
    assert json.loads(answer)["NodeNames"] == names


@given(
    frees=st.lists(st.sets(st.integers(0, 7)), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 8), max_size=12),
    k=st.integers(0, 9),
)
def test_filter_counts_as_dropped_exactly_the_nodes_it_fails(
    frees: list[set[int]], picks: list[int], k: int
) -> None:
    """The count filter returns (the `filtered_nodes` metric) is the number of candidates it
    answered as failed, in every mix: none failing, all failing, nodes it does not know (index
    len(frees): never failed), names sent twice, no GPUs asked for."""
    ranks = table({f"n{i}": ranked("dgx-a100", tuple(sorted(f))) for i, f in enumerate(frees)})
    names = [f"n{min(i, len(frees))}" for i in picks]
    args = parse_args(body(Pod=pod(k), NodeNames=names))
    raw, dropped = filter_answer(args, ranks.verdicts(k))
    answer = json.loads(raw)
    failed = answer["FailedNodes"]
    assert answer["NodeNames"] == [n for n in names if n not in failed]
    assert dropped == sum(n in failed for n in names)
    if k == 0:
        assert answer["NodeNames"] == names
        assert dropped == 0
