"""Each setting is declared once: its flag, env var, settings-file key and `--help` line are derived
from that one `setting()` field, every declaration says its env var and what it does, every help
that names a default names the real one, and the chart's values land on declared settings."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from reporter import cli, settings
from reporter.errors import ConfigError
from reporter.settings import (
    COMMAND_SETTINGS,
    Declaration,
    Kind,
    Resolvable,
    Settings,
    declared,
    help_text,
    resolve_as,
    setting,
    shown_default,
)
from tests.support.helm_chart import ALL_ON, CHART_DIR, Rendered, render

ENV_NAME = re.compile(r"TOPO_REPORTER_[A-Z0-9_]+|NODE_NAME|POD_NAMESPACE|KUBECONFIG")
"""Ours, or the ones Kubernetes and kubectl users already set (the downward API, KUBECONFIG)."""
COMMAND_OF: dict[str, type[Resolvable]] = {
    "run": settings.Settings,
    "collect": settings.CollectSettings,
    "network": settings.NetworkSettings,
    "extender": settings.ExtenderSettings,
    "prune": settings.PruneSettings,
    "doctor": settings.ReaderSettings,
    "dra-template": settings.TemplateSettings,
}
"""Each subcommand whose flags are settings, and the settings it resolves."""
EVERY_DECLARATION = [
    pytest.param(of, f, d, id=f"{of.__name__}.{f.name}")
    for of in COMMAND_SETTINGS
    for f, d in declared(of)
]


def subcommand(name: str) -> argparse.ArgumentParser:
    """The real parser of one `topo-reporter` subcommand."""
    commands = next(
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = commands.choices[name]
    return parser


def squeezed(text: str) -> str:
    """Text without its whitespace: argparse wraps help at spaces and after hyphens."""
    return "".join(text.split())


@dataclasses.dataclass(frozen=True)
class WithColour(Settings):
    """The agent's Settings, and one setting more, added the one way there is."""

    colour: str = setting(
        "teal",
        flag="--colour",
        env="TOPO_REPORTER_COLOUR",
        help="what the example setting is",
        metavar="NAME",
    )


def test_a_setting_added_in_one_place_has_its_flag_env_var_file_key_and_help_line(
    tmp_path: Path,
) -> None:
    parser = argparse.ArgumentParser(prog="topo-reporter run")
    settings.add_arguments(parser, WithColour)
    assert squeezed(
        "--colour NAME what the example setting is (default: teal; env TOPO_REPORTER_COLOUR)"
    ) in squeezed(parser.format_help())

    def resolved(argv: list[str], environ: dict[str, str]) -> str:
        config = resolve_as(WithColour, vars(parser.parse_args(argv)), environ)
        return config.colour

    assert resolved(["--node", "n1"], {}) == "teal"
    assert resolved(["--node", "n1"], {"TOPO_REPORTER_COLOUR": "plum"}) == "plum"
    assert resolved(["--node", "n1", "--colour", "red"], {"TOPO_REPORTER_COLOUR": "plum"}) == "red"
    config_file = tmp_path / "settings.yaml"
    config_file.write_text("colour: ochre\n")
    assert resolved(["--node", "n1", "--config", str(config_file)], {}) == "ochre"
    # The others are untouched by the addition: still every flag `run` has, resolved as before.
    assert resolve_as(WithColour, vars(parser.parse_args(["--node", "n1"])), {}).interval_s == 60.0


@pytest.mark.parametrize(("of", "field", "declaration"), EVERY_DECLARATION)
def test_every_setting_has_an_env_var_and_says_what_it_does(
    of: type[Resolvable], field: dataclasses.Field[Any], declaration: Declaration
) -> None:
    assert declaration.env, "no environment variable"
    assert all(ENV_NAME.fullmatch(variable) for variable in declaration.env), declaration.env
    assert declaration.flag.startswith("--")
    assert declaration.help.strip()
    assert declaration.help == declaration.help.strip()


@pytest.mark.parametrize(("of", "field", "declaration"), EVERY_DECLARATION)
def test_every_help_that_names_a_default_names_the_real_one(
    of: type[Resolvable], field: dataclasses.Field[Any], declaration: Declaration
) -> None:
    # The default is derived from the value; a help text writing one itself could disagree.
    assert "default:" not in declaration.help
    assert "(default" not in declaration.help
    # A hand-written default is only for a value no person reads as one (None: off, or computed).
    if declaration.shown is not None:
        assert field.default is None, f"shown {declaration.shown!r} hides {field.default!r}"
    assert f"(default: {shown_default(field.default, declaration)};" in help_text(
        field.default, declaration
    )


@pytest.mark.parametrize("command", sorted(COMMAND_OF))
def test_each_commands_help_shows_its_settings_derived_lines(command: str) -> None:
    page = squeezed(subcommand(command).format_help())
    for field, declaration in declared(COMMAND_OF[command]):
        assert squeezed(help_text(field.default, declaration)) in page, declaration.flag


@pytest.mark.parametrize("command", sorted(COMMAND_OF))
def test_each_setting_is_in_its_groups_section_of_help_and_a_choice_lists_its_words(
    command: str,
) -> None:
    parser = subcommand(command)
    usage = squeezed(parser.format_usage())
    for declaration_field, declaration in declared(COMMAND_OF[command]):
        (section,) = (
            g
            for g in parser._action_groups
            if any(a.dest == declaration_field.name for a in g._group_actions)
        )
        wanted = "options" if declaration.group is None else declaration.group.value
        assert section.title == wanted, declaration.flag
        if declaration.kind is Kind.CHOICE:
            assert f"{declaration.flag}{{{','.join(declaration.allowed)}}}" in usage


CHOICES = [p for p in EVERY_DECLARATION if p.values[2].kind is Kind.CHOICE]


@pytest.mark.parametrize(("of", "field", "declaration"), CHOICES)
def test_a_choices_default_is_one_of_its_words(
    of: type[Resolvable], field: dataclasses.Field[Any], declaration: Declaration
) -> None:
    assert declaration.allowed
    assert field.default is None or field.default in declaration.allowed


@pytest.mark.parametrize(("of", "field", "declaration"), CHOICES)
def test_a_bad_choice_names_where_it_came_from_flag_variable_or_file(
    of: type[Resolvable],
    field: dataclasses.Field[Any],
    declaration: Declaration,
    tmp_path: Path,
) -> None:
    words = ", ".join(declaration.allowed)
    origins: list[tuple[dict[str, object], dict[str, str], str]] = [
        ({field.name: "bogus"}, {}, declaration.flag),
        *(({}, {variable: "bogus"}, f"from {variable}") for variable in declaration.env),
    ]
    if any(f.name == "config_file" for f, _ in declared(of)):
        settings_file = tmp_path / "settings.yaml"
        settings_file.write_text(f"{declaration.name}: bogus\n")
        origins.append(({"config_file": str(settings_file)}, {}, f"in {settings_file}"))
    for flags, environ, origin in origins:
        with pytest.raises(ConfigError) as refused:
            resolve_as(of, flags, environ)
        assert str(refused.value) == f"{declaration.name} ({origin}) 'bogus' is not one of {words}"


def every_action() -> list[tuple[str, argparse.Action]]:
    commands = next(
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return [
        (name, action)
        for name, parser in commands.choices.items()
        for action in parser._actions
        if action.help and action.default not in (None, argparse.SUPPRESS)
    ]


@pytest.mark.parametrize(
    ("command", "action"), every_action(), ids=lambda v: v if isinstance(v, str) else v.dest
)
def test_every_other_flag_that_names_a_default_names_the_real_one(
    command: str, action: argparse.Action
) -> None:
    """Flags that are a command's request, not settings (`--format`, `--budget`), say theirs too."""
    shown = str(action.help) % {"default": action.default}
    for said in re.findall(r"default: ([^;)]+)", shown):
        assert said == str(action.default), f"{command} {action.option_strings}"


def chart_values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


def chart_paths(values: dict[str, Any], above: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in values.items():
        path = f"{above}{key}"
        paths.add(path)
        if isinstance(value, dict):
            paths |= chart_paths(value, f"{path}.")
    return paths


CHART_DECLARATIONS = [p for p in EVERY_DECLARATION if p.values[2].chart is not None]


@pytest.mark.parametrize(("of", "field", "declaration"), CHART_DECLARATIONS)
def test_each_chart_value_a_setting_names_is_in_the_chart_and_read_by_its_templates(
    of: type[Resolvable], field: dataclasses.Field[Any], declaration: Declaration
) -> None:
    assert declaration.chart in chart_paths(chart_values())
    templates = "".join(p.read_text() for p in sorted((CHART_DIR / "templates").iterdir()))
    assert f".Values.{declaration.chart}" in templates


EVERYTHING_ON: dict[str, Any] = {
    **ALL_ON,
    "availability": {"enabled": True, "heartbeat": {"enabled": True}},
    "nrt": {"enabled": True},
    "fabric": {"taintUnhealthy": True},
    "dra": {"drivers": ["gpu.nvidia.com"], "deviceTaints": True},
    "koordinator": {"enabled": True},
    "kubeletConfig": {
        **ALL_ON["kubeletConfig"],
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
    },
    "extender": {**ALL_ON["extender"], "tls": {"enabled": True, "secretName": "extender-tls"}},
}
"""Every value that becomes a setting, set: each chart-made env var and flag is rendered."""
DOWNWARD_API = {"NODE_NAME": "gpu-node-1", "POD_NAMESPACE": "gpu-system"}
"""What the kubelet fills in for the env vars the chart takes from the pod (valueFrom)."""


def containers(rendered: Rendered) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for obj in rendered.everything():
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        found.extend(pod.get("containers") or [])
    return [c for c in found if c.get("command") == ["topo-reporter"]]


def test_the_charts_env_vars_and_flags_are_each_commands_declared_settings_and_resolve() -> None:
    commands = containers(render(EVERYTHING_ON))
    assert sorted(c["args"][0] for c in commands) == ["extender", "prune", "run"]
    for container in commands:
        command = container["args"][0]
        declarations = [d for _, d in declared(COMMAND_OF[command])]
        env = {
            e["name"]: e["value"] if "value" in e else DOWNWARD_API[e["name"]]
            for e in container.get("env") or []
        }
        ours = {name for name in env if name.startswith("TOPO_REPORTER_")}
        assert ours <= {v for d in declarations for v in d.env}, command
        flags = {a for a in container["args"] if a.startswith("--")}
        assert flags <= {d.flag for d in declarations}, command
        # What the chart renders is what the command accepts: the real parser, then resolve.
        args = cli.build_parser().parse_args(container["args"])
        resolve_as(COMMAND_OF[command], vars(args), env)


TEMPLATE_OF = {"run": "daemonset.yaml", "extender": "extender.yaml", "prune": "prune-hook.yaml"}
"""The template that runs each command the chart runs."""
PASSED_ON = re.compile(
    r"name: (?P<env>TOPO_REPORTER_\w+)\s+value: [^\n]*?\.Values\.(?P<by_env>[\w.]+)"
    r"|- (?P<flag>--[\w-]+)\n\s+- [^\n]*?\.Values\.(?P<by_flag>[\w.]+)"
)
"""An env var or a flag the template sets from a chart value."""


@pytest.mark.parametrize("command", sorted(TEMPLATE_OF))
def test_each_chart_value_the_chart_passes_on_is_the_one_its_setting_declares(
    command: str,
) -> None:
    template = (CHART_DIR / "templates" / TEMPLATE_OF[command]).read_text()
    declarations = [d for _, d in declared(COMMAND_OF[command])]
    passed = [
        (m["env"] or m["flag"], m["by_env"] or m["by_flag"]) for m in PASSED_ON.finditer(template)
    ]
    assert passed, "the template passes no chart value on"
    for given, value in passed:
        setting_of = next(d for d in declarations if given in (d.flag, *d.env))
        assert setting_of.chart == value, f"{given} comes from {value}"
