"""The doctor's pod-group finding: a Pending Kueue Workload that must stay in one NVLink partition
and needs more room than any partition has free, over 20 simulated racks, against a count from
scratch; and Workloads of any shape never break it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reporter.doctor import pod_group_findings
from reporter.doctor.groups import partitions
from reporter.doctor.model import Code
from reporter.doctor.report import report_json, report_text
from tests.extender.test_capacity import PREFIX, node_objects, tray_topologies

PARTITION_KEY = f"{PREFIX}/nvlink-partition"


def workload(pods: int, gpus: int, *, required: str | None = PARTITION_KEY, **status: Any) -> Any:
    request = {} if required is None else {"topologyRequest": {"required": required}}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": f"job-{pods}x{gpus}", "namespace": "ml"},
        "spec": {
            "podSets": [
                {
                    "name": "main",
                    "count": pods,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "t", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
                            ]
                        }
                    },
                    **request,
                }
            ]
        },
        "status": status,
    }


def room_from_scratch(free: dict[str, tuple[int, ...] | None], gpus: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, partition, _ in tray_topologies():
        f = free[name]
        out[partition] = out.get(partition, 0) + (0 if f is None else len(f) // gpus)
    return out


def test_the_room_of_each_partition_is_counted_from_scratch_over_20_racks() -> None:
    for seed in range(3):
        objects, free = node_objects(seed)
        rooms = partitions(objects, PREFIX)
        for gpus in (1, 2, 4):
            assert {p: r.room(gpus) for p, r in rooms.items()} == room_from_scratch(free, gpus)
        whole = room_from_scratch(free, 4)
        assert {p: r.whole_free for p, r in rooms.items()} == whole


def test_a_group_bigger_than_every_partitions_room_is_named_with_the_roomiest() -> None:
    objects, free = node_objects(0)
    best = max(room_from_scratch(free, 4).values())
    found = pod_group_findings([workload(best + 1, 4), workload(best, 4)], objects, PREFIX)
    assert list(found) == [f"workload ml/job-{best + 1}x4"]
    (finding,) = found[f"workload ml/job-{best + 1}x4"]
    assert finding.code == Code.POD_GROUP_EXCEEDS_PARTITIONS
    assert f"needs {best + 1} pods of 4 nvidia.com/gpu in one NVLink partition" in finding.summary
    assert f"has room for {best} now" in finding.summary
    assert len(finding.evidence) == 6  # five partitions, then how many more
    assert finding.evidence[-1].endswith("more partitions, with less room")
    text = report_text(found, summary=True)
    assert text.startswith("0 nodes, 0 without findings\n")
    assert f"workload ml/job-{best + 1}x4: 1 finding" in text
    assert f'"workload": "ml/job-{best + 1}x4"' in report_json(found)


def test_admitted_spread_or_gpu_less_groups_are_not_findings() -> None:
    objects, _ = node_objects(0)
    admitted = workload(999, 4, conditions=[{"type": "Admitted", "status": "True"}])
    waiting = workload(999, 4, conditions=[{"type": "QuotaReserved", "status": "False"}])
    spread = workload(999, 4, required=None)
    cpu_only = workload(999, 0)
    found = pod_group_findings([admitted, waiting, spread, cpu_only], objects, PREFIX)
    assert list(found) == ["workload ml/job-999x4"]
    assert pod_group_findings([waiting], [], PREFIX) == {}  # no partitions: nothing to judge


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(st.lists(json_values, max_size=4), st.sampled_from(["count", "template", "topologyRequest"]))
def test_workloads_of_any_shape_never_raise(junk: list[Any], field: str) -> None:
    objects, _ = node_objects(0)
    shaped = workload(9999, 4)
    shaped["spec"]["podSets"][0][field] = junk[0] if junk else None
    found = pod_group_findings([*junk, shaped], objects, PREFIX)
    assert all(f.code == Code.POD_GROUP_EXCEEDS_PARTITIONS for fs in found.values() for f in fs)
