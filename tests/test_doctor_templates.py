"""The doctor's findings on `dra-template`'s templates: nodes of a wiring the template was not made
for, and a template stored without its derivedAttributes (kube-apiserver's gate off).

Pure judgements on template and Node dicts, the reader's list of templates over an ApiClient
double (403, 404, hostile pages), and templates of any shape never raising. The uncovered nodes on
the real apiserver: tests/test_controlplane_doctor_templates.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.collect import build_scanner
from reporter.doctor import ApiClusterReader, dra_template_findings
from reporter.doctor.model import Severity
from reporter.doctor.report import report_json, report_text
from reporter.doctor.templates import GATE_OFF, UNCOVERED, covered_digests
from reporter.errors import ApiPermanentError
from reporter.publish.api import Resource
from reporter.schema import dra_template
from reporter.schema.codec import encode
from reporter.schema.model import Topology
from tests.test_doctor_groups import json_values

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
    assert finding.summary.startswith("2 nodes with 2 or more GPUs are of a wiring the template")
    assert finding.evidence[0] == "nodes: a100-0, h100-0"
    digests = sorted(dra_template.wiring_digest(scanned(p)) for p in ("dgx-a100", "dgx-h100"))
    assert finding.evidence[1] == f"their wirings: {', '.join(digests)}"
    pairs = dra_template.wiring_digest(scanned("pcie-8x-nvlink-pairs"))
    assert finding.evidence[2] == f"the template covers: {pairs}"
    assert finding.fix == (
        "run `topo-reporter dra-template --gpus 2 --name nvlink-2-gpus --namespace ml` "
        "again and apply it"
    )


def test_past_five_nodes_the_rest_are_counted() -> None:
    nodes = [gpu_node(f"h100-{i}", "dgx-h100") for i in range(8)]
    found = dra_template_findings([template("dgx-a100")], nodes, PREFIX)
    (finding,) = found["template ml/nvlink-2-gpus"]
    assert finding.summary.startswith("8 nodes with 2 or more GPUs")
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
    assert finding.fix == (
        "run `topo-reporter dra-template --gpus 2 --fallback --name nvlink-2-gpus-or-any "
        f"--namespace ml --prefix {OTHER_PREFIX}` again and apply it"
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
    assert all(f.code in (GATE_OFF, UNCOVERED) for fs in found.values() for f in fs)
    report_json(found)
    read, _ = reader({"v1": {"items": [*junk, shaped]}})
    assert len(read.dra_templates(PREFIX) or []) == (covered_digests(shaped, PREFIX) is not None)
