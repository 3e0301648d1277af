"""Koordinator's device-info file: the node's GPUs and their NVLink partitions, for koordlet.

koordlet learns NVLink only from JSON files in its `--xpu-device-infos-dir` (default
`/var/run/koordlet/xpu-device-infos/`, feature gate `Accelerators`): each file a JSON array of
`{vendor, model, uuid, minor, resources, topology: {p2pLinks: [{peerMinor: "1,2,3", type:
"NVLink"}], nodeID, pcieID, busID}, status: {healthy}}` (Koordinator v1.8.0,
`pkg/koordlet/util/device.go` XPUDeviceInfo). koordlet turns every p2pLink of a device into a
partition, the device and its peers, and its scheduler prefers to place a pod on one partition of
its size (`gpu-partition-policy: Prefer`; we never ask for `Honor`).

What koordlet does with the file decides what it must hold (`statesinformer/impl/
states_device_linux.go` reportDevice): once any file reports a device, koordlet stops reporting the
GPUs NVML shows it and builds the node's Device from the files alone; the first entry's `model`
and `vendor` become the Device's labels `node.koordinator.sh/gpu-model` and `gpu-vendor`
verbatim; each entry's `resources` become the device's resources. So:
- `model` is in the form koordlet's own NVML path gives the label: NVIDIA's name without its
  `NVIDIA ` prefix, spaces as dashes (`NVIDIA H100 80GB HBM3` -> `H100-80GB-HBM3`). With spaces it
  is no label value, the API server refuses the Device, and the node has no GPU in Koordinator.
- `vendor` is Koordinator's constant `nvidia`.
- `resources` holds `koordinator.sh/gpu-core` (100, a whole GPU) and `koordinator.sh/gpu-memory`
  (its memory), as koordlet's NVML path reports them (koordlet adds `gpu-memory-ratio` itself).
- `pcieID` is the GPU's PCIe root complex, `pci<domain>:<bus>` (`pci0000:15`), as koordlet's NVML
  path finds it in the GPU's sysfs path; the scheduler groups GPUs and NICs by it.
- `minor` is the driver's minor number (`/dev/nvidia<minor>`, NVML's nvmlDeviceGetMinorNumber),
  what koordlet's NVML path reports and the device plugin's allocations are matched by; `peerMinor`
  names peers by it too. A topology that does not know every GPU's minor (parsed `nvidia-smi`
  text) uses the index (NVML order, PCI bus order), the minor wherever the driver numbers devices
  in PCI order, its default.
A file that cannot be all of this is not written: `device_infos` raises instead, and koordlet
keeps reporting the GPUs NVML shows it.

Links, from the topology: for every GPU, one per GPU it has a direct NVLink to (the pairs), and one
to the rest of its NVLink island when the island has more than two GPUs and every pair of it is
NVLink-connected (an NVSwitch fabric, or a 4-GPU all-to-all bridge). Pure: text out, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from reporter.errors import InputError
from reporter.schema.model import Topology

VENDOR = "nvidia"
"""Koordinator's `apiext.GPUVendorNVIDIA`: the Device's `node.koordinator.sh/gpu-vendor`."""
LINK_TYPE = "NVLink"
FILE_NAME = "topo-reporter.json"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
WHOLE_GPU_CORE = "100"
"""koordlet's NVML path gives every GPU 100 gpu-core: percent of one GPU."""
_NVIDIA_PREFIX = "NVIDIA "
# A Kubernetes label value: at most 63 characters, alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


class KoordinatorFileError(InputError):
    """The device-info file cannot be what koordlet needs; the message says why, in one line."""


def model_label(model: str) -> str:
    """The model in the form koordlet's NVML path labels the Device with (its
    getGPUDriverAndModel): `NVIDIA ` dropped, spaces as dashes. `Tesla V100-SXM2-16GB` becomes
    `Tesla-V100-SXM2-16GB`."""
    return model.removeprefix(_NVIDIA_PREFIX).replace(" ", "-")


def _nvlinked(topology: Topology, a: int, b: int) -> bool:
    return topology.links[a][b].is_nvlink or topology.links[b][a].is_nvlink


def _model(topology: Topology) -> str:
    """The one label-safe model of the node's GPUs. Raises KoordinatorFileError."""
    models = {g.model for g in topology.gpus}
    if None in models:
        missing = next(g.index for g in topology.gpus if g.model is None)
        raise KoordinatorFileError(f"the model of GPU {missing} is unknown")
    names = sorted(m for m in models if m is not None)
    if len(names) > 1:
        raise KoordinatorFileError(
            f"the GPUs are of {len(names)} models ({', '.join(names)}): koordlet labels the "
            "node's Device with one"
        )
    (name,) = names
    label = model_label(name)
    if not _LABEL_VALUE.fullmatch(label):
        raise KoordinatorFileError(
            f"the model {name!r} gives {label!r}, which is no Kubernetes label value: the API "
            "server would refuse koordlet's Device"
        )
    return label


def minors(topology: Topology) -> list[int]:
    """Each GPU's minor, by index: the driver's where every GPU's is known, else the index.
    Raises KoordinatorFileError when two GPUs claim one minor."""
    known = [g.minor for g in topology.gpus if g.minor is not None]
    chosen = known if len(known) == len(topology.gpus) else [g.index for g in topology.gpus]
    if len(set(chosen)) != len(chosen):
        raise KoordinatorFileError(f"two GPUs have one minor number ({chosen})")
    return chosen


def _links(
    topology: Topology, index: int, island: tuple[int, ...], minor: list[int]
) -> list[dict[str, str]]:
    n = len(topology.gpus)
    links = [
        {"peerMinor": str(minor[j]), "type": LINK_TYPE}
        for j in range(n)
        if j != index and _nvlinked(topology, index, j)
    ]
    if len(island) > 2 and all(_nvlinked(topology, a, b) for a in island for b in island if a < b):
        peers = ",".join(str(minor[j]) for j in island if j != index)
        links.append({"peerMinor": peers, "type": LINK_TYPE})
    return links


def device_infos(topology: Topology, pcie_roots: Mapping[int, str]) -> list[dict[str, Any]]:
    """The device-info array koordlet reads, one entry per GPU.

    `pcie_roots` maps a GPU index to its PCIe root complex (`pci0000:15`). Raises
    KoordinatorFileError when the file cannot be what koordlet needs: a GPU without UUID, PCI
    address, memory size or root complex; an unknown model, GPUs of several models, or a model
    that makes no label value; two GPUs of one minor (the module docstring says why each matters).
    """
    if not topology.gpus:
        raise KoordinatorFileError("no GPU is known")
    model = _model(topology)
    minor = minors(topology)
    island_of = {gpu: island for island in topology.islands for gpu in island}
    devices = []
    for gpu in topology.gpus:
        i = gpu.index
        if not gpu.uuid:
            raise KoordinatorFileError(f"the UUID of GPU {i} is unknown")
        if gpu.pci is None:
            raise KoordinatorFileError(f"the PCI address of GPU {i} is unknown")
        if gpu.mem_mib is None:
            raise KoordinatorFileError(f"the memory size of GPU {i} is unknown")
        root = pcie_roots.get(i)
        if root is None or not _PCIE_ROOT.fullmatch(root):
            raise KoordinatorFileError(
                f"the PCIe root complex of GPU {i} ({gpu.pci}) is unknown: sysfs "
                f"bus/pci/devices/{gpu.pci} does not resolve into the PCI tree (check --sysfs-root)"
            )
        placement: dict[str, Any] = {}
        links = _links(topology, i, island_of.get(i, ()), minor)
        if links:
            placement["p2pLinks"] = links
        home = topology.home_numa(i)
        if home is not None:
            placement["nodeID"] = str(home)
        placement["pcieID"] = root
        placement["busID"] = gpu.pci
        devices.append(
            {
                "vendor": VENDOR,
                "model": model,
                "uuid": gpu.uuid,
                "minor": str(minor[i]),
                "resources": {GPU_CORE: WHOLE_GPU_CORE, GPU_MEMORY: f"{gpu.mem_mib}Mi"},
                "topology": placement,
                "status": {"healthy": not gpu.lost},
            }
        )
    return devices


def device_infos_text(topology: Topology, pcie_roots: Mapping[int, str]) -> str:
    """The file's content: the array as compact JSON, one line, with a final newline. Raises
    KoordinatorFileError as `device_infos` does."""
    return json.dumps(device_infos(topology, pcie_roots), separators=(",", ":")) + "\n"
