"""image/build.sh on a machine that lacks a tool it needs: one line naming it, exit 1, before it
builds anything. Runs everywhere (no podman needed): the missing tools are missing from PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.helm_chart import REPO


def machine_with(tmp_path: Path, *commands: str) -> dict[str, str]:
    """An environment whose PATH holds only these commands (links to this machine's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("dirname", *commands):
        found = shutil.which(name)
        assert found is not None, name
        os.symlink(found, bin_dir / name)
    return {"PATH": str(bin_dir), "HOME": str(tmp_path)}


@pytest.mark.parametrize(
    ("present", "missing"),
    [
        ((), "podman"),
        (("podman",), "mmdebstrap"),
        (("podman", "mmdebstrap", "python3"), "runc"),
    ],
    ids=["no podman", "no mmdebstrap", "no runc"],
)
def test_a_missing_tool_is_one_line_and_exit_1(
    tmp_path: Path, present: tuple[str, ...], missing: str
) -> None:
    if any(shutil.which(c) is None for c in present):
        pytest.skip(f"this machine lacks one of {present}, which the case links into its PATH")
    sh = shutil.which("sh")
    assert sh is not None
    done = subprocess.run(
        [sh, str(REPO / "image" / "build.sh")],
        env=machine_with(tmp_path, *present),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"image/build.sh: {missing} not found: "), line
    assert "install" in line


def test_an_unknown_architecture_is_one_line_and_exit_1() -> None:
    done = subprocess.run(
        ["sh", str(REPO / "image" / "build.sh"), "--arch", "riscv64"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "not found" in done.stderr:
        pytest.skip(f"a tool is missing here, which the script reports first: {done.stderr}")
    assert done.returncode == 1
    assert done.stderr == (
        "image/build.sh: unsupported architecture riscv64: the image is built for amd64 and arm64\n"
    )
