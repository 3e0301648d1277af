"""The Dockerfile builds the image the chart runs, the way the README installs the package.

Its base stage's default, debian:bookworm-slim, is on Docker Hub, which the test machines cannot
reach: the recipe is checked statically here (its stages, base, user, entrypoint, that it copies
everything `pip install .` reads), and image/build.sh builds the same Dockerfile with its own
Debian base and wheels, which tests/image/ run and list (no shell, no setuid file).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from typing import Any

import pytest

from tests.support.helm_chart import REPO, container, pyproject_version, render
from tests.support.image_support import Stage, dockerfile_stages

# Packages that only exist to compile code; no stage installs one.
COMPILERS = {"gcc", "g++", "cc", "clang", "make", "build-essential", "musl-dev", "libc6-dev"}


def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def stages() -> dict[str | None, Stage]:
    return {stage.name: stage for stage in dockerfile_stages()[1]}


@pytest.fixture(scope="module")
def final() -> Stage:
    return dockerfile_stages()[1][-1]


def test_the_base_is_debian_12_slim_and_every_stage_but_the_image_builds_on_it(
    stages: dict[str | None, Stage],
) -> None:
    global_args, _ = dockerfile_stages()
    assert re.fullmatch(r"debian:(bookworm|12)-slim", global_args["BASE_IMAGE"])
    assert stages["base"].base == global_args["BASE_IMAGE"]
    assert stages["wheel-build"].base == "base"
    assert stages["build"].base == "base"
    (install,) = stages["base"].args_of("RUN")
    assert re.search(r"apt-get install .*\bpython3 ca-certificates\b", install)


def test_the_image_is_the_build_stages_rootfs_on_nothing(final: Stage) -> None:
    """FROM scratch, one COPY of what image/rootfs.py gathered, no RUN: nothing of the base's
    userland (a shell, dpkg, setuid su) reaches it except through rootfs.py's choice."""
    assert (final.base, final.name) == ("scratch", None)
    assert final.args_of("COPY") == ["--from=build /rootfs /"]
    assert final.args_of("RUN") == []
    assert {kw for kw, _ in final.instructions} <= {
        "LABEL",
        "COPY",
        "ENV",
        "USER",
        "ENTRYPOINT",
        "CMD",
    }


def test_final_stage_runs_as_a_numeric_non_root_user(final: Stage) -> None:
    users = final.args_of("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), uid
    assert int(uid) > 0
    assert gid == "" or int(gid) > 0


def test_chart_runs_the_image_as_the_same_user(final: Stage) -> None:
    uid, _, gid = final.args_of("USER")[-1].partition(":")
    pod = render().one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)


def test_entrypoint_is_topo_reporter_run_as_in_the_chart(final: Stage) -> None:
    entrypoint = json.loads(final.args_of("ENTRYPOINT")[-1])
    cmd = json.loads(final.args_of("CMD")[-1])
    assert [*entrypoint, *cmd] == ["topo-reporter", "run"]
    agent = container(render())
    assert [*agent["command"], *agent["args"]] == [*entrypoint, *cmd]


def test_the_build_stage_installs_only_the_wheels_offline_with_no_compiler(
    stages: dict[str | None, Stage],
) -> None:
    wheel_build, build = stages["wheel-build"], stages["build"]
    wheel = wheel_build.args_of("RUN")[-1]
    # The lock's wheels, each by its pinned hash (the image/build.sh set), and ours built from /src.
    assert re.search(
        r"pip download .*--no-deps .*--require-hashes .*-r /src/image/requirements.txt", wheel
    ), wheel
    assert re.search(r"pip wheel .*--no-deps --wheel-dir /stage/wheels /src\b", wheel), wheel
    assert stages["wheels"].base == "scratch"
    assert stages["wheels"].args_of("COPY") == ["--from=wheel-build /stage /"]
    (install,) = build.args_of("RUN")
    # Copied, so a layer cache keys the install by the wheels it installs.
    assert "--from=wheels / /mnt/" in build.args_of("COPY")
    assert re.search(
        r"pip\" install .*--no-index .*--find-links /mnt/wheels -r /mnt/install.txt", install
    )
    assert "rootfs.py /opt/topo-reporter /rootfs" in install
    for stage in (wheel_build, build):
        for run in stage.args_of("RUN"):
            assert not COMPILERS & set(re.split(r"[\s=]+", run)), run


def copied_sources(stage: Stage) -> set[str]:
    """The build-context paths a stage COPYs (without --from), trailing slashes removed."""
    sources: set[str] = set()
    for args in stage.args_of("COPY"):
        words = shlex.split(args)
        if not any(w.startswith("--from") for w in words):
            sources |= {w.rstrip("/") for w in words[:-1] if not w.startswith("--")}
    return sources


def test_the_wheel_stage_copies_everything_pip_install_dot_reads(
    stages: dict[str | None, Stage],
) -> None:
    project = pyproject()
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = copied_sources(stages["wheel-build"])
    assert needed <= copied, needed - copied
    for path in needed:
        assert (REPO / path).exists(), path


def test_dockerignore_keeps_what_the_build_copies_and_drops_local_state(
    stages: dict[str | None, Stage],
) -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    kept = {p.removeprefix("!") for p in patterns if p.startswith("!")}
    copied = set().union(*(copied_sources(stage) for stage in stages.values()))
    assert "image/rootfs.py" in copied
    for path in copied:
        ignored = any(fnmatch.fnmatch(path, p) or path.startswith(f"{p}/") for p in patterns)
        assert not ignored or path in kept, path
    assert {".git", ".venv", "dist"} <= set(patterns)


def test_image_build_sh_builds_this_dockerfile_on_its_base_with_its_wheels() -> None:
    """The image the tests build and list (tests/image/test_build.py) is this recipe's."""
    script = re.sub(r"\\\n\s*", " ", (REPO / "image" / "build.sh").read_text())
    (build,) = [line for line in script.splitlines() if line.strip().startswith("podman build ")]
    words = shlex.split(build)
    assert words[words.index("--file") + 1] == "Dockerfile"
    assert "--network=none" in words
    assert "BASE_IMAGE=$BASE" in build.replace('"', "")
    assert "wheels=$PWD/$STAGE" in build.replace('"', "")
    assert words[words.index("--tag") + 2] == "."


def test_readme_install_and_image_build_commands_agree_with_the_chart() -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install ." in readme
    assert f"docker build -t topo-reporter:{pyproject_version()} ." in readme
    chart_page = (REPO / "docs" / "chart.md").read_text()
    assert f"docker build -t topo-reporter:{pyproject_version()} ." in chart_page
    assert container(render())["image"] == f"topo-reporter:{pyproject_version()}"
