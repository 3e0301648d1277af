"""The doctor over racks: its cluster-wide NVLink fabric checks, and `doctor --all`, on 20 NVL72
racks x 18 nodes.

    python -m bench.doctor_racks [--racks 20] [--repeat 5]

Nodes: `reporter.collect.simulate.racks`, each tray scanned as the agent scans it and labelled and
annotated as the agent publishes it; one tray missing from one rack (a `partition-short` finding)
and two racks on one clique ID (`clique-id-shared`), so the checks find something.
Measured, median and minimum of `--repeat` runs after a warm-up:
- `fabric checks`: `reporter.doctor.racks.fabric_cluster_findings` over every Node object (pure: the
  labels only);
- `node findings`: `examine` per node without the API (decode of each topology annotation and
  every node finding), the part of `doctor --all` that grows with the annotation;
- `doctor --all`: the command, in process, against the API server double serving the Nodes and
  one ready agent pod per node (it lists the nodes, then reads each node's agent pods and Events).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Any

from bench.common import median_seconds, quiet_logs, table
from reporter.cli import main as cli_main
from reporter.collect import build_scanner
from reporter.collect.simulate.racks import rack_nodes, write_profiles
from reporter.doctor.model import AgentObservation
from reporter.doctor.node import node_findings
from reporter.doctor.racks import fabric_cluster_findings
from reporter.schema.codec import decode, encode
from reporter.schema.labels import labels
from tests.support.kube_double import ApiServerDouble, make_certificate, write_kubeconfig

PREFIX = "gpu.topology.io"
AGENT = {"app.kubernetes.io/name": "topo-reporter"}


def rack_objects(racks: int, work: Path) -> list[dict[str, Any]]:
    """Node objects of `racks` racks as the agent leaves them; rack 0 misses its last tray,
    racks 0 and 1 share a clique ID."""
    cliques = [17044, 17044, *range(2, racks)][:racks]
    nodes = [n for n in rack_nodes(racks, cliques=cliques) if not (n.rack == 0 and n.tray == 17)]
    out = []
    for node, path in zip(nodes, write_profiles(nodes, work), strict=True):
        topology = build_scanner("auto", Path("/sys"), str(path)).scan().topology
        assert topology is not None
        out.append(
            {
                "metadata": {
                    "name": node.name,
                    "labels": labels(topology, PREFIX, node.name),
                    "annotations": {f"{PREFIX}/topology": encode(topology)},
                },
                "status": {
                    "allocatable": {"nvidia.com/gpu": "4"},
                    "capacity": {"nvidia.com/gpu": "4"},
                },
            }
        )
    return out


def node_pass(nodes: list[dict[str, Any]]) -> int:
    found = 0
    healthy = AgentObservation(pod_found=True, pod_ready=True)
    for node in nodes:
        topology = decode(node["metadata"]["annotations"][f"{PREFIX}/topology"])
        found += len(node_findings(node, topology, PREFIX, healthy))
    return found


def doctor_all(kubeconfig: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["doctor", "--all", "--kubeconfig", str(kubeconfig)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    quiet_logs(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        nodes = rack_objects(args.racks, Path(tmp) / "profiles")
        findings = fabric_cluster_findings(nodes, PREFIX)
        rows = []
        median, best = median_seconds(lambda: fabric_cluster_findings(nodes, PREFIX), args.repeat)
        rows.append(("fabric checks", f"{median * 1000:.1f}", f"{best * 1000:.1f}"))
        median, best = median_seconds(lambda: node_pass(nodes), args.repeat)
        rows.append(
            ("node findings (decode + judge)", f"{median * 1000:.0f}", f"{best * 1000:.0f}")
        )
        certificate = make_certificate(Path(tmp))
        with ApiServerDouble(certificate=certificate) as double:
            kubeconfig = write_kubeconfig(
                Path(tmp) / "admin.kubeconfig", double.url, "admin-token", ca_cert=certificate.cert
            )
            load(double, nodes)
            median, best = median_seconds(lambda: doctor_all(kubeconfig), args.repeat)
        rows.append(("doctor --all (API double)", f"{median * 1000:.0f}", f"{best * 1000:.0f}"))
    codes = sorted({f.code for fs in findings.values() for f in fs})
    print(
        f"{len(nodes)} nodes in {args.racks} racks; cluster-wide findings: {', '.join(codes)} "
        f"on {len(findings)} nodes"
    )
    print(table(("what", "median ms", "min ms"), rows))


def load(double: ApiServerDouble, nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        name = node["metadata"]["name"]
        double.add_node(name)
        double.edit_node(name, {"metadata": node["metadata"], "status": node["status"]})
        double.add_pod("gpu-topology", f"topo-reporter-{name}", node=name, labels=AGENT, ready=True)


if __name__ == "__main__":
    main()
