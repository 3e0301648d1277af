"""The image image/build.sh builds, for the tests: built once (the script reuses an image whose
inputs are unchanged), and run with podman as this machine allows (runc, bounded ulimits).

Where podman, runc or mmdebstrap is missing the image tests skip, saying which; tests/prereqs.sh
installs all three, so CI runs them.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.helm_chart import REPO, pyproject_version

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


def require_tools() -> None:
    """Skips where podman, runc or mmdebstrap is missing, saying which."""
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"the image tests need {', '.join(missing)}: install them with sh tests/prereqs.sh "
            "(apt-get install podman runc mmdebstrap)"
        )


def built_image() -> str:
    """The image's name, built or found up to date; skips where the tools are missing."""
    require_tools()
    built = _build()
    assert built.returncode == 0, built.stderr[-4000:]
    return IMAGE


DEBIAN_SLIM = "localhost/topo-reporter-test-debian:bookworm-minbase"
"""What the Dockerfile's default base, debian:bookworm-slim on Docker Hub, is: Debian 12's minbase
with apt and no Python, made here by mmdebstrap (kept: made once per machine)."""
DOCKERFILE_IMAGE = "localhost/topo-reporter-test-dockerfile:latest"
"""The Dockerfile's image as `docker build .` makes it: apt on that base, wheels from the index."""


@functools.cache
def _debian_slim() -> str:
    if podman("image", "exists", DEBIAN_SLIM).returncode == 0:
        return DEBIAN_SLIM
    # mmdebstrap writes a tar to stdout with "-"; podman imports it from stdin.
    made = subprocess.run(
        "mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "
        f"bookworm - | podman import --quiet - {DEBIAN_SLIM}",
        shell=True,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert made.returncode == 0, made.stderr[-4000:]
    return DEBIAN_SLIM


def dockerfile_image() -> str:
    """The Dockerfile built from its base stage on, on a stand-in for debian:bookworm-slim, with
    the network for apt and the package index (podman's layer cache keeps what did not change).
    Where this machine's pip trusts its own CA bundle (PIP_CERT: a proxy that re-signs TLS), the
    build's pip is given it too (an ENV of this test image's config as well)."""
    require_tools()
    args = ["--runtime", "runc", "--build-arg", f"BASE_IMAGE={_debian_slim()}"]
    cert = os.environ.get("PIP_CERT")
    if cert:
        args += ["--volume", f"{cert}:/etc/pip-ca.crt:ro", "--env", "PIP_CERT=/etc/pip-ca.crt"]
    built = podman(
        "build", *args, "--file", "Dockerfile", "--tag", DOCKERFILE_IMAGE, ".",
        timeout=BUILD_TIMEOUT_S, cwd=REPO,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return DOCKERFILE_IMAGE


def podman(*args: str, timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


@dataclass(slots=True)
class Stage:
    """One FROM ... stage of the Dockerfile, its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def dockerfile_stages() -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of the repository's Dockerfile; continuation lines joined."""
    text = (REPO / "Dockerfile").read_text()
    logical = re.sub(r"\\\n\s*", " ", text)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif keyword == "ARG" and not stages:
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, args.strip()))
    return global_args, stages
