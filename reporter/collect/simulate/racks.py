"""Simulated GB200 NVL72 racks: N racks of 18 compute trays, each tray a node of 4 GPUs.

Every node is the shipped `gb200-nvl` profile with its own fabric: its rack's cluster UUID and
clique, its chassis serial, slot and tray. Clique IDs repeat across real racks (two racks both
reported 17044, kubernetes-sigs/dra-driver-nvidia-gpu#377): `cliques` gives each rack's, so two
racks can share one, and `partitions` splits a rack into cliques (an x72 as two x36). For tests
and benchmarks, from Python (`rack_nodes`) or as profile files for `--simulate PATH`:

    python -m reporter.collect.simulate.racks --racks 2 --clique 17044 --clique 17044 --out DIR

writes `DIR/<node>.yaml` per node (the file's stem names the node: run the agent with
`--simulate DIR/<node>.yaml --node <node>`). Nothing here touches the host or the cluster.
"""

from __future__ import annotations

import argparse
import copy
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reporter.collect.simulate.machine import Machine, machine_from_profile, shipped_profile

TRAYS_PER_RACK = 18
"""Compute trays of an NVL72 rack: 18 nodes of 4 GPUs."""
_TOP_TRAYS = 10
"""Compute trays above the 9 NVSwitch trays; the rest sit below them, so slots skip 9."""
_SWITCH_TRAYS = 9
BASE_PROFILE = "gb200-nvl"


def rack_cluster_uuid(rack: int) -> str:
    """The cluster UUID of simulated rack `rack` (stable: a name-based UUID)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"topo-reporter/nvl72-rack/{rack}"))


def node_name(rack: int, tray: int) -> str:
    """`nvl72-r<rack>-n<tray>`, two digits each: a valid Node name."""
    return f"nvl72-r{rack:02d}-n{tray:02d}"


@dataclass(frozen=True, slots=True)
class RackNode:
    """One simulated node of a rack, with the profile document that describes it."""

    name: str
    rack: int
    tray: int
    profile: dict[str, Any]

    @property
    def partition(self) -> str:
        """The `nvlink-partition` it should carry: `<clusterUUID>.<cliqueId>`."""
        fabric = self.profile["fabric"]
        return f"{fabric['cluster_uuid']}.{fabric['clique']}"

    def machine(self) -> Machine:
        """The simulated machine, as `--simulate <name>.yaml` loads it."""
        return machine_from_profile(self.name, self.profile)


MAX_CLIQUE = 2**32 - 1
"""The largest clique ID: NVML's `cliqueId` is a 32-bit unsigned integer."""


def rack_nodes(
    racks: int,
    *,
    trays: int = TRAYS_PER_RACK,
    cliques: Sequence[int] | None = None,
    partitions: int = 1,
) -> list[RackNode]:
    """`racks` x `trays` nodes. Rack r's clique is `cliques[r]` (default 100 + r); with
    `partitions` > 1 its trays are split in that many consecutive groups, the p-th on clique
    `cliques[r] + p`. Raises ValueError for counts out of range."""
    if racks < 1 or not 1 <= trays <= TRAYS_PER_RACK or not 1 <= partitions <= trays:
        raise ValueError(f"racks >= 1, 1 <= trays <= {TRAYS_PER_RACK}, 1 <= partitions <= trays")
    if cliques is not None and len(cliques) != racks:
        raise ValueError(f"{len(cliques)} clique IDs for {racks} racks")
    for rack, first in enumerate(cliques or ()):
        # NVML's cliqueId is 32 bits; the profile loader refuses any other, so say it here,
        # before a partition `<uuid>.-1` is printed that no node can ever carry.
        if not 0 <= first <= MAX_CLIQUE - (partitions - 1):
            raise ValueError(
                f"clique ID {first} of rack {rack} is out of range: give 0 to "
                f"{MAX_CLIQUE - (partitions - 1)} (NVML's 32 bits, less one per further partition)"
            )
    base = shipped_profile(BASE_PROFILE)
    nodes = []
    for rack in range(racks):
        clique = 100 + rack if cliques is None else cliques[rack]
        for tray in range(trays):
            profile = copy.deepcopy(base)
            profile["description"] = f"GB200 NVL72 rack {rack}, compute tray {tray}"
            profile["fabric"] = {
                "cluster_uuid": rack_cluster_uuid(rack),
                "clique": clique + tray * partitions // trays,
                "state": "completed",
                "health": "healthy",
                "chassis_serial": f"1821622{rack:06d}",
                "slot": tray + 1 if tray < _TOP_TRAYS else tray + 1 + _SWITCH_TRAYS,
                "tray": tray,
                "host_id": 0,
            }
            nodes.append(RackNode(node_name(rack, tray), rack, tray, profile))
    return nodes


def write_profiles(nodes: Sequence[RackNode], directory: Path) -> list[Path]:
    """Write each node's profile as `directory/<name>.yaml`; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for node in nodes:
        path = directory / f"{node.name}.yaml"
        path.write_text(yaml.safe_dump(node.profile, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reporter.collect.simulate.racks",
        description="Write one --simulate profile per node of simulated GB200 NVL72 racks.",
    )
    parser.add_argument("--racks", type=int, default=1, help="how many racks (default 1)")
    parser.add_argument("--trays", type=int, default=TRAYS_PER_RACK, help="nodes per rack")
    parser.add_argument(
        "--clique",
        type=int,
        action="append",
        help="clique ID of each rack, once per rack (default 100, 101, ...): repeat one to make "
        "racks share it",
    )
    parser.add_argument("--partitions", type=int, default=1, help="cliques per rack (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="directory for <node>.yaml files")
    args = parser.parse_args(argv)
    try:
        nodes = rack_nodes(
            args.racks, trays=args.trays, cliques=args.clique, partitions=args.partitions
        )
    except ValueError as e:
        print(f"racks: error: {e}", file=sys.stderr)
        return 2
    for path, node in zip(write_profiles(nodes, args.out), nodes, strict=True):
        print(f"{path}\t{node.partition}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
