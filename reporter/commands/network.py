"""`topo-reporter network`: the network tiers above this node, read by one discovery mode.

Each mode (`--lldp`: the Ethernet/RoCE top-of-rack switches by LLDP; `--infiniband`: the leaf
group and the spine group by directed-route SMPs from the HCA ports) is a flag of one required
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
from reporter.collect import infiniband
from reporter.collect.infiniband_tiers import discovery_json
from reporter.collect.lldp import hear, rdma_ethernet_netdevs
from reporter.commands import EXIT_OK, PROG
from reporter.errors import CollectError, ConfigError
from reporter.hostfs import DirHostFS
from reporter.schema.network import ethernet_tier_0

DEFAULT_WAIT_S = 35.0
"""A switch sends LLDP every 30 s unless configured otherwise: one interval and some."""
MAX_WAIT_S = 3600.0
DEFAULT_TIMEOUT_S = 30.0
"""The whole InfiniBand scan: a few hundred SMPs, each answered in milliseconds on a live fabric."""
FORMATS = ("json", "text")


@dataclass(frozen=True, slots=True)
class TierReading:
    """What a mode found: the tiers, closest to the node first, and the evidence, a row each."""

    source: str
    tiers: tuple[str, ...]
    evidence_key: str
    """What the evidence rows are, as the JSON document names their list (`interfaces`, `hcas`)."""
    evidence: tuple[dict[str, object], ...]
    totals: tuple[tuple[str, int], ...] = ()
    """Counts after the evidence, as the JSON document names them (`mads`: the SMPs sent)."""


def handle(args: argparse.Namespace) -> int:
    """Print the tiers the chosen mode reads, or exit 1 with one line where it reads none."""
    config = settings.resolve_as(settings.NetworkSettings, vars(args), os.environ)
    # The mode the required group chose: one branch each.
    if args.infiniband:
        if args.interface:
            raise ConfigError(
                "--interface names LLDP's NICs: with --infiniband, name HCAs by --hca"
            )
        reading = read_infiniband(args.hca or [], args.timeout)
    else:
        if args.hca:
            raise ConfigError("--hca names InfiniBand HCAs: with --lldp, name NICs by --interface")
        reading = read_lldp(config, args.interface or [], args.wait)
    if args.format == "json":
        document = {
            "source": reading.source,
            "tiers": list(reading.tiers),
            reading.evidence_key: list(reading.evidence),
            **dict(reading.totals),
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


def read_infiniband(named: list[str], timeout_s: float) -> TierReading:
    """The leaf group and the spine group over the HCA ports (`named`, else every InfiniBand port
    this process can use), by directed-route SMPs, within `timeout_s` in all. Raises
    CollectError when there is no port, no switch answers, or the scan runs out of time."""
    discovery = infiniband.discover(list(dict.fromkeys(named)) or None, total_s=timeout_s)
    if not discovery.views:
        raise CollectError(
            "no InfiniBand HCA port this process can use (/sys/class/infiniband_mad/umad*): run "
            "where the HCAs' /dev/infiniband/umad* devices are, or name one with --hca"
        )
    if not discovery.tiers:
        raise CollectError(
            "no InfiniBand switch answered behind "
            + ", ".join(f"{view.name} port {view.port}" for view in discovery.views)
            + ": the links are down or cabled back to back; check them with ibstat"
        )
    document = discovery_json(discovery)
    hcas = document["hcas"]
    assert isinstance(hcas, list)
    return TierReading(
        source="infiniband",
        tiers=discovery.tiers,
        evidence_key="hcas",
        evidence=tuple(hcas),
        totals=(("mads", discovery.smps.total),),
    )


def _table(reading: TierReading) -> str:
    lines = [f"tier {i}: {tier}" for i, tier in enumerate(reading.tiers)]
    lines += [f"{name}: {count}" for name, count in reading.totals]
    if reading.evidence:
        columns = list(reading.evidence[0])
        rows = [[c.upper().replace("_", " ") for c in columns]]
        rows += [
            ["-" if row[c] is None else str(row[c]) for c in columns] for row in reading.evidence
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
        for row in rows:
            cells = zip(row, widths, strict=True)
            lines.append("  ".join(f"{cell:<{w}}" for cell, w in cells).rstrip())
    return "\n".join(lines) + "\n"


def _seconds(text: str) -> float:
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
    mode.add_argument(
        "--infiniband",
        action="store_true",
        help="tiers 0, 1 and 2: the leaf group, the spine group and the fabric's top over the "
        "HCA ports, by directed-route SMPs through /dev/infiniband/umad* and one query to the "
        "subnet manager",
    )
    parser.add_argument(
        "--hca",
        action="append",
        metavar="NAME",
        help="with --infiniband: an HCA to scan from (repeat for each; default: every "
        "InfiniBand port this process can use)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="with --infiniband: the whole scan's time (default: %(default)s)",
    )
    parser.add_argument(
        "--interface",
        action="append",
        metavar="NAME",
        help="with --lldp: a compute NIC to read (repeat for each; default: the RDMA devices' "
        "Ethernet ports)",
    )
    parser.add_argument(
        "--wait",
        type=_seconds,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="with --lldp: how long to listen for LLDP where lldpd does not answer "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="json", help="output format (default: %(default)s)"
    )
    settings.add_arguments(parser, settings.NetworkSettings)
