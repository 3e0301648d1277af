"""The Dockerfile builds the image the chart runs, the way the README installs the package.

The Dockerfile needs Docker Hub, which the test machines cannot reach, so it is checked
statically: its stages, base image, user, entrypoint, and that it copies everything `pip install .`
needs. The image the tests build and run is image/build.sh's (tests/test_image*.py).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.helm_chart import REPO, container, pyproject_version, render

# Packages that only exist to compile code; none may be installed in the final image.
COMPILERS = {"gcc", "g++", "cc", "clang", "make", "build-essential", "musl-dev", "libc6-dev"}
PACKAGE_MANAGERS = ("apt-get install", "apt install", "apk add", "dnf install", "yum install")


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


def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def copied_sources(stage: Stage) -> set[str]:
    """The build-context paths a stage COPYs (without --from), trailing slashes removed."""
    sources: set[str] = set()
    for args in stage.args_of("COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        if any(a.startswith("--from") for a in shlex.split(args)):
            continue
        sources |= {w.rstrip("/") for w in words[:-1]}
    return sources


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dockerfile_stages()[1]


def test_multi_stage_with_a_build_stage_and_a_final_stage(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert stages[0].name == "build"


@pytest.mark.parametrize("which", [0, -1], ids=["build stage", "final stage"])
def test_base_is_a_slim_python_3_11_or_newer(stages: list[Stage], which: int) -> None:
    base = stages[which].base
    match = re.fullmatch(r"python:3\.(\d+)(\.\d+)?-slim(-\w+)?", base)
    assert match, base
    assert int(match[1]) >= 11


def test_final_stage_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].args_of("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), uid
    assert int(uid) > 0
    assert gid == "" or int(gid) > 0


def test_chart_runs_the_image_as_the_same_user(stages: list[Stage]) -> None:
    uid, _, gid = stages[-1].args_of("USER")[-1].partition(":")
    pod = render().one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)


def test_entrypoint_is_topo_reporter_run_as_in_the_chart(stages: list[Stage]) -> None:
    final = stages[-1]
    entrypoint = json.loads(final.args_of("ENTRYPOINT")[-1])
    cmd = json.loads(final.args_of("CMD")[-1])
    assert [*entrypoint, *cmd] == ["topo-reporter", "run"]
    agent = container(render())
    assert [*agent["command"], *agent["args"]] == [*entrypoint, *cmd]


def test_no_compiler_or_package_manager_install_in_the_final_stage(stages: list[Stage]) -> None:
    for run in stages[-1].args_of("RUN"):
        assert not any(pm in run for pm in PACKAGE_MANAGERS), run
        assert not COMPILERS & set(re.split(r"[\s=]+", run)), run


def test_final_stage_installs_only_the_wheels_built_in_stage_one(stages: list[Stage]) -> None:
    build, final = stages[0], stages[-1]
    (wheel,) = [r for r in build.args_of("RUN") if "pip wheel" in r]
    wheel_dir = re.search(r"--wheel-dir[= ](\S+)", wheel)
    assert wheel_dir, wheel
    assert shlex.split(wheel)[-1] == ".", wheel
    (install,) = [r for r in final.args_of("RUN") if "pip install" in r]
    assert "--no-index" in install
    assert f"--find-links {wheel_dir[1]}" in install
    assert f"from={build.name},source={wheel_dir[1]}" in install
    assert pyproject()["project"]["name"] in shlex.split(install)


def test_build_stage_copies_everything_pip_install_dot_reads(stages: list[Stage]) -> None:
    project = pyproject()
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = copied_sources(stages[0])
    assert needed <= copied, needed - copied
    for path in needed:
        assert (REPO / path).exists(), path


def test_dockerignore_keeps_what_the_build_copies_and_drops_local_state(
    stages: list[Stage],
) -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in copied_sources(stages[0]):
        assert not any(fnmatch.fnmatch(path, p) for p in patterns), path
    assert {".git", ".venv"} <= set(patterns)


def test_readme_install_and_image_build_commands_agree_with_the_chart() -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install ." in readme
    assert f"docker build -t topo-reporter:{pyproject_version()} ." in readme
    chart_page = (REPO / "docs" / "chart.md").read_text()
    assert f"docker build -t topo-reporter:{pyproject_version()} ." in chart_page
    assert container(render())["image"] == f"topo-reporter:{pyproject_version()}"
