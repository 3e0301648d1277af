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
    monkeypatch.setattr(controlplane_fixtures, "_built", None)
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
    assert controlplane_fixtures._built == controlplane_fixtures.GO_MISSING
