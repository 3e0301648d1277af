"""The control-plane fixtures' own promises that need no server: without Go, or without a C
library a consumer links, one line, a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import controlplane_fixtures
from tests.support.controlplane_fixtures import GoProgram


def test_without_go_the_tests_fail_with_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(controlplane_fixtures, "GO_FALLBACK", tmp_path / "go")
    program = GoProgram("controlplane", controlplane_fixtures.HARNESS)
    with pytest.raises(pytest.fail.Exception) as failed:
        program.build()
    assert str(failed.value) == controlplane_fixtures.GO_MISSING
    assert "\n" not in controlplane_fixtures.GO_MISSING
    assert "install Go 1.26" in controlplane_fixtures.GO_MISSING
    # A skip would be silent in CI: it must be a failure.
    assert not isinstance(failed.value, pytest.skip.Exception)
    # And it stays one failure per run, not one `go` lookup per test.
    with pytest.raises(pytest.fail.Exception):
        program.build()
    assert program._built == controlplane_fixtures.GO_MISSING


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


def test_without_libpfm4_dev_the_consumers_build_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A double of `go`: it fails as cgo does when libpfm4-dev's header is missing (the error
    # text gcc prints), so that this test needs neither the header removed nor a cold build.
    go = tmp_path / "go"
    go.write_text(
        "#!/bin/sh\n"
        '[ "$1" = env ] && { echo go1.26.8; exit 0; }\n'
        "echo '# github.com/koordinator-sh/koordinator/pkg/koordlet/util/perf_group' >&2\n"
        "echo 'perf_group_linux.go:22:10: fatal error: perfmon/pfmlib.h: No such file or "
        "directory' >&2\n"
        "exit 1\n"
    )
    go.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    program = GoProgram("consumers", controlplane_fixtures.CONSUMERS)
    with pytest.raises(pytest.fail.Exception) as failed:
        program.build()
    assert str(failed.value) == controlplane_fixtures.LIBPFM_MISSING
    assert "apt-get install -y libpfm4-dev" in str(failed.value)
    assert "\n" not in str(failed.value)


def test_go_builds_with_a_private_tmpdir_so_no_stray_header_shadows_a_packages_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # cgo compiles its probes from files in TMPDIR: `#include "nvml.h"` there found a stray
    # /tmp/nvml.h before go-nvml's own and broke the build. A double of `go` says where it ran.
    seen = tmp_path / "seen"
    go = tmp_path / "bin" / "go"
    go.parent.mkdir()
    go.write_text(
        "#!/bin/sh\n"
        '[ "$1" = env ] && { echo go1.26.8; exit 0; }\n'
        f'echo "$TMPDIR" > {seen}\n'
        ': > "$3"\n'
    )
    go.chmod(0o755)
    monkeypatch.setenv("PATH", str(go.parent))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    program = GoProgram("consumers", controlplane_fixtures.CONSUMERS)
    built = program.build()
    private = Path(seen.read_text().strip())
    assert private == built.parent / "tmp"
    assert private.is_dir()
