"""Pictures of a topology: Graphviz DOT and a Mermaid flowchart, both from one layout.

What is drawn, and why:
- GPUs are grouped by their NUMA node (one cluster or subgraph each; unknown locality: no group).
- Every NVLink pair is an edge labelled with its bond (`NV12`). A uniform NVSwitch fabric (every
  NVLink pair the same bond) is one `NVSwitch` node with a spoke to each GPU instead of a clique.
- PCIe paths between GPUs are not drawn as a clique: the NUMA groups already say NODE/SYS. Only a
  GPU without any NVLink gets edges, dashed, to its closest peers, and only when they share a PCIe
  switch (`PIX` or `PXB`), the pairs that matter when there is no NVLink.
- Each RDMA NIC is attached to its nearest GPUs (those at its closest path class), with a dashed
  edge labelled with that class; a NIC that is `SYS` from every GPU is drawn alone in its group.

Node ids are generated (`gpu0`, `nic3`, `numa1`), never taken from names, so any NIC name or model
string is safe; labels are escaped for each tool. It must never read anything but the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from parsers.links import Link, LinkKind
from reporter.schema.labels import summary
from reporter.schema.model import Topology

_SWITCH_CLASSES = (LinkKind.PIX, LinkKind.PXB)


@dataclass(frozen=True, slots=True)
class _Node:
    id: str
    label: str
    shape: str
    """`gpu`, `nic` or `switch`."""
    group: int | None
    """The NUMA node this is drawn in; None for the top level."""
    lost: bool = False


@dataclass(frozen=True, slots=True)
class _Edge:
    a: str
    b: str
    label: str
    nvlink: bool


def _pair(topology: Topology, a: int, b: int) -> Link:
    return min(topology.links[a][b], topology.links[b][a], key=lambda c: c.closeness)


def _layout(topology: Topology) -> tuple[list[_Node], list[_Edge]]:
    n = len(topology.gpus)
    nodes = [
        _Node(
            id=f"gpu{g.index}",
            label=f"GPU{g.index}"
            + (f"\n{g.model}" if g.model else "")
            + (" (lost)" if g.lost else ""),
            shape="gpu",
            group=topology.home_numa(g.index),
            lost=g.lost,
        )
        for g in topology.gpus
    ]
    pairs = [(a, b, _pair(topology, a, b)) for a in range(n) for b in range(a + 1, n)]
    nvlink = [(a, b, link) for a, b, link in pairs if link.is_nvlink]
    edges: list[_Edge] = []
    bonds = {link for _, _, link in nvlink}
    if topology.nvswitch and len(bonds) == 1:
        (bond,) = bonds
        nodes.append(_Node(id="nvswitch", label="NVSwitch", shape="switch", group=None))
        on_fabric = sorted({g for a, b, _ in nvlink for g in (a, b)})
        edges += [_Edge(f"gpu{g}", "nvswitch", bond.token, nvlink=True) for g in on_fabric]
    else:
        edges += [_Edge(f"gpu{a}", f"gpu{b}", link.token, nvlink=True) for a, b, link in nvlink]
    with_nvlink = {g for a, b, _ in nvlink for g in (a, b)}
    for a, b, link in pairs:
        if a in with_nvlink or b in with_nvlink or link.kind not in _SWITCH_CLASSES:
            continue
        closest_a = min(_pair(topology, a, x).closeness for x in range(n) if x != a)
        closest_b = min(_pair(topology, b, x).closeness for x in range(n) if x != b)
        if link.closeness in (closest_a, closest_b):
            edges.append(_Edge(f"gpu{a}", f"gpu{b}", link.token, nvlink=False))
    for k, nic in enumerate(topology.nics):
        nearest = min(nic.links, key=lambda c: c.closeness, default=None)
        near_gpus: list[int] = []
        if nearest is not None and nearest.kind is not LinkKind.SYS:
            near_gpus = [g for g in range(n) if nic.links[g] == nearest]
            edges += [_Edge(f"nic{k}", f"gpu{g}", nearest.token, nvlink=False) for g in near_gpus]
        homes = {topology.home_numa(g) for g in near_gpus}
        group = min(nic.numa) if nic.numa else (homes.pop() if len(homes) == 1 else None)
        nodes.append(_Node(id=f"nic{k}", label=nic.name, shape="nic", group=group))
    return nodes, edges


def _groups(nodes: list[_Node]) -> list[int]:
    return sorted({node.group for node in nodes if node.group is not None})


def _dot_string(text: str) -> str:
    """A DOT double-quoted string: backslash and quote escaped, newlines as DOT line breaks."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\r", "").replace("\n", "\\n") + '"'


_DOT_SHAPES = {"gpu": "box", "nic": "ellipse", "switch": "hexagon"}


def to_dot(topology: Topology) -> str:
    """The topology as a Graphviz graph (`dot -Tsvg`), ending in a newline."""
    nodes, edges = _layout(topology)
    lines = [
        "graph topology {",
        f"  graph [label={_dot_string(summary(topology))}, labelloc=t, fontname=Helvetica];",
        "  node [fontname=Helvetica];",
        "  edge [fontname=Helvetica, fontsize=10];",
    ]

    def node_line(node: _Node, indent: str) -> str:
        style = ", style=dashed, color=red" if node.lost else ""
        shape = _DOT_SHAPES[node.shape]
        return f"{indent}{node.id} [label={_dot_string(node.label)}, shape={shape}{style}];"

    for group in _groups(nodes):
        lines.append(f"  subgraph cluster_numa{group} {{")
        lines.append(f"    label={_dot_string(f'NUMA node {group}')};")
        lines += [node_line(node, "    ") for node in nodes if node.group == group]
        lines.append("  }")
    lines += [node_line(node, "  ") for node in nodes if node.group is None]
    for edge in edges:
        style = "penwidth=2" if edge.nvlink else "style=dashed"
        lines.append(f"  {edge.a} -- {edge.b} [label={_dot_string(edge.label)}, {style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_string(text: str) -> str:
    """A Mermaid quoted label: quotes and markup as entity codes, newlines as `<br/>`."""
    escaped = (
        text.replace("#", "#35;")
        .replace('"', "#quot;")
        .replace("<", "#lt;")
        .replace(">", "#gt;")
        .replace("\r", "")
    )
    return '"' + escaped.replace("\n", "<br/>") + '"'


_MERMAID_SHAPES = {"gpu": ("[", "]"), "nic": ("([", "])"), "switch": ("{{", "}}")}


def to_mermaid(topology: Topology) -> str:
    """The topology as a Mermaid flowchart (renders in GitHub and GitLab Markdown)."""
    nodes, edges = _layout(topology)
    lines = ["---", f"title: {json.dumps(summary(topology))}", "---", "flowchart LR"]

    def node_line(node: _Node, indent: str) -> str:
        start, end = _MERMAID_SHAPES[node.shape]
        return f"{indent}{node.id}{start}{_mermaid_string(node.label)}{end}"

    for group in _groups(nodes):
        lines.append(f"  subgraph numa{group}[{_mermaid_string(f'NUMA node {group}')}]")
        lines += [node_line(node, "    ") for node in nodes if node.group == group]
        lines.append("  end")
    lines += [node_line(node, "  ") for node in nodes if node.group is None]
    for edge in edges:
        arrow = "===" if edge.nvlink else "-.-"
        lines.append(f"  {edge.a} {arrow}|{_mermaid_string(edge.label)}| {edge.b}")
    lost = [node.id for node in nodes if node.lost]
    if lost:
        lines.append("  classDef lost stroke:#c00,stroke-dasharray:4")
        lines.append(f"  class {','.join(lost)} lost")
    return "\n".join(lines) + "\n"
