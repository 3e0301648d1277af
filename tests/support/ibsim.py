"""Simulated InfiniBand fabrics for the node's discovery: netlists, the real ibsim, hosts walked.

`FatTree` writes an ibsim 0.10 netlist for 2-tier fat trees (rail-optimized or not, with SHARP
Aggregation Node CAs on every switch, one leaf-spine link removed, one or more separate subnets)
and knows their truth: each host's HCAs, its leaf group and its spine group. `IbSim` runs the real
`ibsim` on one such netlist under its own socket name, and `walk_host` runs the product's walk
(reporter.collect.infiniband.discover) as that host: one process per HCA, since umad2sim makes a
process one CA, each with the preload, in a scratch directory and under a timeout. Run as
`python -m tests.support.ibsim`, this module is that child: it prints its ports' views as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from reporter.collect.infiniband import DEFAULT_BUDGET, MAX_LEVELS, discover
from reporter.collect.infiniband_tiers import Discovery, PortView, SmpCounts, summarize
from reporter.errors import CollectError

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
REPO_ROOT = Path(__file__).resolve().parents[2]
AGGREGATION_NODE = "Mellanox Technologies Aggregation Node"
CLIENT_TIMEOUT_S = 30
SWITCH_GUID_BASE = 0x200000
"""ibsim numbers switches 0x200000 on, CAs 0x100000 on, in the order of their records."""


def have_ibsim() -> bool:
    """Whether ibsim and its preload are installed (tests/prereqs.sh installs them)."""
    return shutil.which("ibsim") is not None and UMAD2SIM.exists()


@dataclass(frozen=True, slots=True)
class FatTree:
    """A 2-tier fat tree per subnet: `units` leaf groups of `rails` leaves each (one per rail),
    `hosts_per_unit` hosts with one HCA per rail, and `spines_per_rail` spines per rail, each
    linked to its rail's leaf in every unit."""

    subnets: int = 1
    units: int = 2
    rails: int = 1
    hosts_per_unit: int = 2
    spines_per_rail: int = 2
    aggregation_nodes: bool = False
    """A SHARP Aggregation Node CA on the last port of every switch, as Quantum switches carry."""
    missing_link: tuple[int, int, int, int] | None = None
    """(subnet, unit, rail, spine): the leaf-spine link left out."""
    switch_ports: int = 0
    """Ports per switch, the unused ones down; 0: just enough."""

    @property
    def radix(self) -> int:
        """Ports per switch: enough for hosts, spines and leaves, plus the Aggregation Node."""
        return (
            max(self.hosts_per_unit + self.spines_per_rail, self.units, self.switch_ports - 1) + 1
        )

    def hosts(self) -> dict[str, tuple[str, ...]]:
        """Every host, and the node ids (SIM_HOST) of its HCAs, rail by rail."""
        return {
            f"s{s}u{u}h{h}": tuple(f"s{s}u{u}h{h}-hca{r}" for r in range(self.rails))
            for s in range(self.subnets)
            for u in range(self.units)
            for h in range(self.hosts_per_unit)
        }

    def leaf_group(self, host: str) -> str:
        """The host's true leaf group: its subnet and unit."""
        return host.split("h", 1)[0]

    def spine_group(self, host: str) -> str:
        """The host's true spine group: its subnet."""
        return host.split("u", 1)[0]

    def leaf_of(self, hca: str) -> str:
        """The node id of the leaf an HCA hangs on."""
        host, rail = hca.rsplit("-hca", 1)
        return f"leaf-{self.leaf_group(host)}r{rail}"

    def switch_guids(self) -> dict[str, int]:
        """The GUID ibsim gives each switch."""
        return {name: SWITCH_GUID_BASE + index for index, name in enumerate(self._records()[0])}

    def netlist(self) -> str:
        """The fabric in ibsim's netlist format."""
        switches, cas = self._records()
        text = []
        for kind, records in (("Switch", switches), ("Hca", cas)):
            for name, ports in records.items():
                count = self.radix if kind == "Switch" else 1
                text.append(f'{kind}\t{count} "{name}"')
                text.extend(
                    f'[{port}]\t"{peer}"[{peer_port}]'
                    for port, (peer, peer_port) in sorted(ports.items())
                )
                text.append("")
        return "\n".join(text)

    def _records(
        self,
    ) -> tuple[dict[str, dict[int, tuple[str, int]]], dict[str, dict[int, tuple[str, int]]]]:
        switches: dict[str, dict[int, tuple[str, int]]] = {}
        cas: dict[str, dict[int, tuple[str, int]]] = {}

        def link(a: str, a_port: int, b: str, b_port: int) -> None:
            for name, port, peer, peer_port in ((a, a_port, b, b_port), (b, b_port, a, a_port)):
                (cas if "hca" in name or AGGREGATION_NODE in name else switches).setdefault(
                    name, {}
                )[port] = (
                    peer,
                    peer_port,
                )

        for s in range(self.subnets):
            for r in range(self.rails):
                for j in range(self.spines_per_rail):
                    spine = f"spine-s{s}r{r}n{j}"
                    switches[spine] = {}
                    for u in range(self.units):
                        if self.missing_link == (s, u, r, j):
                            continue
                        link(spine, u + 1, f"leaf-s{s}u{u}r{r}", self.hosts_per_unit + j + 1)
        for s in range(self.subnets):
            for u in range(self.units):
                for r in range(self.rails):
                    switches.setdefault(f"leaf-s{s}u{u}r{r}", {})
        for host, hcas in self.hosts().items():
            for hca in hcas:
                link(hca, 1, self.leaf_of(hca), int(host.rsplit("h", 1)[1]) + 1)
        if self.aggregation_nodes:
            for switch in list(switches):
                link(switch, self.radix, f"{switch} {AGGREGATION_NODE}", 1)
        return switches, cas


class WalkError(Exception):
    """A walk's child exited non-zero: its status and the last line it wrote."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(f"exit {status}: {line}")
        self.status = status
        self.line = line


@dataclass
class IbSim:
    """The real ibsim serving one netlist, under a socket name of its own, stopped on exit."""

    netlist: str
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ibsim-")))
    sockname: str = field(default_factory=lambda: f"topo{uuid.uuid4().hex[:12]}")
    process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> IbSim:
        try:
            net = self.workdir / "fabric.net"
            net.write_text(self.netlist)
            with (self.workdir / "ibsim.log").open("wb") as log:
                self.process = subprocess.Popen(
                    ["timeout", "600", "ibsim", "-s", "-n", str(net)],
                    cwd=self.workdir,
                    env={**os.environ, "IBSIM_SOCKNAME": self.sockname},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self._wait_listening()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        needle = f"@{self.sockname}:ctl"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"ibsim exited {self.process.returncode}: {self.log()[-2000:]}")
            if needle in Path("/proc/net/unix").read_text():
                return
            time.sleep(0.05)
        raise RuntimeError(f"ibsim did not listen within 30 s: {self.log()[-2000:]}")

    def log(self) -> str:
        """What ibsim printed so far."""
        path = self.workdir / "ibsim.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def run_as(
        self, hca: str, command: list[str], *, timeout_s: float = CLIENT_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """`command` as the CA `hca` of this fabric (one process is one CA in ibsim): under the
        umad2sim preload, in a scratch directory of its own (clients write `./sys-<pid>` there),
        removed after, within `timeout_s`."""
        scratch = Path(tempfile.mkdtemp(prefix="client-", dir=self.workdir))
        try:
            return subprocess.run(
                command,
                cwd=scratch,
                env={
                    **os.environ,
                    "PYTHONPATH": str(REPO_ROOT),
                    "LD_PRELOAD": str(UMAD2SIM),
                    "SIM_HOST": hca,
                    "IBSIM_SOCKNAME": self.sockname,
                },
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def walk(self, hca: str, *arguments: str) -> tuple[tuple[PortView, ...], SmpCounts]:
        """discover as the CA `hca`, in a child process of its own (`arguments`: main's).

        Raises WalkError with the child's last line when it exits non-zero."""
        done = self.run_as(hca, [sys.executable, "-m", "tests.support.ibsim", *arguments])
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [""]
            raise WalkError(done.returncode, lines[-1])
        return _decode(done.stdout)

    def walk_host(self, hcas: tuple[str, ...]) -> Discovery:
        """The Discovery of a host whose HCAs are the CAs `hcas`, each walked by a process."""
        views: list[PortView] = []
        smps = SmpCounts()
        for hca in hcas:
            seen, counts = self.walk(hca)
            # umad2sim names every client's CA ibsim0; the host's HCA names are its node ids.
            views.extend(
                PortView(hca, view.port, view.port_guid, view.leaf, view.under_spines)
                for view in seen
            )
            smps += counts
        return summarize(views, smps)


def _encode(views: tuple[PortView, ...], smps: SmpCounts) -> str:
    return json.dumps(
        {
            "views": [
                [view.name, view.port, view.port_guid, view.leaf, sorted(view.under_spines)]
                for view in views
            ],
            "smps": [smps.node_info, smps.port_info, smps.unanswered],
        }
    )


def _decode(text: str) -> tuple[tuple[PortView, ...], SmpCounts]:
    document = json.loads(text)
    views = tuple(
        PortView(name, port, guid, leaf, frozenset(under))
        for name, port, guid, leaf, under in document["views"]
    )
    return views, SmpCounts(*document["smps"])


def main() -> None:
    """The child: walk the ports this process can use (or those of the HCAs named), print the
    views and the SMP counts; a CollectError is one line on stderr and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.ibsim")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--levels", type=int, default=MAX_LEVELS)
    arguments = parser.parse_args()
    try:
        found = discover(arguments.names or None, levels=arguments.levels, budget=arguments.budget)
        print(_encode(found.views, found.smps))
    except CollectError as error:
        sys.exit(f"topo-reporter: {error}")


if __name__ == "__main__":
    main()
