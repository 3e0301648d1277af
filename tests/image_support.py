"""The image image/build.sh builds, for the tests: built once (the script reuses an image whose
inputs are unchanged), and run with podman as this machine allows (runc, bounded ulimits).

Where podman, runc or mmdebstrap is missing the image tests skip, saying which; tests/prereqs.sh
installs all three, so CI runs them.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
from typing import Any

import pytest

from tests.helm_chart import REPO, pyproject_version

IMAGE = f"localhost/topo-reporter:{pyproject_version()}"
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
"""The architecture image/build.sh builds for by default, in Debian's words."""
TOOLS = ("podman", "runc", "mmdebstrap")
PYTHON = "/opt/topo-reporter/bin/python"
"""The image's interpreter: what runs a command in it (it has no shell, no coreutils)."""
BUILD_TIMEOUT_S = 1500.0
"""A cold build makes the Debian base (2 to 5 minutes on two loaded cores) and the Python layer."""
PODMAN_RUN = (
    "podman",
    "run",
    "--runtime",
    "runc",
    # podman's defaults (nofile 1048576) are above the hard limits of some sandboxes, CI's among
    # them; these are what a kubelet's containerd gives a container, within them.
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=4096:4096",
)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


@functools.cache
def _build() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(REPO / "image" / "build.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
        cwd=REPO,
    )


def built_image() -> str:
    """The image's name, built or found up to date; skips where the tools are missing."""
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"the image tests need {', '.join(missing)}: install them with sh tests/prereqs.sh "
            "(apt-get install podman runc mmdebstrap)"
        )
    built = _build()
    assert built.returncode == 0, built.stderr[-4000:]
    return IMAGE


def podman(*args: str, timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
