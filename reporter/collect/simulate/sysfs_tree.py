"""The sysfs tree of a simulated machine, laid out as the Linux kernel lays out `/sys`.

PCI devices live in their real hierarchy under `devices/pci<domain>:<bus>/…`, with the
`bus/pci/devices/<address>` and `class/infiniband/<name>` symlinks pointing into it, NUMA nodes
under `devices/system/node`. The tree is held in memory (the chart's root filesystem is read-only);
`write_tree` writes one to disk only to make test fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path

from parsers.cpulist import format_cpulist
from reporter.collect.simulate.machine import Machine, PciFunction
from reporter.hostfs import MemoryHostFS


def sysfs_entries(machine: Machine) -> tuple[dict[str, str], dict[str, str]]:
    """The files (path to content) and symlinks (path to relative target) of the machine's sysfs."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for f in machine.functions:
        _pci_function(machine, f, files, links)
    files["devices/system/cpu/possible"] = format_cpulist(machine.cpus_possible) + "\n"
    files["devices/system/cpu/online"] = format_cpulist(machine.cpus_possible) + "\n"
    node_ids = [n.id for n in machine.numa_nodes]
    files["devices/system/node/possible"] = format_cpulist(node_ids) + "\n"
    files["devices/system/node/online"] = format_cpulist(node_ids) + "\n"
    for node in machine.numa_nodes:
        base = f"devices/system/node/node{node.id}"
        files[f"{base}/cpulist"] = format_cpulist(node.cpus) + "\n"
        if node.distances:
            files[f"{base}/distance"] = " ".join(str(d) for d in node.distances) + "\n"
        files[f"{base}/meminfo"] = f"Node {node.id} MemTotal:       {node.mem_gib << 20} kB\n"
    return files, links


def _pci_function(
    machine: Machine, f: PciFunction, files: dict[str, str], links: dict[str, str]
) -> None:
    files[f"{f.path}/vendor"] = f"0x{f.vendor:04x}\n"
    files[f"{f.path}/device"] = f"0x{f.device:04x}\n"
    files[f"{f.path}/class"] = f"0x{f.pci_class:06x}\n"
    files[f"{f.path}/numa_node"] = f"{-1 if f.numa is None else f.numa}\n"
    local = machine.cpus_of(None if f.numa is None else frozenset({f.numa}))
    files[f"{f.path}/local_cpulist"] = format_cpulist(local) + "\n"
    links[f"bus/pci/devices/{f.address}"] = f"../../../{f.path}"
    if f.nic is not None:
        ib = f"{f.path}/infiniband/{f.nic}"
        files[f"{ib}/node_type"] = "1: CA\n"
        links[f"{ib}/device"] = f"../../../{f.address}"
        links[f"class/infiniband/{f.nic}"] = f"../../{ib}"


def memory_hostfs(machine: Machine) -> MemoryHostFS:
    """The machine's sysfs, in memory."""
    files, links = sysfs_entries(machine)
    return MemoryHostFS(files, links)


def procfs_entries(machine: Machine) -> dict[str, str]:
    """The NVIDIA driver's procfs files of the machine (`driver/nvidia/gpus/<bdf>/information`),
    as nv-procfs.c writes them, with each GPU's minor number."""
    files = {}
    for gpu, function in zip(machine.gpus, machine.gpu_functions, strict=True):
        files[f"driver/nvidia/gpus/{function.address}/information"] = (
            f"Model: \t\t {gpu.model}\n"
            f"GPU UUID: \t {gpu.uuid}\n"
            "Bus Type: \t PCIe\n"
            f"Bus Location: \t {function.address}\n"
            f"Device Minor: \t {gpu.minor}\n"
            "GPU Excluded:\t No\n"
        )
    return files


def memory_procfs(machine: Machine) -> MemoryHostFS:
    """The machine's `/proc` as far as the NVIDIA driver writes it, in memory."""
    return MemoryHostFS(procfs_entries(machine), {})


def write_tree(machine: Machine, root: Path) -> None:
    """Write the machine's sysfs under `root` with real symlinks (test fixtures only)."""
    files, links = sysfs_entries(machine)
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    for path, relative in links.items():
        link = root / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(relative, link)
