"""Hostile and broken InfiniBand fabrics for the node's discovery, on the real ibsim.

Each builder writes an ibsim 0.10 netlist (tests.support.ibsim describes the format) for one
thing real fabrics do to a naive walk: a storage switch every host's storage HCA hangs on,
switch NodeDescriptions of control characters or 64 bytes that are not text, a switch claiming
255 ports, cables that loop, ports that stop answering (ibsim's own `Error` command, given as a
`do` line, drops every SMP of one attribute, or all, at a switch), a port without a link, and a
fabric of 10,000 hosts. `HostileSim` runs ibsim with room for such a fabric, and `walk` runs the
product's discover as one CA in a child process (this module, run as `python -m`), with the
per-SMP timeout and the time bound the test gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

import structlog

from reporter.collect.infiniband import DEFAULT_BUDGET, discover
from reporter.collect.infiniband_tiers import Discovery, PortView, SmpCounts
from reporter.errors import CollectError
from tests.support.ibsim import IbSim, WalkError

PROMPT = "sim> "
"""What ibsim's console prints, and flushes, once it has run a command."""
ESCAPES = "\x1b[2J\x1b]0;owned\x07leaf\r\x7f"
"""A NodeDescription that would clear a terminal, retitle it and return to the line's start."""
GARBAGE = (
    bytes((0x80 + 37 * i) % 0x100 for i in range(64))
    .translate(bytes.maketrans(b'\x00\n"[]#@ \t\r\x0b\x0c', b"ABCDEFGHIJKL"))
    .decode("utf-8", "surrogateescape")
)
"""64 bytes, no NUL among them, most not UTF-8. The netlist's own syntax (NUL, newline, quote,
brackets, `#`, `@`) and white space are left out, so that ibsim reads it whole as a
NodeDescription (and serves its first 63: ibsim ends every description with a NUL)."""


def node(
    kind: str, ports: int, name: str, links: dict[int, tuple[str, int]], description: str = ""
) -> str:
    """One netlist record: `kind` (Switch or Hca) with its cabled ports, and a NodeDescription
    other than its name where given (ibnetdiscover's `# "<description>"`, which ibsim reads)."""
    header = f'{kind}\t{ports} "{name}"'
    if description:
        header += f'\t# "{description}" base port 0 lid 0 lmc 0'
    lines = [header]
    lines += [
        f'[{port}]\t"{peer}"[{peer_port}]' for port, (peer, peer_port) in sorted(links.items())
    ]
    return "\n".join(lines) + "\n\n"


@dataclass(frozen=True, slots=True)
class SmallTree:
    """A 2-tier tree built by hand: `leaves` leaves of `hosts` single-HCA hosts each, under
    `spines` spines, every switch `radix` ports; leaf i's port hosts+1+s goes to spine s, spine
    s's port i+1 to leaf i. Switches can be given NodeDescriptions other than their names
    (`descriptions`), cables added (`extra`: switch, port, peer, peer port), and ibsim commands
    appended (`commands`)."""

    leaves: int = 2
    hosts: int = 2
    spines: int = 2
    radix: int = 8
    descriptions: tuple[tuple[str, str], ...] = ()
    extra: tuple[tuple[str, int, str, int], ...] = ()
    commands: tuple[str, ...] = ()

    def hcas(self) -> dict[str, str]:
        """Every host's one HCA (its SIM_HOST), by host."""
        return {
            f"l{leaf_index}h{h}": f"l{leaf_index}h{h}-hca"
            for leaf_index in range(self.leaves)
            for h in range(self.hosts)
        }

    def netlist(self) -> str:
        links: dict[str, dict[int, tuple[str, int]]] = {}

        def link(a: str, a_port: int, b: str, b_port: int) -> None:
            links.setdefault(a, {})[a_port] = (b, b_port)
            links.setdefault(b, {})[b_port] = (a, a_port)

        for leaf_index in range(self.leaves):
            leaf = f"leaf{leaf_index}"
            for s in range(self.spines):
                link(leaf, self.hosts + 1 + s, f"spine{s}", leaf_index + 1)
            for h in range(self.hosts):
                link(leaf, h + 1, f"l{leaf_index}h{h}-hca", 1)
        for a, a_port, b, b_port in self.extra:
            link(a, a_port, b, b_port)
        text = "".join(
            node(
                "Hca" if name.endswith("-hca") else "Switch",
                1 if name.endswith("-hca") else self.radix,
                name,
                ports,
                dict(self.descriptions).get(name, ""),
            )
            for name, ports in links.items()
        )
        return text + "".join(f"do {command}\n" for command in self.commands)


def storage_fabric(leaves: int, hosts: int) -> str:
    """SmallTree's compute fabric, and one storage switch that every host's second HCA
    (`<host>-storage`) hangs on: the switch a naive walk would take for every node's leaf."""
    tree = SmallTree(leaves=leaves, hosts=hosts, radix=max(hosts + 2, leaves) + 1)
    storage = {i + 1: (f"{host}-storage", 1) for i, host in enumerate(tree.hcas())}
    cas = "".join(
        node("Hca", 1, f"{host}-storage", {1: ("storage", i + 1)})
        for i, host in enumerate(tree.hcas())
    )
    return tree.netlist() + node("Switch", len(storage) + 1, "storage", storage) + cas


def big_fabric(
    hosts: int, hosts_per_leaf: int = 48, spines: int = 8, spine_ports: int = 254
) -> str:
    """A 2-tier fat tree of `hosts` hosts, `hosts_per_leaf` on each leaf (its other ports to
    the spines), under `spines` spines of `spine_ports` ports: the switches' radix fixed, as a
    real fabric's is, whatever the hosts."""
    count = -(-hosts // hosts_per_leaf)
    if count > spine_ports:
        raise ValueError(f"{count} leaves do not fit {spine_ports}-port spines")
    parts = [
        node(
            "Switch",
            spine_ports,
            f"spine{s}",
            {
                leaf_index + 1: (f"leaf{leaf_index}", hosts_per_leaf + 1 + s)
                for leaf_index in range(count)
            },
        )
        for s in range(spines)
    ]
    for leaf_index in range(count):
        ports = {
            h + 1: (f"h{leaf_index * hosts_per_leaf + h}", 1)
            for h in range(hosts_per_leaf)
            if leaf_index * hosts_per_leaf + h < hosts
        }
        ports |= {hosts_per_leaf + 1 + s: (f"spine{s}", leaf_index + 1) for s in range(spines)}
        parts.append(node("Switch", hosts_per_leaf + spines, f"leaf{leaf_index}", ports))
    parts += [
        node("Hca", 1, f"h{h}", {1: (f"leaf{h // hosts_per_leaf}", h % hosts_per_leaf + 1)})
        for h in range(hosts)
    ]
    return "".join(parts)


class HostileSim(IbSim):
    """IbSim, with ibsim's tables sized for up to `nodes` nodes (its default holds 2,048 nodes,
    256 switches and 13,312 ports), and its console on a pipe: `console` runs one of its
    commands (`Unlink "<node>"[<port>]`, `ReLink "<node>"`) and returns once ibsim has."""

    def __init__(self, netlist: str, nodes: int = 0) -> None:
        super().__init__(netlist)
        self.nodes = nodes
        self.last_stderr = ""
        """What the last walk's child wrote on stderr (its log lines)."""

    def __enter__(self) -> HostileSim:
        # IbSim's start, with the tables sized (ibsim has no other way to be told) and the
        # netlist written as bytes: a hostile name is not UTF-8 (surrogate escapes in the text).
        sizes = (
            ["-N", str(self.nodes), "-S", "1024", "-P", str(8 * self.nodes)] if self.nodes else []
        )
        try:
            net = self.workdir / "fabric.net"
            net.write_bytes(self.netlist.encode("utf-8", "surrogateescape"))
            with (self.workdir / "ibsim.log").open("wb") as log:
                self.process = subprocess.Popen(
                    ["timeout", "600", "ibsim", "-s", *sizes, str(net)],
                    cwd=self.workdir,
                    env={**os.environ, "IBSIM_SOCKNAME": self.sockname},
                    stdin=subprocess.PIPE,
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
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        super().__exit__(kind, error, tb)

    def console(self, command: str) -> None:
        """Run `command` on ibsim's console; return once it has printed its next prompt (it
        flushes one after each command), within 10 s."""
        assert self.process is not None
        assert self.process.stdin is not None
        prompts = self.log().count(PROMPT)
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + 10
        while self.log().count(PROMPT) == prompts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ibsim did not take {command!r}: {self.log()[-2000:]}")
            time.sleep(0.02)

    def walk_as(self, hca: str, *arguments: str) -> Discovery:
        """discover as the CA `hca`, in a child process (`arguments`: main's). Raises WalkError
        with the child's last line when it exits non-zero."""
        done = self.run_as(hca, [sys.executable, "-m", "tests.support.ibsim_hostile", *arguments])
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [""]
            raise WalkError(done.returncode, lines[-1])
        self.last_stderr = done.stderr
        return decode(done.stdout)


def encode(found: Discovery) -> str:
    """The child's Discovery as JSON: its tiers and counts as found, its views' leaves."""
    return json.dumps(
        {
            "tiers": list(found.tiers),
            "views": [[v.name, v.port, v.port_guid, v.leaf] for v in found.views],
            "smps": dataclasses.asdict(found.smps),
            "subnet_managers": sorted(found.subnet_managers),
        }
    )


def decode(text: str) -> Discovery:
    document = json.loads(text)
    return Discovery(
        tuple(document["tiers"]),
        tuple(
            PortView(name, port, guid, leaf, frozenset())
            for name, port, guid, leaf in document["views"]
        ),
        SmpCounts(**document["smps"]),
        frozenset(document["subnet_managers"]),
    )


def main() -> None:
    """The child: discover from the ports this process can use, print what it found; a
    CollectError is one line on stderr (after any log lines) and exit 1."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parser = argparse.ArgumentParser(prog="python -m tests.support.ibsim_hostile")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--smp-timeout", type=float, default=0.5)
    parser.add_argument("--total", type=float, default=None)
    arguments = parser.parse_args()
    try:
        found = discover(
            budget=arguments.budget, timeout_s=arguments.smp_timeout, total_s=arguments.total
        )
    except CollectError as error:
        sys.exit(f"topo-reporter: {error}")
    print(encode(found))


if __name__ == "__main__":
    main()
