"""`topo-reporter prune`'s usage errors: one line saying what is wrong and what to do, exit 1,
before any cluster is asked (tests/controlplane/test_prune.py runs it on the real apiserver)."""

from __future__ import annotations

import subprocess

import pytest

from tests.cli.test_run import CLI, env


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prefix", "Bad_Prefix"], "prefix 'Bad_Prefix' is not a DNS subdomain"),
        (["--prefix", "node.kubernetes.io"], "is in kubernetes.io, which Kubernetes reserves"),
        (["--namespace", "Bad_NS"], "--namespace 'Bad_NS' is not a namespace name"),
        (["--kubeconfig", "/nonexistent"], "cannot load Kubernetes credentials from /nonexistent"),
    ],
    ids=["a prefix that is no DNS name", "a reserved prefix", "a bad namespace", "no kubeconfig"],
)
def test_a_usage_error_ends_in_one_line_and_exit_1(args: list[str], said: str) -> None:
    done = subprocess.run(
        [*CLI, "prune", *args], capture_output=True, text=True, timeout=60, env=env(), check=False
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("topo-reporter: error: ")
    assert said in line
    assert done.stdout == ""
