"""docs/development.md's layout map names every module of reporter/ and parsers/, and no module
that is gone: the map a newcomer reads first cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
PACKAGES = ("parsers", "reporter")
INDENT = 2
"""Spaces per directory level in the map."""
DESCRIPTION_COLUMN = 24
"""Where descriptions start; a line indented this far continues the description above it."""
ENTRY = re.compile(r"(?P<indent> *)(?P<name>[\w.]+(?:\.py|/))(?:  +\S.*)?$")


def map_lines(text: str) -> list[str]:
    """The lines of the fenced block after the `<!-- layout map -->` marker."""
    lines = text.splitlines()
    start = lines.index("<!-- layout map -->")
    assert lines[start + 1].startswith("```"), "the layout map's marker must precede its block"
    end = next(i for i in range(start + 2, len(lines)) if lines[i].startswith("```"))
    return lines[start + 2 : end]


def map_entries(lines: list[str]) -> tuple[set[str], set[str]]:
    """The files and the directories the map names, as paths from the repository root.

    Raises AssertionError for a line that is neither an entry nor a continuation."""
    files: set[str] = set()
    dirs: set[str] = set()
    parents: list[str] = []
    for line in lines:
        if not line.strip() or len(line) - len(line.lstrip()) >= DESCRIPTION_COLUMN:
            continue
        found = ENTRY.fullmatch(line)
        assert found, f"not a map entry (indent, name, two spaces, description): {line!r}"
        depth, odd = divmod(len(found["indent"]), INDENT)
        assert not odd, f"indented off the tree: {line!r}"
        assert depth <= len(parents), f"indented off the tree: {line!r}"
        del parents[depth:]
        path = "".join(parents) + found["name"]
        if path.endswith("/"):
            dirs.add(path)
            parents.append(found["name"])
        else:
            files.add(path)
    return files, dirs


def tree_modules(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for package in PACKAGES
        for path in (root / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }


GENERATED = ("reporter/collect/podresources_v1/",)
"""Directories the map names without their files: the gRPC stubs generated from api.proto."""


def covered(module: str, files: set[str], dirs: set[str]) -> bool:
    """Named itself, or generated inside a directory the map names."""
    return module in files or any(module.startswith(d) and d in dirs for d in GENERATED)


def test_the_map_names_every_module_and_only_modules_that_exist() -> None:
    files, dirs = map_entries(map_lines(DOC.read_text(encoding="utf-8")))
    modules = tree_modules(ROOT)
    missing = sorted(m for m in modules if not covered(m, files, dirs))
    gone = sorted(f for f in files if not (ROOT / f).is_file())
    gone += sorted(d for d in dirs if not (ROOT / d).is_dir())
    assert not missing, f"docs/development.md's layout map leaves out: {missing}"
    assert not gone, f"docs/development.md's layout map names what is not in the tree: {gone}"


def check(root: Path, block: str) -> tuple[list[str], list[str]]:
    files, dirs = map_entries(map_lines(f"<!-- layout map -->\n```text\n{block}```\n"))
    missing = sorted(m for m in tree_modules(root) if not covered(m, files, dirs))
    return missing, sorted(f for f in files if not (root / f).is_file())


def test_the_check_sees_a_module_left_out_and_one_gone(tmp_path: Path) -> None:
    (tmp_path / "parsers").mkdir()
    (tmp_path / "reporter").mkdir()
    (tmp_path / "reporter" / "new.py").touch()
    stale = "reporter/\n  old.py                a module deleted since\n"
    assert check(tmp_path, stale) == (["reporter/new.py"], ["reporter/old.py"])
    assert check(tmp_path, "reporter/\n  new.py                the new module\n") == ([], [])
    with pytest.raises(AssertionError, match="indented off the tree"):
        check(tmp_path, "reporter/\n   new.py               three spaces in\n")


def test_a_continuation_line_and_a_generated_directory_are_read_as_such() -> None:
    block = (
        "reporter/\n"
        "  collect/              sources\n"
        "    podresources_v1/    stubs generated from api.proto\n"
        "    nvml.py             the ONLY module importing pynvml, a description long enough\n"
        "                        to go on on the next line\n"
    )
    files, dirs = map_entries(map_lines(f"<!-- layout map -->\n```text\n{block}```\n"))
    assert files == {"reporter/collect/nvml.py"}
    assert "reporter/collect/podresources_v1/" in dirs
    assert covered("reporter/collect/podresources_v1/api_pb2.py", files, dirs)
    assert not covered("reporter/collect/other.py", files, dirs)


TESTS = ROOT / "tests"
TOP_LEVEL = {"__init__.py", "conftest.py", "golden.py"}
"""The only Python files at the top of tests/: every test and helper lives in a folder."""
FOLDER_ROW = re.compile(r"\| `tests/(?P<name>[a-z_]+)/` \|")


def test_tests_are_laid_out_in_the_folders_the_docs_list() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- test folders -->") :].split("\n\n", 1)[0]
    listed = {m["name"] for m in FOLDER_ROW.finditer(table)}
    top = {p.name for p in TESTS.glob("*.py")}
    assert top <= TOP_LEVEL, f"move these into a folder of tests/: {sorted(top - TOP_LEVEL)}"
    folders = {
        p.parent.relative_to(TESTS).parts[0]
        for p in TESTS.rglob("*.py")
        if p.parent != TESTS and "node_modules" not in p.parts
    }
    assert folders <= listed, (
        f"docs/development.md's test folder table leaves out: {sorted(folders - listed)}"
    )
    assert listed <= folders, f"the table names folders with no tests: {sorted(listed - folders)}"
    for folder in listed:
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder}/ needs an __init__.py"
