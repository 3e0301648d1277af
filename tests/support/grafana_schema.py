"""The chart's Grafana dashboard checked against Grafana's own schema: the TypeScript types Grafana
generates from its CUE schema and publishes as npm `@grafana/schema` (pinned in
tests/grafana/package.json), applied by the real TypeScript compiler.

The dashboard JSON becomes object literals typed by those types, so the compiler refuses a field
the schema does not know (an excess property), a missing required field, a value outside an enum
and a wrong type, at every depth. Panel options and field configs are typed by their panel
plugin's published types (`timeseries`); a panel of another type is refused until it is added to
PANEL_TYPES. Prometheus queries are typed by PromQuery below, which carries the fields of
Grafana's Prometheus query model (packages/grafana-prometheus/src/dataquery.ts), a plugin type the
schema package does not publish.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

GRAFANA = Path(__file__).resolve().parents[1] / "grafana"
PANEL_TYPES = {
    "timeseries": "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/"
    "TimeSeriesPanelCfg_types.gen",
}
"""Panel plugin -> the module of its Options and FieldConfig types."""

PRELUDE = """\
import type {{ Dashboard, DataQuery }} from "@grafana/schema";
{imports}

// JSON carries a string enum's value, not the enum: each string enum is read as its values.
type J<T> = T extends string
  ? `${{T}}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<J<U>>
      : T extends object
        ? {{ [K in keyof T]: J<T[K]> }}
        : T;

interface PromQuery extends DataQuery {{
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  interval?: string;
  intervalFactor?: number;
  format?: "time_series" | "table" | "heatmap";
  editorMode?: "code" | "builder";
}}
"""


def _node() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node, "Node.js is needed to run the TypeScript compiler (tests/prereqs.sh installs it)"
    assert npm, "npm is needed to install Grafana's schema and TypeScript"
    return node, npm


def install() -> str:
    """Node's path, with tests/grafana/'s packages installed (npm ci on first use)."""
    node, npm = _node()
    if not (GRAFANA / "node_modules" / "@grafana" / "schema").is_dir():
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(GRAFANA)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.fail(f"npm ci in {GRAFANA} failed:\n{result.stderr[-2000:]}", pytrace=False)
    return node


def typescript(dashboard: dict[str, Any]) -> str:
    """The dashboard as TypeScript: the dashboard without its panels' options, field configs'
    custom parts and targets, then each of those typed by its own schema."""
    imports: list[str] = []
    checks: list[str] = []
    shell = json.loads(json.dumps(dashboard))
    for i, panel in enumerate(shell.get("panels", [])):
        kind = panel.get("type")
        if kind == "row":
            continue
        module = PANEL_TYPES.get(kind)
        if module is None:
            checks.append(f"const unknownPanelType{i}: never = {json.dumps(kind)};")
            continue
        alias = f"P{i}"
        imports.append(
            f"import type {{ Options as {alias}Options, FieldConfig as {alias}FieldConfig }} "
            f'from "{module}";'
        )
        checks.append(
            f"const options{i}: J<{alias}Options> = {json.dumps(panel.pop('options', {}))};"
        )
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        custom = defaults.pop("custom", {})
        checks.append(f"const custom{i}: J<{alias}FieldConfig> = {json.dumps(custom)};")
        checks.append(
            f"const targets{i}: Array<J<PromQuery>> = {json.dumps(panel.pop('targets', []))};"
        )
    head = PRELUDE.format(imports="\n".join(imports))
    body = f"const dashboard: J<Dashboard> = {json.dumps(shell, indent=2)};\n" + "\n".join(checks)
    names = ["dashboard"] + [c.split(":")[0].removeprefix("const ") for c in checks]
    return head + "\n" + body + f"\nexport {{ {', '.join(names)} }};\n"


def check(dashboard: dict[str, Any]) -> str:
    """The compiler's complaints about `dashboard` ("" when it conforms)."""
    node = install()
    tsc = GRAFANA / "node_modules" / "typescript" / "bin" / "tsc"
    with tempfile.TemporaryDirectory(dir=GRAFANA, prefix="check-") as work:
        source = Path(work) / "dashboard.ts"
        source.write_text(typescript(dashboard), encoding="utf-8")
        result = subprocess.run(
            [
                node, str(tsc), "--noEmit", "--strict", "--target", "es2022", "--module",
                "esnext", "--moduleResolution", "bundler", "--skipLibCheck", str(source),
            ],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    return "" if result.returncode == 0 else (result.stdout + result.stderr).strip()
