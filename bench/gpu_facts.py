"""What reading the fabric and the NVLinks' health adds to one scan.

Method. One full scan (NVML and sysfs collectors, merge) as the agent makes it, against the fake
pynvml (scan_cost.py's wrapper counts its calls), wall clock, in this process: N rounds after one
warm-up, each round one scan of every variant in turn (so a busy machine slows all alike), median
and minimum per variant. Each cost is the difference between the scan as shipped
and the same scan without the part measured:

- fabric reads, on the shipped `gb200-nvl` tray (4 GPUs, fabric and rack position on every GPU):
  the scan as shipped against one whose driver lacks `nvmlDeviceGetGpuFabricInfoV` and
  `nvmlDeviceGetPlatformInfo` (FunctionNotFound: nothing to read or decode);
- link health, on the shipped `dgx-h100` (8 GPUs, 18 NVLinks each, 4 NVSwitches): the scan as the
  agent makes it (the link count field, the walk to it, the down links' far ends, the error
  counters against the previous scan) against the walk the collector made before (no field API:
  every index up to nvidia-ml-py 13's NVML_NVLINK_MAX_LINKS, 36, and so no counters).

NVML's own latency on hardware (microseconds to a millisecond per call) is not modelled: the NVML
call counts are printed so it can be added. Targets (issues 21 and 22): fabric reads <= 5 ms on a
4-GPU tray, link health <= 10 ms on an 8-GPU H100.

    python bench/gpu_facts.py [--scans 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import quiet_logs, table
from bench.scan_cost import CountingNvml
from reporter.collect.scanner import CollectorScanner
from reporter.collect.simulate import fake_nvml
from reporter.collect.simulate.fake_nvml import FakeNvml, Faults
from reporter.collect.simulate.machine import Machine, load_machine
from reporter.collect.simulate.sysfs_tree import memory_hostfs, memory_procfs

MISSING = fake_nvml.NVML_ERROR_FUNCTION_NOT_FOUND


def scanner(machine: Machine, faults: Faults, calls: Counter[str]) -> Callable[[], object]:
    """One scan of `machine` as the agent makes it (the scanner keeps the counters' memory)."""
    scan = CollectorScanner(
        "auto",
        memory_hostfs(machine),
        lambda: CountingNvml(FakeNvml(machine, faults), calls),
        procfs=memory_procfs(machine),
    )
    return scan.scan


def measure_all(
    cases: list[tuple[str, Machine, Faults]], n: int
) -> dict[str, tuple[float, float, float]]:
    """(median ms, min ms, NVML calls per scan) of each case, interleaved round by round."""
    calls = {name: Counter[str]() for name, *_ in cases}
    scans = {name: scanner(machine, faults, calls[name]) for name, machine, faults in cases}
    for scan in scans.values():
        scan()  # warm-up, and the counters' baseline
    times: dict[str, list[float]] = {name: [] for name in scans}
    for _ in range(n):
        for name, scan in scans.items():
            start = time.perf_counter()
            scan()
            times[name].append(time.perf_counter() - start)
    return {
        name: (
            statistics.median(t) * 1000,
            min(t) * 1000,
            sum(calls[name].values()) / (n + 1),
        )
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scans", type=int, default=30)
    n = parser.parse_args().scans
    quiet_logs()
    tray, h100 = load_machine("gb200-nvl"), load_machine("dgx-h100")
    without_fabric = Faults(
        calls={
            ("nvmlDeviceGetGpuFabricInfoV", None): MISSING,
            ("nvmlDeviceGetPlatformInfo", None): MISSING,
        }
    )
    old_walk = Faults(calls={("nvmlDeviceGetFieldValues", None): MISSING})
    cases = [
        ("gb200-nvl, as shipped", tray, Faults()),
        ("gb200-nvl, no fabric calls", tray, without_fabric),
        ("dgx-h100, as the agent scans", h100, Faults()),
        ("dgx-h100, the walk before (36 indexes)", h100, old_walk),
    ]
    results = measure_all(cases, n)
    rows = [
        [name, f"{median:.2f}", f"{low:.2f}", f"{calls:.0f}"]
        for name, (median, low, calls) in results.items()
    ]
    print(f"median of {n} scans after one warm-up\n")
    print(table(["scan", "median ms", "min ms", "NVML calls/scan"], rows))

    def added(a: str, b: str) -> list[str]:
        (ma, la, ca), (mb, lb, cb) = results[a], results[b]
        return [f"{ma - mb:+.2f} ms", f"{la - lb:+.2f} ms", f"{ca - cb:+.0f}"]

    print()
    print(
        table(
            ["what", "adds (median)", "adds (min)", "NVML calls", "target"],
            [
                [
                    "fabric reads, 4-GPU tray",
                    *added("gb200-nvl, as shipped", "gb200-nvl, no fabric calls"),
                    "<= 5 ms",
                ],
                [
                    "link health, 8-GPU H100 (against the walk before)",
                    *added(
                        "dgx-h100, as the agent scans", "dgx-h100, the walk before (36 indexes)"
                    ),
                    "<= 10 ms",
                ],
            ],
        )
    )


if __name__ == "__main__":
    main()
