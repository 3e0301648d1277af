"""`topo-reporter network --lldp` against the real lldpd, in network namespaces this test makes.

Two top-of-rack switches (`tor-a`, `tor-b`), each a namespace running lldpd on two ports, and four
nodes, each a namespace whose one compute NIC is a veth cabled to a ToR port: nodes 1 and 2 to
tor-a, 3 and 4 to tor-b. A fifth node is cabled to a third switch, `tor-c`, which sends nothing
(no lldpd there, as a switch with LLDP off, or a NIC whose firmware takes the frames): its port is
up and silent, which the agent's LLDP source tells (the `roce-port-silent` finding). Nodes 1 and
3 run lldpd too, so the command reads both ways: lldpd's neighbours (nodes 1 and 3) and its own
packet socket (nodes 2 and 4). lldpd sends every second and holds a neighbour 2 s (tx-hold 2), so
stopping a switch ages it out of lldpd in seconds.

lldpd runs only in these namespaces, on these veths, with its own config (`-O`) and control socket
(`-u`): nothing reaches the machine's own interfaces. Every namespace (with its veths), process
and file is removed afterwards, on failure too. Needs root (CAP_NET_ADMIN, CAP_NET_RAW); lldpd
and iproute2 come from tests/prereqs.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reporter.collect.lldp import lldpd_neighbours

CLI = [sys.executable, "-m", "reporter.cli"]
PREFIX = f"trl{os.getpid()}-"
"""Namespace names of this run only: another run beside it makes its own."""
CABLING = {"node-1": ("tor-a", "p1"), "node-2": ("tor-a", "p2"), "node-3": ("tor-b", "p1")}
CABLING["node-4"] = ("tor-b", "p2")
NODES_RUNNING_LLDPD = ("node-1", "node-3")
SILENT_CABLING = {"node-5": ("tor-c", "p1")}
"""Cabled to a switch that runs no lldpd."""
NIC = "c0"
"""Every node's compute NIC."""
SETTLE_S = 30.0
"""The bound of every wait for lldpd: it sends within 2 s of starting on an idle machine."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _needs() -> None:
    """Skip where this machine cannot make namespaces; fail where a prerequisite is missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_NET_ADMIN) to make network namespaces and veth pairs")
    if shutil.which("ip") is None:
        pytest.fail("ip (iproute2) not installed: run tests/prereqs.sh", pytrace=False)
    probe = PREFIX + "probe"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30, check=False
    )
    if made.returncode != 0:
        if "not permitted" in made.stderr:
            pytest.skip(f"cannot make network namespaces here (no CAP_NET_ADMIN): {made.stderr}")
        pytest.fail(f"ip netns add: {made.stderr}", pytrace=False)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=True)
    missing = [tool for tool in ("lldpd", "lldpcli") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run tests/prereqs.sh", pytrace=False)


@dataclass
class Fabric:
    """The namespaces, the lldpd of each switch and node that runs one, and their files."""

    work: Path
    namespaces: list[str] = field(default_factory=list)
    lldpd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def ns(self, name: str) -> str:
        return PREFIX + name

    def add_namespace(self, name: str) -> None:
        _ip("netns", "add", self.ns(name))
        self.namespaces.append(self.ns(name))
        _ip("-n", self.ns(name), "link", "set", "lo", "up")

    def cable(self, node: str, tor: str, port: str) -> None:
        _ip("-n", self.ns(tor), "link", "add", port, "type", "veth", "peer", "name", NIC)
        _ip("-n", self.ns(tor), "link", "set", NIC, "netns", self.ns(node))
        _ip("-n", self.ns(tor), "link", "set", port, "up")
        _ip("-n", self.ns(node), "link", "set", NIC, "up")

    def socket(self, name: str) -> Path:
        return self.work / f"{name}.socket"

    def start_lldpd(self, name: str, ports: list[str], port_ids: dict[str, str]) -> None:
        config = self.work / f"{name}.conf"
        lines = [
            f"configure system hostname {name}",
            "configure lldp tx-interval 1",
            "configure lldp tx-hold 2",
            *(f"configure ports {p} lldp portidsubtype local {i}" for p, i in port_ids.items()),
        ]
        config.write_text("\n".join(lines) + "\n")
        log = (self.work / f"{name}.log").open("wb")
        self.lldpd[name] = subprocess.Popen(
            [
                *("ip", "netns", "exec", self.ns(name), "lldpd", "-d", "-k", "-I", ",".join(ports)),
                *("-u", str(self.socket(name)), "-O", str(config)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def stop_lldpd(self, name: str) -> None:
        process = self.lldpd.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def network(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`topo-reporter network --lldp` on `node`'s compute NIC, lldpd's socket its own where it
        runs one, else one no lldpd answers on."""
        return subprocess.run(
            [
                *("ip", "netns", "exec", self.ns(node), *CLI, "network", "--lldp"),
                *("--interface", NIC, "--lldpd-socket", str(self.socket(node)), *args),
            ],
            capture_output=True,
            text=True,
            timeout=SETTLE_S + 30,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )

    def agent_source(self, node: str, wait_s: float) -> dict[str, object]:
        """The agent's LLDP source on `node`, its compute NIC an RDMA Ethernet port as sysfs
        shows it (a tree in the work directory), read as the agent's loop reads it until its
        listen is over, and the node-local findings it leads to, as JSON."""
        sysfs = self.work / f"{node}-sys"
        roce = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        (roce / "gid_attrs" / "ndevs").mkdir(parents=True, exist_ok=True)
        (roce / "link_layer").write_text("Ethernet\n")
        (roce / "gid_attrs" / "ndevs" / "0").write_text(f"{NIC}\n")
        done = subprocess.run(
            [
                *("ip", "netns", "exec", self.ns(node), sys.executable, "-c", AGENT_SOURCE),
                *(str(sysfs), str(self.socket(node)), str(wait_s)),
            ],
            capture_output=True,
            text=True,
            timeout=SETTLE_S + 30,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert done.returncode == 0, done.stderr
        # The last line: the agent's log lines, on stdout as in a pod, come before it.
        document: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return document

    def remove(self) -> None:
        for name in list(self.lldpd):
            self.stop_lldpd(name)
        for namespace in self.namespaces:
            subprocess.run(
                ["ip", "netns", "del", namespace], capture_output=True, timeout=30, check=False
            )


AGENT_SOURCE = """
import json, sys, time
from pathlib import Path
from reporter.collect import build_scanner
from reporter.collect.lldp import LldpTierSource
from reporter.doctor.node import local_findings
from reporter.hostfs import DirHostFS

source = LldpTierSource(DirHostFS(Path(sys.argv[1])), sys.argv[2], float(sys.argv[3]))
reading = source.read()
while source.interval_s is None:  # a listen under way: the loop's next steps read again
    time.sleep(0.1)
    reading = source.read()
topology = build_scanner("auto", Path("/nonexistent"), "dgx-h100").scan().topology
findings = local_findings(topology, None, None, source.silent)
print(json.dumps({
    "state": reading.state.value,
    "value": reading.value,
    "silent": source.silent,
    "findings": [{"code": f.code, "evidence": f.evidence, "fix": f.fix} for f in findings],
}))
"""
"""The agent's LLDP source and its findings, run inside a node's namespace."""


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    # Taken before `_needs()`, whose probe namespace already makes and mounts /run/netns.
    netns_dir = Path("/run/netns")
    made_netns_dir = not netns_dir.exists()
    was_mounted = not made_netns_dir and _mounted(netns_dir)
    try:
        _needs()
    except BaseException:
        _restore_netns_dir(netns_dir, made_netns_dir, was_mounted)
        raise
    # lldpd applies its config with lldpcli as its unprivileged user, which must reach the
    # control socket: pytest's tmp_path sits in a directory only root may enter.
    work = Path(tempfile.mkdtemp(prefix=PREFIX))
    work.chmod(0o755)
    # lldpd's privilege separation chroots into /run/lldpd, which its service unit makes.
    chroot = Path("/run/lldpd")
    made_chroot = not chroot.exists()
    built = Fabric(work)
    try:
        chroot.mkdir(exist_ok=True)
        for name in ("tor-a", "tor-b", "tor-c", *CABLING, *SILENT_CABLING):
            built.add_namespace(name)
        for node, (tor, port) in {**CABLING, **SILENT_CABLING}.items():
            built.cable(node, tor, port)
        for tor in ("tor-a", "tor-b"):
            ports = sorted(p for t, p in CABLING.values() if t == tor)
            built.start_lldpd(tor, ports, {p: f"Ethernet1/{p[1:]}" for p in ports})
        for node in NODES_RUNNING_LLDPD:
            built.start_lldpd(node, [NIC], {})
        yield built
    finally:
        built.remove()
        shutil.rmtree(work, ignore_errors=True)
        if made_chroot:
            shutil.rmtree(chroot, ignore_errors=True)
        _restore_netns_dir(netns_dir, made_netns_dir, was_mounted)


def _mounted(path: Path) -> bool:
    """Whether `path` is a mount point. `os.path.ismount` misses a directory bind mounted onto
    itself (same device, same inode), which is what `ip netns add` makes."""
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        return any(line.split()[4] == str(path) for line in mounts)


def _restore_netns_dir(netns_dir: Path, made: bool, was_mounted: bool) -> None:
    """Put /run/netns back as the machine had it: `ip netns add` makes it where it is missing
    and bind mounts it onto itself where it is not a mount point (once per mount it found
    missing, so unmount until none is left); removed where it was not there, unmounted where it
    was there but not mounted. Left alone while another namespace is in it."""
    if was_mounted or not netns_dir.exists() or any(netns_dir.iterdir()):
        return
    for _ in range(8):
        if not _mounted(netns_dir):
            break
        subprocess.run(["umount", str(netns_dir)], capture_output=True, timeout=30, check=False)
    if made:
        netns_dir.rmdir()


def _heard(fabric: Fabric, node: str) -> dict[str, object]:
    """The command's document on `node`, asked until lldpd (where it runs there) has heard the
    switch, within SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        done = fabric.network(node, "--wait", "5")
        if done.returncode == 0 or time.monotonic() > deadline:
            break
    assert done.returncode == 0, done.stderr
    document: dict[str, object] = json.loads(done.stdout)
    return document


def test_nodes_under_the_same_switch_share_tier_0_and_the_others_do_not(fabric: Fabric) -> None:
    read = {node: _heard(fabric, node) for node in CABLING}
    tiers = {node: document["tiers"] for node, document in read.items()}
    assert tiers["node-1"] == tiers["node-2"]
    assert tiers["node-3"] == tiers["node-4"]
    assert tiers["node-1"] != tiers["node-3"]
    for node, (tor, port) in CABLING.items():
        (interface,) = read[node]["interfaces"]  # type: ignore[misc]
        assert read[node]["source"] == "lldp"
        assert interface["name"] == NIC
        assert interface["system_name"] == tor
        assert interface["port_id"] == f"Ethernet1/{port[1:]}"
    # lldpd's answer (nodes 1 and 3) and the packet socket's (2 and 4) name a switch alike.
    (from_lldpd,) = lldpd_neighbours(str(fabric.socket("node-1")), [NIC]) or [None]
    assert from_lldpd is not None
    assert from_lldpd.system_name == "tor-a"
    assert read["node-2"]["interfaces"][0]["chassis_id"] == from_lldpd.chassis_id  # type: ignore[index]


def test_a_stopped_switch_ages_out_and_its_nodes_hear_nothing(fabric: Fabric) -> None:
    before = _heard(fabric, "node-3")
    assert before["interfaces"][0]["system_name"] == "tor-b"  # type: ignore[index]
    _heard(fabric, "node-1")
    fabric.stop_lldpd("tor-b")
    deadline = time.monotonic() + SETTLE_S
    while True:
        # node-3 asks its lldpd, then listens 1 s itself; both must have let tor-b go.
        after = fabric.network("node-3", "--wait", "1")
        if after.returncode != 0 or time.monotonic() > deadline:
            break
    assert after.returncode == 1, after.stdout
    assert lldpd_neighbours(str(fabric.socket("node-3")), [NIC]) == []
    assert after.stderr.startswith("topo-reporter: error: no LLDP neighbour heard on c0 within 1s")
    assert after.stderr.count("\n") == 1
    node_4 = fabric.network("node-4", "--wait", "3")
    assert node_4.returncode == 1
    assert node_4.stdout == ""
    # The other switch is untouched.
    assert fabric.network("node-1", "--wait", "5").returncode == 0


def test_the_agents_source_tells_an_up_port_whose_switch_sends_nothing(fabric: Fabric) -> None:
    silent = fabric.agent_source("node-5", 2.0)
    assert silent["state"] == "failed"
    assert silent["value"] is None
    assert silent["silent"] == [[NIC, "no LLDP frame within 2s"]]
    (finding,) = [f for f in silent["findings"] if f["code"] == "roce-port-silent"]  # type: ignore[attr-defined]
    assert finding["evidence"] == [f"{NIC}: up, no LLDP frame within 2s"]
    assert "disable-fw-lldp on" in finding["fix"]
    # A node under a switch that sends, with no lldpd of its own: heard by its own socket.
    heard = fabric.agent_source("node-2", SETTLE_S)
    assert heard["state"] == "ok"
    assert heard["value"] == _heard(fabric, "node-1")["tiers"][0]  # type: ignore[index]
    assert heard["silent"] == []
    assert not [f for f in heard["findings"] if f["code"] == "roce-port-silent"]  # type: ignore[attr-defined]
    # Its port taken down: down is not silent.
    _ip("-n", fabric.ns("node-2"), "link", "set", NIC, "down")
    down = fabric.agent_source("node-2", 1.0)
    assert down["state"] == "failed"
    assert down["silent"] == []
