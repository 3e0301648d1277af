"""`topo-reporter network`: the network tiers above this node, read by one discovery mode.

Each mode (`--lldp`: the Ethernet/RoCE top-of-rack switches by LLDP) is a flag of one required
group and a function reading its tiers into a `TierReading`; printing, in JSON or as a table, is
the same for every mode.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from reporter import settings, terminal
from reporter.collect.lldp import hear, rdma_ethernet_netdevs
from reporter.commands import EXIT_OK, PROG
from reporter.errors import CollectError
from reporter.hostfs import DirHostFS
from reporter.schema.network import ethernet_tier_0

DEFAULT_WAIT_S = 35.0
"""A switch sends LLDP every 30 s unless configured otherwise: one interval and some."""
MAX_WAIT_S = 3600.0
FORMATS = ("json", "text")


@dataclass(frozen=True, slots=True)
class TierReading:
    """What a mode found: the tiers, closest to the node first, and the evidence, a row each."""

    source: str
    tiers: tuple[str, ...]
    evidence_key: str
    """What the evidence rows are, as the JSON document names their list (`interfaces`)."""
    evidence: tuple[dict[str, str | None], ...]


def handle(args: argparse.Namespace) -> int:
    """Print the tiers the chosen mode reads, or exit 1 with one line where it reads none."""
    config = settings.resolve_as(settings.NetworkSettings, vars(args), os.environ)
    # The mode the required group chose: one branch each (only --lldp so far).
    reading = read_lldp(config, args.interface or [], args.wait)
    if args.format == "json":
        document = {
            "source": reading.source,
            "tiers": list(reading.tiers),
            reading.evidence_key: list(reading.evidence),
        }
        terminal.write(sys.stdout, json.dumps(document, indent=2) + "\n")
    else:
        terminal.write(sys.stdout, _table(reading))
    return EXIT_OK


def read_lldp(config: settings.NetworkSettings, named: list[str], wait_s: float) -> TierReading:
    """Tier 0 from the switches the compute NICs (`named`, else the RDMA Ethernet ports) hear:
    lldpd's neighbours where it runs and hears them, else LLDP frames heard within `wait_s`.
    Raises CollectError when there is no interface or none hears a switch."""
    interfaces = list(dict.fromkeys(named)) or rdma_ethernet_netdevs(
        DirHostFS(Path(config.sysfs_root))
    )
    if not interfaces:
        raise CollectError(
            f"no RDMA NIC with an Ethernet link layer under {config.sysfs_root}/class/infiniband: "
            "name the compute NICs with --interface"
        )
    heard = hear(interfaces, config.lldpd_socket, wait_s)
    silent = [name for name in interfaces if name not in {n.interface for n in heard}]
    for name in silent:
        terminal.write(sys.stderr, f"{PROG}: warning: {name}: no LLDP neighbour heard\n")
    return TierReading(
        source="lldp",
        tiers=(ethernet_tier_0(n.chassis_id for n in heard),),
        evidence_key="interfaces",
        evidence=tuple(
            {
                "name": n.interface,
                "chassis_id": n.chassis_id,
                "system_name": n.system_name,
                "port_id": n.port_id,
            }
            for n in heard
        ),
    )


def _table(reading: TierReading) -> str:
    lines = [f"tier {i}: {tier}" for i, tier in enumerate(reading.tiers)]
    if reading.evidence:
        columns = list(reading.evidence[0])
        rows = [[c.upper().replace("_", " ") for c in columns]]
        rows += [[row[c] or "-" for c in columns] for row in reading.evidence]
        widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
        for row in rows:
            cells = zip(row, widths, strict=True)
            lines.append("  ".join(f"{cell:<{w}}" for cell, w in cells).rstrip())
    return "\n".join(lines) + "\n"


def _wait(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds above 0 and at most {MAX_WAIT_S:g}"
        )
    return seconds


def arguments(parser: argparse.ArgumentParser) -> None:
    """The discovery mode, the interfaces, the wait, --format; the settings (sysfs, lldpd)."""
    mode = parser.add_argument_group(
        "discovery mode (one is required)"
    ).add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--lldp",
        action="store_true",
        help="tier 0: the top-of-rack switches the compute NICs hear by LLDP (Ethernet, RoCE)",
    )
    parser.add_argument(
        "--interface",
        action="append",
        metavar="NAME",
        help="a compute NIC to read (repeat for each; default: the RDMA devices' Ethernet ports)",
    )
    parser.add_argument(
        "--wait",
        type=_wait,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="how long to listen for LLDP where lldpd does not answer (default: %(default)s)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="json", help="output format (default: %(default)s)"
    )
    settings.add_arguments(parser, settings.NetworkSettings)
