"""The kubelet's policies as a node source: each way its config file reads, as a reading (value,
state, problem) and as labels; an absent file is no data, a file that does not read is a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsers.kubelet import KubeletPolicies
from reporter.collect import SourceState
from reporter.collect.kubelet import read_kubelet
from reporter.collect.kubelet_policies import KubeletSource
from reporter.schema import keys

PREFIX = "example.com"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "kubelet"


@pytest.mark.parametrize(
    ("text", "state", "problem", "policy"),
    [
        (None, SourceState.NO_DATA, "no kubelet config at", None),
        ("kind: [\n", SourceState.FAILED, "config.yaml", None),
        (
            "kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n",
            SourceState.OK,
            None,
            "restricted",
        ),
    ],
    ids=[
        "an absent config is no data, and says where it looked",
        "a config that does not parse is a failure naming the file",
        "a readable config is its policies",
    ],
)
def test_each_way_the_config_reads_is_one_state(
    tmp_path: Path,
    text: str | None,
    state: SourceState,
    problem: str | None,
    policy: str | None,
) -> None:
    config = tmp_path / "config.yaml"
    if text is not None:
        config.write_text(text)
    source = KubeletSource(lambda: read_kubelet(config))
    reading = source.read()
    assert reading.state is state
    if problem is None:
        assert reading.problem is None
    else:
        assert reading.problem is not None
        assert problem in reading.problem
    if policy is None:
        assert reading.value is None
    else:
        assert reading.value is not None
        labels = source.labels(reading.value, PREFIX)
        assert labels[f"{PREFIX}/{keys.TOPOLOGY_MANAGER_POLICY}"] == policy


def test_its_labels_are_the_kubelet_labels_of_the_policies_it_read() -> None:
    source = KubeletSource(lambda: read_kubelet(FIXTURES / "gpu-single-numa-node.yaml"))
    reading = source.read()
    assert reading.value == KubeletPolicies("single-numa-node", "pod", "static")
    assert source.labels(reading.value, PREFIX) == {
        f"{PREFIX}/{keys.TOPOLOGY_MANAGER_POLICY}": "single-numa-node",
        f"{PREFIX}/{keys.TOPOLOGY_MANAGER_SCOPE}": "pod",
        f"{PREFIX}/{keys.CPU_MANAGER_POLICY}": "static",
    }
