"""`topo-reporter run --network-infiniband` as a host of the real ibsim: the agent's dry run
prints a patch whose tier labels group the hosts as the fabric does, under our keys or
Topograph's, with the same levels on every host."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reporter.schema import keys
from tests.support.ibsim import CLIENT_TIMEOUT_S, FatTree, IbSim, have_ibsim

TOPO_REPORTER = Path(sys.executable).parent / "topo-reporter"
SYSFS = Path(__file__).parents[1] / "fixtures" / "machines" / "asus-esc8000a" / "sysfs"
"""A GPU machine's sysfs tree, so the agent has a topology to publish beside the tiers."""
OURS = [keys.key(keys.DEFAULT_PREFIX, name) for name in keys.NETWORK_TIERS]


@pytest.fixture(autouse=True)
def _ibsim_installed() -> None:
    if not have_ibsim():
        pytest.fail("ibsim is missing: run `sh tests/prereqs.sh`, which installs it", pytrace=False)


def dry_run(sim: IbSim, host_ca: str, *arguments: str) -> dict[str, Any]:
    """The patch `run --once --dry-run --network-infiniband` prints as the CA `host_ca`."""
    done = sim.run_as(
        host_ca,
        [
            str(TOPO_REPORTER),
            "run",
            "--once",
            "--dry-run",
            "--node",
            "gpu-node-1",
            "--backend",
            "sysfs",
            "--sysfs-root",
            str(SYSFS),
            "--kubelet-config",
            "/nonexistent/kubelet-config.yaml",
            "--listen",
            "",
            "--network-infiniband",
            # umad2sim's one CA: the fixture's HCAs are not this fabric's.
            "--network-infiniband-hcas",
            "ibsim0",
            *arguments,
        ],
        timeout_s=CLIENT_TIMEOUT_S * 4,
    )
    assert done.returncode == 0, done.stderr
    patch: dict[str, Any] = json.loads(done.stdout)
    return patch


@pytest.mark.parametrize(
    ("arguments", "tier_keys"),
    [((), OURS), (("--network-label-style", "topograph"), list(keys.TOPOGRAPH_TIER_KEYS))],
    ids=["our keys", "topograph's keys"],
)
def test_every_host_gets_both_tiers_grouped_as_the_fabric_is(
    arguments: tuple[str, ...], tier_keys: list[str]
) -> None:
    fabric = FatTree(units=2, hosts_per_unit=2)
    hosts = fabric.hosts()
    with IbSim(fabric.netlist()) as sim:
        labels = {
            host: dry_run(sim, hca, *arguments)["metadata"]["labels"]
            for host, (hca,) in hosts.items()
        }
    for host, found in labels.items():
        assert set(tier_keys) <= set(found), host
        assert not {*OURS, *keys.TOPOGRAPH_TIER_KEYS} - set(tier_keys) & set(found), host
    for level, truth in ((0, fabric.leaf_group), (1, fabric.spine_group)):
        for a in hosts:
            for b in hosts:
                same = labels[a][tier_keys[level]] == labels[b][tier_keys[level]]
                assert same == (truth(a) == truth(b)), (level, a, b)
