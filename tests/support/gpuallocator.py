"""go-gpuallocator's own code, for the tests: its best-effort policy built from the Go module cache
and run on requests, and the link types it declares.

The runner (`tests/controlplane/gpuallocator/testdata/main.go`) is assembled here into a module of
its own named like go-gpuallocator's, so that go-gpuallocator's internal package is importable:
`gpuallocator/besteffort_policy.go` copied unchanged from `go mod download` of the pinned release,
`internal/links` with the P2PLinkType declarations cut out of go-gpuallocator's own
`internal/links/device.go`, and the small `device.go` and `allocator.go` of that folder for the
types the policy reads. The rest of go-gpuallocator reaches NVML through go-nvml's cgo bindings,
which Go 1.26's cgo does not compile; main.go says more. The build needs no network beyond the
one `go mod download`, and takes about a second once Go's build cache is warm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from reporter.gpuallocator import GO_GPUALLOCATOR_VERSION
from tests.support.controlplane_fixtures import HARNESS, go_binary, go_module_dir

MODULE = "github.com/NVIDIA/go-gpuallocator"
SOURCES = HARNESS / "gpuallocator" / "testdata"
BUILD_TIMEOUT_S = 600.0

LINK_TYPES = (
    "P2PLinkCrossCPU",
    "P2PLinkSameCPU",
    "P2PLinkHostBridge",
    "P2PLinkMultiSwitch",
    "P2PLinkSingleSwitch",
    "P2PLinkSameBoard",
    *(
        f"{word}NVLINKLink{'s' if n > 1 else ''}"
        for n, word in enumerate(
            [
                "Single",
                "Two",
                "Three",
                "Four",
                "Five",
                "Six",
                "Seven",
                "Eight",
                "Nine",
                "Ten",
                "Eleven",
                "Twelve",
                "Thirteen",
                "Fourteen",
                "Fifteen",
                "Sixteen",
                "Seventeen",
                "Eighteen",
            ],
            start=1,
        )
    ),
)
"""go-gpuallocator's P2PLinkType names, numbered from 1 in declaration order (0 is Unknown)."""


def module_dir() -> Path:
    """go-gpuallocator's release that reporter.gpuallocator re-implements, in Go's module cache."""
    return go_module_dir(MODULE, GO_GPUALLOCATOR_VERSION)


def _links_declarations(module: Path) -> str:
    """`type P2PLinkType` and its constants, as internal/links/device.go declares them."""
    text = (module / "internal" / "links" / "device.go").read_text()
    found = re.search(r"^type P2PLinkType uint\n.*?^const \(\n.*?^\)\n", text, re.M | re.S)
    assert found, "internal/links/device.go no longer declares P2PLinkType as expected"
    return "package links\n\n" + found.group(0)


def declared_link_types(module: Path) -> tuple[str, ...]:
    """The constant names of P2PLinkType after Unknown, in declaration order."""
    block = _links_declarations(module)
    names = re.findall(r"^\t(\w+)", block.split("const (", 1)[1], re.M)
    assert names[0] == "P2PLinkUnknown", names
    return tuple(names[1:])


def build(out_dir: Path) -> Path:
    """The runner, assembled and built in `out_dir` (Go caches the compiled packages)."""
    module = module_dir()
    work = out_dir / "module"
    if work.exists():
        shutil.rmtree(work)
    (work / "gpuallocator").mkdir(parents=True)
    (work / "internal" / "links").mkdir(parents=True)
    (work / "cmd" / "check").mkdir(parents=True)
    (work / "go.mod").write_text(f"module {MODULE}\n\ngo 1.20\n")
    policy = module / "gpuallocator" / "besteffort_policy.go"
    (work / "gpuallocator" / policy.name).write_bytes(policy.read_bytes())
    for name in ("device.go", "allocator.go"):
        (work / "gpuallocator" / name).write_bytes((SOURCES / name).read_bytes())
    (work / "internal" / "links" / "device.go").write_text(_links_declarations(module))
    (work / "cmd" / "check" / "main.go").write_bytes((SOURCES / "main.go").read_bytes())
    binary = out_dir / "gpuallocator-check"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        [go_binary(), "build", "-o", str(binary), "./cmd/check"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"building go-gpuallocator's policy failed:\n{result.stderr[-4000:]}")
    return binary


@dataclass(frozen=True, slots=True)
class Request:
    """One Allocate call: the node's links (go-gpuallocator's type numbers), its inputs."""

    gpus: int
    links: tuple[tuple[int, int, int], ...]
    available: tuple[int, ...]
    required: tuple[int, ...]
    size: int


def run(binary: Path, requests: Sequence[Request]) -> list[tuple[int | None, ...]]:
    """What go-gpuallocator's Allocate returns for each request (None for an empty place)."""
    body = json.dumps(
        [
            {
                "gpus": r.gpus,
                "links": [list(link) for link in r.links],
                "available": list(r.available),
                "required": list(r.required),
                "size": r.size,
            }
            for r in requests
        ]
    )
    result = subprocess.run(
        [str(binary)], input=body, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    return [tuple(None if g < 0 else g for g in answer) for answer in answers]
