"""Scan cost: one full scan (NVML and sysfs collectors, merge, encode) on 1 to 64 simulated GPUs.

Method. Machines are the shipped `single-gpu` and `dgx-h100` profiles and synthetic DGX-H100-like
profiles of 16, 32 and 64 GPUs built from the profile format (bench/common.py `synthetic_profile`:
one NIC per GPU behind its own switch, two NUMA nodes, four NVSwitches with 18 links per GPU).
The fake pynvml is wrapped to count every `nvml*` call a scan makes; sysfs is the simulation's
in-memory tree, wrapped to count reads. Time is the median (and minimum) of N scans after one
warm-up, wall clock, in this process; NVML's own latency on real hardware (microseconds to a
millisecond per call) is not modelled, so multiply the call count by it for a real node.

    python bench/scan_cost.py
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_seconds, quiet_logs, synthetic_profile, table
from reporter.collect.scanner import CollectorScanner
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.machine import Machine, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs
from reporter.hostfs import HostFS
from reporter.schema.codec import encode

SIZES = [1, 8, 16, 32, 64]


class CountingNvml:
    """The fake pynvml with a counter on every `nvml*` function."""

    def __init__(self, inner: FakeNvml, calls: Counter[str]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not name.startswith("nvml") or not callable(attribute):
            return attribute

        def counted(*args: Any) -> Any:
            self._calls[name] += 1
            return attribute(*args)

        return counted


class CountingHostFS:
    """The simulated sysfs with a counter on every read, listing and link resolution."""

    def __init__(self, inner: HostFS, calls: Counter[str]) -> None:
        self._inner = inner
        self._calls = calls

    def read_text(self, path: str) -> str:
        self._calls["read_text"] += 1
        return self._inner.read_text(path)

    def listdir(self, path: str) -> list[str]:
        self._calls["listdir"] += 1
        return self._inner.listdir(path)

    def realpath(self, path: str) -> str:
        self._calls["realpath"] += 1
        return self._inner.realpath(path)


def machines(directory: Path) -> dict[int, Machine]:
    out = {1: load_machine("single-gpu"), 8: load_machine("dgx-h100")}
    for n in SIZES:
        if n not in out:
            out[n] = load_machine(str(synthetic_profile(n, directory)))
    return out


def one_scan(machine: Machine, nvml: Counter[str], sysfs: Counter[str]) -> Callable[[], str]:
    fs = CountingHostFS(memory_hostfs(machine), sysfs)
    # The counting wrapper stands in for the module exactly as the fake does.
    scanner = CollectorScanner("auto", fs, lambda: CountingNvml(FakeNvml(machine), nvml))  # type: ignore[arg-type, return-value]

    def scan() -> str:
        result = scanner.scan()
        assert result.topology is not None
        assert not result.degraded
        return encode(result.topology)

    return scan


def main() -> None:
    quiet_logs()
    rows = []
    top: dict[int, list[tuple[str, int]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for n, machine in machines(Path(directory)).items():
            nvml: Counter[str] = Counter()
            sysfs: Counter[str] = Counter()
            scan = one_scan(machine, nvml, sysfs)
            scan()
            calls, reads = sum(nvml.values()), sum(sysfs.values())
            top[n] = nvml.most_common(3)
            repeat = 30 if n <= 16 else 10
            median, fastest = median_seconds(scan, repeat)
            rows.append(
                [
                    n,
                    f"{median * 1000:.1f}",
                    f"{fastest * 1000:.1f}",
                    repeat,
                    calls,
                    f"{calls / n:.0f}",
                    reads,
                    len(scan()),
                ]
            )
    print(
        table(
            [
                "GPUs",
                "median ms",
                "min ms",
                "N",
                "NVML calls/scan",
                "per GPU",
                "sysfs ops/scan",
                "annotation B",
            ],
            rows,
        )
    )
    print("\nMost frequent NVML calls per scan:\n")
    print(
        table(
            ["GPUs", "top 3 functions (calls)"],
            [[n, ", ".join(f"{f} {c}" for f, c in calls)] for n, calls in top.items()],
        )
    )


if __name__ == "__main__":
    main()
