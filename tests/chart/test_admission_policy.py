"""The admission policy's CEL, as the chart renders it, decides node updates the way DESIGN.md says.

The expressions are taken from the rendered ValidatingAdmissionPolicy and evaluated with
cel-python on admission requests built here, the way the API server evaluates them:
matchConditions first (all must be true for the policy to apply), then `variables` (bound under
`variables.`), then each validation in order; the first false one denies with its message, and an
expression that fails to evaluate denies too, because the policy's failurePolicy is Fail.

Every expression uses standard CEL only (no Kubernetes extension library), so the evaluator
registers no function of its own; a test below keeps it that way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from celpy.celtypes import MapType, StringType
from celpy.evaluation import CELEvalError
from lark import Token, Tree

from reporter.publish.client import EventType, event_body
from reporter.publish.patch import NodeMetadata
from reporter.schema import dra, keys
from reporter.schema.nrt import own_labels
from tests.support.helm_chart import ALL_ON, FULLNAME, NAMESPACE, NODE_POLICY, VAP_API, render

NODE_CLAIM = "authentication.kubernetes.io/node-name"
AGENT = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"

# Functions and macros of the CEL standard definitions that Kubernetes CEL also has.
STANDARD_CEL = {
    "has", "size", "all", "exists", "exists_one", "map", "filter",
    "startsWith", "endsWith", "contains", "matches",
    "int", "uint", "double", "string", "bytes", "bool", "type", "dyn",
}  # fmt: skip
# What a ValidatingAdmissionPolicy expression may name at its root (Kubernetes docs,
# "Validation expression"); `params`, `namespaceObject` and `authorizer` go unused here.
ADMISSION_ROOTS = {"object", "oldObject", "request", "variables"}


@dataclass(frozen=True, slots=True)
class Decision:
    """What the API server would answer: admitted or not, and why not."""

    allowed: bool
    applies: bool
    message: str = ""


class PolicyEvaluator:
    """A ValidatingAdmissionPolicy's CEL, compiled once, evaluated like the API server does."""

    def __init__(self, policy: dict[str, Any]) -> None:
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        env = celpy.Environment()
        self.expressions: list[str] = []

        def compile_(expression: str) -> Callable[[dict[str, Any]], Any]:
            self.expressions.append(expression)
            program: Callable[[dict[str, Any]], Any] = env.program(env.compile(expression)).evaluate
            return program

        self.match = [compile_(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], compile_(v["expression"])) for v in spec["variables"]]
        self.validations = [(compile_(v["expression"]), v["message"]) for v in spec["validations"]]

    def admit(self, request: dict[str, Any]) -> Decision:
        """Evaluate the policy on an UPDATE `request` (with `object` and `oldObject`)."""
        activation: dict[str, Any] = {
            "request": json_to_cel(request),
            "object": json_to_cel(request["object"]),
            "oldObject": json_to_cel(request["oldObject"]),
        }
        for condition in self.match:
            if not _value(condition, activation):
                return Decision(allowed=True, applies=False)
        bound: dict[str, Any] = {}
        for name, variable in self.variables:
            activation["variables"] = json_to_cel(bound)
            bound[name] = _value(variable, activation)
        activation["variables"] = MapType({StringType(k): v for k, v in bound.items()})
        for validation, message in self.validations:
            try:
                ok = _value(validation, activation)
            except CELEvalError as e:
                return Decision(allowed=False, applies=True, message=f"evaluation error: {e}")
            if not ok:
                return Decision(allowed=False, applies=True, message=message)
        return Decision(allowed=True, applies=True)


def _value(program: Callable[[dict[str, Any]], Any], activation: dict[str, Any]) -> Any:
    result = program(activation)
    # celpy returns errors as values from some paths instead of raising them.
    if isinstance(result, CELEvalError):
        raise result
    return result


def node(name: str = "gpu-node-1") -> dict[str, Any]:
    """A GPU node as the API server stores it, before the agent's first publish."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "5b0b7c7e-2f1f-4a43-9a0e-6f3f2c1d9e10",
            "resourceVersion": "812",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": f"kind://docker/kind/{name}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def request(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    username: str = AGENT,
    extra: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """An admission request for an UPDATE of a Node (a PATCH reaches admission as one)."""
    return {
        "operation": "UPDATE",
        "name": new["metadata"]["name"],
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "userInfo": {
            "username": username,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_CLAIM: ["gpu-node-1"]} if extra is None else extra,
        },
        "object": new,
        "oldObject": old,
    }


Change = Callable[[dict[str, Any]], None]


def changed(
    change: Change, base: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(old, new): the node before and after `change`; the agent's own previous keys included."""
    old = base if base is not None else node()
    new = copy.deepcopy(old)
    change(new)
    return old, new


def published(prefix: str) -> dict[str, Any]:
    """The node after a first publish under `prefix`."""
    n = node()
    n["metadata"]["labels"] |= {f"{prefix}/count": "8", f"{prefix}/interconnect": "nvswitch"}
    n["metadata"]["annotations"] |= {f"{prefix}/topology": '{"v":1}', f"{prefix}/owned": "x"}
    return n


def set_label(key: str, value: str) -> Change:
    return lambda n: n["metadata"]["labels"].__setitem__(key, value)


def set_annotation(key: str, value: str) -> Change:
    return lambda n: n["metadata"]["annotations"].__setitem__(key, value)


def drop_label(key: str) -> Change:
    return lambda n: n["metadata"]["labels"].pop(key)


def drop_annotation(key: str) -> Change:
    return lambda n: n["metadata"]["annotations"].pop(key)


def publish(prefix: str) -> Change:
    def change(n: dict[str, Any]) -> None:
        n["metadata"]["labels"] |= {f"{prefix}/count": "8", f"{prefix}/nvlink-islands": "1"}
        n["metadata"]["annotations"] |= {f"{prefix}/topology": "{}", f"{prefix}/matrix": "GPU0"}

    return change


@dataclass(frozen=True, slots=True)
class Rendering:
    """A rendered policy, the prefix and the agent username its values were rendered with."""

    policy: PolicyEvaluator
    prefix: str
    agent: str


@pytest.fixture(scope="module", params=["default", "custom prefix"])
def rendering(request: pytest.FixtureRequest) -> Rendering:
    """The policy with default values, and with every option on (another prefix, SA `topo`)."""
    if request.param == "default":
        rendered = render(api_versions=(VAP_API,))
        return Rendering(
            PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", NODE_POLICY)),
            "gpu.topology.io",
            AGENT,
        )
    rendered = render(ALL_ON, api_versions=(VAP_API,))
    return Rendering(
        PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", NODE_POLICY)),
        ALL_ON["agent"]["prefix"],
        f"system:serviceaccount:{NAMESPACE}:{ALL_ON['serviceAccount']['name']}",
    )


ALLOWED: dict[str, Callable[[str], tuple[dict[str, Any], dict[str, Any]]]] = {
    "first publish on its own node adds our labels and annotations": lambda p: changed(publish(p)),
    "its own node, one of our labels changes value": lambda p: changed(
        set_label(f"{p}/count", "4"), published(p)
    ),
    "its own node, a stale key of ours is removed": lambda p: changed(
        drop_label(f"{p}/interconnect"), published(p)
    ),
    "its own node, one of our annotations is rewritten": lambda p: changed(
        set_annotation(f"{p}/topology", '{"v":1,"gpus":[]}'), published(p)
    ),
    "its own node, a no-op update": lambda p: changed(lambda n: None, published(p)),
    "its own node had no labels or annotations at all": lambda p: changed(
        publish(p), {**node(), "metadata": {"name": "gpu-node-1", "labels": {}, "annotations": {}}}
    ),
}

DENIED: dict[str, tuple[Callable[[str], tuple[dict[str, Any], dict[str, Any]]], str]] = {
    "a foreign label is added": (
        lambda p: changed(set_label("nvidia.com/gpu.clique", "x")),
        "only labels under",
    ),
    "a foreign label is changed": (
        lambda p: changed(set_label("nvidia.com/gpu.product", "A100")),
        "only labels under",
    ),
    "a foreign label is removed": (
        lambda p: changed(drop_label("nvidia.com/gpu.present")),
        "only labels under",
    ),
    "a kubernetes.io label is added": (
        lambda p: changed(set_label("node-role.kubernetes.io/control-plane", "")),
        "Kubernetes-reserved namespaces",
    ),
    "a label under a look-alike prefix": (
        lambda p: changed(set_label(f"{p}.evil.example/count", "8")),
        "only labels under",
    ),
    "a label named like the prefix without the slash": (
        lambda p: changed(set_label(f"{p}x/count", "8")),
        "only labels under",
    ),
    "a foreign annotation is added": (
        lambda p: changed(set_annotation("example.com/owner", "me")),
        "only annotations under",
    ),
    "a foreign annotation is changed": (
        lambda p: changed(set_annotation("node.alpha.kubernetes.io/ttl", "30")),
        "Kubernetes-reserved namespaces",
    ),
    "a foreign annotation is removed": (
        lambda p: changed(
            drop_annotation("volumes.kubernetes.io/controller-managed-attach-detach")
        ),
        "Kubernetes-reserved namespaces",
    ),
    "a taint is added": (
        lambda p: changed(
            lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoExecute"})
        ),
        "spec",
    ),
    "the GPU taint is removed": (lambda p: changed(lambda n: n["spec"].pop("taints")), "spec"),
    "the node is cordoned": (
        lambda p: changed(lambda n: n["spec"].__setitem__("unschedulable", True)),
        "spec",
    ),
    "the podCIDR is changed": (
        lambda p: changed(lambda n: n["spec"].__setitem__("podCIDR", "10.0.0.0/8")),
        "spec",
    ),
    "a finalizer is added": (
        lambda p: changed(lambda n: n["metadata"].__setitem__("finalizers", ["example.com/hold"])),
        "finalizers or ownerReferences",
    ),
    "an owner reference is added": (
        lambda p: changed(
            lambda n: n["metadata"].__setitem__(
                "ownerReferences", [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "1"}]
            )
        ),
        "finalizers or ownerReferences",
    ),
}


@pytest.mark.parametrize("case", ALLOWED.keys())
def test_agent_may_change_its_own_keys_on_its_own_node(rendering: Rendering, case: str) -> None:
    evaluator, prefix = rendering.policy, rendering.prefix
    old, new = ALLOWED[case](prefix)
    decision = evaluator.admit(request(old, new, username=rendering.agent))
    assert decision == Decision(allowed=True, applies=True)


@pytest.mark.parametrize("case", DENIED.keys())
def test_agent_may_not_touch_anything_else(rendering: Rendering, case: str) -> None:
    evaluator, prefix = rendering.policy, rendering.prefix
    make, reason = DENIED[case]
    old, new = make(prefix)
    decision = evaluator.admit(request(old, new, username=rendering.agent))
    assert not decision.allowed
    assert reason in decision.message


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({NODE_CLAIM: ["gpu-node-2"]}, "another node"),
        ({}, "a token without the node-name claim"),
        ({NODE_CLAIM: []}, "an empty node-name claim"),
        ({NODE_CLAIM: ["gpu-node-1", "gpu-node-2"]}, "a claim naming two nodes"),
    ],
    ids=["another node", "no node claim", "an empty node claim", "a claim naming two nodes"],
)
def test_agent_may_change_only_the_node_named_by_its_token(
    rendering: Rendering, extra: dict[str, list[str]], reason: str
) -> None:
    evaluator, prefix = rendering.policy, rendering.prefix
    old, new = changed(publish(prefix))
    decision = evaluator.admit(request(old, new, username=rendering.agent, extra=extra))
    assert not decision.allowed, reason
    assert "only the Node its pod runs on" in decision.message


def test_other_users_are_not_judged_by_this_policy(rendering: Rendering) -> None:
    evaluator = rendering.policy
    old, new = changed(lambda n: n["spec"].__setitem__("unschedulable", True))
    for user in ("system:node:gpu-node-1", "kubernetes-admin", "system:serviceaccount:other:tr"):
        assert evaluator.admit(request(old, new, username=user)) == Decision(
            allowed=True, applies=False
        )


def test_policy_prefix_is_the_configured_prefix_with_its_slash(
    rendering: Rendering,
) -> None:
    evaluator, prefix = rendering.policy, rendering.prefix
    assert f'"{prefix}/"' in evaluator.expressions


def _calls_and_roots(tree: Tree[Token]) -> tuple[set[str], set[str], set[str]]:
    """(functions called, root identifiers, comprehension variables) in a parsed expression."""
    calls: set[str] = set()
    roots: set[str] = set()
    loop_vars: set[str] = set()
    for sub in tree.iter_subtrees():
        if sub.data == "ident_arg":
            calls.add(str(sub.children[0]))
        elif sub.data == "member_dot_arg":
            name = str(sub.children[1])
            calls.add(name)
            if name in {"all", "exists", "exists_one", "map", "filter"}:
                first_arg = sub.children[2].children[0]  # type: ignore[union-attr]
                loop_vars |= {str(t) for t in first_arg.scan_values(lambda v: isinstance(v, Token))}  # type: ignore[union-attr]
        elif sub.data == "ident":
            roots.add(str(sub.children[0]))
    return calls, roots, loop_vars


def test_expressions_use_only_standard_cel_and_admission_variables(
    rendering: Rendering,
) -> None:
    evaluator = rendering.policy
    env = celpy.Environment()
    for expression in evaluator.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)


RESERVED_KEYS = (
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node-role.kubernetes.io/control-plane",
    "node.kubernetes.io/instance-type",
    "k8s.io/x",
    "topology.k8s.io/zone",
)


def _reserved_prefix_policy(prefix: str) -> PolicyEvaluator:
    """The policy as `helm install --skip-schema-validation --set agent.prefix=...` renders it.

    The values schema refuses a reserved prefix, so the chart cannot render one here; the policy
    puts agent.prefix into one variable, which this sets as the template would have.
    """
    rendered = render(api_versions=(VAP_API,))
    policy = copy.deepcopy(rendered.named("ValidatingAdmissionPolicy", NODE_POLICY))
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "prefix"]
    variable["expression"] = f'"{prefix}/"'
    return PolicyEvaluator(policy)


@pytest.mark.parametrize("prefix", ["kubernetes.io", "node.kubernetes.io", "k8s.io"])
@pytest.mark.parametrize(
    "change",
    ["add", "change", "remove"],
    ids=["a reserved key added", "a reserved key changed", "a reserved key removed"],
)
@pytest.mark.parametrize("section", ["labels", "annotations"])
def test_reserved_keys_are_denied_even_when_the_prefix_is_reserved(
    prefix: str, change: str, section: str
) -> None:
    evaluator = _reserved_prefix_policy(prefix)
    old = node()
    old["metadata"][section] |= {k: "old" for k in RESERVED_KEYS if k.startswith(prefix)}
    for key in (k for k in RESERVED_KEYS if k.startswith(prefix) or change == "add"):
        new = copy.deepcopy(old)
        values = new["metadata"][section]
        if change == "add":
            old["metadata"][section].pop(key, None)
            values[key] = "new"
        elif change == "change":
            values[key] = "new"
        else:
            values.pop(key)
        decision = evaluator.admit(request(old, new))
        assert not decision.allowed, (key, change)
        assert "Kubernetes-reserved namespaces" in decision.message


def test_the_agent_deleting_what_an_edited_owned_list_names_is_denied() -> None:
    """The attack of issue 11: prefix kubernetes.io, `owned` edited to list the kubelet's labels."""
    evaluator = _reserved_prefix_policy("kubernetes.io")
    old = node()
    old["metadata"]["labels"] |= {"kubernetes.io/arch": "amd64"}
    old["metadata"]["annotations"]["kubernetes.io/owned"] = (
        "kubernetes.io/hostname,kubernetes.io/os,kubernetes.io/arch"
    )
    new = copy.deepcopy(old)
    for key in ("kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"):
        new["metadata"]["labels"].pop(key)
    assert not evaluator.admit(request(old, new)).allowed


def test_a_prefix_that_only_ends_like_a_reserved_domain_is_not_reserved(
    rendering: Rendering,
) -> None:
    """`notkubernetes.io` and `kubernetes.io.example.com` are someone's own domains."""
    evaluator = _reserved_prefix_policy("notkubernetes.io")
    old, new = changed(publish("notkubernetes.io"))
    assert evaluator.admit(request(old, new)).allowed
    evaluator = _reserved_prefix_policy("kubernetes.io.example.com")
    old, new = changed(publish("kubernetes.io.example.com"))
    assert evaluator.admit(request(old, new)).allowed


# --- The agent's own taint (fabric.taintUnhealthy) -----------------------------------------------

TAINT_VALUES = {"fabric": {"taintUnhealthy": True}}


@pytest.fixture(scope="module", params=["default", "custom prefix"])
def taint_rendering(request: pytest.FixtureRequest) -> Rendering:
    """The policy with `fabric.taintUnhealthy` on: the default values, and every option on."""
    values = TAINT_VALUES if request.param == "default" else {**ALL_ON, **TAINT_VALUES}
    rendered = render(values, api_versions=(VAP_API,))
    prefix = ALL_ON["agent"]["prefix"] if request.param != "default" else "gpu.topology.io"
    account = ALL_ON["serviceAccount"]["name"] if request.param != "default" else FULLNAME
    return Rendering(
        PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", NODE_POLICY)),
        prefix,
        f"system:serviceaccount:{NAMESPACE}:{account}",
    )


def own_taint(prefix: str, value: str = "unhealthy", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": f"{prefix}/fabric-health", "value": value, "effect": effect}


def tainted(prefix: str) -> dict[str, Any]:
    n = published(prefix)
    n["spec"]["taints"].append(own_taint(prefix))
    return n


def set_taints(*taints: dict[str, str]) -> Change:
    return lambda n: n["spec"].__setitem__("taints", list(taints))


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

TAINT_ALLOWED: dict[str, Callable[[str], tuple[dict[str, Any], dict[str, Any]]]] = {
    "its own taint is added after the others": lambda p: changed(
        set_taints(GPU_TAINT, own_taint(p)), published(p)
    ),
    "its own taint changes value": lambda p: changed(
        set_taints(GPU_TAINT, own_taint(p, "degraded")), tainted(p)
    ),
    "its own taint is removed": lambda p: changed(set_taints(GPU_TAINT), tainted(p)),
    "its own taint is added to a node without taints": lambda p: changed(
        set_taints(own_taint(p)), {**published(p), "spec": {}}
    ),
    "the last taint, its own, is removed (the field goes)": lambda p: changed(
        lambda n: n["spec"].pop("taints"), {**tainted(p), "spec": {"taints": [own_taint(p)]}}
    ),
    "labels and its own taint change together": lambda p: changed(
        lambda n: (
            set_label(f"{p}/fabric-health", "unhealthy")(n),
            n["spec"]["taints"].append(own_taint(p)),
        ),
        published(p),
    ),
    "a no-op update of a tainted node": lambda p: changed(lambda n: None, tainted(p)),
}

TAINT_DENIED: dict[str, tuple[Callable[[str], tuple[dict[str, Any], dict[str, Any]]], str]] = {
    "a foreign taint is added": (
        lambda p: changed(
            set_taints(GPU_TAINT, {"key": "x", "effect": "NoSchedule"}), published(p)
        ),
        "only its own taint",
    ),
    "a foreign taint is removed": (
        lambda p: changed(set_taints(), published(p)),
        "only its own taint",
    ),
    "a foreign taint changes value": (
        lambda p: changed(set_taints({**GPU_TAINT, "value": "gone"}), published(p)),
        "only its own taint",
    ),
    "a foreign taint is replaced by its own": (
        lambda p: changed(set_taints(own_taint(p)), published(p)),
        "only its own taint",
    ),
    "its own key with NoExecute (evicting pods)": (
        lambda p: changed(set_taints(GPU_TAINT, own_taint(p, effect="NoExecute")), published(p)),
        "only its own taint",
    ),
    "its own key twice, the second NoExecute": (
        lambda p: changed(
            set_taints(GPU_TAINT, own_taint(p), own_taint(p, effect="NoExecute")), published(p)
        ),
        "only its own taint",
    ),
    "a look-alike key under another prefix": (
        lambda p: changed(
            set_taints(GPU_TAINT, {**own_taint(p), "key": f"{p}x/fabric-health"}), published(p)
        ),
        "only its own taint",
    ),
    "another key under its own prefix": (
        lambda p: changed(
            set_taints(GPU_TAINT, {**own_taint(p), "key": f"{p}/evict"}), published(p)
        ),
        "only its own taint",
    ),
    "the node is cordoned with its taint": (
        lambda p: changed(
            lambda n: (
                n["spec"]["taints"].append(own_taint(p)),
                n["spec"].__setitem__("unschedulable", True),
            ),
            published(p),
        ),
        "spec",
    ),
    "the podCIDR is changed": (
        lambda p: changed(lambda n: n["spec"].__setitem__("podCIDR", "10.0.0.0/8"), published(p)),
        "spec",
    ),
    "the providerID is removed": (
        lambda p: changed(lambda n: n["spec"].pop("providerID"), published(p)),
        "spec",
    ),
    "the spec goes entirely": (lambda p: changed(lambda n: n.pop("spec"), published(p)), "spec"),
    "a foreign label with its taint": (
        lambda p: changed(
            lambda n: (set_label("team", "x")(n), n["spec"]["taints"].append(own_taint(p))),
            published(p),
        ),
        "only labels under",
    ),
}


@pytest.mark.parametrize("case", TAINT_ALLOWED.keys())
def test_opted_in_the_agent_may_set_and_clear_its_own_taint(
    taint_rendering: Rendering, case: str
) -> None:
    old, new = TAINT_ALLOWED[case](taint_rendering.prefix)
    decision = taint_rendering.policy.admit(request(old, new, username=taint_rendering.agent))
    assert decision == Decision(allowed=True, applies=True)


@pytest.mark.parametrize("case", TAINT_DENIED.keys())
def test_opted_in_the_agent_may_touch_no_other_taint_nor_spec(
    taint_rendering: Rendering, case: str
) -> None:
    make, reason = TAINT_DENIED[case]
    old, new = make(taint_rendering.prefix)
    decision = taint_rendering.policy.admit(request(old, new, username=taint_rendering.agent))
    assert not decision.allowed
    assert reason in decision.message


def test_opted_in_its_own_taint_on_another_node_is_denied(taint_rendering: Rendering) -> None:
    old, new = TAINT_ALLOWED["its own taint is added after the others"](taint_rendering.prefix)
    extra = {NODE_CLAIM: ["gpu-node-2"]}
    decision = taint_rendering.policy.admit(
        request(old, new, username=taint_rendering.agent, extra=extra)
    )
    assert not decision.allowed
    assert "only the Node its pod runs on" in decision.message


def test_not_opted_in_its_own_taint_is_denied(rendering: Rendering) -> None:
    old, new = TAINT_ALLOWED["its own taint is added after the others"](rendering.prefix)
    decision = rendering.policy.admit(request(old, new, username=rendering.agent))
    assert not decision.allowed
    assert "may not change a Node's spec" in decision.message


def test_fabric_taint_policy_expressions_use_only_standard_cel_and_admission_variables(
    taint_rendering: Rendering,
) -> None:
    env = celpy.Environment()
    for expression in taint_rendering.policy.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)


# --- managedFields: no server-side-apply manager gains a field ------------------------------------


def managed(prefix: str, *, operator_labels: tuple[str, ...]) -> dict[str, Any]:
    """The published node with managedFields: the kubelet's Update entry, a controller's Apply
    entry owning `operator_labels`, the agent's Update entry owning its keys."""
    n = published(prefix)
    n["metadata"]["labels"] |= dict.fromkeys(operator_labels, "x")

    def labels(*keys: str) -> dict[str, Any]:
        return {"f:metadata": {"f:labels": {f"f:{k}": {} for k in keys}}}

    n["metadata"]["managedFields"] = [
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
         "fieldsV1": labels("kubernetes.io/hostname"), "fieldsType": "FieldsV1"},
        {"manager": "gpu-operator", "operation": "Apply", "apiVersion": "v1",
         "fieldsV1": labels(*operator_labels), "fieldsType": "FieldsV1"},
        {"manager": "topo-reporter", "operation": "Update", "apiVersion": "v1",
         "fieldsV1": labels(f"{prefix}/count", f"{prefix}/interconnect"), "fieldsType": "FieldsV1"},
    ]  # fmt: skip
    return n


def _applied_labels(n: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [m for m in n["metadata"]["managedFields"] if m["operation"] == "Apply"]
    labels: dict[str, Any] = entry["fieldsV1"]["f:metadata"]["f:labels"]
    return labels


@pytest.fixture(scope="module", params=["default", "fabric taint"])
def node_policy(request: pytest.FixtureRequest) -> PolicyEvaluator:
    values = {} if request.param == "default" else TAINT_VALUES
    rendered = render(values, api_versions=(VAP_API,))
    return PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", f"{FULLNAME}-own-node"))


def _take_over(key: str) -> Change:
    """What the server does when the agent writes `key`, which the Apply entry owned."""

    def change(n: dict[str, Any]) -> None:
        n["metadata"]["labels"][key] = "8"
        _applied_labels(n).pop(f"f:{key}")

    return change


def _hand_over(key: str) -> Change:
    """A patch carrying managedFields that give the Apply entry `key` too."""
    return lambda n: _applied_labels(n).__setitem__(f"f:{key}", {})


def _drop_applied(n: dict[str, Any]) -> None:
    n["metadata"]["managedFields"] = [
        m for m in n["metadata"]["managedFields"] if m["operation"] != "Apply"
    ]


def _new_applier(n: dict[str, Any]) -> None:
    n["metadata"]["managedFields"].append(
        {"manager": "scheduler-x", "operation": "Apply", "apiVersion": "v1",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}, "fieldsType": "FieldsV1"}
    )  # fmt: skip


P = "gpu.topology.io"
MANAGED_ALLOWED = {
    "the agent's write takes a key under its prefix from the applied set": (
        ("example.com/a", f"{P}/count"),
        _take_over(f"{P}/count"),
    ),
    "the applied set's last key, under the prefix, taken: its entry goes": (
        (f"{P}/count",),
        lambda n: (_take_over(f"{P}/count")(n), _drop_applied(n)),
    ),
    "managedFields unchanged": (("example.com/a",), publish(P)),
}
MANAGED_DENIED = {
    "a foreign label handed to the applied set": (("example.com/a",), _hand_over("team")),
    "a key under the prefix handed to the applied set": (("example.com/a",), _hand_over(f"{P}/x")),
    "an applied set made for a manager that had none": (("example.com/a",), _new_applier),
    "a foreign label taken from the applied set": (
        ("example.com/a", "example.com/b"),
        lambda n: _applied_labels(n).pop("f:example.com/b"),
    ),
    "an applied set of foreign labels dropped": (("example.com/a",), _drop_applied),
}


@pytest.mark.parametrize("case", MANAGED_ALLOWED.keys())
def test_managed_fields_change_only_as_the_agents_own_write_changes_them(
    node_policy: PolicyEvaluator, case: str
) -> None:
    operator, change = MANAGED_ALLOWED[case]
    old, new = changed(change, managed(P, operator_labels=operator))
    assert node_policy.admit(request(old, new)) == Decision(True, True)


@pytest.mark.parametrize("case", MANAGED_DENIED.keys())
def test_the_agent_may_not_hand_fields_to_a_server_side_apply_manager(
    node_policy: PolicyEvaluator, case: str
) -> None:
    operator, change = MANAGED_DENIED[case]
    old, new = changed(change, managed(P, operator_labels=operator))
    decision = node_policy.admit(request(old, new))
    assert not decision.allowed
    assert "may not hand fields to a server-side-apply manager" in decision.message


def test_an_applied_set_may_lose_the_agents_taint_only_with_the_fabric_taint_on(
    node_policy: PolicyEvaluator,
) -> None:
    base = managed(P, operator_labels=("example.com/a",))
    (entry,) = [m for m in base["metadata"]["managedFields"] if m["operation"] == "Apply"]
    element = f'k:{{"effect":"NoSchedule","key":"{P}/fabric-health"}}'
    entry["fieldsV1"]["f:spec"] = {"f:taints": {".": {}, element: {}}}
    base["spec"]["taints"].append({"key": f"{P}/fabric-health", "effect": "NoSchedule"})

    def untaint(n: dict[str, Any]) -> None:
        n["spec"]["taints"] = [t for t in n["spec"]["taints"] if t["key"] != f"{P}/fabric-health"]
        (applied,) = [m for m in n["metadata"]["managedFields"] if m["operation"] == "Apply"]
        applied["fieldsV1"]["f:spec"]["f:taints"].pop(element)

    old, new = changed(untaint, base)
    taint_on = any("f:spec" in e for e in node_policy.expressions)
    assert node_policy.admit(request(old, new)).allowed is taint_on


# --- The NodeResourceTopology policy (nrt.enabled) ----------------------------------------------

NRT_VALUES = {"availability": {"enabled": True}, "nrt": {"enabled": True}}


@pytest.fixture(scope="module")
def nrt_policy() -> PolicyEvaluator:
    rendered = render(NRT_VALUES, api_versions=(VAP_API,))
    (policy,) = [
        p
        for p in rendered.of_kind("ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == f"{FULLNAME}-own-nrt"
    ]
    return PolicyEvaluator(policy)


def nrt_request(
    operation: str, name: str, *, username: str = AGENT, claim: list[str] | None = None
) -> dict[str, Any]:
    """A create or update of the NodeResourceTopology `name` (oldObject null on a create), labelled
    as the agent labels it (its prefix's owner label included)."""
    obj = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "labels": own_labels(name, keys.DEFAULT_PREFIX)},
        "zones": [],
    }
    return {
        "operation": operation,
        "name": name,
        "resource": {
            "group": "topology.node.k8s.io",
            "version": "v1alpha2",
            "resource": "noderesourcetopologies",
        },
        "userInfo": {
            "username": username,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_CLAIM: ["gpu-node-1"] if claim is None else claim},
        },
        "object": obj,
        "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
    }


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_the_agent_may_write_the_nrt_of_its_own_node(
    nrt_policy: PolicyEvaluator, operation: str
) -> None:
    assert nrt_policy.admit(nrt_request(operation, "gpu-node-1")) == Decision(True, True)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize(
    ("name", "claim"),
    [("gpu-node-2", None), ("gpu-node-1", []), ("gpu-node-1", ["gpu-node-1", "gpu-node-2"])],
    ids=["another node's", "a token without the node claim", "a token naming two nodes"],
)
def test_the_agent_may_not_write_any_other_nrt(
    nrt_policy: PolicyEvaluator, operation: str, name: str, claim: list[str] | None
) -> None:
    decision = nrt_policy.admit(nrt_request(operation, name, claim=claim))
    assert decision.applies
    assert not decision.allowed
    assert "only the NodeResourceTopology of the Node its pod runs on" in decision.message


def test_other_producers_are_not_judged_by_the_nrt_policy(nrt_policy: PolicyEvaluator) -> None:
    other = "system:serviceaccount:node-feature-discovery:nfd-topology-updater"
    decision = nrt_policy.admit(nrt_request("UPDATE", "gpu-node-2", username=other))
    assert decision == Decision(allowed=True, applies=False)


def test_nrt_policy_expressions_use_only_standard_cel_and_admission_variables(
    nrt_policy: PolicyEvaluator,
) -> None:
    env = celpy.Environment()
    for expression in nrt_policy.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)


# --- The heartbeat Lease policy (availability.heartbeat.enabled) ---------------------------------

HEARTBEAT_VALUES = {"availability": {"enabled": True}}
"""Availability on; its heartbeat is on by default."""


@pytest.fixture(scope="module")
def lease_policy() -> PolicyEvaluator:
    rendered = render(HEARTBEAT_VALUES, api_versions=(VAP_API,))
    (policy,) = [
        p
        for p in rendered.of_kind("ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == f"{FULLNAME}-own-lease"
    ]
    return PolicyEvaluator(policy)


def lease_request(
    operation: str,
    name: str,
    *,
    holder: str | None = "gpu-node-1",
    username: str = AGENT,
    claim: list[str] | None = None,
    duration: int | None = 40,
) -> dict[str, Any]:
    """A create or update of the Lease `name` held by `holder` (oldObject null on a create)."""
    spec: dict[str, Any] = {"renewTime": "2026-01-01T00:00:00.000000Z"}
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    if holder is not None:
        spec["holderIdentity"] = holder
    obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }
    return {
        "operation": operation,
        "name": name,
        "namespace": NAMESPACE,
        "resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
        "userInfo": {
            "username": username,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_CLAIM: ["gpu-node-1"] if claim is None else claim},
        },
        "object": obj,
        "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
    }


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_the_agent_may_write_the_lease_of_its_own_node_held_by_it(
    lease_policy: PolicyEvaluator, operation: str
) -> None:
    assert lease_policy.admit(lease_request(operation, "gpu-node-1")) == Decision(True, True)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize(
    ("name", "holder", "claim"),
    [
        ("gpu-node-2", "gpu-node-2", None),
        ("gpu-node-1", "gpu-node-2", None),
        ("gpu-node-1", None, None),
        ("gpu-node-1", "gpu-node-1", []),
        ("gpu-node-1", "gpu-node-1", ["gpu-node-1", "gpu-node-2"]),
    ],
    ids=[
        "another node's",
        "its own, held by another node",
        "its own, held by nobody",
        "a token without the node claim",
        "a token naming two nodes",
    ],
)
def test_the_agent_may_not_write_any_other_lease(
    lease_policy: PolicyEvaluator,
    operation: str,
    name: str,
    holder: str | None,
    claim: list[str] | None,
) -> None:
    decision = lease_policy.admit(lease_request(operation, name, holder=holder, claim=claim))
    assert decision.applies
    assert not decision.allowed
    assert "only the heartbeat Lease of the Node its pod runs on" in decision.message


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize(
    "duration", [86400, 41, 0, None], ids=["a day", "a second past the chart's", "zero", "none"]
)
def test_the_agent_may_not_make_its_lease_vouch_longer_than_the_chart_says(
    lease_policy: PolicyEvaluator, operation: str, duration: int | None
) -> None:
    decision = lease_policy.admit(lease_request(operation, "gpu-node-1", duration=duration))
    assert decision.applies
    assert not decision.allowed
    assert "leaseDurationSeconds of 1 to 40 (availability.heartbeat.duration 40s)" in (
        decision.message
    )


@pytest.mark.parametrize(
    ("duration", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h", 3600)]
)
def test_the_lease_duration_bound_is_the_charts_duration_in_seconds(
    duration: str, seconds: int
) -> None:
    values = {"availability": {"enabled": True, "heartbeat": {"duration": duration}}}
    rendered = render(values, api_versions=(VAP_API,))
    policy = PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", f"{FULLNAME}-own-lease"))
    own = "gpu-node-1"
    assert policy.admit(lease_request("UPDATE", own, duration=seconds)).allowed
    assert not policy.admit(lease_request("UPDATE", own, duration=seconds + 1)).allowed


def test_other_writers_of_leases_are_not_judged_by_the_lease_policy(
    lease_policy: PolicyEvaluator,
) -> None:
    kubelet = "system:node:gpu-node-2"
    decision = lease_policy.admit(lease_request("UPDATE", "gpu-node-2", username=kubelet))
    assert decision == Decision(allowed=True, applies=False)


def test_lease_policy_expressions_use_only_standard_cel_and_admission_variables(
    lease_policy: PolicyEvaluator,
) -> None:
    env = celpy.Environment()
    for expression in lease_policy.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)


# --- The DeviceTaintRule policy (dra.deviceTaints) -----------------------------------------------


@pytest.fixture(scope="module")
def taint_policy() -> PolicyEvaluator:
    rendered = render({"dra": {"deviceTaints": True}}, api_versions=(VAP_API,))
    (policy,) = [
        p
        for p in rendered.of_kind("ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == f"{FULLNAME}-own-device-taints"
    ]
    return PolicyEvaluator(policy)


def taint_rule(
    node: str = "gpu-node-1", change: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The rule the agent on `node` writes for its gpu-1 (reporter.schema.dra.rule), then
    `change`d."""
    rule = dra.rule(
        dra.DeviceTaint(1, "gpu-1", dra.REASON_LOST),
        node=node,
        prefix="gpu.topology.io",
        version="v1alpha3",
    )
    if change is not None:
        change(rule)
    return rule


def _selector(**fields: str | None) -> Callable[[dict[str, Any]], None]:
    """Set (a value) or drop (None) fields of the rule's device selector."""

    def change(rule: dict[str, Any]) -> None:
        selector = rule["spec"]["deviceSelector"]
        for field, value in fields.items():
            if value is None:
                selector.pop(field, None)
            else:
                selector[field] = value

    return change


def _set(path: str | tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """Set (or with None drop) the field at `path` of the rule (dotted, or its parts)."""

    def change(rule: dict[str, Any]) -> None:
        *parents, last = path.split(".") if isinstance(path, str) else path
        here = rule
        for part in parents:
            here = here[part]
        if value is None:
            here.pop(last, None)
        else:
            here[last] = value

    return change


def taint_request(
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    *,
    username: str = AGENT,
    claim: list[str] | None = None,
) -> dict[str, Any]:
    """A create (no oldObject), update or delete (no object) of a DeviceTaintRule."""
    return {
        "operation": operation,
        "name": (new or old or {}).get("metadata", {}).get("name"),
        "resource": {
            "group": "resource.k8s.io",
            "version": "v1alpha3",
            "resource": "devicetaintrules",
        },
        "userInfo": {
            "username": username,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_CLAIM: ["gpu-node-1"] if claim is None else claim},
        },
        "object": new,
        "oldObject": old,
    }


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        ("CREATE", taint_rule(), None),
        ("DELETE", None, taint_rule()),
        ("UPDATE", taint_rule(change=_set("spec.taint.value", "nvlink-down")), taint_rule()),
    ],
    ids=["create", "delete", "update"],
)
def test_the_agent_may_write_the_rules_it_writes_for_its_own_node(
    taint_policy: PolicyEvaluator,
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
) -> None:
    assert taint_policy.admit(taint_request(operation, new, old)) == Decision(True, True)


QUARANTINE = taint_rule(
    change=lambda r: (
        _set("metadata.name", "quarantine-gpu-1")(r),
        _set("metadata.labels", None)(r),
        _set("spec.taint", {"key": "example.com/quarantine", "effect": "NoExecute"})(r),
    )
)
"""An administrator's quarantine of gpu-1 of the agent's own node, evicting its pods."""

DENIED_WRITES = [
    ("another node's rule", taint_rule("gpu-node-2"), None),
    (
        "another node's rule name in its own pool (a squat)",
        taint_rule(change=_set("metadata.name", "topo-reporter.gpu-node-2.gpu-1")),
        None,
    ),
    (
        "a name that is not the device's",
        taint_rule(change=_set("metadata.name", "topo-reporter.gpu-node-1.gpu-2")),
        None,
    ),
    ("a name of its own choosing", taint_rule(change=_set("metadata.name", "mine")), None),
    ("without its labels", taint_rule(change=_set("metadata.labels", None)), None),
    (
        "labelled for another node",
        taint_rule(change=_set(("metadata", "labels", "gpu.topology.io/node"), "gpu-node-2")),
        None,
    ),
    ("without a pool: every pool's device", taint_rule(change=_selector(pool=None)), None),
    ("without a selector", taint_rule(change=_set("spec.deviceSelector", None)), None),
    ("without a driver: every driver's", taint_rule(change=_selector(driver=None)), None),
    ("another driver", taint_rule(change=_selector(driver="rdma.example.com")), None),
    ("without a device: the whole pool", taint_rule(change=_selector(device=None)), None),
    (
        "a device that is not a whole GPU",
        taint_rule(change=_selector(device="gpu-1-mig-1g10gb-0-0")),
        None,
    ),
    ("a device class", taint_rule(change=_selector(deviceClassName="gpu.nvidia.com")), None),
    ("a CEL selector", taint_rule(change=_set("spec.deviceSelector.selectors", [{}])), None),
    ("effect NoExecute", taint_rule(change=_set("spec.taint.effect", "NoExecute")), None),
    ("without an effect", taint_rule(change=_set("spec.taint.effect", None)), None),
    ("another taint key", taint_rule(change=_set("spec.taint.key", "example.com/x")), None),
    ("without a taint", taint_rule(change=_set("spec.taint", None)), None),
]


@pytest.mark.parametrize(
    ("new", "claim"),
    [(new, None) for _, new, _ in DENIED_WRITES]
    + [(taint_rule(), []), (taint_rule(), ["gpu-node-1", "gpu-node-2"])],
    ids=[f"create {what}" for what, _, _ in DENIED_WRITES]
    + ["a token without the node claim", "a token naming two nodes"],
)
def test_the_agent_may_create_only_the_rules_it_writes_for_its_own_node(
    taint_policy: PolicyEvaluator, new: dict[str, Any], claim: list[str] | None
) -> None:
    decision = taint_policy.admit(taint_request("CREATE", new, None, claim=claim))
    assert decision.applies
    assert not decision.allowed
    assert "may write only DeviceTaintRules of the Node its pod runs on" in decision.message


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [("DELETE", None, old) for _, old, _ in DENIED_WRITES]
    + [
        ("DELETE", None, QUARANTINE),
        ("UPDATE", taint_rule(), taint_rule("gpu-node-2")),
        ("UPDATE", taint_rule(), QUARANTINE),
    ],
    ids=[f"delete {what}" for what, _, _ in DENIED_WRITES]
    + [
        "delete an administrator's NoExecute quarantine in its own pool",
        "take over another node's rule",
        "turn an administrator's quarantine into its own rule",
    ],
)
def test_the_agent_may_delete_or_change_only_the_rules_it_writes_for_its_own_node(
    taint_policy: PolicyEvaluator,
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any],
) -> None:
    decision = taint_policy.admit(taint_request(operation, new, old))
    assert decision.applies
    assert not decision.allowed
    assert "may change or delete only DeviceTaintRules it wrote" in decision.message


def test_the_agent_may_not_move_its_rule_to_another_node(taint_policy: PolicyEvaluator) -> None:
    decision = taint_policy.admit(taint_request("UPDATE", taint_rule("gpu-node-2"), taint_rule()))
    assert not decision.allowed
    assert "may write only DeviceTaintRules of the Node its pod runs on" in decision.message


def test_other_writers_of_rules_are_not_judged_by_the_taint_policy(
    taint_policy: PolicyEvaluator,
) -> None:
    other = "system:serviceaccount:nvidia-dra-driver:gpu-kubelet-plugin"
    decision = taint_policy.admit(
        taint_request("CREATE", taint_rule("gpu-node-2"), None, username=other)
    )
    assert decision == Decision(allowed=True, applies=False)


def test_taint_policy_expressions_use_only_standard_cel_and_admission_variables(
    taint_policy: PolicyEvaluator,
) -> None:
    env = celpy.Environment()
    for expression in taint_policy.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)


# --- The Event policy (issue 28 item 9) ----------------------------------------------------------


@pytest.fixture(scope="module")
def event_policy() -> PolicyEvaluator:
    rendered = render({}, api_versions=(VAP_API,))
    (policy,) = [
        p
        for p in rendered.of_kind("ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == f"{FULLNAME}-own-events"
    ]
    return PolicyEvaluator(policy)


def agent_event(
    about: str = "gpu-node-1", change: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The Event the agent posts about Node `about` (reporter.publish.client.event_body), then
    `change`d."""
    body = event_body(
        NodeMetadata(name=about, uid="5b0b7c7e-2f1f-4a43-9a0e-6f3f2c1d9e10"),
        EventType.WARNING,
        "GPUTopologyDegraded",
        "nvml failed",
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    body["apiVersion"], body["kind"] = "v1", "Event"
    body["metadata"] = {"name": f"{about}.1", "namespace": "default"}
    if change is not None:
        change(body)
    return body


def event_request(
    new: dict[str, Any],
    *,
    operation: str = "CREATE",
    username: str = AGENT,
    claim: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "operation": operation,
        "name": new["metadata"]["name"],
        "namespace": "default",
        "resource": {"group": "", "version": "v1", "resource": "events"},
        "userInfo": {
            "username": username,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {NODE_CLAIM: ["gpu-node-1"] if claim is None else claim},
        },
        "object": new,
        "oldObject": copy.deepcopy(new) if operation == "UPDATE" else None,
    }


def _event_field(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(event: dict[str, Any]) -> None:
        here = event
        for part in path[:-1]:
            here = here[part]
        if value is None:
            here.pop(path[-1], None)
        else:
            here[path[-1]] = value

    return change


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize(
    "event",
    [
        agent_event(),
        agent_event(change=_event_field("reportingInstance", value=None)),
        agent_event(change=_event_field("source", value=None)),
    ],
    ids=["as the agent posts it", "without reportingInstance", "without source"],
)
def test_the_agent_may_post_events_about_its_own_node(
    event_policy: PolicyEvaluator, event: dict[str, Any], operation: str
) -> None:
    assert event_policy.admit(event_request(event, operation=operation)) == Decision(True, True)


@pytest.mark.parametrize(
    ("event", "claim", "message"),
    [
        (agent_event("gpu-node-2"), None, "only about the Node its pod runs on"),
        (
            agent_event(change=_event_field("involvedObject", "kind", value="Pod")),
            None,
            "only about the Node its pod runs on",
        ),
        (
            agent_event(change=_event_field("involvedObject", "namespace", value="default")),
            None,
            "only about the Node its pod runs on",
        ),
        (
            agent_event(
                change=_event_field(
                    "related", value={"kind": "Node", "name": "gpu-node-2", "apiVersion": "v1"}
                )
            ),
            None,
            "only about the Node its pod runs on",
        ),
        (agent_event(), [], "only about the Node its pod runs on"),
        (agent_event(), ["gpu-node-1", "gpu-node-2"], "only about the Node its pod runs on"),
        (
            agent_event(change=_event_field("reportingInstance", value="gpu-node-2")),
            None,
            "reported only by the Node its pod runs on",
        ),
        (
            agent_event(change=_event_field("source", "host", value="gpu-node-2")),
            None,
            "reported only by the Node its pod runs on",
        ),
    ],
    ids=[
        "about another node",
        "about a Pod of the node's name",
        "about a namespaced object of the node's name",
        "naming another node as related",
        "a token without the node claim",
        "a token naming two nodes",
        "reported by another node's instance",
        "from another node's host",
    ],
)
def test_the_agent_may_not_post_events_about_or_from_another_node(
    event_policy: PolicyEvaluator, event: dict[str, Any], claim: list[str] | None, message: str
) -> None:
    decision = event_policy.admit(event_request(event, claim=claim))
    assert decision.applies
    assert not decision.allowed
    assert message in decision.message


def test_other_writers_of_events_are_not_judged_by_the_event_policy(
    event_policy: PolicyEvaluator,
) -> None:
    kubelet = "system:node:gpu-node-2"
    decision = event_policy.admit(event_request(agent_event("gpu-node-2"), username=kubelet))
    assert decision == Decision(allowed=True, applies=False)


def test_event_policy_expressions_use_only_standard_cel_and_admission_variables(
    event_policy: PolicyEvaluator,
) -> None:
    env = celpy.Environment()
    for expression in event_policy.expressions:
        calls, roots, loop_vars = _calls_and_roots(env.compile(expression))
        assert calls <= STANDARD_CEL, (expression, calls - STANDARD_CEL)
        assert roots - loop_vars <= ADMISSION_ROOTS, (expression, roots)
