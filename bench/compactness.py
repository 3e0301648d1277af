"""Compactness: bytes of the `topology` annotation against bytes of `nvidia-smi topo -m` text.

Method. Real machines: every paste in tests/fixtures/nvidia-smi/ (except the rocm-smi one) is
parsed, and the annotation is `encode()` of the parsed topology (source nvidia-smi: what the text
carries, so no UUIDs, PCI addresses or models). The nvidia-smi bytes are the block nvidia-smi
prints, cut from the paste: the header line and matrix rows, the blank line, `Legend:` through the
`NV#` line, and the `NIC Legend:` block when there is one (the poster's prompt, fences and other
output around it are not counted). Simulated machines: one full scan (NVML and sysfs) of every
shipped profile; the annotation is what the agent would publish, the nvidia-smi bytes are the matrix
rendered as a 550-series driver prints it when piped (bench/common.py `nvidia_smi_text`, checked
against the real pastes: column "render" below). The target is annotation <= 0.5 x nvidia-smi.

Node bytes. What the agent adds to a Node, keys and values together, as every Node watcher
receives it on every Node update: the labels (with the kubelet policy labels at their longest
values, `single-numa-node`/`container`/`static`), the `topology`, `matrix` and `owned` annotations.
Column "nvidia-smi layout B" is what the `matrix` annotation cost when it was nvidia-smi's layout
(the CLI's `--format matrix`). The Node is named `gpu-node-01` (a node without a multi-node fabric
is its own NVLink domain, named after it). The target is at most 5 KiB for a DGX H100 (6 KiB while
schema v2 wrote every GPU's shared fields in each GPU; `gpu_common` brought it back under 5 KiB).

    python bench/compactness.py
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import nvidia_smi_text, quiet_logs, table
from parsers.errors import ParseError
from parsers.kubelet import KubeletPolicies
from parsers.nvsmi import parse_topo
from reporter.agent import SchemaProjection
from reporter.collect import build_scanner, list_profiles
from reporter.schema import keys
from reporter.schema.codec import encode
from reporter.schema.labels import kubelet_labels
from reporter.schema.matrix import render_matrix
from reporter.schema.model import Topology
from reporter.schema.normalize import topology_from_matrix

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nvidia-smi"
TARGET = 0.5
PARTS = ["gpu_common", "gpus", "links", "pcie", "nics", "numa_nodes", "islands", "hash"]


def printed_block(text: str, header_line: int, rows: int) -> str:
    """The lines of `text` that nvidia-smi printed: header, rows, Legend, NIC Legend."""
    lines = text.replace("\r\n", "\n").split("\n")
    block = lines[header_line - 1 : header_line + rows]
    rest = lines[header_line + rows :]
    for title, entry in (("Legend:", r"\s+\S+\s*=\s"), ("NIC Legend:", r"\s*NIC\d+:")):
        start = next((i for i, line in enumerate(rest[:4]) if line.strip() == title), None)
        if start is None:
            continue
        end = start + 1
        for i in range(start + 1, len(rest)):
            if re.match(entry, rest[i]):
                end = i + 1
            elif rest[i].strip():
                break
        block += rest[:end]
        rest = rest[end:]
    return "\n".join(block) + "\n"


def breakdown(annotation: str) -> dict[str, int]:
    """Bytes of each top-level field (`"name":value,`); `other` is v, source, driver and braces."""
    doc: dict[str, Any] = json.loads(annotation)
    parts = {
        k: len(json.dumps({k: doc[k]}, separators=(",", ":"))) - 1 if k in doc else 0 for k in PARTS
    }
    parts["other"] = len(annotation) - sum(parts.values())
    return parts


def gpu_fields(annotation: str) -> list[list[Any]]:
    """Per GPU field, summed over the GPUs: bytes of names (`"uuid":`), of values, nulls; a field
    written once in `gpu_common` is its own row, `(once)` after its name."""
    doc = json.loads(annotation)
    fields: dict[str, list[int]] = {}
    for gpu, suffix in [(doc.get("gpu_common", {}), " (once)")] + [(g, "") for g in doc["gpus"]]:
        for name, value in gpu.items():
            entry = fields.setdefault(name + suffix, [0, 0, 0])
            entry[0] += len(name) + 3 + 1  # quotes, colon and the comma or brace after it
            entry[1] += len(json.dumps(value, separators=(",", ":")))
            entry[2] += value is None
    return [[name, *counts] for name, counts in fields.items()]


def gzip_b64(annotation: str) -> int:
    return len(base64.b64encode(gzip.compress(annotation.encode("ascii"), 9, mtime=0)))


def row(name: str, topology: Topology, smi_bytes: int, render: int | str) -> list[Any]:
    annotation = encode(topology)
    ratio = len(annotation) / smi_bytes
    parts = breakdown(annotation)
    verdict = "met" if ratio <= TARGET else f"missed x{ratio / TARGET:.1f}"
    return [
        name,
        len(topology.gpus),
        len(topology.nics),
        smi_bytes,
        render,
        len(annotation),
        f"{ratio:.2f}",
        verdict,
        *(parts[p] for p in [*PARTS, "other"]),
        gzip_b64(annotation),
    ]


HEADERS = [
    "machine", "GPUs", "NICs", "nvidia-smi B", "render B", "annotation B", "ratio", "target 0.5",
    *(f"{p} B" for p in PARTS), "other B", "gzip+b64 B",
]  # fmt: skip


NODE_TARGET = 5 * 1024
NODE_NAME = "gpu-node-01"
LONGEST_POLICIES = KubeletPolicies("single-numa-node", "container", "static")
NODE_HEADERS = [
    "machine", "GPUs", "NICs", "labels B", "topology B", "matrix B", "nvidia-smi layout B",
    "owned B", "total B", "target 5 KiB",
]  # fmt: skip


def node_row(name: str, topology: Topology) -> list[Any]:
    """Bytes the agent adds to a Node: labels, each annotation, all keys included."""
    projection = SchemaProjection(keys.DEFAULT_PREFIX, NODE_NAME)
    want = projection.desired(topology, kubelet_labels(LONGEST_POLICIES, keys.DEFAULT_PREFIX))

    def size(items: dict[str, str]) -> int:
        return sum(len(k.encode()) + len(v.encode()) for k, v in items.items())

    labels = size(dict(want.labels))
    notes = {k.rsplit("/", 1)[1]: size({k: v}) for k, v in want.annotations.items()}
    total = labels + sum(notes.values())
    key = len(keys.key(keys.DEFAULT_PREFIX, keys.MATRIX))
    return [
        name,
        len(topology.gpus),
        len(topology.nics),
        labels,
        notes[keys.TOPOLOGY],
        notes[keys.MATRIX],
        key + len(render_matrix(topology)),
        notes[keys.OWNED],
        total,
        "met" if total <= NODE_TARGET else f"over by {total - NODE_TARGET}",
    ]


def real_topologies() -> dict[str, Topology]:
    out = {}
    for path in sorted(FIXTURES.glob("*.txt")):
        try:
            out[path.stem] = topology_from_matrix(parse_topo(path.read_text(encoding="utf-8")))
        except ParseError:
            continue  # the rocm-smi paste: not an nvidia-smi machine
    return out


def real_rows() -> list[list[Any]]:
    rows = []
    for path in sorted(FIXTURES.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        try:
            matrix = parse_topo(text)
        except ParseError:
            continue  # the rocm-smi paste: not an nvidia-smi machine
        topology = topology_from_matrix(matrix)
        size = len(matrix.gpu_links) + len(matrix.nic_names)
        smi = printed_block(text, matrix.header_line, size)
        rows.append(
            row(path.stem, topology, len(smi.encode("utf-8")), len(nvidia_smi_text(topology)))
        )
    return rows


def simulated() -> dict[str, Topology]:
    out = {}
    for profile in list_profiles():
        topology = build_scanner("auto", Path("/sys"), profile.name).scan().topology
        assert topology is not None, profile.name
        out[profile.name] = topology
    return out


def main() -> None:
    quiet_logs()
    print("Real nvidia-smi pastes (annotation of the parsed text, source nvidia-smi):\n")
    real = real_rows()
    print(table(HEADERS, real))
    sims = simulated()
    sim_rows = [
        row(f"sim {name}", t, len(nvidia_smi_text(t).encode()), "=") for name, t in sims.items()
    ]
    print("\nSimulated machines (one full NVML + sysfs scan, source nvml):\n")
    print(table(HEADERS, sim_rows))
    print("\nWhere the GPU objects' bytes go, simulated dgx-h100 (8 GPUs):\n")
    print(
        table(
            ["field", "name bytes", "value bytes", "nulls"],
            gpu_fields(encode(sims["dgx-h100"])),
        )
    )
    print("\nNode bytes: labels and annotations the agent adds, keys included:\n")
    nodes = [node_row(f"sim {name}", t) for name, t in sims.items()]
    nodes += [node_row(name, t) for name, t in real_topologies().items()]
    print(table(NODE_HEADERS, nodes))
    ratios = [float(r[6]) for r in [*real, *sim_rows]]
    met = sum(r <= TARGET for r in ratios)
    print(
        f"\n{met} of {len(ratios)} machines meet the target; ratio median "
        f"{sorted(ratios)[len(ratios) // 2]:.2f}, range {min(ratios):.2f}..{max(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
