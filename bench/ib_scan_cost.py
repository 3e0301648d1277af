"""InfiniBand discovery's cost per node: SMPs by kind a host sends, small fabric against 500+ CAs.

Method. Rail-optimized 2-tier fat trees from tests/support/ibsim.py (4 rails, 16 hosts per leaf
group, 4 spines per rail, a SHARP Aggregation Node CA on every switch, 40-port switches), with
2, 4 and 8 leaf groups: 128, 256 and 512 host HCAs, plus the switches' Aggregation Nodes. The
real ibsim serves each; three hosts are walked (one process per HCA, as umad2sim makes a process
one CA), and each host's SMPs by kind are reported with the floor a full discovery would pay (a
NodeInfo per node and a PortInfo per switch port). Wall time is per host, four processes, Python
start included: ibsim answers in microseconds, real switches in tens to hundreds.

    python bench/ib_scan_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from tests.support.ibsim import FatTree, IbSim, have_ibsim

UNITS = [2, 4, 8]


def main() -> None:
    if not have_ibsim():
        sys.exit("bench/ib_scan_cost.py: needs ibsim (apt-get install ibsim-utils)")
    rows = []
    for units in UNITS:
        fabric = FatTree(
            units=units,
            rails=4,
            hosts_per_unit=16,
            spines_per_rail=4,
            aggregation_nodes=True,
            switch_ports=40,
        )
        hosts = fabric.hosts()
        switches = len(fabric.switch_guids())
        cas = len(hosts) * fabric.rails + switches
        with IbSim(fabric.netlist()) as sim:
            for host in (next(iter(hosts)), f"s0u{units // 2}h7", f"s0u{units - 1}h15"):
                started = time.monotonic()
                discovery = sim.walk_host(hosts[host])
                wall = time.monotonic() - started
                rows.append(
                    [
                        f"{len(hosts) * fabric.rails} + {switches} SHARP",
                        host,
                        str(discovery.smps.node_info),
                        str(discovery.smps.port_info),
                        str(discovery.smps.total),
                        str(discovery.smps.unanswered),
                        f"{cas + switches + switches * fabric.radix:,}",
                        f"{wall * 1000:.0f}",
                    ]
                )
    print(
        table(
            [
                "host HCAs + CAs",
                "host",
                "NodeInfo",
                "PortInfo",
                "SMPs",
                "unanswered",
                "full walk's floor",
                "ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
