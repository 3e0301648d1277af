"""The control-plane fixtures' own promises that need no server: without Go, one line, a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import controlplane_fixtures


def test_without_go_the_tests_fail_with_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(controlplane_fixtures, "GO_FALLBACK", tmp_path / "go")
    monkeypatch.setattr(controlplane_fixtures.HARNESS_PROGRAM, "_built", None)
    with pytest.raises(pytest.fail.Exception) as failed:
        controlplane_fixtures.build_harness()
    assert str(failed.value) == controlplane_fixtures.GO_MISSING
    assert "\n" not in controlplane_fixtures.GO_MISSING
    assert "install Go 1.26" in controlplane_fixtures.GO_MISSING
    # A skip would be silent in CI: it must be a failure.
    assert not isinstance(failed.value, pytest.skip.Exception)
    # And it stays one failure per run, not one `go` lookup per test.
    with pytest.raises(pytest.fail.Exception):
        controlplane_fixtures.build_harness()
    assert controlplane_fixtures.HARNESS_PROGRAM._built == controlplane_fixtures.GO_MISSING


def fake_go(directory: Path, version: str) -> Path:
    """A double of the `go` command that only says its version (`go env GOVERSION`)."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(f"#!/bin/sh\necho {version}\n")
    go.chmod(0o755)
    return go


def test_an_older_go_on_path_is_passed_over_for_the_one_in_usr_local_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Debian's golang-go on PATH, Go 1.26 where tests/prereqs.sh (or the tarball) put it."""
    monkeypatch.setenv("PATH", str(fake_go(tmp_path / "usr-bin", "go1.19.8").parent))
    fallback = fake_go(tmp_path / "usr-local-go", "go1.26.8")
    monkeypatch.setattr(controlplane_fixtures, "GO_FALLBACK", fallback)
    assert controlplane_fixtures.go_binary() == str(fallback)


def test_only_older_gos_fail_in_one_line_naming_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = fake_go(tmp_path / "usr-bin", "go1.25.3")
    monkeypatch.setenv("PATH", str(old.parent))
    monkeypatch.setattr(controlplane_fixtures, "GO_FALLBACK", tmp_path / "absent" / "go")
    with pytest.raises(pytest.fail.Exception) as failed:
        controlplane_fixtures.go_binary()
    assert str(failed.value) == (
        f"the control-plane tests need Go 1.26 or newer, found only {old} (go1.25): install Go "
        "1.26 (https://go.dev/dl/, or sh tests/prereqs.sh)"
    )
