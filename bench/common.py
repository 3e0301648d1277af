"""What the benchmarks share: the table printer, nvidia-smi's text for a model, synthetic machines,
the API server double answering a random share of requests with faults.

Benchmarks measure; they never assert. Nothing here is imported by the package or the tests.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from parsers.cpulist import format_cpulist
from reporter.schema.model import Topology
from tests.support.kube_double import ApiServerDouble, Fault, Recorded

# `nvidia-smi topo -m` prints this legend under every matrix (drivers 470 and later).
LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""  # noqa: E501 (nvidia-smi's own lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table, so the output pastes into bench/README.md as it is."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cpus(cpus: frozenset[int] | None) -> str:
    return "" if cpus is None else format_cpulist(cpus)


def nvidia_smi_text(topology: Topology) -> str:
    """The `nvidia-smi topo -m` output of a machine, as a 550-series driver prints it when piped.

    Tabs between cells, ` X ` on the diagonal, NICs named NIC<k> with a NIC Legend, and the
    CPU Affinity, NUMA Affinity and GPU NUMA ID columns (`N/A` when a GPU has no memory node).
    """
    nics = topology.nics
    labels = [f"GPU{g.index}" for g in topology.gpus] + [f"NIC{k}" for k in range(len(nics))]
    out = ["\t" + "\t".join([*labels, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for g, gpu in enumerate(topology.gpus):
        cells = [" X " if c.token == "X" else c.token for c in topology.links[g]]
        cells += [nic.links[g].token for nic in nics]
        numa = _cpus(gpu.numa) or "N/A"
        gpu_numa = "N/A" if gpu.gpu_numa is None else str(gpu.gpu_numa)
        out.append("\t".join([f"GPU{g}", *cells, _cpus(gpu.cpus), numa, "", gpu_numa]))
    for k, nic in enumerate(nics):
        cells = [c.token for c in nic.links]
        peers = nic.peers or tuple(nics[j].links[0] for j in range(len(nics)))
        cells += [" X " if j == k else peers[j].token for j in range(len(nics))]
        out.append("\t".join([f"NIC{k}", *cells, "", "", "", ""]))
    text = "\n".join(out) + "\n\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(
            f"  NIC{k}: {nic.name}\n" for k, nic in enumerate(nics)
        )
    return text


def synthetic_profile(n_gpus: int, directory: Path) -> Path:
    """A DGX-H100-like machine profile with `n_gpus` GPUs: each GPU with one NIC behind its own
    PCIe switch on its own host bridge, half the GPUs on each of two NUMA nodes, and (for two or
    more GPUs) all GPUs on four NVSwitches with 18 links each, as on a DGX H100.
    """
    bridges: list[dict[str, Any]] = []
    for i in range(n_gpus):
        bridges.append(
            {
                "host_bridge": f"{i // 16:04x}:{(i % 16) * 16:02x}",
                "numa": 0 if i < max(n_gpus // 2, 1) else 1,
                "root_ports": [{"switch": [{"gpu": i}, {"nic": f"mlx5_{i}"}]}],
            }
        )
    profile: dict[str, Any] = {
        "description": f"synthetic: {n_gpus}x H100, one NIC per GPU, 2 NUMA nodes",
        "driver": "550.54.15",
        "gpu": {"model": "NVIDIA H100 80GB HBM3", "mem_mib": 81559, "mig": False},
        "numa_nodes": [
            {"id": 0, "cpus": "0-55,112-167", "distances": [10, 21]},
            {"id": 1, "cpus": "56-111,168-223", "distances": [21, 10]},
        ],
        "pcie": bridges,
    }
    if n_gpus > 1:
        switches = [{"nvswitch": f"sw{s}"} for s in range(4)]
        bridges.append(
            {
                "host_bridge": f"{n_gpus // 16 + 1:04x}:00",
                "numa": 1,
                "root_ports": [{"switch": switches}],
            }
        )
        profile["nvlink"] = [
            {"gpus": "all", "switches": ["sw0", "sw3"], "links": 5},
            {"gpus": "all", "switches": ["sw1", "sw2"], "links": 4},
        ]
    path = directory / f"synthetic-{n_gpus}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False), encoding="utf-8")
    return path


def median_seconds(run: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median and minimum wall time of `repeat` calls, after one warm-up call."""
    run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def quiet_logs(level: int = logging.WARNING) -> None:
    """Keep the collectors' debug events off the benchmark's output: warnings and above only."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


def throttled(rng: random.Random, method: str, path: str) -> Fault | None:
    """A 429 with Retry-After: 1, the apiserver's priority-and-fairness answer under load."""
    return Fault(429, retry_after="1", message="too many requests")


def fault_kind(fault: Fault) -> str:
    """How a served fault is counted: its status code, `drop`, or `delay`."""
    if fault.drop:
        return "drop"
    return str(fault.status) if fault.status else "delay"


@dataclass
class RandomFaultDouble(ApiServerDouble):
    """The double, serving `choose`'s fault to a random share `rate` of requests (0: none).

    Planned faults (`plan`) come first. `served` counts the random faults by `fault_kind`;
    `times` holds each request's arrival, for request rates.
    """

    rate: float = 0.0
    choose: Callable[[random.Random, str, str], Fault | None] = throttled
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    times: list[float] = field(default_factory=list)
    served: Counter[str] = field(default_factory=Counter)
    _draw: threading.Lock = field(default_factory=threading.Lock)

    def record(self, entry: Recorded) -> None:
        self.times.append(time.monotonic())
        super().record(entry)

    def peak(self, since: float) -> int:
        """The most requests in one wall-clock second after `since`."""
        seconds = Counter(int(t - since) for t in self.times if t >= since)
        return max(seconds.values(), default=0)

    def take_fault(self, method: str, path: str) -> Fault | None:
        planned = super().take_fault(method, path)
        if planned is not None or not self.rate:
            return planned
        with self._draw:
            fault = self.choose(self.rng, method, path) if self.rng.random() < self.rate else None
            if fault is not None:
                self.served[fault_kind(fault)] += 1
        return fault
