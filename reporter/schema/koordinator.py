"""Koordinator's device-info file: the node's GPUs and their NVLink partitions, for koordlet.

koordlet learns NVLink only from JSON files in its `--xpu-device-infos-dir` (default
`/var/run/koordlet/xpu-device-infos/`, feature gate `Accelerators`): each file a JSON array of
`{vendor, model, uuid, minor, topology: {p2pLinks: [{peerMinor: "1,2,3", type: "NVLink"}],
nodeID, busID}, status: {healthy}}`. koordlet turns every p2pLink of a device into a partition,
the device and its peers, and its scheduler prefers to place a pod on one partition of its size
(`gpu-partition-policy: Prefer`; we never ask for `Honor`).

What we write, from the topology: for every GPU, one link per GPU it has a direct NVLink to (the
pairs), and one link to the rest of its NVLink island when the island has more than two GPUs and
every pair of it is NVLink-connected (an NVSwitch fabric, or a 4-GPU all-to-all bridge). The
`minor` is the GPU's index (NVML order, PCI bus order), which is the /dev/nvidia<minor> number
wherever the driver numbers devices in PCI order, as it does by default. Pure: text out, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from reporter.schema.model import Topology

VENDOR = "NVIDIA"
LINK_TYPE = "NVLink"
FILE_NAME = "topo-reporter.json"


def _nvlinked(topology: Topology, a: int, b: int) -> bool:
    return topology.links[a][b].is_nvlink or topology.links[b][a].is_nvlink


def device_infos(topology: Topology) -> list[dict[str, Any]]:
    """The device-info array koordlet reads, one entry per GPU."""
    n = len(topology.gpus)
    island_of = {gpu: island for island in topology.islands for gpu in island}
    devices = []
    for gpu in topology.gpus:
        i = gpu.index
        links = [
            {"peerMinor": str(j), "type": LINK_TYPE}
            for j in range(n)
            if j != i and _nvlinked(topology, i, j)
        ]
        island = island_of.get(i, ())
        if len(island) > 2 and all(
            _nvlinked(topology, a, b) for a in island for b in island if a < b
        ):
            peers = ",".join(str(j) for j in island if j != i)
            links.append({"peerMinor": peers, "type": LINK_TYPE})
        device: dict[str, Any] = {
            "vendor": VENDOR,
            "model": gpu.model or "",
            "uuid": gpu.uuid or "",
            "minor": str(i),
            "status": {"healthy": not gpu.lost},
        }
        placement: dict[str, Any] = {}
        if links:
            placement["p2pLinks"] = links
        home = topology.home_numa(i)
        if home is not None:
            placement["nodeID"] = str(home)
        if gpu.pci is not None:
            placement["busID"] = gpu.pci
        if placement:
            device["topology"] = placement
        devices.append(device)
    return devices


def device_infos_text(topology: Topology) -> str:
    """The file's content: the array as compact JSON, one line, with a final newline."""
    return json.dumps(device_infos(topology), separators=(",", ":")) + "\n"
