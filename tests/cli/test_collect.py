"""`topo-reporter collect` and `profiles`: simulated machines, real roots, and every user error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reporter.cli import main
from reporter.collect import list_profiles, scanner
from reporter.collect.simulate import fake_nvml
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import load_machine

ASUS = Path(__file__).parents[1] / "fixtures" / "machines" / "asus-esc8000a" / "sysfs"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_profiles_lists_every_simulated_machine(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["profiles"], capsys)
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == [p.name for p in list_profiles()]


@pytest.mark.parametrize("fmt", ["json", "yaml", "annotation", "matrix", "labels"])
def test_collect_prints_a_simulated_machine_in_every_format(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["collect", "--simulate", "dgx-a100", "--format", fmt], capsys)
    assert status == 0
    assert err == ""
    assert "NV12" in out


def test_collect_reads_a_sysfs_root_without_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["collect", "--backend", "sysfs", "--sysfs-root", str(ASUS)], capsys)
    assert status == 0
    document = json.loads(out)
    assert document["source"] == "sysfs"
    assert document["links"][0] == "X NODE SYS SYS"


def test_collect_labels_use_the_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collect", "--simulate", "single-gpu", "--format", "labels", "--prefix", "example.com"]
    status, out, _ = run(argv, capsys)
    assert status == 0
    assert "example.com/count=1\n" in out


@pytest.mark.parametrize(
    ("argv", "message", "exit_status"),
    [
        (["collect", "--simulate", "dgx-9000"], "unknown simulated machine 'dgx-9000'", 2),
        (["collect", "--sysfs-root", "/nonexistent/sys"], "is not a readable directory", 2),
        (["collect", "--backend", "nvml", "--sysfs-root", str(ASUS)], "NVML did not initialise", 1),
    ],
    ids=["unknown profile", "unreadable sysfs root", "NVML unavailable with --backend nvml"],
)
def test_collect_errors_are_one_line_and_non_zero(
    argv: list[str],
    message: str,
    exit_status: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whatever this machine has, its NVML answers as a node without a loaded driver does.
    machine = load_machine("single-gpu")
    faults = Faults(init=fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setattr(scanner, "load_pynvml", lambda: FakeNvml(machine, faults))
    status, out, err = run(argv, capsys)
    assert status == exit_status
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err
