"""The kubelet configuration parser on real files, defaults, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsers.errors import ParseError
from parsers.kubelet import KubeletPolicies, parse_kubelet_config

KUBELET = Path(__file__).parents[1] / "fixtures" / "kubelet"


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("kubeadm-default.yaml", KubeletPolicies("none", "container", "none")),
        ("gpu-single-numa-node.yaml", KubeletPolicies("single-numa-node", "pod", "static")),
        ("ansible-restricted.json", KubeletPolicies("restricted", "container", "none")),
    ],
    ids=["kubeadm's defaults", "a GPU worker aligned to one NUMA node", "JSON, one policy set"],
)
def test_real_kubelet_configs(name: str, want: KubeletPolicies) -> None:
    assert parse_kubelet_config((KUBELET / name).read_text()) == want


def test_an_empty_file_means_every_default() -> None:
    assert parse_kubelet_config("") == KubeletPolicies()


def test_numa_alignment_is_only_for_restricted_and_single_numa_node() -> None:
    assert KubeletPolicies("single-numa-node").aligns_numa
    assert KubeletPolicies("restricted").aligns_numa
    assert not KubeletPolicies("best-effort").aligns_numa
    assert not KubeletPolicies().aligns_numa


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: KubeletConfiguration\ncpuManagerPolicy: [static\n", "not YAML"),
        ("- a\n- b\n", "expected a KubeletConfiguration"),
        ("kind: Pod\n", "kind is 'Pod'"),
        ("topologyManagerPolicy: 42\n", "topologyManagerPolicy"),
        ("topologyManagerPolicy: 'single numa'\n", "topologyManagerPolicy"),
    ],
    ids=["bad YAML", "a list", "another kind", "a number", "a value with a space"],
)
def test_bad_kubelet_configs_raise_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_kubelet_config(text)


def test_bad_yaml_names_the_line() -> None:
    with pytest.raises(ParseError) as info:
        parse_kubelet_config("kind: KubeletConfiguration\nfoo: bar\n  baz: [\n")
    assert info.value.line is not None
