"""Hostile and broken InfiniBand fabrics, on the real ibsim: each ends in tiers that stand or in
one line that names the HCA, what happened and what to do, within a bounded scan; never a crash
or a hang.

ibsim produces all but one of them: switch NodeDescriptions of control characters and 64 bytes
that are not text, a switch claiming 255 ports, cables from a switch back to itself and between
leaves, switches that stop answering (ibsim's `Error` command drops every SMP of one attribute
at a switch: what a walker sees when a link goes down after the switch's NodeInfo answered), a
port without a link, a storage switch under every host, and 10,000 hosts. The one it cannot, an
HCA that takes no SMP agent (an SR-IOV VF or a VM's HCA), is the real kernel refusing a device
that is not umad, and a double of the kernel's EPROTONOSUPPORT, named as such.
"""

from __future__ import annotations

import errno
import fcntl
from collections import defaultdict
from collections.abc import Hashable, Mapping
from pathlib import Path

import pytest

from parsers.lldp import printable
from reporter.collect.infiniband import UmadPort, walk_ports
from reporter.errors import CollectError
from tests.support.ibsim import WalkError, have_ibsim
from tests.support.ibsim_hostile import (
    ESCAPES,
    GARBAGE,
    HostileSim,
    SmallTree,
    big_fabric,
    node,
    storage_fabric,
)

SMP_TIMEOUT = ("--smp-timeout", "0.2")


@pytest.fixture(autouse=True)
def _ibsim_installed() -> None:
    if not have_ibsim():
        pytest.fail("ibsim is missing: run `sh tests/prereqs.sh`, which installs it", pytrace=False)


def _partition(values: Mapping[str, Hashable]) -> set[frozenset[str]]:
    groups: dict[Hashable, set[str]] = defaultdict(set)
    for host, value in values.items():
        groups[value].add(host)
    return {frozenset(group) for group in groups.values()}


# -- storage HCAs --------------------------------------------------------------------------------


def test_the_compute_hcas_group_hosts_by_leaf_where_a_storage_switch_would_group_them_all() -> None:
    tree = SmallTree(leaves=3, hosts=2)
    with HostileSim(storage_fabric(leaves=3, hosts=2)) as sim:
        compute = {host: sim.walk_as(hca).tiers for host, hca in tree.hcas().items()}
        storage = {host: sim.walk_as(f"{host}-storage").tiers for host in tree.hcas()}
    by_leaf = _partition({host: host.split("h")[0] for host in tree.hcas()})
    assert _partition({host: tiers[0] for host, tiers in compute.items()}) == by_leaf
    assert len(_partition({host: tiers[1] for host, tiers in compute.items()})) == 1
    # What walking the storage HCA would publish: one leaf group of every node.
    assert _partition({host: tiers[0] for host, tiers in storage.items()}) == {
        frozenset(tree.hcas())
    }


# -- NodeDescriptions that are not text ----------------------------------------------------------


@pytest.mark.parametrize(
    ("switch", "name", "escaped"),
    [
        pytest.param(
            "leaf0",
            ESCAPES,
            "\\x1b[2J\\x1b]0;owned\\x07leaf\\x0d\\x7f",
            id="a leaf named in escape sequences that would clear and retitle the terminal",
        ),
        pytest.param(
            "spine1",
            GARBAGE,
            # ibsim ends a description with a NUL, so it serves the first 63 of the 64 bytes;
            # tests/parsers/test_smp.py decodes all 64 without a NUL.
            printable(GARBAGE.encode("utf-8", "surrogateescape")[:63]),
            id="a spine whose description is 64 bytes that are not text",
        ),
    ],
)
def test_a_switch_that_stops_answering_is_named_escaped_in_one_line(
    switch: str, name: str, escaped: str
) -> None:
    tree = SmallTree(descriptions=((switch, name),), commands=(f'Error "{switch}" 100 21',))
    with HostileSim(tree.netlist()) as sim, pytest.raises(WalkError) as raised:
        sim.walk_as("l0h0-hca", *SMP_TIMEOUT)
    line = raised.value.line
    assert raised.value.status == 1
    assert line.isprintable(), line
    assert line.startswith("topo-reporter: InfiniBand scan from ibsim0 port 1: switch 0x")
    assert "did not answer PortInfo of its port" in line
    assert "check the links (iblinkinfo)" in line
    assert f'"{escaped}"' in line


# -- 255 ports -----------------------------------------------------------------------------------


def test_a_switch_claiming_255_ports_is_walked_to_port_254_with_a_warning() -> None:
    tree = SmallTree(leaves=2, hosts=1, spines=1, radix=255)
    with HostileSim(tree.netlist()) as sim:
        found = sim.walk_as("l0h0-hca")
        stderr = sim.last_stderr
    assert len(found.tiers) == 3
    # PortInfo on ports 1-254 of the leaf and of the spine, less the port each was entered by;
    # one on the other leaf (its first port's host tells it is a leaf), one on the HCA's own.
    assert found.smps.port_info == 2 * 253 + 1 + 1
    assert stderr.count("infiniband_switch_ports_beyond_254") == 2


# -- cables that loop ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "more"),
    [
        pytest.param((("leaf0", 6, "leaf0", 7),), 0, id="a cable from a leaf back to itself"),
        pytest.param((("spine0", 6, "spine0", 7),), 0, id="a cable from a spine back to itself"),
        pytest.param(
            (("leaf0", 6, "leaf1", 6),),
            8 - 1,
            id="a cable between two leaves: the other leaf is walked once, as a spine",
        ),
    ],
)
def test_a_looping_cable_is_not_walked_twice(
    extra: tuple[tuple[str, int, str, int], ...], more: int
) -> None:
    """What the loop costs beyond the same tree without it: nothing where a switch is cabled to
    itself, one switch's ports at most where two leaves are."""
    plain = SmallTree()
    looped = SmallTree(extra=extra)
    with HostileSim(plain.netlist()) as sim:
        truth = sim.walk_as("l0h0-hca")
    with HostileSim(looped.netlist()) as sim:
        found = sim.walk_as("l0h0-hca")
    assert truth.smps.port_info <= found.smps.port_info <= truth.smps.port_info + more
    assert found.smps.unanswered == 0
    assert found.tiers[0] == truth.tiers[0]
    if extra[0][0] == extra[0][2]:
        assert found.tiers == truth.tiers


# -- ports that stop answering -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("netlist", "arguments", "message"),
    [
        pytest.param(
            SmallTree(commands=('Error "leaf0" 100 21',)).netlist(),
            SMP_TIMEOUT,
            'switch 0x0000000000200000 "leaf0" did not answer PortInfo of its port 2 '
            "(2 tries of 0.2 s)",
            id="the leaf stops answering after its NodeInfo (as when the link goes down mid-scan)",
        ),
        pytest.param(
            SmallTree().netlist() + node("Hca", 1, "unlinked-hca", {}),
            SMP_TIMEOUT,
            "nothing answered at the other end of its link (2 tries of 0.2 s): the link is down",
            id="the HCA's port has no link",
        ),
        pytest.param(
            SmallTree(commands=('Error "spine0" 100 17', 'Error "spine1" 100 17')).netlist(),
            SMP_TIMEOUT,
            'no switch behind switch 0x0000000000200000 "leaf0" answered: nothing answered '
            "NodeInfo behind its live ports 3, 4, and the tiers above it would be lost",
            id="every spine stops answering: not a leaf cut off from the spines",
        ),
        pytest.param(
            SmallTree().netlist(),
            ("--total", "0"),
            "the scan ran out of its 0 s before it had seen its leaves' and spines' ports",
            id="the scan's time spent: not one SMP more",
        ),
    ],
)
def test_a_scan_that_stops_says_which_hca_why_and_what_to_do(
    netlist: str, arguments: tuple[str, ...], message: str
) -> None:
    host = "unlinked-hca" if "unlinked-hca" in netlist else "l0h0-hca"
    with HostileSim(netlist) as sim, pytest.raises(WalkError) as raised:
        sim.walk_as(host, *arguments)
    assert raised.value.status == 1
    assert raised.value.line.startswith("topo-reporter: InfiniBand scan from ibsim0 port 1: ")
    assert message in raised.value.line
    assert "SMPs sent" in raised.value.line


def test_links_that_go_down_and_come_back_between_scans() -> None:
    """ibsim's console takes links down and back (Unlink, ReLink) while it serves: a spine
    link lost leaves the tiers as they were; the host's own link lost fails the scan in one
    line; back, the scan finds what it found first."""
    tree = SmallTree()
    with HostileSim(tree.netlist()) as sim:
        first = sim.walk_as("l0h0-hca").tiers
        sim.console('Unlink "spine0"[1]')
        assert sim.walk_as("l0h0-hca").tiers == first
        sim.console('Unlink "l0h0-hca"')
        with pytest.raises(WalkError) as raised:
            sim.walk_as("l0h0-hca", *SMP_TIMEOUT)
        sim.console('ReLink "l0h0-hca"')
        sim.console('ReLink "spine0"')
        again = sim.walk_as("l0h0-hca")
    assert "nothing answered at the other end of its link" in raised.value.line
    assert again.tiers == first
    assert again.smps.unanswered == 0


def test_a_spine_that_stops_answering_is_a_missing_link_counted_unanswered() -> None:
    plain = SmallTree(spines=3)
    with HostileSim(plain.netlist()) as sim:
        truth = {host: sim.walk_as(hca).tiers for host, hca in plain.hcas().items()}
    mute = SmallTree(spines=3, commands=('Error "spine2" 100 17',))
    with HostileSim(mute.netlist()) as sim:
        found = {host: sim.walk_as(hca, *SMP_TIMEOUT) for host, hca in mute.hcas().items()}
    assert _partition({h: d.tiers for h, d in found.items()}) == _partition(truth)
    # The leaf asks NodeInfo behind its port to spine2 (twice), and gets no answer.
    assert {d.smps.unanswered for d in found.values()} == {1}


# -- an HCA that takes no SMP agent (a VF, a VM) ---------------------------------------------------


def test_a_device_that_is_not_umad_is_refused_by_the_kernel_in_one_line() -> None:
    with pytest.raises(CollectError) as raised:
        walk_ports((UmadPort("mlx5_vf0", 1, "/dev/null"),))
    assert str(raised.value).startswith(
        "InfiniBand scan from mlx5_vf0 port 1: /dev/null refused an SMP agent "
        "(Inappropriate ioctl for device): it is not a umad device with subnet management"
    )
    assert "--network-infiniband-hcas" in str(raised.value)


def test_a_port_without_qp0_is_named_a_vf_double_of_the_kernels_eprotonosupport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A double: the kernel's ib_register_mad_agent answers EPROTONOSUPPORT on a port without
    QP0 (an SR-IOV VF), which no device on this machine can give."""

    def refuse(*_: object) -> None:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    with pytest.raises(CollectError, match="the port has no subnet management QP \\(QP0\\)"):
        walk_ports((UmadPort("mlx5_vf0", 1, "/dev/null"),))


def test_a_device_that_does_not_open_is_named() -> None:
    with pytest.raises(CollectError) as raised:
        walk_ports((UmadPort("mlx5_9", 1, str(Path("/nonexistent/umad9"))),))
    assert str(raised.value).startswith(
        "InfiniBand scan from mlx5_9 port 1: cannot open /nonexistent/umad9: No such file"
    )


# -- 10,000 hosts --------------------------------------------------------------------------------


def test_a_hosts_scan_of_10000_hosts_is_bounded_by_its_leaf_and_spines() -> None:
    """The switches' radix is the same in both fabrics (48-host leaves with 8 uplinks, 8 spines
    of 254 ports): a host asks its leaf's and spines' ports, and the nodes behind the live ones
    (one more question for each other leaf: is it a core?), so what grows with the fabric is
    the spines' cabled ports, never past their radix; at 10,000 hosts a small fraction of one
    full discovery."""
    found = {}
    for hosts in (500, 10_000):
        with HostileSim(big_fabric(hosts), nodes=hosts + 1024) as sim:
            found[hosts] = sim.walk_as(f"h{hosts - 1}")
    for hosts, discovery in found.items():
        leaves = -(-hosts // 48)
        on_last_leaf = hosts - 48 * (leaves - 1)
        others = leaves - 1
        # PortInfo on its leaf's and spines' ports but the ones they were entered by, its own
        # port's, and each other leaf's first port, whose host tells it is no core.
        assert discovery.smps.port_info == (56 - 1) + 8 * (254 - 1) + 1 + others
        # Its own NodeInfo and its leaf's, then behind each live port: the leaf's (its hosts
        # but itself, the spines) and each spine's (the leaves but the one it came from); and
        # the host on each other leaf's first port, with its NodeDescription.
        assert discovery.smps.node_info == 2 + (on_last_leaf - 1 + 8) + 8 * others + others
        assert discovery.smps.node_description == others
        assert discovery.smps.unanswered == 0
        assert len(discovery.tiers) == 3
    # One full discovery's floor: NodeInfo of every node, PortInfo of every switch port.
    full = 10_000 + 209 + 8 + 209 * 56 + 8 * 254
    assert found[10_000].smps.total * 5 < full
