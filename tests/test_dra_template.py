"""`topo-reporter dra-template`: the clique map, its expression in Kubernetes' own DRA CEL code, the
template's fields against k8s.io/api v0.37.2, and the command's exits."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.dra_template import paired_kinds
from parsers.links import SELF, Link, LinkKind
from reporter import cli
from reporter.collect import build_scanner, list_profiles
from reporter.schema import dra_template
from reporter.schema.dra_template import Machine, TemplateError
from reporter.schema.model import Gpu, Source, Topology
from tests.controlplane_fixtures import go_binary
from tests.dra_cel import evaluate, nvidia_attributes
from tests.golden import DRA_TEMPLATES, dra_templates
from tests.test_doctor_groups import json_values

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
    gpu = topology.gpus[index]
    return template.values.get(f"uuid:{gpu.uuid}") or template.values.get(
        f"bus:{gpu.model}/{gpu.pci}", ()
    )


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
    assert template.by_uuid == ()
    assert not any(k.startswith("uuid:") for k in template.values)


def test_nodes_sharing_keys_but_wired_differently_are_told_apart_by_uuid(tmp_path: Path) -> None:
    crossed = rewired(tmp_path, [[0, 2], [1, 3], [4, 6], [5, 7]])
    nodes = machines("pcie-8x-nvlink-pairs", crossed, "dgx-h100")
    template = dra_template.build(nodes, 2, uuids_known=True)
    assert set(template.by_uuid) == {"pcie-8x-nvlink-pairs", crossed}
    for machine in nodes:
        topology = machine.topologies[0]
        for gpus in itertools.combinations(range(len(topology.gpus)), 2):
            assert shares_an_id(template, topology, gpus) == connected(topology, gpus)
    # Only the colliding GPUs went to UUIDs: the H100s keep their bus keys.
    assert sum(k.startswith("uuid:") for k in template.values) == 16


@pytest.mark.parametrize(
    ("profiles", "k", "said"),
    [
        (("dgx-h100",), 9, r"^--gpus 9: no machine given has 9 GPUs .*the largest such set: 8"),
        (("pcie-8x",), 2, r"^--gpus 2: no machine given has 2 GPUs .*the largest such set: 1"),
        (("dgx-h100",), 1, r"^--gpus 1: one GPU is connected by itself"),
    ],
    ids=["more-than-any-clique", "no-nvlink-at-all", "one-gpu"],
)
def test_an_impossible_k_is_refused(profiles: tuple[str, ...], k: int, said: str) -> None:
    with pytest.raises(TemplateError, match=said):
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
        ["dra-template", "--gpus", "2", "--simulate", "pcie-8x-nvlink-pairs"], capsys
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
            "dra-template", "--gpus", "4", "--simulate", "dgx-1-v100", "--simulate", "dgx-h100",
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
    ("argv", "said"),
    [
        (["--gpus", "2", "--simulate", "dgx-h1000"], "unknown simulated machine 'dgx-h1000'"),
        (["--gpus", "9", "--simulate", "dgx-h100"], "--gpus 9: no machine given has 9 GPUs"),
        (["--gpus", "0", "--simulate", "dgx-h100"], "--gpus 0: one GPU is connected by itself"),
        (["--gpus", "4", "--simulate", "pcie-8x-nvlink-pairs"], "the largest such set: 2"),
    ],
    ids=["unknown-profile", "k-past-the-machine", "k-zero", "k-past-the-pairs"],
)
def test_a_bad_request_is_one_line_on_stderr_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["dra-template", *argv], capsys)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1, err
    assert said in err


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
        for gpus in itertools.combinations(range(len(topology.gpus)), k):
            shared = shares_an_id(template, topology, gpus)
            if shared:  # sound: never an unconnected set, lost GPUs or not
                assert connected(topology, gpus), (machine.name, gpus)
            if not any(topology.gpus[i].lost for i in gpus):  # complete over usable GPUs
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
