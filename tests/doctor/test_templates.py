"""The doctor's findings on `dra-template`'s templates: nodes of a wiring the template was not made
for, and a template stored without its derivedAttributes (kube-apiserver's gate off).

Pure judgements on template and Node dicts, the reader's list of templates over an ApiClient
double (403, 404, hostile pages), and templates of any shape never raising. The uncovered nodes on
the real apiserver: tests/controlplane/test_doctor_templates.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.dra_template import numbered, nvlinks_down
from parsers.links import SELF
from reporter.collect import build_scanner
from reporter.doctor import ApiClusterReader, dra_template_findings
from reporter.doctor.model import Code, Severity
from reporter.doctor.report import report_json, report_text
from reporter.doctor.templates import covered_digests
from reporter.errors import ApiPermanentError
from reporter.publish.api import Resource
from reporter.schema import dra_template
from reporter.schema.codec import encode
from reporter.schema.model import Topology
from tests.cli.test_dra_template import NV12, SYS, moon_moser
from tests.doctor.test_groups import json_values
from tests.support.dra_cel import nvidia_attributes

GATE_OFF = Code.DRA_TEMPLATE_GATE_OFF
MISROUTED = Code.DRA_TEMPLATE_MISROUTED_NODES
UNCOVERED = Code.DRA_TEMPLATE_UNCOVERED_NODES

PREFIX = "gpu.topology.io"
OTHER_PREFIX = "other.example.com"


@cache
def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/"), profile).scan().topology
    assert topology is not None
    return topology


def gpu_node(name: str, profile: str, prefix: str = PREFIX) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "annotations": {f"{prefix}/topology": encode(scanned(profile))},
        },
        "status": {"capacity": {"nvidia.com/gpu": str(len(scanned(profile).gpus))}},
    }


def template(
    *profiles: str, gpus: int = 2, fallback: bool = False, prefix: str = PREFIX
) -> dict[str, Any]:
    machines = [dra_template.Machine(p, (scanned(p),)) for p in profiles]
    built = dra_template.build(machines, gpus, fallback=fallback, namespace="ml", prefix=prefix)
    return built.document


def without_derived(document: dict[str, Any]) -> dict[str, Any]:
    """The template as kube-apiserver stores it with DRADerivedAttributes off."""
    stored = copy.deepcopy(document)
    (request,) = stored["spec"]["spec"]["devices"]["requests"]
    for part in [request.get("exactly"), *request.get("firstAvailable", [])]:
        if part is not None:
            part.pop("derivedAttributes", None)
    return stored


def test_nodes_of_a_wiring_the_template_was_not_made_for_are_one_warning_naming_them() -> None:
    nodes = [
        gpu_node("pairs-0", "pcie-8x-nvlink-pairs"),
        gpu_node("pairs-1", "pcie-8x-nvlink-pairs"),
        gpu_node("h100-0", "dgx-h100"),
        gpu_node("a100-0", "dgx-a100"),
    ]
    found = dra_template_findings([template("pcie-8x-nvlink-pairs")], nodes, PREFIX)
    assert list(found) == ["template ml/nvlink-2-gpus"]
    (finding,) = found["template ml/nvlink-2-gpus"]
    assert (finding.code, finding.severity) == (UNCOVERED, Severity.WARNING)
    assert finding.summary == (
        "2 nodes with 2 or more NVLink-connected GPUs are of a wiring the template was not made "
        "from, and its map gives no 2 of their GPUs a clique: the template's claims never get "
        "GPUs there as NVLink-connected"
    )
    assert finding.evidence[0] == "nodes: a100-0, h100-0"
    digests = sorted(dra_template.wiring_digest(scanned(p)) for p in ("dgx-a100", "dgx-h100"))
    assert finding.evidence[1] == f"their wirings: {', '.join(digests)}"
    pairs = dra_template.wiring_digest(scanned("pcie-8x-nvlink-pairs"))
    assert finding.evidence[2] == f"the template covers: {pairs}"
    assert finding.fix == (
        "where their NVLinks are down, bring them back; then make the template again from the "
        "nodes now and apply it: "
        "`topo-reporter dra-template --gpus 2 --name nvlink-2-gpus --namespace ml`"
    )


def node_of(name: str, topology: Topology) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {f"{PREFIX}/topology": encode(topology)}}}


def cluster_template(*machines: dra_template.Machine, **options: Any) -> dict[str, Any]:
    """What `dra-template --kubeconfig` makes of these nodes."""
    built = dra_template.build(machines, 2, namespace="ml", uuids_known=True, **options)
    return built.document


def test_a_node_whose_nvlinks_went_down_after_the_template_is_an_error_saying_what_happens() -> (
    None
):
    """The repro: a template made over two DGX H100 nodes, then node 2's fabric manager stops
    (every pair SYS). Its 28 pairs still share clique "a": the allocator hands them out as
    connected."""
    h100 = scanned("dgx-h100")
    first, second = numbered(h100, 1), numbered(h100, 2)
    made = cluster_template(dra_template.Machine("h100", (first, second), ("gpu-1", "gpu-2")))
    nodes = [node_of("gpu-1", first), node_of("gpu-2", nvlinks_down(second))]
    (finding,) = dra_template_findings([made], nodes, PREFIX)["template ml/nvlink-2-gpus"]
    assert (finding.code, finding.severity) == (MISROUTED, Severity.ERROR)
    assert finding.summary == (
        "1 node of a wiring the template was not made from has GPUs at product and PCI bus IDs "
        "its clique map holds: claims for 2 GPUs from it can get GPUs there that are not "
        "NVLink-connected, handed out as connected"
    )
    assert finding.evidence[0] == "nodes: gpu-2"
    assert finding.fix == (
        "make the template again from the nodes now and apply it: `topo-reporter dra-template "
        "--gpus 2 --name nvlink-2-gpus --namespace ml` (a node that joined later or whose "
        "NVLinks went down then gets no clique)"
    )


def test_a_node_kept_out_when_the_template_was_made_is_only_a_warning() -> None:
    h100 = scanned("dgx-h100")
    healthy, down = [numbered(h100, n) for n in range(2)], nvlinks_down(numbered(h100, 2))
    made = cluster_template(
        dra_template.Machine("h100", tuple(healthy), ("gpu-0", "gpu-1")),
        dra_template.Machine("down", (down,), ("gpu-2",)),
    )
    nodes = [node_of("gpu-0", healthy[0]), node_of("gpu-1", healthy[1]), node_of("gpu-2", down)]
    assert dra_template_findings([made], nodes, PREFIX) == {}  # all NVLinks down: none to give
    # A node that joins later with the same wiring but its own UUIDs is not kept out.
    later = node_of("gpu-3", nvlinks_down(numbered(h100, 3)))
    (finding,) = dra_template_findings([made], [*nodes, later], PREFIX)["template ml/nvlink-2-gpus"]
    assert (finding.code, finding.evidence[0]) == (MISROUTED, "nodes: gpu-3")


def test_gpus_are_looked_up_by_the_uuids_their_resource_slices_list() -> None:
    """The expression reads the driver's UUIDs: a node kept out by them, whose annotation says
    other UUIDs, is no error once the slices are read."""
    h100 = scanned("dgx-h100")
    healthy, sliced = numbered(h100, 1), nvlinks_down(numbered(h100, 2))
    made = cluster_template(
        dra_template.Machine("h100", (healthy, numbered(h100, 3)), ("gpu-1", "gpu-3")),
        dra_template.Machine("down", (sliced,), ("gpu-2",)),
    )
    annotated = nvlinks_down(numbered(h100, 7))  # the annotation's UUIDs are not the driver's
    nodes = [node_of("gpu-1", healthy), node_of("gpu-2", annotated)]
    (finding,) = dra_template_findings([made], nodes, PREFIX)["template ml/nvlink-2-gpus"]
    assert finding.code == MISROUTED
    slices = [
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-2", "devices": [
            {"name": f"gpu-{g.index}", "attributes": nvidia_attributes(g)} for g in sliced.gpus
        ]}}
    ]  # fmt: skip
    assert dra_template_findings([made], nodes, PREFIX, slices) == {}


def test_a_node_of_another_wiring_that_joins_later_at_the_same_keys_is_an_error() -> None:
    pairs = scanned("pcie-8x-nvlink-pairs")
    # The bridges between other cards: (0, 2), (1, 3), (4, 6), (5, 7).
    crossed = replace(
        pairs,
        links=tuple(
            tuple(
                SELF if a == b else NV12 if (a // 4, a % 2) == (b // 4, b % 2) else SYS
                for b in range(8)
            )
            for a in range(8)
        ),
    )
    made = cluster_template(dra_template.Machine("pairs", (numbered(pairs, 1),), ("gpu-1",)))
    found = dra_template_findings([made], [node_of("gpu-9", numbered(crossed, 9))], PREFIX)
    assert [f.code for f in found["template ml/nvlink-2-gpus"]] == [MISROUTED]


def test_an_expression_not_ours_counts_every_node_of_another_wiring_as_an_error() -> None:
    made = template("dgx-h100")
    (request,) = made["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["derivedAttributes"][0]["expression"] = '["a"]'
    nodes = [gpu_node("h100-0", "dgx-h100"), gpu_node("a100-0", "dgx-a100")]
    (finding,) = dra_template_findings([made], nodes, PREFIX)["template ml/nvlink-2-gpus"]
    assert (finding.code, finding.evidence[0]) == (MISROUTED, "nodes: a100-0")
    assert finding.evidence[-1] == (
        "its expression is not one dra-template writes: every node of another wiring is counted"
    )


def test_the_fix_repeats_the_device_class_and_the_node_selection() -> None:
    made = dra_template.build(
        [dra_template.Machine("dgx-a100", (scanned("dgx-a100"),))],
        2,
        namespace="ml",
        device_class="h100.example.com",
        selection=["--selector", "gpu in (h100, a100)", "--exclude", "gpu-7"],
    ).document
    (finding,) = dra_template_findings([made], [gpu_node("h100-0", "dgx-h100")], PREFIX)[
        "template ml/nvlink-2-gpus"
    ]
    assert finding.fix.endswith(
        "`topo-reporter dra-template --gpus 2 --device-class h100.example.com --name "
        "nvlink-2-gpus --namespace ml --selector 'gpu in (h100, a100)' --exclude gpu-7`"
    )
    # A selection annotation of anything but those flags is left out of the command.
    made["metadata"]["annotations"][f"{PREFIX}/dra-template-selection"] = "--kubeconfig x; rm"
    (finding,) = dra_template_findings([made], [gpu_node("h100-0", "dgx-h100")], PREFIX)[
        "template ml/nvlink-2-gpus"
    ]
    assert finding.fix.endswith("--name nvlink-2-gpus --namespace ml`")


def test_a_node_past_the_clique_bound_is_named_never_searched_without_end() -> None:
    forged = moon_moser(16)
    (finding,) = dra_template_findings([template("dgx-h100")], [node_of("forged", forged)], PREFIX)[
        "template ml/nvlink-2-gpus"
    ]
    assert (finding.code, finding.evidence[0]) == (UNCOVERED, "nodes: forged")
    assert finding.evidence[-1] == (
        "past the clique search's bound (1024 maximal cliques), which dra-template leaves out: "
        "forged"
    )


def test_past_five_nodes_the_rest_are_counted() -> None:
    nodes = [gpu_node(f"h100-{i}", "dgx-h100") for i in range(8)]
    found = dra_template_findings([template("dgx-a100")], nodes, PREFIX)
    (finding,) = found["template ml/nvlink-2-gpus"]
    assert finding.summary.startswith("8 nodes with 2 or more NVLink-connected GPUs")
    assert finding.evidence[0] == "nodes: h100-0, h100-1, h100-2, h100-3, h100-4 and 3 more"


def test_a_template_that_covers_every_wiring_has_no_finding() -> None:
    nodes = [gpu_node("pairs-0", "pcie-8x-nvlink-pairs"), gpu_node("h100-0", "dgx-h100")]
    covering = template("pcie-8x-nvlink-pairs", "dgx-h100")
    assert dra_template_findings([covering], nodes, PREFIX) == {}


def test_a_node_too_small_for_the_claims_or_without_a_readable_topology_is_not_uncovered() -> None:
    small = gpu_node("workstation", "workstation-nvlink-bridge")
    broken = gpu_node("broken", "dgx-h100")
    broken["metadata"]["annotations"][f"{PREFIX}/topology"] = '{"v":2}'
    bare: dict[str, Any] = {"metadata": {"name": "cpu-0"}}
    found = dra_template_findings([template("dgx-h100", gpus=4)], [small, broken, bare], PREFIX)
    assert found == {}
    (finding,) = dra_template_findings(
        [template("dgx-h100", gpus=2)], [small, broken, bare], PREFIX
    )["template ml/nvlink-2-gpus"]
    assert finding.evidence[0] == "nodes: workstation"


def test_templates_not_ours_or_of_another_prefix_are_passed_over() -> None:
    nodes = [gpu_node("h100-0", "dgx-h100")]
    foreign = without_derived(template("dgx-a100"))
    foreign["metadata"]["annotations"] = {"example.com/owner": "someone"}
    other = template("dgx-a100", prefix=OTHER_PREFIX)
    assert dra_template_findings([foreign, other], nodes, PREFIX) == {}
    assert covered_digests(foreign, PREFIX) is None
    assert covered_digests(other, OTHER_PREFIX) == (
        dra_template.wiring_digest(scanned("dgx-a100")),
    )


def test_the_fix_names_the_fallback_and_a_prefix_of_its_own() -> None:
    nodes = [gpu_node("h100-0", "dgx-h100", prefix=OTHER_PREFIX)]
    made = template("dgx-a100", fallback=True, prefix=OTHER_PREFIX)
    (finding,) = dra_template_findings([made], nodes, OTHER_PREFIX)[
        "template ml/nvlink-2-gpus-or-any"
    ]
    assert finding.fix.endswith(
        "`topo-reporter dra-template --gpus 2 --fallback --name nvlink-2-gpus-or-any "
        f"--namespace ml --prefix {OTHER_PREFIX}`"
    )


@pytest.mark.parametrize(
    ("fallback", "effect"),
    [
        (False, "so every claim from it is unschedulable"),
        (True, "so its claims never get connected GPUs, only the fallback's any GPUs"),
    ],
    ids=[
        "a template stored without derivedAttributes makes every claim unschedulable",
        "its connected subrequest stored without them leaves only the fallback",
    ],
)
def test_a_template_stored_without_derived_attributes_is_an_error_naming_the_gates(
    fallback: bool, effect: str
) -> None:
    nodes = [gpu_node("h100-0", "dgx-h100")]
    stored = without_derived(template("dgx-h100", fallback=fallback))
    name = f"template ml/{stored['metadata']['name']}"
    (finding,) = dra_template_findings([stored], nodes, PREFIX)[name]
    assert (finding.code, finding.severity) == (GATE_OFF, Severity.ERROR)
    assert f"while the {dra_template.GATES[0]} feature gate is off" in finding.summary
    assert f"no device carries {PREFIX}/nvlinkClique" in finding.summary
    assert finding.summary.endswith(effect)
    assert finding.fix == (
        f"turn on {dra_template.GATES[0]} and {dra_template.GATES[1]} on kube-apiserver and "
        "kube-scheduler, then apply the template again"
    )
    # With its derivedAttributes kept, the same template is no finding.
    assert dra_template_findings([template("dgx-h100", fallback=fallback)], nodes, PREFIX) == {}


def test_a_template_with_both_faults_has_both_findings_worst_first() -> None:
    nodes = [gpu_node("h100-0", "dgx-h100")]
    stored = without_derived(template("dgx-a100"))
    found = dra_template_findings([stored], nodes, PREFIX)
    assert [f.code for f in found["template ml/nvlink-2-gpus"]] == [GATE_OFF, UNCOVERED]


def test_the_report_names_the_template_not_a_node() -> None:
    nodes = [gpu_node("h100-0", "dgx-h100")]
    found = {"h100-0": [], **dra_template_findings([template("dgx-a100")], nodes, PREFIX)}
    text = report_text(found, summary=True)
    assert text.startswith("1 nodes, 1 without findings\n")
    assert f"  WARNING {UNCOVERED}: 1 (template ml/nvlink-2-gpus)\n" in text
    assert "\ntemplate ml/nvlink-2-gpus: 1 finding\n" in text
    doc = json.loads(report_json(found))
    assert [{k: v for k, v in n.items() if k != "findings"} for n in doc["nodes"]] == [
        {"node": "h100-0"},
        {"template": "ml/nvlink-2-gpus"},
    ]


class TemplateApi:
    """An ApiClient double for `list` alone: each version's answer, a page or an error status."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
        metadata_only: bool = False,
    ) -> Any:
        assert (resource.group, resource.plural, namespace) == (
            "resource.k8s.io",
            "resourceclaimtemplates",
            None,
        )
        self.asked.append(resource.version)
        answer = self.answers.get(resource.version, 404)
        if isinstance(answer, int):
            raise ApiPermanentError(f"status {answer}", status=answer)
        return answer


def reader(answers: Mapping[str, Any]) -> tuple[ApiClusterReader, TemplateApi]:
    api = TemplateApi(answers)
    return ApiClusterReader(api), api  # type: ignore[arg-type]  # list is all it calls


def test_the_reader_keeps_our_templates_in_the_newest_version_served() -> None:
    ours, other = template("dgx-h100"), template("dgx-h100", prefix=OTHER_PREFIX)
    page: dict[str, Any] = {"items": [ours, other, {"metadata": None}, "junk", None, []]}
    read, api = reader({"v1beta2": page})
    assert read.dra_templates(PREFIX) == [ours]
    assert api.asked == ["v1", "v1beta2"]


@pytest.mark.parametrize(
    ("answers", "asked"),
    [
        ({"v1": 403}, ["v1"]),
        ({}, ["v1", "v1beta2", "v1beta1"]),
    ],
    ids=["templates the operator may not list are unknown", "none served is unknown"],
)
def test_templates_the_reader_cannot_read_are_unknown(
    answers: Mapping[str, Any], asked: list[str]
) -> None:
    read, api = reader(answers)
    assert read.dra_templates(PREFIX) is None
    assert api.asked == asked


def test_another_refusal_is_raised() -> None:
    read, _ = reader({"v1": 401})
    with pytest.raises(ApiPermanentError, match="status 401"):
        read.dra_templates(PREFIX)


@pytest.mark.parametrize(
    "page",
    [[], "junk", {"items": None}, {"items": {"a": 1}}, {}],
    ids=["a list", "a string", "no items", "items an object", "an empty object"],
)
def test_a_page_of_the_wrong_shape_holds_no_template(page: Any) -> None:
    read, _ = reader({"v1": page})
    assert read.dra_templates(PREFIX) == []


PATHS = [
    ("metadata",),
    ("metadata", "annotations"),
    ("metadata", "annotations", f"{PREFIX}/dra-template-machines"),
    ("metadata", "name"),
    ("spec",),
    ("spec", "spec", "devices"),
    ("spec", "spec", "devices", "requests"),
    ("spec", "spec", "devices", "requests", 0),
    ("spec", "spec", "devices", "requests", 0, "firstAvailable"),
    ("spec", "spec", "devices", "requests", 0, "firstAvailable", 0),
    ("spec", "spec", "devices", "requests", 0, "firstAvailable", 0, "name"),
    ("spec", "spec", "devices", "requests", 0, "firstAvailable", 0, "count"),
    ("spec", "spec", "devices", "requests", 0, "firstAvailable", 0, "derivedAttributes"),
]


@given(
    st.lists(json_values, max_size=4),
    st.sampled_from(PATHS),
    st.booleans(),
)
def test_templates_of_any_shape_never_raise(
    junk: list[Any], path: tuple[str | int, ...], stripped: bool
) -> None:
    shaped = template("dgx-a100", fallback=True)
    if stripped:
        shaped = without_derived(shaped)
    parent: Any = shaped
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = junk[0] if junk else None
    nodes = [gpu_node("h100-0", "dgx-h100"), *junk]
    found = dra_template_findings([*junk, shaped], nodes, PREFIX)
    # Junk of at most 8 characters a key cannot carry our annotation: only `shaped` may be ours.
    assert len(found) <= (covered_digests(shaped, PREFIX) is not None)
    assert all(f.code in (GATE_OFF, MISROUTED, UNCOVERED) for fs in found.values() for f in fs)
    report_json(found)
    read, _ = reader({"v1": {"items": [*junk, shaped]}})
    assert len(read.dra_templates(PREFIX) or []) == (covered_digests(shaped, PREFIX) is not None)
