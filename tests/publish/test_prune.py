"""Prune's judgement of NodeResourceTopology and NodeFeature objects, by prefix, without a cluster
(tests/controlplane/test_prune.py runs the command on the real apiserver, with objects the real
agent wrote).

Issue 41's repro: after a prefix change to NEW, `prune --prefix OLD` deleted the current
install's objects, judged by `app.kubernetes.io/managed-by` and the name alone. Each is now
judged by its `<prefix>/node` label; one that carries no prefix's label (an earlier version wrote
it) is left, and said, unless prune is asked for it (`--unlabelled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import structlog

from reporter.publish.api import NODE_FEATURES, NODE_RESOURCE_TOPOLOGIES, Resource
from reporter.publish.prune import (
    Owner,
    Pruner,
    node_feature_owner,
    node_resource_topology_owner,
)
from tests.support.agent_support import FAST

OLD = "old.example.com"
NEW = "gpu.topology.io"
MANAGED = {"app.kubernetes.io/managed-by": "topo-reporter"}
NFD_NODE = "nfd.node.kubernetes.io/node-name"
NAMESPACE = "gpu-system"


def nrt(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels)}, "zones": []}


def node_feature(node: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{node}-topo-reporter",
            "namespace": NAMESPACE,
            "labels": {NFD_NODE: node, **labels},
        },
        "spec": {},
    }


LABELS: dict[str, tuple[dict[str, str], Owner | None]] = {
    "ours, written under the pruned prefix": ({**MANAGED, f"{OLD}/node": "n1"}, Owner.PREFIX),
    "ours, written under the current prefix": ({**MANAGED, f"{NEW}/node": "n1"}, None),
    "ours, from a version before the label": (MANAGED, Owner.UNLABELLED),
    "ours, its prefix label naming another node": ({**MANAGED, f"{OLD}/node": "n2"}, None),
    "another producer's, our prefix label on it": (
        {"app.kubernetes.io/managed-by": "nfd", f"{OLD}/node": "n1"},
        None,
    ),
    "no producer's": ({f"{OLD}/node": "n1"}, None),
}


@pytest.mark.parametrize("case", sorted(LABELS))
def test_a_node_resource_topology_is_the_pruned_prefixs_only_by_its_label(case: str) -> None:
    labels, owner = LABELS[case]
    assert node_resource_topology_owner(nrt("n1", labels), OLD) is owner


@pytest.mark.parametrize("case", sorted(LABELS))
def test_a_node_feature_is_the_pruned_prefixs_only_by_its_label(case: str) -> None:
    labels, owner = LABELS[case]
    assert node_feature_owner(node_feature("n1", labels), OLD) is owner


def test_a_node_feature_named_after_another_node_is_nobodys() -> None:
    named = node_feature("n1", {**MANAGED, f"{OLD}/node": "n1"})
    named["metadata"]["name"] = "n2-topo-reporter"
    assert node_feature_owner(named, OLD) is None


class ListingApi:
    """An ApiClient double for `list` alone: every object of a collection, by plural, filtered
    by the selector's `key=value` terms; every other collection is empty."""

    def __init__(self, objects: Mapping[str, list[dict[str, Any]]]) -> None:
        self.objects = objects

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        selector = (query or {}).get("labelSelector", "")
        terms = [term.split("=", 1) for term in selector.split(",") if term]
        items = [
            o
            for o in self.objects.get(resource.plural, [])
            if all(
                o["metadata"]["labels"].get(t[0]) == t[1]
                if len(t) == 2
                else t[0] in o["metadata"]["labels"]
                for t in terms
            )
        ]
        return {"items": items, "metadata": {}}


def the_repro() -> ListingApi:
    """Installed with prefix NEW: n1's agent wrote under NEW, n2's still under OLD, n3's object
    is an earlier version's (no prefix label), n4's is another producer's."""
    return ListingApi(
        {
            NODE_RESOURCE_TOPOLOGIES.plural: [
                nrt("n1", {**MANAGED, f"{NEW}/node": "n1"}),
                nrt("n2", {**MANAGED, f"{OLD}/node": "n2"}),
                nrt("n3", MANAGED),
                nrt("n4", {"app.kubernetes.io/managed-by": "nfd"}),
            ],
            NODE_FEATURES.plural: [
                node_feature("n1", {**MANAGED, f"{NEW}/node": "n1"}),
                node_feature("n2", {**MANAGED, f"{OLD}/node": "n2"}),
                node_feature("n3", MANAGED),
            ],
        }
    )


def planned(prefix: str, *, unlabelled: bool = False) -> tuple[list[str], list[str]]:
    """What prune under `prefix` would remove, and what it would leave as unlabelled."""
    pruner = Pruner(
        the_repro(),  # type: ignore[arg-type]  # list is all find calls
        prefix=prefix,
        namespace=NAMESPACE,
        log=structlog.get_logger(),
        backoff=FAST,
        unlabelled=unlabelled,
    )
    plan = pruner.find()
    return [o.describe() for o in plan.objects], [o.describe() for o in plan.unlabelled]


def test_prune_of_the_old_prefix_removes_its_objects_and_not_the_current_installs() -> None:
    removed, left = planned(OLD)
    assert removed == ["NodeResourceTopology n2", f"NodeFeature {NAMESPACE}/n2-topo-reporter"]
    assert left == ["NodeResourceTopology n3", f"NodeFeature {NAMESPACE}/n3-topo-reporter"]


def test_prune_of_the_current_prefix_removes_only_the_current_installs() -> None:
    removed, left = planned(NEW)
    assert removed == ["NodeResourceTopology n1", f"NodeFeature {NAMESPACE}/n1-topo-reporter"]
    assert left == ["NodeResourceTopology n3", f"NodeFeature {NAMESPACE}/n3-topo-reporter"]


@pytest.mark.parametrize("prefix", [OLD, NEW])
def test_asked_for_them_prune_also_removes_the_objects_that_name_no_prefix(prefix: str) -> None:
    removed, left = planned(prefix, unlabelled=True)
    node = "n2" if prefix == OLD else "n1"
    assert removed == [
        f"NodeResourceTopology {node}",
        "NodeResourceTopology n3",
        f"NodeFeature {NAMESPACE}/{node}-topo-reporter",
        f"NodeFeature {NAMESPACE}/n3-topo-reporter",
    ]
    assert left == []
