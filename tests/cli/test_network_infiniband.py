"""`topo-reporter network --infiniband` as a user runs it, as a host of the real ibsim: the
Interface's JSON, the tiers the fabric's truth gives, and one line with exit 1 where no switch
answers or no HCA can be used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reporter.schema.fabric import is_label_value
from tests.support.ibsim import FatTree, IbSim, have_ibsim

TOPO_REPORTER = Path(sys.executable).parent / "topo-reporter"


@pytest.fixture(autouse=True)
def _ibsim_installed() -> None:
    if not have_ibsim():
        pytest.fail("ibsim is missing: run `sh tests/prereqs.sh`, which installs it", pytrace=False)


def network(sim: IbSim, host_ca: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """The command as the CA `host_ca` of `sim`'s fabric."""
    return sim.run_as(host_ca, [str(TOPO_REPORTER), "network", "--infiniband", *arguments])


def test_the_json_is_the_interfaces_and_its_tiers_are_the_fabrics() -> None:
    fabric = FatTree(units=3, hosts_per_unit=2, aggregation_nodes=True)
    hosts = fabric.hosts()
    guids = fabric.switch_guids()
    with IbSim(fabric.netlist()) as sim:
        found = {}
        for host, (hca,) in hosts.items():
            done = network(sim, hca, "--format", "json")
            assert done.returncode == 0, done.stderr
            found[host] = json.loads(done.stdout)
    for host, document in found.items():
        assert list(document) == ["source", "tiers", "hcas", "mads"]
        assert document["source"] == "infiniband"
        assert len(document["tiers"]) == 3
        assert all(is_label_value(tier) and len(tier) <= 63 for tier in document["tiers"])
        (hca,) = document["hcas"]
        assert set(hca) == {"name", "port", "guid", "leaf"}
        assert hca["leaf"] == f"0x{guids[fabric.leaf_of(hosts[host][0])]:016x}"
        assert isinstance(document["mads"], int)
        assert document["mads"] > 0
    for level, truth in ((0, fabric.leaf_group), (1, fabric.spine_group), (2, fabric.core_group)):
        for a in hosts:
            for b in hosts:
                same = found[a]["tiers"][level] == found[b]["tiers"][level]
                assert same == (truth(a) == truth(b)), (level, a, b)


def test_a_port_cabled_back_to_back_exits_1_with_one_line() -> None:
    # Two CAs and no switch: nothing above the node to name.
    netlist = 'Hca\t1 "a-hca0"\n[1]\t"b-hca0"[1]\n\nHca\t1 "b-hca0"\n[1]\t"a-hca0"[1]\n'
    with IbSim(netlist) as sim:
        done = network(sim, "a-hca0", "--timeout", "10")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "no InfiniBand switch answered" in done.stderr


def test_an_hca_this_process_cannot_use_exits_1_with_one_line() -> None:
    fabric = FatTree(units=1, hosts_per_unit=1)
    ((hca,),) = fabric.hosts().values()
    with IbSim(fabric.netlist()) as sim:
        done = network(sim, hca, "--hca", "mlx5_9")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "mlx5_9" in done.stderr
