"""reporter.terminal: what the commands print carries no terminal control sequence, and every
printing command writes through it."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reporter.terminal import TerminalStream, terminal_text
from tests.support.fuzz import fuzz
from tests.support.hostile_text import ESCAPES, controls

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        *((f"node a{escape}b", "node ab") for escape in ESCAPES.values()),
        ("\x1b]0;title, never ended\nnext line", "\nnext line"),
        ("\x9b2J\x9d0;eight-bit title\x9cok", "ok"),
        ("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel"),
        ("\x1b(0lqk\x1b(B", "lqk"),
        ("\x1b[31mred\x1b[0m", "red"),
        ("real\rforged", "realforged"),
        ("bell\x07 del\x7f nul\x00 lone esc\x1b", "bell del nul lone esc"),
        ("GPU0\tNV18\tPIX\nGPU1 → NV12 …", "GPU0\tNV18\tPIX\nGPU1 → NV12 …"),
    ],
    ids=[
        *ESCAPES,
        "an unterminated OSC is cut at the end of its line, not at the end of the output",
        "8-bit CSI and OSC",
        "a DCS (sixel) string",
        "a character set switch to line drawing and back",
        "colours",
        "a carriage return that would overwrite the line",
        "stray C0 controls and DEL",
        "tabs, newlines and other Unicode are kept",
    ],
)
def test_control_sequences_are_removed_whole(text: str, shown: str) -> None:
    assert terminal_text(text) == shown


@fuzz(300)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FF)))
def test_nothing_a_terminal_obeys_is_left_and_a_second_pass_changes_nothing(text: str) -> None:
    once = terminal_text(text)
    assert controls(once) == []
    assert terminal_text(once) == once


def test_the_console_log_stream_writes_through_it() -> None:
    out = io.StringIO()
    stream = TerminalStream(out)
    stream.write("api_error message=" + ESCAPES["a clipboard write (OSC 52)"] + "\n")
    stream.flush()
    assert out.getvalue() == "api_error message=\n"


@pytest.mark.parametrize(
    "module",
    [
        "reporter/cli.py",
        "reporter/kubectl_plugin.py",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "reporter/commands").glob("*.py")),
    ],
)
def test_the_commands_print_only_through_it(module: str) -> None:
    """A command that wrote `sys.stdout.write(...)` or `print(...)` itself would bypass it."""
    tree = ast.parse((ROOT / module).read_text())
    bypasses = [
        f"{module}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "print")
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "write"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr in ("stdout", "stderr")
            )
        )
    ]
    assert bypasses == []
