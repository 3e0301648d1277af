"""The three tiers against the real ibsim and the real OpenSM: 3-tier and rail-optimized fat trees
(4 and 8 rails), an Aggregation Node CA on every switch, a leaf-spine or spine-core cable cut;
each sampled host's tiers against the truth the generator knows (tests/support/ibsim.FatTree),
not against our code.

ibsim makes one process one CA, so a host of 8 rails is 8 walks: the hosts are sampled so that
every class is covered twice over (two hosts of one leaf group, a host of each other leaf group
of each pod), which keeps the file within a minute on two cores.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest

from reporter.collect.infiniband_tiers import Discovery, fabric_tiers
from reporter.schema.fabric import is_label_value
from tests.support.ibsim import FatTree, IbSim, WalkError, have_ibsim, have_opensm


@pytest.fixture(autouse=True)
def _ibsim_installed() -> None:
    if not (have_ibsim() and have_opensm()):
        pytest.fail(
            "ibsim or opensm is missing: run `sh tests/prereqs.sh`, which installs them",
            pytrace=False,
        )


def _three_tier(rails: int = 1, cut: tuple[str, str] | None = None) -> FatTree:
    """Two pods of two leaf groups of two hosts, two spines a rail per pod, two cores a group,
    an Aggregation Node on every switch."""
    return FatTree(
        pods=2,
        units=2,
        hosts_per_unit=2,
        spines_per_rail=2,
        cores_per_group=2,
        rails=rails,
        aggregation_nodes=True,
        cut=cut,
    )


FABRICS = [
    pytest.param(
        _three_tier(),
        True,
        id="3-tier, Aggregation Nodes on every switch, with an SM",
    ),
    pytest.param(
        _three_tier(rails=4),
        True,
        id="3-tier, rail-optimized, 4 rails",
    ),
    pytest.param(
        _three_tier(rails=8),
        True,
        id="3-tier, rail-optimized, 8 rails",
    ),
    pytest.param(
        _three_tier(rails=2, cut=("leaf-s0p0u1r1", "spine-s0p0r1n0")),
        True,
        id="3-tier, a leaf-spine cable cut: the leaf loses that spine's cores too",
    ),
    pytest.param(
        _three_tier(rails=2, cut=("spine-s0p1r0n1", "core-s0r0n1c0")),
        True,
        id="3-tier, a spine-core cable cut: the pod below no longer reaches that core",
    ),
    pytest.param(
        FatTree(subnets=2, units=2, rails=2, aggregation_nodes=True, missing_link=(1, 1, 0, 0)),
        True,
        id="2-tier, two subnets with an SM each, a leaf-spine cable cut",
    ),
    pytest.param(
        _three_tier(rails=2),
        False,
        id="3-tier, no SM: tier 2 the cores the spines reach",
    ),
]


def _sample(fabric: FatTree) -> dict[str, tuple[str, ...]]:
    """Two hosts of each pod's first leaf group, one of each other leaf group."""
    hosts = fabric.hosts()
    first: dict[str, str] = {}
    chosen = []
    for host in hosts:
        group = fabric.leaf_group(host)
        if group not in first:
            first[group] = host
            chosen.append(host)
        elif group.endswith("u0") and sum(fabric.leaf_group(h) == group for h in chosen) < 2:
            chosen.append(host)
    return {host: hosts[host] for host in chosen}


def _partition(hosts: list[str], key: Callable[[str], str]) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = defaultdict(set)
    for host in hosts:
        groups[key(host)].add(host)
    return {frozenset(group) for group in groups.values()}


@pytest.mark.parametrize(("fabric", "with_sm"), FABRICS)
def test_every_sampled_host_gets_its_fabrics_true_leaf_spine_and_core_groups(
    fabric: FatTree, with_sm: bool
) -> None:
    hosts = _sample(fabric)
    managers = fabric.subnet_manager_nodes() if with_sm else ()
    with IbSim(fabric.netlist(), managers) as sim:
        found: dict[str, Discovery] = {host: sim.walk_host(hcas) for host, hcas in hosts.items()}
    guids = fabric.switch_guids()
    tiers = {host: fabric_tiers(d.views, d.subnet_managers) for host, d in found.items()}
    for host, discovery in found.items():
        assert discovery.tiers == tiers[host], host
        assert len(tiers[host]) == 3, host
        assert all(is_label_value(value) and len(value) <= 63 for value in tiers[host])
        assert [view.leaf for view in discovery.views] == [
            guids[fabric.leaf_of(hca)] for hca in hosts[host]
        ]
        assert discovery.smps.unanswered == 0
        assert discovery.smps.sa_queries == int(with_sm)
        assert bool(discovery.subnet_managers) is with_sm
    sampled = list(hosts)
    for level, truth in enumerate((fabric.leaf_group, fabric.spine_group, fabric.core_group)):
        ours = {host: tiers[host][level] for host in sampled}
        assert _partition(sampled, ours.__getitem__) == _partition(sampled, truth), level
    for level in (0, 1):
        above: dict[str, set[str]] = defaultdict(set)
        for values in tiers.values():
            above[values[level]].add(values[level + 1])
        assert all(len(parents) == 1 for parents in above.values()), level


def test_without_an_sm_a_cut_leaf_spine_cable_splits_only_tier_2() -> None:
    """What the SM's absence loses: the leaf that lost a spine misses that spine's cores."""
    fabric = _three_tier(cut=("leaf-s0p0u1r0", "spine-s0p0r0n0"))
    hosts = fabric.hosts()
    with IbSim(fabric.netlist()) as sim:
        cut, whole = (sim.walk_host(hosts[host]) for host in ("s0p0u1h0", "s0p0u0h0"))
    assert cut.tiers[1] == whole.tiers[1]
    assert cut.tiers[2] != whole.tiers[2]
    assert not cut.subnet_managers


def test_an_sm_that_configured_the_ports_but_no_longer_answers_fails_the_scan_in_one_line() -> None:
    """Publishing the walked tier 2 instead would split the subnet's tier 2 in two."""
    fabric = FatTree(units=2, aggregation_nodes=True)
    (hca,) = fabric.hosts()["s0u0h0"]
    with IbSim(fabric.netlist(), fabric.subnet_manager_nodes()) as sim:
        sim.stop_subnet_managers()
        with pytest.raises(WalkError) as raised:
            sim.walk(hca)
    assert raised.value.status == 1
    assert "the subnet manager at LID" in raised.value.line
    assert "did not answer within 2 s" in raised.value.line
