"""`topo-reporter prune`'s errors before any cluster is asked: one line saying what is wrong and
what to do, exit 2 for bad usage and 1 for credentials that do not load
(tests/controlplane/test_prune.py runs it on the real apiserver)."""

from __future__ import annotations

import subprocess

import pytest

from tests.cli.test_run import CLI, env


@pytest.mark.parametrize(
    ("args", "said", "status"),
    [
        (["--prefix", "Bad_Prefix"], "prefix 'Bad_Prefix' is not a DNS subdomain", 2),
        (["--prefix", "node.kubernetes.io"], "is in kubernetes.io, which Kubernetes reserves", 2),
        (["--namespace", "Bad_NS"], "--namespace 'Bad_NS' is not a namespace name", 2),
        (["--kubeconfig", "/nonexistent"], "cannot load Kubernetes credentials from /nonexist", 1),
    ],
    ids=["a prefix that is no DNS name", "a reserved prefix", "a bad namespace", "no kubeconfig"],
)
def test_an_error_before_the_cluster_is_asked_ends_in_one_line(
    args: list[str], said: str, status: int
) -> None:
    done = subprocess.run(
        [*CLI, "prune", *args], capture_output=True, text=True, timeout=60, env=env(), check=False
    )
    assert done.returncode == status
    (line,) = done.stderr.splitlines()
    assert line.startswith("topo-reporter: error: ")
    assert said in line
    assert done.stdout == ""
