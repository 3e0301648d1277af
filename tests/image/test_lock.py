"""image/requirements.txt, the image's Python packages pinned with their wheels' SHA-256, agrees
with pyproject.toml: every dependency but the ones left out on purpose is pinned at a version its
specifier admits (image/lock.py rewrites the file; this says when it is due)."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.helm_chart import REPO

LOCK = REPO / "image" / "requirements.txt"
PIN = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9.-]*)==(?P<version>\S+)(?P<hashes>( --hash=sha256:[0-9a-f]{64})+)$"
)
LEFT_OUT = {"kubernetes"}
"""image/lock.py's EXCLUDED: docs/image.md says what leaving it out costs."""


def pins() -> dict[str, tuple[str, int]]:
    """{name: (version, number of hashes)} of the lock's requirement lines."""
    found: dict[str, tuple[str, int]] = {}
    for line in LOCK.read_text().splitlines():
        if line.startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"not a hash-pinned requirement: {line!r}"
        found[m["name"]] = (m["version"], m["hashes"].count("--hash="))
    return found


def dependencies() -> list[Requirement]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]


def test_every_dependency_but_those_left_out_is_pinned_within_its_specifier() -> None:
    locked = pins()
    for dependency in dependencies():
        name = canonicalize_name(dependency.name)
        if name in LEFT_OUT:
            assert name not in locked, f"{name} is left out of the image but pinned"
            continue
        assert name in locked, f"{name} is a dependency but not in {LOCK.name}: run image/lock.py"
        version = locked[name][0]
        assert dependency.specifier.contains(version, prereleases=True), (name, version)


def test_every_pin_names_its_canonical_name_and_pip_is_pinned_for_the_build() -> None:
    locked = pins()
    assert all(canonicalize_name(n) == n for n in locked)
    assert "pip" in locked
    # Pure wheels have one hash; a compiled one, one per architecture (amd64, arm64).
    assert {count for _, count in locked.values()} <= {1, 2}
    assert locked["grpcio"][1] == 2
