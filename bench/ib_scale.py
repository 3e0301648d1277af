"""InfiniBand discovery on a fabric of 10,000 hosts: what ibsim needs to hold it, what one host's
scan costs (issue 43 item 4).

Method. 2-tier fat trees from tests/support/ibsim_hostile.py (`big_fabric`: 48-host leaves with 8
uplinks, 8 spines of 254 ports, the switches' radix fixed whatever the hosts) of 500, 2,000 and
10,000 hosts, each served by the real ibsim with its tables sized (`-N/-S/-P`). For each: the
seconds until ibsim listens, its peak resident memory, and one host's scan (the last host, on
the last leaf), walked in a child process as the suite does: its SMPs by kind and its wall time,
Python's start included. The full discovery's floor is a NodeInfo per node and a PortInfo per
switch port.

    python bench/ib_scale.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from tests.support.ibsim import have_ibsim
from tests.support.ibsim_hostile import HostileSim, big_fabric

HOSTS = [500, 2_000, 10_000]
HOSTS_PER_LEAF, SPINES, SPINE_PORTS = 48, 8, 254


def _peak_mib(pid: int) -> float:
    """The peak resident memory of process `pid` (ibsim under `timeout`: its child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for line in Path(f"/proc/{children[0]}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    if not have_ibsim():
        sys.exit("bench/ib_scale.py: needs ibsim (apt-get install ibsim-utils)")
    rows = []
    for hosts in HOSTS:
        leaves = -(-hosts // HOSTS_PER_LEAF)
        full = hosts + leaves + SPINES + leaves * (HOSTS_PER_LEAF + SPINES) + SPINES * SPINE_PORTS
        started = time.monotonic()
        with HostileSim(big_fabric(hosts), nodes=hosts + 1024) as sim:
            load = time.monotonic() - started
            assert sim.process is not None
            memory = _peak_mib(sim.process.pid)
            started = time.monotonic()
            found = sim.walk_as(f"h{hosts - 1}")
            wall = time.monotonic() - started
        rows.append(
            [
                f"{hosts:,}",
                f"{load:.2f}",
                f"{memory:.0f}",
                str(found.smps.node_info),
                str(found.smps.port_info),
                str(found.smps.node_description),
                f"{found.smps.total:,}",
                f"{full:,}",
                f"{found.smps.total / full:.0%}",
                f"{wall * 1000:.0f}",
            ]
        )
    print(
        table(
            [
                "hosts",
                "ibsim load s",
                "ibsim MiB",
                "NodeInfo",
                "PortInfo",
                "NodeDesc",
                "SMPs",
                "full walk's floor",
                "share",
                "scan ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
