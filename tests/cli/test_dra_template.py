"""`topo-reporter dra-template`: the clique map, its expression in Kubernetes' own DRA CEL code, the
template's fields against k8s.io/api v0.37.2, and the command's exits."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import tracemalloc
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.dra_template import nodes_of, numbered, nvlinks_down, paired_kinds
from parsers.links import SELF, Link, LinkKind
from reporter import cli
from reporter.collect import build_scanner, list_profiles
from reporter.commands import dra_template as dra_template_command
from reporter.errors import ApiPermanentError, ConfigError
from reporter.publish.api import Resource
from reporter.schema import dra_template
from reporter.schema.codec import encode
from reporter.schema.dra_template import CliqueBoundError, Device, LeftOut, Machine, TemplateError
from reporter.schema.model import Gpu, Source, Topology
from tests.doctor.test_groups import json_values
from tests.golden import DRA_TEMPLATES, dra_templates
from tests.support.controlplane_fixtures import go_binary
from tests.support.dra_cel import evaluate, nvidia_attributes

NV12, SYS = Link(LinkKind.NV, 12), Link(LinkKind.SYS)
PROFILES = [p.name for p in list_profiles()]
SHIPPED = Path(dra_template.__file__).parent.parent / "collect/simulate/profiles"
API_MODULE = "k8s.io/api@v0.37.2"
BUDGET = 1_000_000
"""DeviceClaimDerivedAttributeCELMaxCost: every derived expression of a claim together."""


@cache
def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None
    return topology


def machines(*profiles: str) -> list[Machine]:
    return [Machine(p, (scanned(p),)) for p in profiles]


def connected(topology: Topology, gpus: tuple[int, ...]) -> bool:
    return all(topology.link(a, b).is_nvlink for a, b in itertools.combinations(gpus, 2))


def shares_an_id(
    template: dra_template.Template, topology: Topology, gpus: tuple[int, ...]
) -> bool:
    """What the allocator's running intersection over the chosen devices decides (a device with
    the empty list is never chosen)."""
    sets = [set(ids_of(template, topology, i)) for i in gpus]
    return all(sets) and bool(set.intersection(*sets))


def ids_of(template: dra_template.Template, topology: Topology, index: int) -> tuple[str, ...]:
    """What the expression gives the GPU: its UUID's entry where the map has one, else its bus
    key's."""
    gpu = topology.gpus[index]
    by_uuid = f"uuid:{gpu.uuid}"
    if by_uuid in template.values:
        return template.values[by_uuid]
    return template.values.get(f"bus:{gpu.model}/{gpu.pci}", ())


CLIQUES = {
    "pcie-8x-nvlink-pairs": [{0, 1}, {2, 3}, {4, 5}, {6, 7}],
    # The hybrid cube mesh: two fully joined quads and the four links between them. The island is
    # all 8 GPUs, which are not a clique.
    "dgx-1-v100": [{0, 1, 2, 3}, {0, 4}, {1, 5}, {2, 6}, {3, 7}, {4, 5, 6, 7}],
    "dgx-h100": [set(range(8))],
    "dgx-2": [set(range(16))],
    "workstation-nvlink-bridge": [{0, 1}],
    "pcie-8x": [],
    "single-gpu": [],
}


@pytest.mark.parametrize(("profile", "cliques"), CLIQUES.items(), ids=list(CLIQUES))
def test_the_maximal_nvlink_cliques_of_each_wiring(profile: str, cliques: list[set[int]]) -> None:
    assert [set(c) for c in dra_template.maximal_cliques(scanned(profile))] == cliques


def largest(profile: str) -> int:
    return max((len(c) for c in dra_template.maximal_cliques(scanned(profile))), default=1)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "all-profiles-in-one"])
@pytest.mark.parametrize("profile", [p for p in PROFILES if largest(p) >= 2])
def test_k_gpus_share_an_id_exactly_when_every_two_share_nvlinks(
    profile: str, together: bool
) -> None:
    topology = scanned(profile)
    for k in range(2, largest(profile) + 1):
        covered = machines(*PROFILES) if together else machines(profile)
        template = dra_template.build([m for m in covered if largest(m.name) >= k], k)
        for gpus in itertools.combinations(range(len(topology.gpus)), k):
            assert shares_an_id(template, topology, gpus) == connected(topology, gpus), (k, gpus)


def rewired(tmp_path: Path, pairs: list[list[int]]) -> str:
    """pcie-8x-nvlink-pairs with its bridges between other cards: same GPUs, same bus IDs."""
    data = yaml.safe_load((SHIPPED / "pcie-8x-nvlink-pairs.yaml").read_text(encoding="utf-8"))
    data["nvlink"] = [{"gpus": p, "links": 12} for p in pairs]
    path = tmp_path / "pairs-crossed.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_profiles_sharing_keys_but_wired_differently_are_refused_naming_both(
    tmp_path: Path,
) -> None:
    crossed = rewired(tmp_path, [[0, 2], [1, 3], [4, 6], [5, 7]])
    with pytest.raises(
        TemplateError, match=r"^machines /.*/pairs-crossed.yaml, pcie-8x-nvlink-pairs have GPUs"
    ):
        dra_template.build(machines("pcie-8x-nvlink-pairs", crossed), 2)


def test_profiles_sharing_keys_and_wiring_need_no_uuid(tmp_path: Path) -> None:
    same = rewired(tmp_path, [[0, 1], [2, 3], [4, 5], [6, 7]])
    template = dra_template.build(machines("pcie-8x-nvlink-pairs", same), 2)
    assert template.keyed_out == ()
    assert not any(k.startswith("uuid:") for k in template.values)


def test_the_wiring_of_most_nodes_keeps_the_keys_and_the_others_gpus_get_no_clique(
    tmp_path: Path,
) -> None:
    crossed = scanned(rewired(tmp_path, [[0, 2], [1, 3], [4, 6], [5, 7]]))
    cluster = [
        nodes_of("pairs", scanned("pcie-8x-nvlink-pairs"), 0, 2),
        nodes_of("crossed", crossed, 2, 1),
        nodes_of("h100", scanned("dgx-h100"), 3, 1),
    ]
    template = dra_template.build(cluster, 2, uuids_known=True)
    assert template.keyed_out == ("node-2",)
    assert template.covers == ("pairs", "h100")
    for machine in cluster:
        for topology in machine.topologies:
            for gpus in itertools.combinations(range(len(topology.gpus)), 2):
                want = connected(topology, gpus) and machine.name != "crossed"
                assert shares_an_id(template, topology, gpus) == want, (machine.name, gpus)
    # Only the crossed node's 8 GPUs went to UUIDs, each to no clique.
    uuids = {k: v for k, v in template.values.items() if k.startswith("uuid:")}
    assert uuids == {f"uuid:{g.uuid}": () for g in cluster[1].topologies[0].gpus}


def test_one_node_with_its_nvlinks_down_among_30_costs_its_uuids_not_the_template() -> None:
    """The repro: 30 DGX H100 nodes, one with its fabric manager stopped. Before, every H100 went
    to UUID keys: 12,058 bytes, refused. Now the down node's GPUs get no clique by UUID."""
    h100 = scanned("dgx-h100")
    cluster = [nodes_of("h100", h100, 0, 29), nodes_of("down", nvlinks_down(h100), 29, 1)]
    template = dra_template.build(cluster, 2, uuids_known=True)
    assert len(template.expression.encode()) < 1024
    assert template.keyed_out == ("node-29",)
    down = cluster[1].topologies[0]
    assert all(ids_of(template, down, g.index) == () for g in down.gpus)
    for topology in cluster[0].topologies:
        assert all(ids_of(template, topology, g.index) == ("a",) for g in topology.gpus)


@pytest.mark.parametrize("majority", ["h100", "down"])
def test_either_way_round_no_pair_of_the_down_node_shares_an_id(majority: str) -> None:
    h100 = scanned("dgx-h100")
    counts = {"h100": 1, "down": 1, majority: 3}
    cluster = [
        nodes_of("h100", h100, 0, counts["h100"]),
        nodes_of("down", nvlinks_down(h100), 10, counts["down"]),
    ]
    if majority == "down":
        # The healthy node is the one kept out, and then no GPU keeps a clique.
        with pytest.raises(TemplateError, match=r"^--gpus 2: no GPU keeps a clique: machines h100"):
            dra_template.build(cluster, 2, uuids_known=True)
        return
    template = dra_template.build(cluster, 2, uuids_known=True)
    for topology in cluster[1].topologies:
        assert not any(
            shares_an_id(template, topology, p) for p in itertools.combinations(range(8), 2)
        )


@pytest.mark.parametrize(
    ("profiles", "k", "said", "error"),
    [
        (
            ("dgx-h100",),
            9,
            r"^--gpus 9: no machine given has 9 GPUs .*the largest such set: 8",
            TemplateError,
        ),
        (
            ("pcie-8x",),
            2,
            r"^--gpus 2: no machine given has 2 GPUs .*the largest such set: 1",
            TemplateError,
        ),
        (("dgx-h100",), 1, r"^--gpus 1: one GPU is connected by itself", ConfigError),
    ],
    ids=["more-than-any-clique", "no-nvlink-at-all", "one-gpu"],
)
def test_an_impossible_k_is_refused(
    profiles: tuple[str, ...], k: int, said: str, error: type[Exception]
) -> None:
    """K past the machines cannot be met (a TemplateError, exit 1); K below 2 is no request for
    connected GPUs at all (a ConfigError, bad usage)."""
    with pytest.raises(error, match=said):
        dra_template.build(machines(*profiles), k)


@pytest.mark.parametrize(
    ("count", "gpus", "fits"), [(20, 8, True), (20, 16, True), (27, 16, False)]
)
def test_the_map_stays_within_the_expression_limit_or_is_refused(
    count: int, gpus: int, fits: bool
) -> None:
    if not fits:
        with pytest.raises(TemplateError, match=r"bytes of CEL, past the API's 10240"):
            dra_template.build(paired_kinds(count, gpus), 2)
        return
    template = dra_template.build(paired_kinds(count, gpus), 2)
    assert len(template.expression.encode()) <= dra_template.MAX_EXPRESSION_BYTES


# -- the expression in Kubernetes' own DRA CEL compiler and evaluator (k8s.io/dynamic-resource-
#    allocation/cel at the harness's version, 1.37: see tests/controlplane/dracel) -------------


def devices_of(
    template: dra_template.Template, topology: Topology
) -> list[tuple[dict[str, Any], list[str]]]:
    return [
        (nvidia_attributes(g), list(ids_of(template, topology, g.index))) for g in topology.gpus
    ]


def strangers(
    topology: Topology, template: dra_template.Template
) -> list[tuple[dict[str, Any], list[str]]]:
    """Devices the map must answer [] for, without a runtime error."""
    first = topology.gpus[0]
    no_bus = nvidia_attributes(first, bus_id=False)
    unknown = nvidia_attributes(first)
    unknown["productName"] = {"string": "NVIDIA B300 SXM6 AC"}
    unknown["uuid"] = {"string": "GPU-5b0e1a2c-3d4f-4a5b-8c6d-7e8f9a0b1c2d"}
    odd = nvidia_attributes(first)
    odd["productName"] = {"int": 3}
    odd["resource.kubernetes.io/pciBusID"] = {"bool": True}
    by_uuid = list(template.values.get(f"uuid:{first.uuid}", ()))
    return [
        (no_bus, by_uuid),  # pciBusID unread: only a UUID lookup can place it
        (unknown, []),  # a GPU of a machine the template does not know
        (odd, by_uuid),  # attributes of other types than NVIDIA's
        ({}, []),  # a device of another driver
        ({"uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"}}, []),
    ]


@pytest.mark.parametrize("k", [2, 4])
def test_kubernetes_dra_cel_gives_every_gpu_the_cliques_our_model_gives(
    dracel_bin: Path, k: int
) -> None:
    covered = [m for m in machines(*PROFILES) if largest(m.name) >= k]
    template = dra_template.build(covered, k)
    devices = [d for m in machines(*PROFILES) for d in devices_of(template, m.topologies[0])]
    devices += strangers(scanned("dgx-h100"), template)
    evaluation = evaluate(dracel_bin, template.expression, devices)
    assert evaluation.outcomes == [(True, None)] * len(devices)
    assert evaluation.cost <= BUDGET


def test_kubernetes_dra_cel_reads_the_uuid_map_first(dracel_bin: Path, tmp_path: Path) -> None:
    crossed = rewired(tmp_path, [[0, 2], [1, 3], [4, 6], [5, 7]])
    nodes = machines("pcie-8x-nvlink-pairs", crossed, "dgx-h100")
    template = dra_template.build(nodes, 2, uuids_known=True)
    devices = [d for m in nodes for d in devices_of(template, m.topologies[0])]
    devices += strangers(nodes[0].topologies[0], template)
    evaluation = evaluate(dracel_bin, template.expression, devices)
    assert evaluation.outcomes == [(True, None)] * len(devices)
    assert evaluation.cost <= BUDGET


def test_kubernetes_dra_cel_gives_the_down_nodes_gpus_no_clique(dracel_bin: Path) -> None:
    """The repro's 30 DGX H100 nodes, one with its NVLinks down, in Kubernetes' own CEL."""
    h100 = scanned("dgx-h100")
    cluster = [nodes_of("h100", h100, 0, 29), nodes_of("down", nvlinks_down(h100), 29, 1)]
    template = dra_template.build(cluster, 2, uuids_known=True)
    (down,) = cluster[1].topologies
    devices = [(nvidia_attributes(g), ["a"]) for t in cluster[0].topologies for g in t.gpus]
    devices += [(nvidia_attributes(g), []) for g in down.gpus]
    evaluation = evaluate(dracel_bin, template.expression, devices)
    assert evaluation.outcomes == [(True, None)] * len(devices)
    assert evaluation.cost <= BUDGET


def test_a_wrong_answer_is_seen_by_the_evaluator(dracel_bin: Path) -> None:
    """The check can fail: a device given another clique's ID does not match."""
    template = dra_template.build(machines("pcie-8x-nvlink-pairs"), 2)
    gpu = scanned("pcie-8x-nvlink-pairs").gpus[0]
    evaluation = evaluate(dracel_bin, template.expression, [(nvidia_attributes(gpu), ["b"])])
    assert evaluation.outcomes == [(False, None)]


# -- the document against k8s.io/api v0.37.2 resource/v1/types.go ------------------------------


@cache
def api_structs() -> dict[str, dict[str, str]]:
    """Each struct of resource/v1/types.go: JSON name -> Go type, read from the module itself."""
    done = subprocess.run(
        [go_binary(), "mod", "download", "-json", API_MODULE],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    source = (Path(json.loads(done.stdout)["Dir"]) / "resource/v1/types.go").read_text()
    structs: dict[str, dict[str, str]] = {}
    for name, body in re.findall(r"^type (\w+) struct \{\n(.*?)^\}", source, re.M | re.S):
        fields = re.findall(r'^\t\w+ ([\w.\[\]*]+) `json:"(\w+)[,"]', body, re.M)
        structs[name] = {tag: go for go, tag in fields}
    return structs


def check_fields(value: Any, go_type: str, path: str) -> None:
    go_type = go_type.lstrip("*")
    if go_type.startswith("[]"):
        assert isinstance(value, list), path
        for n, item in enumerate(value):
            check_fields(item, go_type[2:], f"{path}[{n}]")
        return
    structs = api_structs()
    if go_type not in structs:
        return  # a scalar, or metav1's ObjectMeta
    assert isinstance(value, dict), path
    for key, item in value.items():
        assert key in structs[go_type], f"{path}.{key}: no such field in {go_type}"
        check_fields(item, structs[go_type][key], f"{path}.{key}")


@pytest.mark.parametrize("fallback", [False, True], ids=["exactly", "first-available"])
def test_every_field_of_the_template_is_one_of_k8s_api_v0_37_2(fallback: bool) -> None:
    template = dra_template.build(machines("dgx-1-v100"), 4, fallback=fallback)
    document = template.document
    assert document["apiVersion"] == "resource.k8s.io/v1"
    check_fields({k: v for k, v in document.items() if k in ("spec",)}, "ResourceClaimTemplate", "")
    assert "DeviceDerivedAttribute" in api_structs()


# -- the command ------------------------------------------------------------------------------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_the_command_prints_one_template_for_nvidias_device_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(
        ["dra-template", "--gpus", "2", "--machine", "pcie-8x-nvlink-pairs"], capsys
    )
    assert (status, err) == (0, "")
    documents = list(yaml.safe_load_all(out))
    assert len(documents) == 1
    (template,) = documents
    assert template["kind"] == "ResourceClaimTemplate"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["count"] == 2
    (constraint,) = template["spec"]["spec"]["devices"]["constraints"]
    assert constraint == {"requests": ["gpus"], "matchAttribute": "gpu.topology.io/nvlinkClique"}
    assert "DRADerivedAttributes and DRAListTypeAttributes" in out.split("apiVersion")[0]
    assert template["metadata"]["annotations"]["gpu.topology.io/dra-template-gates"] == (
        "DRADerivedAttributes,DRAListTypeAttributes"
    )


def test_the_command_takes_its_class_name_namespace_and_fallback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(
        [
            "dra-template", "--gpus", "4", "--machine", "dgx-1-v100", "--machine", "dgx-h100",
            "--fallback", "--device-class", "h100.example.com", "--name", "tp4",
            "--namespace", "ml",
        ],
        capsys,
    )  # fmt: skip
    assert status == 0
    template = yaml.safe_load(out)
    assert (template["metadata"]["name"], template["metadata"]["namespace"]) == ("tp4", "ml")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    connected_, any_ = request["firstAvailable"]
    assert (connected_["name"], any_["name"]) == ("connected", "any")
    assert connected_["deviceClassName"] == any_["deviceClassName"] == "h100.example.com"
    assert "derivedAttributes" not in any_
    assert template["spec"]["spec"]["devices"]["constraints"][0]["requests"] == ["gpus/connected"]


@pytest.mark.parametrize(
    ("argv", "said", "exit_status"),
    [
        (["--gpus", "2", "--machine", "dgx-h1000"], "unknown simulated machine 'dgx-h1000'", 2),
        (["--gpus", "9", "--machine", "dgx-h100"], "--gpus 9: no machine given has 9 GPUs", 1),
        (["--gpus", "0", "--machine", "dgx-h100"], "--gpus 0: one GPU is connected by itself", 2),
        (["--gpus", "4", "--machine", "pcie-8x-nvlink-pairs"], "the largest such set: 2", 1),
    ],
    ids=["unknown-profile", "k-past-the-machine", "k-zero", "k-past-the-pairs"],
)
def test_a_request_refused_is_one_line_on_stderr_exit_2_for_usage_1_for_the_machines(
    argv: list[str], said: str, exit_status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["dra-template", *argv], capsys)
    assert (status, out) == (exit_status, "")
    assert err.count("\n") == 1, err
    assert said in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--prefix", "BAD/x"], "prefix 'BAD/x' is not a DNS subdomain"),
        (["--prefix", "kubernetes.io"], "prefix 'kubernetes.io' is in kubernetes.io, which"),
        (["--name", "UPPER_bad"], "--name 'UPPER_bad' is not a DNS subdomain"),
        (["--name", "a" * 300], "is not a DNS subdomain (lower-case letters, digits, '-' and '.'"),
        (["--namespace", "bad/ns"], "--namespace 'bad/ns' is not a DNS label"),
        (["--selector", "gpu=h100"], "--selector and --exclude choose among the cluster's Nodes"),
        (["--kubeconfig", "/k"], "--machine and --kubeconfig both given"),
    ],
    ids=["prefix-not-a-domain", "prefix-reserved", "name-upper", "name-300", "namespace-slash",
         "selector-offline", "kubeconfig-offline"],
)  # fmt: skip
def test_a_name_the_apiserver_would_refuse_is_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["dra-template", "--gpus", "2", "--machine", "dgx-h100", *argv], capsys)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1, err
    assert err.startswith("topo-reporter: error: ")
    assert said in err, err


def test_every_profiles_template_is_its_golden_file() -> None:
    """Reviewed as a diff when they change (`python -m tests.golden`)."""
    made = dra_templates()
    assert sorted(made) == sorted(p.name for p in DRA_TEMPLATES.glob("*.yaml"))
    for name, text in made.items():
        assert text == (DRA_TEMPLATES / name).read_text(encoding="utf-8"), name


@st.composite
def clusters(draw: st.DrawFn) -> list[Machine]:
    """1 to 4 kinds of machine of 2 to 7 GPUs, two products and few bus IDs (so keys collide),
    any NVLink graph, some GPUs lost, every GPU a UUID of its own."""
    out = []
    for kind in range(draw(st.integers(1, 4))):
        n = draw(st.integers(2, 7))
        buses = draw(st.permutations([f"0000:{b:02x}:00.0" for b in range(1, 9)]))[:n]
        model = draw(st.sampled_from(["NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB"]))
        edges = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
        joined = {frozenset(e) for e in edges if e[0] != e[1]}
        links = tuple(
            tuple(
                SELF if a == b else NV12 if frozenset((a, b)) in joined else SYS for b in range(n)
            )
            for a in range(n)
        )
        gpus = tuple(
            Gpu(
                i,
                uuid=f"GPU-{kind:04d}-{i:04d}",
                pci=buses[i],
                model=model,
                lost=draw(st.booleans()),
            )
            for i in range(n)
        )
        out.append(Machine(f"kind-{kind}", (Topology(Source.NVML, gpus, links),)))
    return out


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cluster=clusters(), k=st.integers(2, 4), uuids_known=st.booleans())
def test_any_cluster_gets_an_exact_map_or_one_refusal(
    cluster: list[Machine], k: int, uuids_known: bool
) -> None:
    try:
        template = dra_template.build(cluster, k, uuids_known=uuids_known)
    except TemplateError as e:
        refusal = str(e)
    else:
        refusal = ""
    # A refusal is one line: no machine has k connected GPUs, or profiles' keys collide.
    assert "\n" not in refusal
    if refusal:
        return
    for machine in cluster:
        topology = machine.topologies[0]
        covered = machine.name in template.covers
        assert covered != (machine.name in template.keyed_out)  # each kept, or kept out
        for gpus in itertools.combinations(range(len(topology.gpus)), k):
            shared = shares_an_id(template, topology, gpus)
            if shared:  # sound: never an unconnected set, lost GPUs or not
                assert connected(topology, gpus), (machine.name, gpus)
            if covered and not any(topology.gpus[i].lost for i in gpus):
                # complete over usable GPUs, on the machines whose cliques it holds
                assert shared == connected(topology, gpus), (machine.name, gpus)


# --- keeps_derived_attributes: the stored template, as the apiserver answers ---------------------


def test_a_stored_template_keeps_its_derived_attribute_or_is_told_dropped() -> None:
    for fallback in (False, True):
        document = dra_template.build(
            [Machine("dgx-1-v100", (scanned("dgx-1-v100"),))], 4, fallback=fallback
        ).document
        assert dra_template.keeps_derived_attributes(document)
        (request,) = document["spec"]["spec"]["devices"]["requests"]
        for r in request.get("firstAvailable", [request.get("exactly")]):
            r.pop("derivedAttributes", None)
        assert not dra_template.keeps_derived_attributes(document)


@given(
    stored=st.fixed_dictionaries(
        {"spec": st.fixed_dictionaries({"spec": st.fixed_dictionaries({"devices": json_values})})}
    )
    | json_values
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_shape_of_answer_is_judged_without_raising(stored: Any) -> None:
    assert dra_template.keeps_derived_attributes(stored) in (True, False)


# --- nodes left out, copied UUIDs, GPUs without UUIDs ---------------------------------------------


def devices(topology: Topology) -> tuple[Device, ...]:
    """The node's GPUs as its ResourceSlice lists them."""
    return tuple(Device(g.uuid, g.model, g.pci) for g in topology.gpus)


def test_a_node_left_out_is_kept_from_cliques_only_where_it_is_wired_otherwise() -> None:
    h100 = scanned("dgx-h100")
    same, down, unread = numbered(h100, 5), numbered(nvlinks_down(h100), 6), numbered(h100, 7)
    template = dra_template.build(
        [nodes_of("h100", h100, 0, 2)],
        2,
        uuids_known=True,
        left_out=[
            LeftOut("same", same),  # --exclude'd, but wired as the map says: right as it is
            LeftOut("down", down),  # outside --selector, NVLinks down
            LeftOut("unread", devices=devices(unread)),  # its annotation does not decode
        ],
    )
    assert template.keyed_out == ("down", "unread")
    assert all(ids_of(template, same, g.index) == ("a",) for g in same.gpus)
    for topology in (down, unread):
        assert all(ids_of(template, topology, g.index) == () for g in topology.gpus)


def test_a_gpu_to_keep_out_without_a_uuid_takes_its_bus_key_out_of_the_map() -> None:
    h100 = scanned("dgx-h100")
    nameless = replace(
        nvlinks_down(h100), gpus=tuple(replace(g, uuid=None) for g in h100.gpus[:2]) + h100.gpus[2:]
    )
    template = dra_template.build(
        [nodes_of("h100", h100, 0, 3), Machine("down", (nameless,), ("down",))],
        2,
        uuids_known=True,
    )
    first, second = (f"bus:{g.model}/{g.pci}" for g in h100.gpus[:2])
    assert first not in template.values
    assert second not in template.values
    shown = ", ".join(f"{g.model} at {g.pci}" for g in h100.gpus[:2])
    assert template.notes == (
        f"no clique on any node for 2 GPU product and PCI bus IDs ({shown}): down is wired "
        "otherwise there and published no GPU UUID to keep apart by",
    )
    # The others stay on their bus keys; the down node's GPUs 2-7 go by UUID.
    assert sum(k.startswith("uuid:") for k in template.values) == 6
    assert ids_of(template, numbered(h100, 0), 2) == ("a",)


@pytest.mark.parametrize(
    ("listed", "copying", "said"),
    [
        ("a", {"b"}, "left out: b (the GPUs are in the other's ResourceSlice)"),
        (
            None,
            {"a", "b"},
            "left out: all of them (no ResourceSlice of gpu.nvidia.com tells which holds them)",
        ),
    ],
    ids=["the slices name the copier", "without slices both are left out"],
)
def test_nodes_publishing_the_same_uuids_are_named_and_the_copier_left_out(
    listed: str | None, copying: set[str], said: str
) -> None:
    genuine = numbered(scanned("dgx-h100"), 1)
    copier = nvlinks_down(genuine)  # the copy of the UUIDs, on other wiring
    slices = None if listed is None else {listed: list(devices(genuine))}
    found, lines = dra_template.copiers(
        [("a", genuine), ("b", copier), ("c", numbered(copier, 2))], slices
    )
    assert found == copying
    assert lines == [f"nodes a, b publish the same GPU UUIDs: {said}"]


def test_the_devices_of_nvidias_slices_in_every_version_and_their_uuids_win() -> None:
    gpu = scanned("dgx-h100").gpus[0]
    v1 = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "a",
            "devices": [
                {"name": "gpu-0", "attributes": nvidia_attributes(replace(gpu, uuid="GPU-slice"))}
            ],
        }
    }
    v1beta1 = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "b",
            "devices": [{"name": "gpu-0", "basic": {"attributes": nvidia_attributes(gpu)}}],
        }
    }
    other = {"spec": {"driver": "other.example.com", "nodeName": "c", "devices": [{}]}}
    found = dra_template.slice_devices([v1, v1beta1, other, {"spec": None}, "junk", None])
    assert found == {
        "a": [Device("GPU-slice", gpu.model, gpu.pci)],
        "b": [Device(gpu.uuid, gpu.model, gpu.pci)],
    }
    topology = dra_template.with_slice_uuids(scanned("dgx-h100"), found["a"])
    assert [g.uuid for g in topology.gpus][:2] == ["GPU-slice", scanned("dgx-h100").gpus[1].uuid]


# --- the clique search's bound -------------------------------------------------------------------


def moon_moser(parts: int) -> Topology:
    """`parts` triples of GPUs, every GPU NVLinked to every GPU of another triple and to none of
    its own: 3^parts maximal cliques (the most any graph of 3·parts vertices has)."""
    n = 3 * parts
    links = tuple(
        tuple(SELF if a == b else SYS if a // 3 == b // 3 else NV12 for b in range(n))
        for a in range(n)
    )
    gpus = tuple(
        Gpu(i, uuid=f"GPU-{i:08d}", pci=f"0000:{i:02x}:00.0", model="NVIDIA H100 80GB HBM3")
        for i in range(n)
    )
    return Topology(Source.NVML, gpus, links)


def test_a_wiring_of_3_to_the_16_maximal_cliques_is_refused_within_bounded_memory() -> None:
    """The repro: 48 GPUs, 43 million maximal cliques; before, 3.8 GB and no answer."""
    topology = moon_moser(16)
    tracemalloc.start()
    try:
        with pytest.raises(CliqueBoundError, match=r"more than 1024 maximal cliques"):
            dra_template.maximal_cliques(topology)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_the_bound_counts_search_steps_too() -> None:
    with pytest.raises(CliqueBoundError, match=r"more than 10 steps"):
        dra_template.maximal_cliques(moon_moser(4), steps=10)
    assert len(dra_template.maximal_cliques(moon_moser(4))) == 3**4


def test_a_node_past_the_bound_is_left_out_with_one_line_and_its_gpus_kept_from_cliques() -> None:
    forged = moon_moser(16)
    # Its first 8 GPUs sit at the bus IDs of the H100s the template is made of.
    h100 = replace(
        scanned("dgx-h100"),
        gpus=tuple(
            replace(g, model=forged.gpus[0].model, pci=forged.gpus[g.index].pci)
            for g in scanned("dgx-h100").gpus
        ),
    )
    template = dra_template.build(
        [nodes_of("h100", h100, 0, 2), Machine("forged", (forged,), ("forged",))],
        2,
        uuids_known=True,
    )
    assert template.notes == (
        "left out: node forged: its NVLink wiring has more than 1024 maximal cliques, which no "
        "real machine has (is its agent's annotation forged?)",
    )
    assert template.keyed_out == ("forged",)
    assert all(ids_of(template, forged, i) == () for i in range(8))
    with pytest.raises(TemplateError, match=r"^profile forged: its NVLink wiring has more than"):
        dra_template.build([Machine("forged", (forged,))], 2)


# --- the map read back from the expression (the doctor's view) ------------------------------------


def test_the_map_reads_back_from_the_expression_and_nothing_else_does(tmp_path: Path) -> None:
    crossed = scanned(rewired(tmp_path, [[0, 2], [1, 3], [4, 6], [5, 7]]))
    cluster = [
        nodes_of("pairs", scanned("pcie-8x-nvlink-pairs"), 0, 2),
        nodes_of("crossed", crossed, 2, 1),
    ]
    template = dra_template.build(cluster, 2, uuids_known=True)
    read = dra_template.clique_map(template.expression)
    assert read is not None
    assert {f"{k[0]}:{k[1]}" + (f"/{k[2]}" if k[2] else ""): v for k, v in read.items()} == dict(
        template.values
    )
    # An edit that hands clique "a" to every GPU the map does not hold is not ours.
    edited = template.expression.replace("?p[n][b]:[]", '?p[n][b]:["a"]')
    assert edited != template.expression
    for text in (edited, template.expression[:-1], "true", None, 3, template.expression + " "):
        assert dra_template.clique_map(text) is None


# --- the command's reading of the cluster, over an ApiClient double ----------------------------


class ClusterApi:
    """An ApiClient double for `list` alone: Nodes (a label selector `k=v` applied) and
    ResourceSlices in the versions given, each a list or an error status."""

    def __init__(self, nodes: list[dict[str, Any]], slices: Mapping[str, Any]) -> None:
        self.nodes = nodes
        self.slices = slices

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> Any:
        if resource.plural == "nodes":
            selector = (query or {}).get("labelSelector")
            if selector is None:
                return {"items": self.nodes}
            key, _, value = selector.partition("=")
            picked = [n for n in self.nodes if n["metadata"].get("labels", {}).get(key) == value]
            return {"items": picked}
        answer = self.slices.get(resource.version, 404)
        if isinstance(answer, int):
            raise ApiPermanentError(f"status {answer}", status=answer)
        return {"items": answer}


def node_object(name: str, topology: Topology | None, **labels: str) -> dict[str, Any]:
    annotations = {} if topology is None else {"gpu.topology.io/topology": encode(topology)}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def nvidia_slice(node: str, topology: Topology) -> dict[str, Any]:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "devices": [
                {"name": f"gpu-{g.index}", "attributes": nvidia_attributes(g)}
                for g in topology.gpus
            ],
        }
    }


def cluster_template(
    api: ClusterApi, selector: str | None = None, excluded: Sequence[str] = ()
) -> dra_template.Template:
    machines, left_out = dra_template_command._cluster_machines(
        api,  # type: ignore[arg-type]  # list is all it calls
        "gpu.topology.io",
        selector,
        excluded,
    )
    return dra_template.build(machines, 2, uuids_known=True, left_out=left_out)


def test_nodes_outside_the_selector_or_excluded_give_no_clique_and_get_none_where_wired_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100 = scanned("dgx-h100")
    kept, same, down = numbered(h100, 0), numbered(h100, 1), numbered(nvlinks_down(h100), 2)
    # The down node's driver publishes other UUIDs than its annotation: the slice's win.
    sliced = numbered(down, 12)
    api = ClusterApi(
        [
            node_object("gpu-0", kept, pool="a"),
            node_object("gpu-1", same, pool="a"),
            node_object("gpu-2", down, pool="b"),
        ],
        {"v1": [nvidia_slice("gpu-2", sliced)]},
    )
    template = cluster_template(api, selector="pool=a", excluded=["gpu-1", "gpu-9"])
    assert template.covers == ("gpu-0",)
    assert template.keyed_out == ("gpu-2",)
    assert all(ids_of(template, same, g.index) == ("a",) for g in same.gpus)
    assert all(ids_of(template, sliced, g.index) == () for g in sliced.gpus)
    assert capsys.readouterr().err == "topo-reporter: warning: --exclude 'gpu-9': no such Node\n"


@pytest.mark.parametrize(
    ("slices", "warned"),
    [
        ({"v1beta2": []}, ""),
        ({}, ""),
        ({"v1": 403}, "topo-reporter: warning: ResourceSlices may not be listed"),
    ],
    ids=["an older version served", "none served: quiet", "forbidden: said"],
)
def test_the_slices_are_read_in_the_newest_version_served(
    slices: Mapping[str, Any], warned: str, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ClusterApi([node_object("gpu-0", numbered(scanned("dgx-h100"), 0))], slices)
    cluster_template(api)
    assert capsys.readouterr().err.startswith(warned)


def test_an_unreadable_node_and_one_without_an_agent_are_kept_out_by_their_slices_uuids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100 = scanned("dgx-h100")
    broken, bare = numbered(h100, 8), numbered(h100, 9)
    unreadable = node_object("gpu-8", None)
    unreadable["metadata"]["annotations"]["gpu.topology.io/topology"] = '{"v":2}'
    api = ClusterApi(
        [node_object("gpu-0", numbered(h100, 0)), unreadable, node_object("gpu-9", None)],
        {"v1": [nvidia_slice("gpu-8", broken), nvidia_slice("gpu-9", bare)]},
    )
    template = cluster_template(api)
    assert template.keyed_out == ("gpu-8", "gpu-9")
    for topology in (broken, bare):
        assert all(ids_of(template, topology, g.index) == () for g in topology.gpus)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("topo-reporter: warning: left out: node gpu-8: ")


def test_a_node_copying_anothers_uuids_is_named_with_it_and_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100 = scanned("dgx-h100")
    genuine, own = numbered(h100, 0), numbered(nvlinks_down(h100), 5)
    copier = replace(own, gpus=genuine.gpus)  # its annotation, the other's UUIDs
    api = ClusterApi(
        [node_object("gpu-0", genuine), node_object("gpu-1", numbered(h100, 1)),
         node_object("gpu-5", copier)],
        {"v1": [nvidia_slice("gpu-0", genuine), nvidia_slice("gpu-5", own)]},
    )  # fmt: skip
    template = cluster_template(api)
    assert capsys.readouterr().err == (
        "topo-reporter: warning: nodes gpu-0, gpu-5 publish the same GPU UUIDs: left out: gpu-5 "
        "(the GPUs are in the other's ResourceSlice)\n"
    )
    assert template.covers == ("gpu-0 (+1 alike)",)
    # The copier's own GPUs (its slice's UUIDs) get none; the genuine node keeps its cliques.
    assert all(ids_of(template, own, g.index) == () for g in own.gpus)
    assert all(ids_of(template, genuine, g.index) == ("a",) for g in genuine.gpus)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cluster=clusters(), k=st.integers(2, 4), left=st.integers(0, 3), known=st.booleans())
def test_nodes_left_out_never_share_a_clique_with_gpus_they_are_not_joined_to(
    cluster: list[Machine], k: int, left: int, known: bool
) -> None:
    """Any cluster with some of its machines left out (their wiring known or only their GPUs):
    every machine's GPUs, left out or not, share an ID only where they are all joined."""
    kept, out = cluster[left:], cluster[:left]
    strangers = [
        LeftOut(m.name, m.topologies[0])
        if known
        else LeftOut(m.name, devices=devices(m.topologies[0]))
        for m in out
    ]
    try:
        template = dra_template.build(kept, k, uuids_known=True, left_out=strangers)
    except TemplateError:
        return
    for machine in cluster:
        topology = machine.topologies[0]
        for gpus in itertools.combinations(range(len(topology.gpus)), k):
            if shares_an_id(template, topology, gpus):
                assert connected(topology, gpus), (machine.name, gpus)
