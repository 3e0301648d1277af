"""Simulated InfiniBand fabrics for the node's discovery: netlists, the real ibsim, hosts walked.

`FatTree` writes an ibsim 0.10 netlist for 2-tier and 3-tier fat trees (rail-optimized or not,
with SHARP Aggregation Node CAs on every switch, a leaf-spine or spine-core link removed, one or
more separate subnets) and knows their truth: each host's HCAs, its leaf group, its spine group
(its pod) and its core group (its subnet). `IbSim` runs the real `ibsim` on one such netlist under
its own socket name, and the real OpenSM on the switches named, each the master of its subnet;
`walk_host` runs the product's walk (reporter.collect.infiniband.discover) as that host: one
process per HCA, since umad2sim makes a process one CA, each with the preload, in a scratch
directory and under a timeout. Run as `python -m tests.support.ibsim`, this module is that child:
it prints its ports' views as JSON.
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
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType

from reporter.collect.infiniband import (
    DEFAULT_BUDGET,
    MAX_LEVELS,
    discover,
    list_ports,
    walk_ports,
)
from reporter.collect.infiniband_tiers import Discovery, PortView, SmpCounts, summarize
from reporter.errors import CollectError

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
REPO_ROOT = Path(__file__).resolve().parents[2]
AGGREGATION_NODE = "Mellanox Technologies Aggregation Node"
CLIENT_TIMEOUT_S = 30
SM_UP_TIMEOUT_S = 60
"""OpenSM's first sweep of a simulated fabric of a few hundred nodes takes a second or two."""
SWITCH_GUID_BASE = 0x200000
"""ibsim numbers switches 0x200000 on, CAs 0x100000 on, in the order of their records."""


def have_ibsim() -> bool:
    """Whether ibsim and its preload are installed (tests/prereqs.sh installs them)."""
    return shutil.which("ibsim") is not None and UMAD2SIM.exists()


def have_opensm() -> bool:
    """Whether OpenSM is installed (tests/prereqs.sh installs it, its service kept stopped)."""
    return shutil.which("opensm") is not None


@dataclass(frozen=True, slots=True)
class FatTree:
    """Fat trees, one per subnet. 2-tier (`pods` 0): `units` leaf groups of `rails` leaves each
    (one per rail), `hosts_per_unit` hosts with one HCA per rail, and `spines_per_rail` spines per
    rail, each linked to its rail's leaf in every unit. 3-tier (`pods` > 0): that 2-tier tree is a
    pod, `pods` of them per subnet, and spine n of rail r of every pod links to each of the
    `cores_per_group` cores of core group (r, n), as a Clos network wires its cores."""

    subnets: int = 1
    units: int = 2
    rails: int = 1
    hosts_per_unit: int = 2
    spines_per_rail: int = 2
    aggregation_nodes: bool = False
    """A SHARP Aggregation Node CA on the last port of every switch, as Quantum switches carry."""
    missing_link: tuple[int, int, int, int] | None = None
    """(subnet, unit, rail, spine) of a 2-tier tree: the leaf-spine link left out."""
    switch_ports: int = 0
    """Ports per switch, the unused ones down; 0: just enough."""
    pods: int = 0
    cores_per_group: int = 1
    cut: tuple[str, str] | None = None
    """Two switches (node ids) whose link is left out: a leaf and a spine, or a spine and a core."""

    @property
    def radix(self) -> int:
        """Ports per switch: enough for hosts, spines, leaves and cores, plus the Aggregation
        Node."""
        cores = self.cores_per_group if self.pods else 0
        return (
            max(
                self.hosts_per_unit + self.spines_per_rail,
                self.units + cores,
                self.pods,
                self.switch_ports - 1,
            )
            + 1
        )

    def pod_names(self) -> list[str]:
        """Every pod: a subnet in a 2-tier tree (`s0`), a pod of one in a 3-tier tree (`s0p1`)."""
        if not self.pods:
            return [f"s{s}" for s in range(self.subnets)]
        return [f"s{s}p{p}" for s in range(self.subnets) for p in range(self.pods)]

    def hosts(self) -> dict[str, tuple[str, ...]]:
        """Every host, and the node ids (SIM_HOST) of its HCAs, rail by rail."""
        return {
            f"{pod}u{u}h{h}": tuple(f"{pod}u{u}h{h}-hca{r}" for r in range(self.rails))
            for pod in self.pod_names()
            for u in range(self.units)
            for h in range(self.hosts_per_unit)
        }

    def leaf_group(self, host: str) -> str:
        """The host's true leaf group: its pod and unit."""
        return host.split("h", 1)[0]

    def spine_group(self, host: str) -> str:
        """The host's true spine group: its pod (its subnet in a 2-tier tree)."""
        return host.split("u", 1)[0]

    def core_group(self, host: str) -> str:
        """The host's true core group, the top of its fabric: its subnet."""
        return host.split("u", 1)[0].split("p", 1)[0]

    def leaf_of(self, hca: str) -> str:
        """The node id of the leaf an HCA hangs on."""
        host, rail = hca.rsplit("-hca", 1)
        return f"leaf-{self.leaf_group(host)}r{rail}"

    def subnet_manager_nodes(self) -> tuple[str, ...]:
        """A switch of each subnet for OpenSM to run on (a managed switch's SM, on port 0)."""
        pod = "p0" if self.pods else ""
        return tuple(f"spine-s{s}{pod}r0n0" for s in range(self.subnets))

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
        if self.missing_link is not None and self.pods:
            raise ValueError("missing_link names a 2-tier tree's cable: in 3 tiers name it by cut")
        switches: dict[str, dict[int, tuple[str, int]]] = {}
        cas: dict[str, dict[int, tuple[str, int]]] = {}
        cut = frozenset(self.cut or ())

        def link(a: str, a_port: int, b: str, b_port: int) -> None:
            if {a, b} == cut:
                return
            for name, port, peer, peer_port in ((a, a_port, b, b_port), (b, b_port, a, a_port)):
                (cas if "hca" in name or AGGREGATION_NODE in name else switches).setdefault(
                    name, {}
                )[port] = (peer, peer_port)

        for pod_index, pod in enumerate(self.pod_names()):
            s = int(pod[1:].split("p", 1)[0])
            for r in range(self.rails):
                for j in range(self.spines_per_rail):
                    spine = f"spine-{pod}r{r}n{j}"
                    switches[spine] = {}
                    for u in range(self.units):
                        if self.missing_link == (s, u, r, j):
                            continue
                        link(spine, u + 1, f"leaf-{pod}u{u}r{r}", self.hosts_per_unit + j + 1)
                    if self.pods:
                        p = pod_index % self.pods
                        for c in range(self.cores_per_group):
                            link(spine, self.units + c + 1, f"core-s{s}r{r}n{j}c{c}", p + 1)
        for pod in self.pod_names():
            for u in range(self.units):
                for r in range(self.rails):
                    switches.setdefault(f"leaf-{pod}u{u}r{r}", {})
        for host, hcas in self.hosts().items():
            for hca in hcas:
                link(hca, 1, self.leaf_of(hca), int(host.rsplit("h", 1)[1]) + 1)
        if self.aggregation_nodes:
            for switch in list(switches):
                link(switch, self.radix, f"{switch} {AGGREGATION_NODE}", 1)
        return switches, cas


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


class WalkError(Exception):
    """A walk's child exited non-zero: its status and the last line it wrote."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(f"exit {status}: {line}")
        self.status = status
        self.line = line


@dataclass
class IbSim:
    """The real ibsim serving one netlist, under a socket name of its own, and the real OpenSM on
    each node of `subnet_managers` (a switch: its SM on port 0), all stopped on exit. OpenSM's
    log, cache and dumps stay in the scratch directory (OSM_CACHE_DIR, --dump_files_dir); `-d2`
    flushes its log at every line, which is how the wait for its first sweep reads it."""

    netlist: str
    subnet_managers: tuple[str, ...] = ()
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ibsim-")))
    sockname: str = field(default_factory=lambda: f"topo{uuid.uuid4().hex[:12]}")
    process: subprocess.Popen[bytes] | None = None
    sms: list[subprocess.Popen[bytes]] = field(default_factory=list)

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
            for node in self.subnet_managers:
                self._start_sm(node)
            for index in range(len(self.subnet_managers)):
                self._wait_sm_up(index)
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

    def _start_sm(self, node: str) -> None:
        home = self.workdir / f"sm{len(self.sms)}"
        home.mkdir()
        self.sms.append(
            subprocess.Popen(
                [
                    *("timeout", "600", "opensm", "-d2", "-f", str(home / "opensm.log")),
                    *("--dump_files_dir", str(home)),
                ],
                cwd=home,
                env={
                    **os.environ,
                    "LD_PRELOAD": str(UMAD2SIM),
                    "SIM_HOST": node,
                    "IBSIM_SOCKNAME": self.sockname,
                    "OSM_CACHE_DIR": str(home),
                    "OSM_TMP_DIR": str(home),
                },
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def _wait_sm_up(self, index: int) -> None:
        """Until SM `index` has swept its subnet and serves it (its log says `SUBNET UP`)."""
        log = self.workdir / f"sm{index}" / "opensm.log"
        deadline = time.monotonic() + SM_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.sms[index].poll() is not None:
                raise RuntimeError(f"opensm exited {self.sms[index].returncode}")
            if log.exists() and "SUBNET UP" in log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"opensm on {self.subnet_managers[index]} was not up within 60 s")

    def stop_subnet_managers(self) -> None:
        """Stop every OpenSM: the ports keep the LIDs it gave them, and no SA answers."""
        for sm in self.sms:
            _end(sm)

    def log(self) -> str:
        """What ibsim printed so far."""
        path = self.workdir / "ibsim.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _stop(self) -> None:
        for sm in self.sms:
            _end(sm)
        if self.process is not None:
            _end(self.process)
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
        views, smps, _ = self._walk(hca, *arguments)
        return views, smps

    def _walk(
        self, hca: str, *arguments: str
    ) -> tuple[tuple[PortView, ...], SmpCounts, frozenset[int]]:
        done = self.run_as(hca, [sys.executable, "-m", "tests.support.ibsim", *arguments])
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [""]
            raise WalkError(done.returncode, lines[-1])
        return _decode(done.stdout)

    def walk_host(self, hcas: tuple[str, ...]) -> Discovery:
        """The Discovery of a host whose HCAs are the CAs `hcas`, each walked by a process; only
        the first asks the subnet manager, as the product asks it once for all its ports."""
        views: list[PortView] = []
        smps = SmpCounts()
        managers: frozenset[int] = frozenset()
        for index, hca in enumerate(hcas):
            seen, counts, found = self._walk(hca, *(("--no-sa",) if index else ()))
            # umad2sim names every client's CA ibsim0; the host's HCA names are its node ids.
            views.extend(replace(view, name=hca) for view in seen)
            smps += counts
            managers |= found
        return summarize(views, smps, managers)


def _encode(views: tuple[PortView, ...], smps: SmpCounts, managers: frozenset[int]) -> str:
    return json.dumps(
        {
            "views": [
                [
                    view.name,
                    view.port,
                    view.port_guid,
                    view.leaf,
                    sorted(view.under_spines),
                    sorted(view.cores),
                    view.master_sm_lid,
                ]
                for view in views
            ],
            "smps": [getattr(smps, counted.name) for counted in fields(SmpCounts)],
            "managers": sorted(managers),
        }
    )


def _decode(text: str) -> tuple[tuple[PortView, ...], SmpCounts, frozenset[int]]:
    document = json.loads(text)
    views = tuple(
        PortView(name, port, guid, leaf, frozenset(under), frozenset(cores), sm_lid)
        for name, port, guid, leaf, under, cores, sm_lid in document["views"]
    )
    return views, SmpCounts(*document["smps"]), frozenset(document["managers"])


def main() -> None:
    """The child: walk the ports this process can use (or those of the HCAs named), print the
    views, the MAD counts and the SMs; a CollectError is one line on stderr and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.ibsim")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--levels", type=int, default=MAX_LEVELS)
    parser.add_argument("--no-sa", action="store_true", help="walk only: ask no subnet manager")
    arguments = parser.parse_args()
    names = arguments.names or None
    try:
        if arguments.no_sa:
            views, smps = walk_ports(
                list_ports(names), levels=arguments.levels, budget=arguments.budget
            )
            print(_encode(views, smps, frozenset()))
        else:
            found = discover(names, levels=arguments.levels, budget=arguments.budget)
            print(_encode(found.views, found.smps, found.subnet_managers))
    except CollectError as error:
        sys.exit(f"topo-reporter: {error}")


if __name__ == "__main__":
    main()
