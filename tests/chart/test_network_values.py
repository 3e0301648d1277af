"""The chart's network values: `network.lldp.enabled` (the host's network and NET_RAW),
`network.infiniband.enabled` (one unit of the RDMA device plugin's resource), both refused
together, and `network.labelStyle: topograph`, which the node and prune admission policies then
admit, Topograph's two tier keys exactly and nothing more."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from reporter.schema import keys
from tests.chart.test_admission_policy import (
    AGENT,
    Decision,
    PolicyEvaluator,
    changed,
    drop_label,
    published,
    request,
    set_label,
)
from tests.support.helm_chart import (
    FULLNAME,
    NAMESPACE,
    NODE_POLICY,
    VAP_API,
    Rendered,
    container,
    env,
    render,
)

NEWEST = kubernetes_validate.utils.latest_version()
LLDP = {"network": {"lldp": {"enabled": True}}}
INFINIBAND = {"network": {"infiniband": {"enabled": True}}}
TOPOGRAPH = {"network": {"labelStyle": "topograph"}}
P = keys.DEFAULT_PREFIX


def _pod(rendered: Rendered) -> dict[str, Any]:
    pod: dict[str, Any] = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize(
    "values",
    [LLDP, INFINIBAND, {**INFINIBAND, **TOPOGRAPH}],
    ids=["lldp", "infiniband", "infiniband, topograph keys"],
)
def test_each_network_render_validates_against_the_kubernetes_schemas(
    values: dict[str, Any],
) -> None:
    values = {"network": {k: v for d in values.values() for k, v in d.items()}}
    for obj in render(values, api_versions=(VAP_API,), kube_version=NEWEST).everything():
        if obj["kind"] not in {"ServiceMonitor", "PrometheusRule"}:
            kubernetes_validate.validate(obj, NEWEST, strict=True)


def test_off_by_default_no_host_network_no_device_no_capability() -> None:
    rendered = render()
    assert not _pod(rendered).get("hostNetwork", False)
    assert container(rendered)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    limits = (container(rendered).get("resources") or {}).get("limits") or {}
    assert "rdma/hca_shared_devices_a" not in limits
    variables = env(rendered)
    assert "TOPO_REPORTER_NETWORK_LLDP" not in variables
    assert "TOPO_REPORTER_NETWORK_INFINIBAND" not in variables
    assert variables["TOPO_REPORTER_NETWORK_LABEL_STYLE"] == "topo-reporter"


def test_lldp_runs_on_the_hosts_network_as_root_with_net_raw_only() -> None:
    rendered = render(LLDP)
    pod, sc = _pod(rendered), container(rendered)["securityContext"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    assert (sc["runAsUser"], sc["privileged"], sc["allowPrivilegeEscalation"]) == (0, False, False)
    assert env(rendered)["TOPO_REPORTER_NETWORK_LLDP"] == "true"


@pytest.mark.parametrize(
    ("resource", "resources"),
    [
        ("rdma/hca_shared_devices_a", {}),
        ("rdma/ib", {"limits": {"memory": "256Mi"}, "requests": {"cpu": "10m"}}),
    ],
    ids=["the default resource", "a resource of the site's, beside the values' own resources"],
)
def test_infiniband_asks_one_unit_of_the_device_plugins_resource_and_no_capability(
    resource: str, resources: dict[str, Any]
) -> None:
    values: dict[str, Any] = {"network": {"infiniband": {"enabled": True, "resource": resource}}}
    rendered = render({**values, "resources": resources} if resources else values)
    got = container(rendered)
    assert got["resources"]["limits"][resource] == 1
    for section, given in resources.items():
        assert given.items() <= got["resources"][section].items()
    sc = got["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert (sc["runAsUser"], sc["privileged"]) == (0, False)
    assert not _pod(rendered).get("hostNetwork", False)
    assert not [v for v in _pod(rendered)["volumes"] if "infiniband" in str(v)]
    assert env(rendered)["TOPO_REPORTER_NETWORK_INFINIBAND"] == "true"


@pytest.mark.parametrize(
    ("hcas", "variable"),
    [([], None), (["mlx5_0", "mlx5_3"], "mlx5_0,mlx5_3")],
    ids=["none named: the topology's compute HCAs", "the compute HCAs named"],
)
def test_the_compute_hcas_named_reach_the_agent_comma_joined(
    hcas: list[str], variable: str | None
) -> None:
    rendered = render({"network": {"infiniband": {"enabled": True, "hcas": hcas}}})
    assert env(rendered).get("TOPO_REPORTER_NETWORK_INFINIBAND_HCAS") == variable


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"network": {"lldp": {"enabled": True}, "infiniband": {"enabled": True}}},
            "both publish network-tier-0",
        ),
        ({**TOPOGRAPH, "agent": {"sink": "nodefeature"}}, "it needs agent.sink: node"),
    ],
    ids=["lldp and infiniband together", "topograph keys through a NodeFeature"],
)
def test_a_combination_the_agent_refuses_is_refused_at_render_in_one_line(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"network": {"labelStyle": "kueue"}}, "/network/labelStyle"),
        (
            {"network": {"infiniband": {"resource": "hca_shared_devices_a"}}},
            "/network/infiniband/resource",
        ),
    ],
    ids=["a style nobody reads", "a resource name with no domain"],
)
def test_the_schema_checks_the_network_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"at '{where}'"):
        render(values)


def _policy(values: dict[str, Any], name: str) -> PolicyEvaluator:
    rendered = render(values, api_versions=(VAP_API,))
    return PolicyEvaluator(rendered.named("ValidatingAdmissionPolicy", name))


TIER_KEYS = [
    (keys.TOPOGRAPH_TIER_KEYS[0], True),
    (keys.TOPOGRAPH_TIER_KEYS[1], True),
    (keys.TOPOGRAPH_TIER_KEYS[2], True),
    ("fabric.topograph.run/tier-3", False),
    ("fabric.topograph.run/tier-0x", False),
    ("fabric.topograph.run/accelerator", False),
    ("xfabric.topograph.run/tier-0", False),
]
TIER_IDS = [
    "tier-0",
    "tier-1",
    "tier-2",
    "a tier we never write",
    "a longer key",
    "another key",
    "a look-alike",
]


@pytest.mark.parametrize(("key", "ours"), TIER_KEYS, ids=TIER_IDS)
@pytest.mark.parametrize("style", ["topo-reporter", "topograph"])
def test_the_node_policy_admits_writing_exactly_topographs_tier_keys_only_with_that_style(
    key: str, ours: bool, style: str
) -> None:
    policy = _policy({"network": {"labelStyle": style}}, NODE_POLICY)
    for old, new in (
        changed(set_label(key, "ib-leaves-1")),
        changed(set_label(key, "ib-leaves-2"), published_with(key)),
    ):
        decision = policy.admit(request(old, new, username=AGENT))
        assert decision.allowed is (ours and style == "topograph"), (key, style)
        if not decision.allowed:
            assert f"only labels under {P}/" in decision.message


@pytest.mark.parametrize(("key", "ours"), TIER_KEYS, ids=TIER_IDS)
@pytest.mark.parametrize("style", ["topo-reporter", "topograph"])
def test_the_node_policy_admits_removing_topographs_tier_keys_only_in_their_style(
    key: str, ours: bool, style: str
) -> None:
    """Under the default style Topograph may own its keys: the agent removes none of them."""
    policy = _policy({"network": {"labelStyle": style}}, NODE_POLICY)
    old, new = changed(drop_label(key), published_with(key))
    allowed = ours and style == "topograph"
    assert policy.admit(request(old, new, username=AGENT)).allowed is allowed, (key, style)


def published_with(key: str) -> dict[str, Any]:
    """The node after a publish that wrote `key` beside our own keys."""
    n = published(P)
    n["metadata"]["labels"][key] = "ib-leaves-1"
    return n


def test_our_own_keys_stay_admitted_with_the_topograph_style() -> None:
    policy = _policy(TOPOGRAPH, NODE_POLICY)
    old, new = changed(set_label(f"{P}/count", "4"), published(P))
    assert policy.admit(request(old, new, username=AGENT)) == Decision(True, True)


PRUNE_AGENT = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-prune"


@pytest.mark.parametrize("key", [key for key, _ in TIER_KEYS], ids=TIER_IDS)
@pytest.mark.parametrize("style", ["topo-reporter", "topograph"])
def test_the_prune_policy_removes_no_topograph_key_whatever_the_style(style: str, key: str) -> None:
    """Prune touches only its own prefix: not even the Topograph keys the agent wrote."""
    rendered = render({"network": {"labelStyle": style}}, api_versions=(VAP_API,))
    prune = rendered.named("ValidatingAdmissionPolicy", f"{FULLNAME}-prune")
    # cel-python cannot compare a map with null, which the prune policy does for DELETEs (no
    # object); an UPDATE of a Node has both objects, so the guard is true and is left out here.
    # tests/controlplane/test_chart_prune.py runs the policy as written on the real apiserver.
    for variable in prune["spec"]["variables"]:
        for guard in ("oldObject != null && ", "object != null && "):
            variable["expression"] = variable["expression"].replace(guard, "")
    policy = PolicyEvaluator(prune)
    old, new = changed(drop_label(key), published_with(key))
    decision = policy.admit(request(old, new, username=PRUNE_AGENT))
    assert decision.applies
    assert not decision.allowed, key
    assert f"only remove labels and annotations under {P}/" in decision.message
