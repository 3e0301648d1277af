"""The pages that list everything of a kind list all of it, and nothing that is gone.

Each list is read from the code at run time, never written out here: the label and annotation
keys (reporter.schema.keys) in docs/schema.md, the metrics the agent's and the extender's
registries hold in docs/monitoring.md, the doctor's finding codes (reporter.doctor.model.Code) in
docs/doctor.md, every command and flag of `topo-reporter` and `kubectl gpu-topology` (walked from
their argparse parsers) in docs/cli.md, and the chart's values in docs/chart.md.
(tests/chart/test_values.py checks the other direction of the last: every value is on the page.)
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from parsers.kubelet import KubeletPolicies
from reporter import cli, kubectl_plugin
from reporter.agent import SchemaProjection
from reporter.collect import build_scanner, list_profiles
from reporter.collect.podresources import AllocationView
from reporter.doctor.model import Code
from reporter.extender.cache import NodeCache
from reporter.extender.heartbeat import Heartbeats, heartbeat_metrics
from reporter.extender.server import ExtenderMetrics
from reporter.free_sets import compute_availability
from reporter.placement_quality import HeldSet
from reporter.publish import availability
from reporter.publish.lease import heartbeat_label
from reporter.schema import dra, dra_template, keys, nrt
from reporter.schema.availability import Allocation
from reporter.schema.labels import kubelet_labels
from reporter.schema.model import Topology
from reporter.serve.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PREFIX = keys.DEFAULT_PREFIX

_HEADING = re.compile(r"^(#+) ", re.M)
_SPAN = re.compile(r"`([^`]+)`")


def section(page: str, heading: str) -> str:
    """The text under `heading` (a whole heading line) up to the next heading as high or higher."""
    text = (DOCS / page).read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    level = len(heading) - len(heading.lstrip("#"))
    following = (m for m in _HEADING.finditer(text, start) if len(m[1]) <= level)
    end = next((m.start() for m in following), len(text))
    return text[start:end]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row in `text`, header and separator rows left out."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        # A `\|` inside a cell is a pipe of its text, not a column break.
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append(cells)
    return rows[1:] if rows else rows


def spans(cell: str) -> list[str]:
    return _SPAN.findall(cell)


def missing_and_stale(code: set[str], documented: set[str]) -> tuple[list[str], list[str]]:
    return sorted(code - documented), sorted(documented - code)


# Keys -------------------------------------------------------------------------------------------

NOT_KEYS = {
    "DEFAULT_PREFIX": "the prefix every key is under",
    "GPU_RESOURCE": "NVIDIA's resource name, which the agent reads and never writes",
    "FABRIC_TAINT_EFFECT": "the fabric taint's effect, a value",
    "HEARTBEAT_AVAILABILITY": "the heartbeat label's value",
    "AGENT_POD_SELECTOR": "the chart's label selector of the agent's pods, which the doctor reads",
    "TOPOGRAPH_TIER_DOMAIN": "Topograph's prefix, not ours: its keys are on docs/schema.md",
}
"""The str constants of reporter.schema.keys that are not names under the prefix."""


def key_names() -> set[str]:
    """Every name reporter.schema.keys gives a label, annotation, taint or attribute."""
    return {
        value
        for name, value in vars(keys).items()
        if name.isupper() and isinstance(value, str) and name not in NOT_KEYS
    }


def test_every_key_is_in_the_schema_pages_table_of_keys() -> None:
    documented = {
        s for row in table_rows(section("schema.md", "## Every key")) for s in spans(row[0])
    }
    missing, stale = missing_and_stale(key_names(), documented)
    assert not missing, f"keys.py has keys docs/schema.md's 'Every key' does not list: {missing}"
    assert not stale, f"docs/schema.md's 'Every key' lists keys keys.py does not have: {stale}"


def test_what_is_not_a_key_is_still_a_constant_of_keys() -> None:
    assert set(NOT_KEYS) <= set(vars(keys)), set(NOT_KEYS) - set(vars(keys))


def scanned(profile: str) -> Topology:
    topology = build_scanner("auto", Path("/sys"), profile).scan().topology
    assert topology is not None
    return topology


def written_keys(topology: Topology) -> Iterator[str]:
    """Every key the agent and `dra-template` write for `topology`, everything turned on."""
    policies = KubeletPolicies("single-numa-node", "pod", "static")
    projection = SchemaProjection(PREFIX, "n1", taint_unhealthy_fabric=True)
    node = projection.desired(topology, kubelet_labels(policies, PREFIX))
    yield from node.labels
    yield from node.annotations
    assert node.taint is not None
    yield node.taint.key
    gpus = [g.index for g in topology.gpus]
    free = compute_availability(topology, gpus[1:])
    held = (HeldSet("ns", "pod", "main", tuple(gpus[:2])),) if len(gpus) > 1 else ()
    live = availability.desired(free, PREFIX, Allocation(("dra",), tuple(gpus[:1])), held)
    yield from live.labels
    yield from live.annotations
    yield heartbeat_label(PREFIX)[0]
    yield from nrt.own_labels("n1", PREFIX)
    marked = dra.rule(
        dra.DeviceTaint(0, "gpu-0", dra.REASON_LOST), node="n1", prefix=PREFIX, version="v1"
    )
    yield from marked["metadata"]["labels"]
    yield marked["spec"]["taint"]["key"]


def test_every_key_written_is_one_keys_py_holds() -> None:
    names = key_names()
    found = {k for p in list_profiles() for k in written_keys(scanned(p.name))}
    template = dra_template.build(
        [dra_template.Machine("dgx-h100", (scanned("dgx-h100"),))],
        2,
        prefix=PREFIX,
        selection=("--selector", "gpu=yes"),
    ).document
    found |= set(template["metadata"]["annotations"])
    request = template["spec"]["spec"]["devices"]["requests"][0]
    found |= {a["name"] for a in request["exactly"]["derivedAttributes"]}
    ours = {k for k in found if k.startswith(f"{PREFIX}/")}
    assert ours, "no key was written"
    strays = sorted(k for k in ours if k.removeprefix(f"{PREFIX}/") not in names)
    assert not strays, f"written, but not in reporter/schema/keys.py: {strays}"


# Metrics ----------------------------------------------------------------------------------------


def exposed_names(registry: Any) -> set[str]:
    """The names a scrape shows of each family: a counter's with `_total`, as the docs write it."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in registry.collect()
    }


def agent_metrics() -> set[str]:
    metrics = Metrics()
    # The placement families exist once a PodResources read was judged.
    view = AllocationView(
        allocatable=frozenset(range(8)),
        allocated=frozenset(),
        unhealthy=(),
        unknown_ids=0,
        unknown_examples=(),
    )
    metrics.placement.observe(scanned("dgx-h100"), view)
    return exposed_names(metrics.registry)


def extender_metrics() -> set[str]:
    metrics = ExtenderMetrics(NodeCache(PREFIX))
    heartbeat_metrics(metrics.registry, Heartbeats())
    return exposed_names(metrics.registry)


def documented_metrics(heading: str) -> set[str]:
    rows = table_rows(section("monitoring.md", heading))
    return {s for row in rows for s in spans(row[0]) if s.startswith("topo_reporter_")}


@pytest.mark.parametrize(
    ("heading", "registered"),
    [("## Agent metrics", agent_metrics), ("## Extender metrics", extender_metrics)],
    ids=["the agent's", "the extender's"],
)
def test_every_metric_is_in_the_monitoring_pages_table(heading: str, registered: Any) -> None:
    names = registered()
    assert names, "no metric was registered"
    missing, stale = missing_and_stale(names, documented_metrics(heading))
    assert not missing, f"registered, but not in docs/monitoring.md's {heading!r}: {missing}"
    assert not stale, f"docs/monitoring.md's {heading!r} lists metrics not registered: {stale}"


METRIC_MODULES = {
    "reporter.serve.metrics",
    "reporter.extender.server",
    "reporter.extender.heartbeat",
}
"""The modules whose metrics the test above collects."""
_METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def _makes_metrics(node: ast.AST) -> bool:
    """An import of prometheus_client that brings a metric, or a collector's metric family."""
    if isinstance(node, ast.Import):
        return any(a.name.startswith("prometheus_client") for a in node.names)
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client"):
        names = {a.name for a in node.names}
        return bool(names & _METRIC_CLASSES) or any(n.endswith("MetricFamily") for n in names)
    return False


def test_no_module_defines_metrics_the_test_above_does_not_collect() -> None:
    found = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "reporter").rglob("*.py")
        if any(map(_makes_metrics, ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    }
    assert found == METRIC_MODULES


# Doctor findings --------------------------------------------------------------------------------


def test_every_finding_code_is_in_the_doctor_pages_table() -> None:
    text = (DOCS / "doctor.md").read_text(encoding="utf-8")
    table = text[text.index("| finding |") :]
    rows = table_rows(table[: table.index("\n\n")])
    documented = {spans(row[0])[0] for row in rows}
    missing, stale = missing_and_stale({str(c) for c in Code}, documented)
    assert not missing, f"finding codes docs/doctor.md's table does not list: {missing}"
    assert not stale, f"docs/doctor.md's table lists codes no finding has: {stale}"


# Commands and flags -----------------------------------------------------------------------------


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command line the package installs, by how it is typed: `topo-reporter`, each of its
    subcommands, and `kubectl gpu-topology`."""
    top = cli.build_parser()
    found = {"topo-reporter": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found |= {f"topo-reporter {name}": p for name, p in action.choices.items()}
    found["kubectl gpu-topology"] = kubectl_plugin.build_parser()
    return found


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if not isinstance(action, argparse._HelpAction)
    }


def flag_index() -> dict[str, set[str]]:
    """docs/cli.md's 'Every command and its flags': the flags of each command line."""
    rows = table_rows(section("cli.md", "## Every command and its flags"))
    return {spans(row[0])[0]: set(spans(row[1])) for row in rows}


def test_every_command_is_in_the_cli_pages_index() -> None:
    documented = set(flag_index())
    commands = {f"topo-reporter {c.name}" for c in cli.COMMANDS}
    assert commands <= set(parsers())
    missing, stale = missing_and_stale(set(parsers()), documented)
    assert not missing, f"docs/cli.md's index lacks: {missing}"
    assert not stale, f"docs/cli.md's index lists commands that are gone: {stale}"


COMMAND_LINES = sorted(parsers())


@pytest.mark.parametrize("command", COMMAND_LINES, ids=COMMAND_LINES)
def test_every_flag_is_in_the_cli_pages_index(command: str) -> None:
    missing, stale = missing_and_stale(flags(parsers()[command]), flag_index().get(command, set()))
    assert not missing, f"{command}: flags docs/cli.md's index does not list: {missing}"
    assert not stale, f"{command}: docs/cli.md's index lists flags it does not take: {stale}"


_ALTERNATIVES = re.compile(r"(--[a-z][a-z-]*)[ =]([a-z0-9-]+(?:\\?\|[a-z0-9-]+)+)")


def test_every_choice_list_the_cli_page_shows_is_the_parsers() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    shown = [(m[1], set(m[2].replace("\\|", "|").split("|"))) for m in _ALTERNATIVES.finditer(text)]
    assert shown, "docs/cli.md shows no `--flag a|b` list any more"
    for flag, values in shown:
        offered = [
            {str(c) for c in action.choices}
            for parser in parsers().values()
            for action in parser._actions
            if flag in action.option_strings and action.choices
        ]
        assert values in offered, f"docs/cli.md shows {flag} {'|'.join(sorted(values))}: {offered}"


# Chart values -----------------------------------------------------------------------------------


def value_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key path of values.yaml, groups and members alike (`agent`, `agent.prefix`)."""
    for key, value in values.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from value_paths(value, f"{prefix}{key}.")


def test_every_value_the_chart_page_lists_is_one_values_yaml_has() -> None:
    values = yaml.safe_load((ROOT / "charts" / "topo-reporter" / "values.yaml").read_text())
    paths = set(value_paths(values))
    rows = table_rows(section("chart.md", "## Values"))
    listed = {spans(row[0])[0] for row in rows}
    assert len(listed) > 50, "the Values table was not found"
    stale = sorted(listed - paths)
    assert not stale, (
        f"docs/chart.md's Values table lists values values.yaml does not have: {stale}"
    )


@pytest.mark.parametrize("page", ["schema.md", "network.md"])
def test_topographs_tier_keys_are_named_whole_on_the_schema_and_network_pages(page: str) -> None:
    text = (DOCS / page).read_text()
    assert [k for k in keys.TOPOGRAPH_TIER_KEYS if f"`{k}`" not in text] == []
