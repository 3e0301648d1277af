"""InfiniBand discovery's cost per node: the MADs a host sends, by kind, small fabric against large.

Method. Rail-optimized fat trees from tests/support/ibsim.py (4 rails, 16 hosts per leaf group,
4 spines per rail, 40-port switches, a SHARP Aggregation Node CA on every switch): 2-tier with
2, 4 and 8 leaf groups (128 to 512 host HCAs), and 3-tier with 2 and 4 pods of 4 leaf groups
(512 and 1,024 host HCAs; 2 cores per core group, so 32 cores). The real ibsim serves each, the
real OpenSM is its master SM, and three hosts are walked in each (one process per HCA, as
umad2sim makes a process one CA; the first asks the SA, as the product asks once a node). Each
host's SMPs by attribute and its SA query are reported, with the floor a full discovery would
pay (a NodeInfo per node and a PortInfo per switch port). Wall time is per host, four
processes, Python start included: ibsim answers in microseconds, real switches in tens to
hundreds.

    python bench/ib_scan_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table
from tests.support.ibsim import FatTree, IbSim, have_ibsim


def _tree(units: int, pods: int = 0) -> FatTree:
    return FatTree(
        units=units,
        pods=pods,
        cores_per_group=2,
        rails=4,
        hosts_per_unit=16,
        spines_per_rail=4,
        aggregation_nodes=True,
        switch_ports=40,
    )


FABRICS = [
    ("2-tier", _tree(2)),
    ("2-tier", _tree(4)),
    ("2-tier", _tree(8)),
    ("3-tier", _tree(4, pods=2)),
    ("3-tier", _tree(4, pods=4)),
]


def main() -> None:
    if not have_ibsim():
        sys.exit("bench/ib_scan_cost.py: needs ibsim and opensm (sh tests/prereqs.sh)")
    rows = []
    for kind, fabric in FABRICS:
        hosts = fabric.hosts()
        names = list(hosts)
        switches = len(fabric.switch_guids())
        host_cas = len(hosts) * fabric.rails
        cas = host_cas + switches
        with IbSim(fabric.netlist(), fabric.subnet_manager_nodes()) as sim:
            for host in (names[0], names[len(names) // 2], names[-1]):
                started = time.monotonic()
                discovery = sim.walk_host(hosts[host])
                wall = time.monotonic() - started
                smps = discovery.smps
                rows.append(
                    [
                        kind,
                        f"{host_cas:,} + {switches} SHARP",
                        host,
                        str(smps.node_info),
                        str(smps.port_info),
                        str(smps.node_description),
                        f"{smps.sa_queries} ({smps.sa_replies})",
                        str(smps.total),
                        str(smps.unanswered),
                        f"{cas + switches + switches * fabric.radix:,}",
                        f"{wall * 1000:.0f}",
                    ]
                )
    print(
        table(
            [
                "fabric",
                "host HCAs + CAs",
                "host",
                "NodeInfo",
                "PortInfo",
                "NodeDesc",
                "SA queries (replies)",
                "MADs sent",
                "unanswered",
                "full walk's floor",
                "ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
