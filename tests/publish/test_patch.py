"""The minimal node patch: only our keys, stale owned keys removed, nothing sent when equal."""

from __future__ import annotations

from typing import Any

import pytest

from reporter.errors import ApiPermanentError
from reporter.publish import patch as p
from reporter.publish.patch import Desired, NodeMetadata
from reporter.schema import keys

PREFIX = "gpu.topology.io"
OWNED = f"{PREFIX}/owned"


def node(labels: dict[str, str], annotations: dict[str, str], rv: str | None = "7") -> NodeMetadata:
    return NodeMetadata("n1", labels, annotations, rv, "uid-1")


def want(labels: dict[str, str], annotations: dict[str, str]) -> Desired:
    return p.desired(labels, annotations, PREFIX)


CASES: list[tuple[str, NodeMetadata, Desired, dict[str, Any] | None]] = [
    (
        "a fresh node gets every key and the owned list, with the resourceVersion it was read at",
        node({"kubernetes.io/hostname": "n1"}, {}),
        want({f"{PREFIX}/count": "8"}, {f"{PREFIX}/matrix": "m"}),
        {
            "metadata": {
                "labels": {f"{PREFIX}/count": "8"},
                "annotations": {
                    f"{PREFIX}/matrix": "m",
                    OWNED: "count,matrix",
                },
                "resourceVersion": "7",
            }
        },
    ),
    (
        "nothing is sent when the node already carries exactly what is desired",
        node(
            {f"{PREFIX}/count": "8", "team": "a"},
            {f"{PREFIX}/matrix": "m", OWNED: "count,matrix"},
        ),
        want({f"{PREFIX}/count": "8"}, {f"{PREFIX}/matrix": "m"}),
        None,
    ),
    (
        "a changed value is the only key in the patch; foreign keys are never named",
        node(
            {f"{PREFIX}/count": "8", "nvidia.com/gpu.count": "8", "team": "a"},
            {f"{PREFIX}/matrix": "m", OWNED: "count,matrix", "x/y": "z"},
        ),
        want({f"{PREFIX}/count": "7"}, {f"{PREFIX}/matrix": "m"}),
        {"metadata": {"labels": {f"{PREFIX}/count": "7"}, "resourceVersion": "7"}},
    ),
    (
        "keys the owned list names and that are no longer produced are deleted with null; "
        "a list of full keys (earlier builds) reads the same and is rewritten as names",
        node(
            {f"{PREFIX}/count": "8", f"{PREFIX}/rdma-nics": "8"},
            {
                f"{PREFIX}/matrix": "m",
                f"{PREFIX}/old": "x",
                OWNED: f"{PREFIX}/count,{PREFIX}/matrix,{PREFIX}/old,{PREFIX}/rdma-nics",
            },
        ),
        want({f"{PREFIX}/count": "8"}, {f"{PREFIX}/matrix": "m"}),
        {
            "metadata": {
                "labels": {f"{PREFIX}/rdma-nics": None},
                "annotations": {
                    f"{PREFIX}/old": None,
                    OWNED: "count,matrix",
                },
                "resourceVersion": "7",
            }
        },
    ),
    (
        "a key under our prefix that the owned list does not name is someone else's: kept",
        node(
            {f"{PREFIX}/count": "8", f"{PREFIX}/added-by-hand": "yes"},
            {OWNED: "count"},
        ),
        want({f"{PREFIX}/count": "8"}, {}),
        None,
    ),
    (
        "a foreign key smuggled into the owned list is still never deleted",
        node(
            {f"{PREFIX}/count": "8", "kubernetes.io/hostname": "n1"},
            {OWNED: "count,kubernetes.io/hostname"},
        ),
        want({f"{PREFIX}/count": "8"}, {}),
        {"metadata": {"annotations": {OWNED: "count"}, "resourceVersion": "7"}},
    ),
    (
        "our key edited by hand is set back (drift)",
        node({f"{PREFIX}/count": "80"}, {OWNED: "count"}),
        want({f"{PREFIX}/count": "8"}, {}),
        {"metadata": {"labels": {f"{PREFIX}/count": "8"}, "resourceVersion": "7"}},
    ),
    (
        "without a known resourceVersion the patch carries none",
        node({}, {}, rv=None),
        want({f"{PREFIX}/count": "8"}, {}),
        {
            "metadata": {
                "labels": {f"{PREFIX}/count": "8"},
                "annotations": {OWNED: "count"},
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("current", "desired", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_minimal_patch(
    current: NodeMetadata, desired: Desired, expected: dict[str, Any] | None
) -> None:
    assert p.minimal_patch(current, desired, PREFIX) == expected


def test_applying_the_patch_reaches_the_desired_state_and_keeps_foreign_keys() -> None:
    current = node(
        {f"{PREFIX}/count": "8", f"{PREFIX}/rdma-nics": "8", "team": "a"},
        {OWNED: f"{PREFIX}/count,{PREFIX}/rdma-nics", "other.io/x": "y"},
    )
    desired = want({f"{PREFIX}/count": "7"}, {f"{PREFIX}/matrix": "m"})
    body = p.minimal_patch(current, desired, PREFIX)
    assert body is not None
    after = p.apply(current, body)
    assert p.ours(after, PREFIX) == desired
    assert after.labels["team"] == "a"
    assert after.annotations["other.io/x"] == "y"
    assert p.minimal_patch(after, desired, PREFIX) is None


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [({"team": "a"}, {}), ({}, {"kubernetes.io/x": "y"}), ({}, {OWNED: "x"})],
    ids=["a label outside the prefix", "an annotation outside the prefix", "the owned key itself"],
)
def test_desired_refuses_keys_it_must_not_own(
    labels: dict[str, str], annotations: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="refusing"):
        p.desired(labels, annotations, PREFIX)


def test_owned_list_ignores_blanks_spaces_and_foreign_keys() -> None:
    text = f" {PREFIX}/a ,,{PREFIX}/b, other.io/c ,{PREFIX}x/d, e ,f"
    assert p.owned({OWNED: text}, PREFIX) == {f"{PREFIX}/{k}" for k in "abef"}


def test_owned_lists_names_under_the_prefix_without_repeating_it() -> None:
    desired = want({f"{PREFIX}/count": "8", f"{PREFIX}/rdma-nics": "8"}, {f"{PREFIX}/matrix": "m"})
    assert desired.annotations[OWNED] == "count,matrix,rdma-nics"
    assert p.owned(desired.annotations, PREFIX) == {*desired.labels, f"{PREFIX}/matrix"}


KUBELET_LABELS = {
    "kubernetes.io/hostname": "n1",
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
    "node-role.kubernetes.io/gpu": "",
    "topology.k8s.io/zone": "a",
}


@pytest.mark.parametrize(
    "prefix", ["kubernetes.io", "node-role.kubernetes.io", "k8s.io", "topology.k8s.io"]
)
def test_a_reserved_prefix_owns_nothing_whatever_the_owned_list_says(prefix: str) -> None:
    """Settings refuse such a prefix; the ownership check holds without them (issue 11)."""
    owned_key = f"{prefix}/owned"
    listed = ",".join(KUBELET_LABELS)
    current = node(dict(KUBELET_LABELS), {owned_key: listed})
    assert p.owned(current.annotations, prefix) == frozenset()
    assert p.ours(current, prefix) == Desired({}, {})
    assert p.minimal_patch(current, Desired({}, {}), prefix) is None
    with pytest.raises(ValueError, match="refusing"):
        p.desired({f"{prefix}/count": "8"}, {}, prefix)


def test_annotation_budget_counts_every_annotation_in_bytes_and_names_the_shares() -> None:
    foreign = {"other.io/blob": "é" * 130_000}  # 260 000 bytes of someone else's
    current = node({}, foreign)
    body = p.minimal_patch(current, want({}, {f"{PREFIX}/matrix": "m" * 3000}), PREFIX)
    assert body is not None
    with pytest.raises(ApiPermanentError, match=r"over the apiserver's 262144-byte limit") as e:
        p.check_annotation_budget(current, body, PREFIX)
    assert "260013 from others" in str(e.value)
    assert e.value.status == 422


def test_annotation_budget_allows_exactly_the_limit() -> None:
    key = f"{PREFIX}/matrix"
    owned_len = len(OWNED) + len("matrix")
    value = "m" * (p.ANNOTATION_BUDGET_BYTES - len(key) - owned_len)
    current = node({}, {})
    body = p.minimal_patch(current, want({}, {key: value}), PREFIX)
    assert body is not None
    assert p.annotation_bytes(p.apply(current, body).annotations) == p.ANNOTATION_BUDGET_BYTES
    p.check_annotation_budget(current, body, PREFIX)


# --- The agent's own taint (opt-in) -------------------------------------------------------------

TAINT_KEY = f"{PREFIX}/fabric-health"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
EVICTING = {"key": "x", "effect": "NoExecute", "timeAdded": "2026-01-02T03:04:05Z"}


def tainted(*taints: dict[str, str], rv: str | None = "7") -> NodeMetadata:
    return NodeMetadata("n1", {}, {OWNED: ""}, rv, "uid-1", tuple(taints))


def taint_want(value: str | None) -> Desired:
    return Desired({}, {OWNED: ""}, p.OwnTaint(TAINT_KEY, value))


def own(value: str) -> dict[str, str]:
    return {"key": TAINT_KEY, "value": value, "effect": "NoSchedule"}


TAINT_CASES: list[tuple[str, NodeMetadata, Desired, dict[str, Any] | None]] = [
    (
        "its taint goes after the others, which are sent back as read (timeAdded included)",
        tainted(GPU_TAINT, EVICTING),
        taint_want("unhealthy"),
        {
            "metadata": {"resourceVersion": "7"},
            "spec": {"taints": [GPU_TAINT, EVICTING, own("unhealthy")]},
        },
    ),
    (
        "its taint changes value in place of the old one",
        tainted(own("unhealthy"), GPU_TAINT),
        taint_want("degraded"),
        {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [GPU_TAINT, own("degraded")]}},
    ),
    (
        "its taint is removed, the others stay",
        tainted(GPU_TAINT, own("degraded")),
        taint_want(None),
        {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [GPU_TAINT]}},
    ),
    (
        "removing the last taint removes the field",
        tainted(own("degraded")),
        taint_want(None),
        {"metadata": {"resourceVersion": "7"}, "spec": {"taints": None}},
    ),
    ("its taint as wanted: nothing to send", tainted(GPU_TAINT, own("x")), taint_want("x"), None),
    ("no taint wanted, none there: nothing to send", tainted(GPU_TAINT), taint_want(None), None),
    (
        "not opted in: a taint of its key is left alone",
        tainted(own("unhealthy")),
        Desired({}, {OWNED: ""}),
        None,
    ),
    (
        "its key with another effect (set by someone else) is replaced by its own",
        tainted({**own("unhealthy"), "effect": "NoExecute"}),
        taint_want("unhealthy"),
        {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [own("unhealthy")]}},
    ),
]


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [c[1:] for c in TAINT_CASES],
    ids=[c[0] for c in TAINT_CASES],
)
def test_the_agents_own_taint(
    current: NodeMetadata, desired: Desired, expected: dict[str, Any] | None
) -> None:
    assert p.minimal_patch(current, desired, PREFIX) == expected


def test_labels_and_the_taint_change_in_one_patch() -> None:
    current = tainted(GPU_TAINT)
    desired = p.desired(
        {f"{PREFIX}/fabric-health": "unhealthy"}, {}, PREFIX, p.OwnTaint(TAINT_KEY, "unhealthy")
    )
    body = p.minimal_patch(current, desired, PREFIX)
    assert body is not None
    assert body["metadata"]["labels"] == {f"{PREFIX}/fabric-health": "unhealthy"}
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["spec"] == {"taints": [GPU_TAINT, own("unhealthy")]}
    assert p.apply(current, body).taints == (GPU_TAINT, own("unhealthy"))


def test_the_taint_is_read_from_the_node_object() -> None:
    read = p.node_metadata(
        {"metadata": {"name": "n1"}, "spec": {"taints": [GPU_TAINT, "not a taint", own("x")]}}
    )
    assert read.taints == (GPU_TAINT, own("x"))
    assert p.node_metadata({"metadata": {"name": "n1"}, "spec": {"taints": None}}).taints == ()


@pytest.mark.parametrize(
    "key", ["example.com/fabric-health", f"{PREFIX}x/fabric-health", "kubernetes.io/x"]
)
def test_a_taint_outside_the_prefix_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="taint"):
        p.desired({}, {}, PREFIX, p.OwnTaint(key, "unhealthy"))
    with pytest.raises(ValueError, match="taint"):
        p.minimal_patch(tainted(), Desired({}, {}, p.OwnTaint(key, "x")), PREFIX)


TOPOGRAPH = frozenset(keys.TOPOGRAPH_TIER_KEYS)
"""The foreign keys the agent writes with `--network-label-style topograph`."""


@pytest.mark.parametrize(
    ("listed", "foreign", "kept"),
    [
        ("fabric.topograph.run/tier-0,fabric.topograph.run/tier-1", TOPOGRAPH, 2),
        ("fabric.topograph.run/tier-0,fabric.topograph.run/tier-1", frozenset(), 0),
        ("fabric.topograph.run/tier-9", TOPOGRAPH, 0),
        ("fabric.topograph.run/other,topograph.run/tier-0", TOPOGRAPH, 0),
    ],
    ids=[
        "the topograph style: its tiers 0 and 1 (of 0, 1, 2) are ours",
        "the default style: an owned list naming them (anyone can edit it) owns nothing",
        "a tier we never write: not ours",
        "another key of the domain, or another domain: not ours",
    ],
)
def test_only_the_topograph_tier_keys_we_write_are_owned_beside_the_prefix(
    listed: str, foreign: frozenset[str], kept: int
) -> None:
    assert len(p.owned({OWNED: listed}, PREFIX, foreign)) == kept


def test_topograph_tier_labels_are_written_listed_whole_and_removed_in_their_style() -> None:
    tier = "fabric.topograph.run/tier-0"
    desired = p.desired({tier: "ib-leaves-1", f"{PREFIX}/count": "8"}, {}, PREFIX, None, TOPOGRAPH)
    assert desired.annotations[OWNED] == f"count,{tier}"
    current = node({tier: "ib-leaves-1", "fabric.topograph.run/tier-3": "x"}, desired.annotations)
    assert p.ours(current, PREFIX, TOPOGRAPH).labels == {tier: "ib-leaves-1"}
    body = p.minimal_patch(current, want({f"{PREFIX}/count": "8"}, {}), PREFIX, TOPOGRAPH)
    assert body is not None
    assert body["metadata"]["labels"] == {f"{PREFIX}/count": "8", tier: None}


def test_without_the_topograph_style_a_topograph_label_is_never_written_or_deleted() -> None:
    tier = "fabric.topograph.run/tier-0"
    with pytest.raises(ValueError, match="outside"):
        want({tier: "ib-leaves-1"}, {})
    # Topograph's own label, and an owned list someone edited to name it.
    current = node({tier: "topograph's own"}, {OWNED: f"count,{tier}"})
    assert p.ours(current, PREFIX).labels == {}
    body = p.minimal_patch(current, want({f"{PREFIX}/count": "8"}, {}), PREFIX)
    assert body is not None
    assert tier not in body["metadata"]["labels"]
