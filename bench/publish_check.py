"""What checking a scan against the schema before it is published adds to one scan.

Method. The scanner checks the topology of every scan with the decoder's own rules
(`reporter.schema.codec.check`: the JSON Schema, then what a schema cannot say) before anyone
publishes it, so that a driver answering garbage fails its source instead of reaching the Node.
The scanner remembers the last topology that passed, so a steady machine pays the check once:

- steady: one full scan (NVML and sysfs collectors through the fake pynvml, merge, the check) as
  the agent makes it, the machine unchanged since the last scan, against the same scan with the
  check replaced by nothing;
- changed: the check itself, as a scan whose topology changed pays it (a first scan, a GPU
  lost, a link down).

Wall clock, in this process, N rounds after one warm-up, each round one of each in turn (a busy
machine slows all alike); median and minimum. Machines: the shipped `single-gpu` and `dgx-h100`
profiles and bench/common.py's synthetic DGX-H100-like profiles of 16, 32 and 64 GPUs.

    python bench/publish_check.py [--scans 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, synthetic_profile, table
from reporter.collect import ScanResult
from reporter.collect import scanner as scanner_module
from reporter.collect.scanner import CollectorScanner
from reporter.collect.simulate.fake_nvml import FakeNvml
from reporter.collect.simulate.machine import Machine, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs
from reporter.schema.codec import check


def scan_of(machine: Machine) -> Callable[[], ScanResult]:
    scanner = CollectorScanner(
        "auto",
        memory_hostfs(machine),
        lambda: FakeNvml(machine),
        procfs=memory_procfs(machine),
    )
    return scanner.scan


def measure(machine: Machine, n: int) -> dict[str, list[float]]:
    """Wall times (s) of `n` steady scans with the check, `n` without, and `n` checks alone."""
    scan = scan_of(machine)
    topology = scan_of(machine)().topology
    assert topology is not None
    times: dict[str, list[float]] = {"steady": [], "unchecked": [], "check": []}
    scan()
    for _ in range(n):
        start = time.perf_counter()
        scan()
        times["steady"].append(time.perf_counter() - start)
        with mock.patch.object(scanner_module, "check", return_value=None):
            start = time.perf_counter()
            scan()
            times["unchecked"].append(time.perf_counter() - start)
        start = time.perf_counter()
        check(topology)
        times["check"].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scans", type=int, default=20)
    n = parser.parse_args().scans
    quiet_logs()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        machines = {1: load_machine("single-gpu"), 8: load_machine("dgx-h100")}
        for gpus in (16, 32, 64):
            machines[gpus] = load_machine(str(synthetic_profile(gpus, Path(directory))))
        for gpus, machine in machines.items():
            times = measure(machine, n)
            med = {k: statistics.median(v) * 1000 for k, v in times.items()}
            low = {k: min(v) * 1000 for k, v in times.items()}
            rows.append(
                [
                    gpus,
                    f"{med['unchecked']:.2f}",
                    f"{med['steady'] - med['unchecked']:+.2f}",
                    f"{low['steady'] - low['unchecked']:+.2f}",
                    f"{med['check']:.2f}",
                    f"{low['check']:.2f}",
                ]
            )
    print(f"{n} rounds after one warm-up\n")
    headers = [
        "GPUs",
        "scan ms (median)",
        "steady adds (median)",
        "steady adds (min)",
        "changed adds ms (median)",
        "(min)",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
