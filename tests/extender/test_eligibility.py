"""Where a pod may run, as the extender judges the nodes it holds a pod for (issue 28, item 10):
kube-scheduler's NodeUnschedulable, TaintToleration and NodeAffinity semantics, by example and by
the laws that tie the operators, terms and expressions together."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.extender.eligibility import (
    ANYWHERE,
    MAX_PLACEMENT_CHECKS,
    MAX_PLACEMENT_VALUES,
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
    UNSCHEDULABLE_TAINT,
    NodeFacts,
    Taint,
    node_facts,
    placement,
)

FABRIC = "gpu.topology.io/fabric-health"


def node(
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    *,
    unschedulable: bool = False,
    ready: str | None = "True",
) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "metadata": {"name": "n", "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, *conditions]},
    }


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def allows(spec: dict[str, Any], facts: dict[str, Any], name: str = "n") -> bool:
    return placement(spec).allows(name, node_facts(facts))


def one(*exprs: dict[str, Any]) -> dict[str, Any]:
    """A pod spec whose required node affinity is one term of `exprs`."""
    return {"affinity": affinity({"matchExpressions": list(exprs)})}


def tolerating(**toleration: str) -> dict[str, Any]:
    return {"tolerations": [toleration]}


GPU_NODE = node({"gpu.topology.io/interconnect": "nvswitch", "zone": "a", "gpus": "8"})
SICK = node(
    GPU_NODE["metadata"]["labels"], [{"key": FABRIC, "value": "unhealthy", "effect": "NoSchedule"}]
)
OTHER_TERMS = affinity(
    {"matchExpressions": [expr("zone", "In", "b")]}, {"matchExpressions": [expr("zone", "In", "a")]}
)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    ("a pod without constraints on a plain node", {}, GPU_NODE, True),
    ("a nodeSelector that matches", {"nodeSelector": {"zone": "a"}}, GPU_NODE, True),
    ("a nodeSelector of another zone", {"nodeSelector": {"zone": "b"}}, GPU_NODE, False),
    ("a nodeSelector on a label the node lacks", {"nodeSelector": {"x": "1"}}, GPU_NODE, False),
    ("In", one(expr("zone", "In", "b", "a")), GPU_NODE, True),
    ("NotIn on the node's value", one(expr("zone", "NotIn", "a")), GPU_NODE, False),
    ("NotIn on an absent label", one(expr("rack", "NotIn", "a")), GPU_NODE, True),
    ("Exists", one(expr("zone", "Exists")), GPU_NODE, True),
    ("DoesNotExist", one(expr("zone", "DoesNotExist")), GPU_NODE, False),
    ("Gt as integers, not text (8 > 10 is false)", one(expr("gpus", "Gt", "10")), GPU_NODE, False),
    ("Lt as integers", one(expr("gpus", "Lt", "10")), GPU_NODE, True),
    ("Gt on a label that is not an integer", one(expr("zone", "Gt", "1")), GPU_NODE, False),
    ("terms are ORed", {"affinity": OTHER_TERMS}, GPU_NODE, True),
    (
        "expressions are ANDed",
        one(expr("zone", "In", "a"), expr("gpus", "In", "4")),
        GPU_NODE,
        False,
    ),
    ("an empty term matches no node", {"affinity": affinity({})}, GPU_NODE, False),
    (
        "matchFields on the node's name",
        {"affinity": affinity({"matchFields": [expr("metadata.name", "In", "n")]})},
        GPU_NODE,
        True,
    ),
    (
        "matchFields on another name",
        {"affinity": affinity({"matchFields": [expr("metadata.name", "In", "m")]})},
        GPU_NODE,
        False,
    ),
    ("a cordoned node", {}, node(unschedulable=True), False),
    (
        "a cordoned node, the taint tolerated",
        tolerating(key=UNSCHEDULABLE_TAINT, operator="Exists", effect="NoSchedule"),
        node(unschedulable=True),
        True,
    ),
    ("the fabric-health taint", {}, SICK, False),
    (
        "the fabric-health taint tolerated by value",
        tolerating(key=FABRIC, value="unhealthy"),
        SICK,
        True,
    ),
    ("a toleration of another value", tolerating(key=FABRIC, value="degraded"), SICK, False),
    (
        "a toleration of another effect",
        tolerating(key=FABRIC, operator="Exists", effect="NoExecute"),
        SICK,
        False,
    ),
    ("a NoExecute taint", {}, node(taints=[{"key": "k", "effect": "NoExecute"}]), False),
    (
        "PreferNoSchedule never excludes",
        {},
        node(taints=[{"key": "k", "effect": "PreferNoSchedule"}]),
        True,
    ),
    (
        "an empty key with Exists tolerates every taint",
        tolerating(operator="Exists"),
        node(taints=[{"key": "k", "effect": "NoExecute"}], unschedulable=True, ready="False"),
        True,
    ),
    ("a node that is not Ready", {}, node(ready="False"), False),
    ("a node whose Ready is Unknown", {}, node(ready="Unknown"), False),
    (
        "not Ready, the taint tolerated",
        tolerating(key=NOT_READY_TAINT, operator="Exists"),
        node(ready="False"),
        True,
    ),
    ("a node without a Ready condition is not judged by it", {}, node(ready=None), True),
]


@pytest.mark.parametrize(
    ("spec", "facts", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_pod_may_run_on_the_node_as_kube_scheduler_judges(
    spec: dict[str, Any], facts: dict[str, Any], expected: bool
) -> None:
    assert allows(spec, facts) is expected


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": ["zone"]},
        {"nodeSelector": {"zone": 1}},
        {"affinity": affinity({"matchExpressions": [expr("zone", "Near", "a")]})},
        {"affinity": affinity({"matchExpressions": [{"key": 5, "operator": "Exists"}]})},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
        {"tolerations": [{"key": "k", "operator": "Less"}]},
        {"tolerations": "all"},
        "not a spec",
    ],
    ids=[
        "a nodeSelector that is a list",
        "a nodeSelector value that is a number",
        "an operator Kubernetes does not have",
        "a key that is a number",
        "a required affinity that is a list",
        "a toleration operator Kubernetes does not have",
        "tolerations that are a string",
        "a spec that is a string",
    ],
)
def test_a_placement_that_does_not_read_is_anywhere(spec: Any) -> None:
    # As before: the hold is then decided over every node, and the request never fails.
    assert placement(spec) is ANYWHERE


def test_the_node_lifecycle_taints_stand_for_cordon_and_readiness() -> None:
    facts = node_facts(node(unschedulable=True, ready="Unknown"))
    assert set(facts.taints) == {
        Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule"),
        Taint(UNREACHABLE_TAINT, "", "NoSchedule"),
    }
    # The controller's own taint as well as the condition: counted once.
    tainted = node(taints=[{"key": NOT_READY_TAINT, "effect": "NoSchedule"}], ready="False")
    assert node_facts(tainted).taints == (Taint(NOT_READY_TAINT, "", "NoSchedule"),)


# -- The laws, over generated labels and expressions --------------------------------------------

KEYS = st.sampled_from(["zone", "gpus", "rack"])
VALUES = st.sampled_from(["a", "b", "4", "8", "10", "-3", "+2", "x1"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=3)
SETS = st.lists(VALUES, min_size=1, max_size=3)


@st.composite
def expressions(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(KEYS)
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))
    if operator in ("Exists", "DoesNotExist"):
        return expr(key, operator)
    if operator in ("Gt", "Lt"):
        return expr(key, operator, str(draw(st.integers(-20, 20))))
    return expr(key, operator, *draw(SETS))


def matches(labels: dict[str, str], *terms: list[dict[str, Any]]) -> bool:
    spec = {"affinity": affinity(*({"matchExpressions": t} for t in terms))}
    return placement(spec).allows("n", NodeFacts(labels))


@given(LABELS, KEYS, SETS)
def test_not_in_is_the_negation_of_in(labels: dict[str, str], key: str, values: list[str]) -> None:
    assert matches(labels, [expr(key, "NotIn", *values)]) is not matches(
        labels, [expr(key, "In", *values)]
    )


@given(LABELS, KEYS)
def test_does_not_exist_is_the_negation_of_exists(labels: dict[str, str], key: str) -> None:
    assert matches(labels, [expr(key, "DoesNotExist")]) is not matches(
        labels, [expr(key, "Exists")]
    )


@given(LABELS, KEYS, st.integers(-20, 20))
def test_gt_and_lt_compare_integers_and_fail_on_anything_else(
    labels: dict[str, str], key: str, bound: int
) -> None:
    found = labels.get(key)
    number = int(found) if found is not None and found.lstrip("+-").isdigit() else None
    assert matches(labels, [expr(key, "Gt", str(bound))]) is (number is not None and number > bound)
    assert matches(labels, [expr(key, "Lt", str(bound))]) is (number is not None and number < bound)


@given(LABELS, st.lists(expressions(), min_size=1, max_size=3))
def test_expressions_of_a_term_are_anded(
    labels: dict[str, str], term: list[dict[str, Any]]
) -> None:
    assert matches(labels, term) is all(matches(labels, [e]) for e in term)


@given(LABELS, st.lists(st.lists(expressions(), min_size=1, max_size=2), min_size=1, max_size=3))
def test_terms_are_ored(labels: dict[str, str], terms: list[list[dict[str, Any]]]) -> None:
    assert matches(labels, *terms) is any(matches(labels, t) for t in terms)


@given(LABELS, st.dictionaries(KEYS, VALUES, max_size=2))
def test_a_node_selector_is_required_affinity_with_one_value_per_key(
    labels: dict[str, str], selector: dict[str, str]
) -> None:
    as_selector = placement({"nodeSelector": selector}).allows("n", NodeFacts(labels))
    exprs = [expr(k, "In", v) for k, v in selector.items()]
    assert as_selector is (not exprs or matches(labels, exprs))


TAINTS = st.lists(
    st.builds(
        Taint,
        st.sampled_from(["a", "b", FABRIC]),
        st.sampled_from(["", "x", "unhealthy"]),
        st.sampled_from(["NoSchedule", "NoExecute"]),
    ),
    max_size=3,
)


@given(TAINTS, st.sampled_from(["a", "b", FABRIC]))
def test_a_taint_excludes_until_a_toleration_of_its_key_exists(
    taints: list[Taint], key: str
) -> None:
    facts = NodeFacts({}, tuple(taints))
    exists = placement({"tolerations": [{"key": key, "operator": "Exists"}]})
    assert exists.allows("n", facts) is all(t.key == key for t in taints)
    assert placement({}).allows("n", facts) is (not taints)


# -- The hold check's budget (issue 41, item 3) -------------------------------------------------


def repro_affinity() -> dict[str, Any]:
    """The review's affinity: 34 terms of 1,000 expressions (34,000, about 1.4 MB of JSON, which
    the API server stores), each term failing only at its last expression, so that judging one
    node read them all: 3.4 ms a node."""
    term = {"matchExpressions": [expr("zone", "Exists")] * 999 + [expr("zone", "DoesNotExist")]}
    return {"affinity": affinity(*[term] * 34)}


def test_the_repros_affinity_of_34000_expressions_reads_as_anywhere() -> None:
    spec = repro_affinity()
    assert 1_300_000 < len(json.dumps(spec)) < 1_450_000
    assert placement(spec) is ANYWHERE


def test_an_affinity_within_the_budget_is_read_and_one_item_more_is_anywhere() -> None:
    # Terms, expressions and fields spend one each; the selector's pairs and the tolerations too.
    tolerations = [{"key": "k", "operator": "Exists"}] * 10
    selector = {f"s{i}": "x" for i in range(5)}
    left = MAX_PLACEMENT_CHECKS - 1 - len(tolerations) - len(selector)
    at: dict[str, Any] = {
        "nodeSelector": selector,
        "tolerations": tolerations,
        "affinity": affinity({"matchExpressions": [expr("zone", "In", "a")] * left}),
    }
    assert placement(at) is not ANYWHERE
    at["nodeSelector"] |= {"one": "more"}
    assert placement(at) is ANYWHERE
    values = [str(i) for i in range(MAX_PLACEMENT_VALUES // 2)]
    spec = one(expr("zone", "In", *values), expr("zone", "NotIn", *values))
    assert placement(spec) is not ANYWHERE
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"].append("1 more")
    assert placement(spec) is ANYWHERE


class CountedLabels(dict[str, str]):
    """A node's labels that count how often the check looks one up."""

    looked = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.looked += 1
        return super().get(key, default)


def test_judging_one_node_looks_up_at_most_the_budget_whatever_the_values() -> None:
    # The worst a readable placement can do: every check passes but the last, so every one is
    # read; values cost one set lookup each, however many.
    values = [f"v{i}" for i in range(MAX_PLACEMENT_VALUES - 1)] + ["a"]
    exprs = [expr("zone", "In", *values)] + [expr("zone", "Exists")] * (MAX_PLACEMENT_CHECKS - 3)
    term = {"matchExpressions": [*exprs, expr("zone", "DoesNotExist")]}
    spec = {"affinity": affinity(term)}
    labels = CountedLabels(zone="a")
    found = placement(spec)
    assert found is not ANYWHERE
    assert found.allows("n", NodeFacts(labels)) is False
    assert labels.looked == MAX_PLACEMENT_CHECKS - 1  # one check is the term
