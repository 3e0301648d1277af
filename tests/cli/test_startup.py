"""The console scripts load only what they run: `topo-reporter --help` imports no subcommand's
module, `topo-reporter NAME --help` only NAME's, `kubectl gpu-topology --help` nothing that reads
the cluster. Counted in a fresh interpreter's sys.modules; how long a start takes is
bench/cli_startup.py's to measure, never a test's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reporter.cli import COMMANDS
from reporter.commands import Command

MOST_MODULES = 20
"""`reporter` and `parsers` modules an entry point's `--help` may load (89 did when every
subcommand's module was imported)."""
PLUGIN_MOST_MODULES = 32
"""The plugin's `--help` reads reporter.settings too: its --kubeconfig is the one declaration every
command shares, and settings loads the constants its declarations name (placement's policies, the
availability defaults)."""
PROBE = textwrap.dedent(
    """
    import contextlib, io, sys
    from {module} import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(sys.argv[1:])
    print("\\n".join(m for m in sys.modules if m.split(".")[0] in ("reporter", "parsers")))
    """
)


def loaded(module: str, *argv: str) -> set[str]:
    """Our modules in sys.modules once `module.main(argv)` has returned or exited."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(result.stdout.split())


def commands_of(modules: set[str]) -> set[str]:
    return {m for m in modules if m.startswith("reporter.commands.")}


def test_topo_reporter_help_imports_no_subcommand() -> None:
    ours = loaded("reporter.cli", "--help")
    assert not commands_of(ours)
    assert len(ours) < MOST_MODULES, sorted(ours)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_subcommands_help_imports_its_own_module_and_no_other(command: Command) -> None:
    own = command.handler.partition(":")[0]
    assert commands_of(loaded("reporter.cli", command.name, "--help")) == {own}


def test_kubectl_plugin_help_imports_nothing_that_reads_the_cluster() -> None:
    ours = loaded("reporter.kubectl_plugin", "--help")
    assert not commands_of(ours)
    assert not {m for m in ours if m.split(".")[1:2] in (["doctor"], ["extender"], ["publish"])}
    assert len(ours) < PLUGIN_MOST_MODULES, sorted(ours)


def test_kubectl_plugin_loads_its_reading_once_the_arguments_parse() -> None:
    # No cluster to read: the run fails with one line, after importing what reads it.
    ours = loaded("reporter.kubectl_plugin", "--kubeconfig", "/nonexistent")
    assert "reporter.commands.gpu_topology" in ours
