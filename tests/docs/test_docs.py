"""The documentation runs: every command shown in README.md and docs/*.md, its output, its links.

Commands come from ```sh and ```console blocks (in a console block, `$ ` lines; the lines under one
are its output). Each runs in a shell, here, against the real pastes (under the file names the
pages use) and an API server double holding the nodes the pages name, published as the agent
publishes a simulated DGX H100; `~/.kube/config` points at it, and `kubectl` is the real one.
Shown output must match what the command prints: every shown line, in order, where `(...)` or a
trailing `...` stands for text left out and runs of spaces compare as one. A command that cannot
run here is in NOT_RUN or matched by NOT_RUN_TOOLS, with the reason; an entry no page shows any
more fails the test, so neither list goes stale.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from parsers.kubelet import KubeletPolicies
from reporter.agent import SchemaProjection
from reporter.collect.kubelet import KubeletReading
from reporter.free_sets import compute_availability
from reporter.schema import keys
from reporter.schema.availability import encode_availability
from reporter.schema.labels import kubelet_labels
from tests.golden import FIXTURES
from tests.support.agent_support import NODE, FakeScanner, ok, wire_agent
from tests.support.describe_machines import machines
from tests.support.kube_double import ApiServerDouble, write_kubeconfig
from tests.support.kube_double.tls import make_certificate

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIX = "gpu.topology.io"

FILES = {
    "dgx-a100.txt": FIXTURES / "03-dgx-a100-nv12-mlx5.txt",
    "dgx1-topo.txt": FIXTURES / "01-dgx1-style-8x-v100-nv1-nv2-nic-gpu-numa-id.txt",
}
"""The file names the pages use, and the real paste each stands for."""

NODES = (NODE, "dgx-01", "dgx-07")
PLACEHOLDERS = {"<gpu-node>": NODE}

NOT_RUN_TOOLS = {
    "helm": "installs into a real cluster; tests/chart/ render and validate the chart",
    "docker": "needs Docker Hub; tests/image/test_build.py builds the Dockerfile with podman",
    "sh image/build.sh": "builds the image (minutes); tests/image/test_build.py runs it",
    "podman": "runs or pushes the image; the tests in tests/image/ run it with podman",
    "trivy": "needs a vulnerability database, which cannot be downloaded here",
    "grype": "needs a vulnerability database, which cannot be downloaded here",
    "kind": "needs a kind cluster",
    "sh tests/prereqs.sh": "installs system packages; tests/project/test_readme_command.py runs it "
    "with doubles of apt-get and sudo",
    "pip": "installs packages; the suite runs from the installed package",
    "python3 -m venv": "makes a virtual environment; the suite runs in one",
    ". .venv/bin/activate": "enters the virtual environment the suite already runs in",
    "git": "reads the repository's history",
    "python -m grpc_tools.protoc": "rewrites the committed stubs; "
    "tests/collect/test_podresources_proto.py regenerates them into a scratch directory and "
    "compares",
}
"""Commands that start with these are not run here, for the reason given."""

NOT_RUN = {
    "pytest": "the test suite itself",
    "python -m tests.golden": "rewrites the golden files (test_parsers_topo checks them)",
    "topo-reporter collect": "scans this machine's GPUs: there are none here (the --simulate "
    "forms run)",
    "topo-reporter collect --backend sysfs --format matrix": "as above, through sysfs",
    "topo-reporter run --node gpu-node-1 --kubeconfig ~/.kube/config --interval 60s --resync 5m": (
        "runs until stopped (the --once forms run)"
    ),
    "topo-reporter run --sink nodefeature --node gpu-node-1 --namespace gpu-topology": (
        "runs until stopped (the --dry-run form runs)"
    ),
    "topo-reporter prune --prefix gpu.topology.io --namespace gpu-system --dry-run": (
        "lists every kind prune removes, and the docs' API double lists no NodeResourceTopology "
        "objects; tests/controlplane/test_prune.py runs it on the real apiserver"
    ),
    "topo-reporter prune --prefix gpu.topology.io --namespace gpu-system": (
        "removes what the agents wrote from the nodes the other pages' commands read; "
        "tests/controlplane/test_prune.py runs it on the real apiserver"
    ),
    "topo-reporter network --lldp --format json": (
        "needs a switch sending LLDP; tests/collect/test_lldp_namespaces.py runs it against the "
        "real lldpd in network namespaces"
    ),
    "topo-reporter network --infiniband --format json": (
        "needs an InfiniBand fabric; tests/cli/test_network_infiniband.py runs it as a host of the "
        "real ibsim"
    ),
    "topo-reporter extender --listen 0.0.0.0:8888 --kubeconfig ~/.kube/config": (
        "serves until stopped; tests/extender/test_cli.py starts it on loopback"
    ),
}
"""Commands of ours shown in the docs that cannot run here, with the reason."""

KUBECTL_RUN = (
    re.compile(r"kubectl (get|describe) nodes?\b"),
    re.compile(r"kubectl gpu-topology\b"),
)
"""kubectl commands that run against the double: reading Nodes, and the plugin. The others read
objects the double does not serve (DaemonSets) or NodeFeatures through a real nfd-master's CRD, or
edit every node; tests/agent/test_kubectl.py and the NodeFeature tests run kubectl on those."""

EXIT_STATUS = {
    "topo-reporter doctor --node dgx-07": 1,
    "topo-reporter doctor --all": 1,
    "topo-reporter doctor --all --format json": 1,
}
"""Exit 1: dgx-07 has an error finding, and the doctor says so in its status."""


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    output: tuple[str, ...] | None
    """The output a console block shows under the command; None in an sh block."""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Shell:
    """Where the commands run: the environment and the working directory."""

    env: dict[str, str]
    cwd: Path


_BLOCK = re.compile(r"^```(sh|console)\n(.*?)^```", re.S | re.M)


def _logical_lines(body: str, first: int) -> Iterator[tuple[int, str]]:
    """Lines with their `\\` continuations joined, numbered from `first`."""
    pending, start = "", first
    for n, line in enumerate(body.splitlines(), first):
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        yield start, pending + line.strip()
        pending = ""


def _strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (none of ours quote a `#`)."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


def commands() -> list[Command]:
    """Every command shown in the pages' sh and console blocks."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(ROOT).as_posix()
        for block in _BLOCK.finditer(text):
            first = text.count("\n", 0, block.start(2)) + 1
            lines = list(_logical_lines(block.group(2), first))
            if block.group(1) == "sh":
                found += [
                    Command(name, n, _strip_comment(line), None)
                    for n, line in lines
                    if _strip_comment(line) and not line.startswith("#")
                ]
                continue
            starts = [i for i, (_, line) in enumerate(lines) if line.startswith("$ ")]
            for i, end in zip(starts, [*starts[1:], len(lines)], strict=True):
                n, line = lines[i]
                output = tuple(text for _, text in lines[i + 1 : end])
                found.append(Command(name, n, _strip_comment(line[2:]), output))
    return found


def segments(command: str) -> list[str]:
    """The parts of an `&&` chain."""
    return [part.strip() for part in command.split("&&")]


def runnable(segment: str) -> bool:
    """Whether a chain segment runs here; raises AssertionError for one nobody classified."""
    if segment in NOT_RUN or any(segment.startswith(tool) for tool in NOT_RUN_TOOLS):
        return False
    if segment.startswith("kubectl"):
        return any(pattern.match(segment) for pattern in KUBECTL_RUN)
    return True


COMMANDS = commands()


def _collapse(line: str) -> str:
    """Runs of spaces as one, and an Event's age (`0s`, `12d`) as any age."""
    return re.sub(r"\b\d+[smhd]\b", "<age>", re.sub(r"\s+", " ", line.strip()))


def line_matches(shown: str, actual: str) -> bool:
    """`actual` is `shown` with `(...)` and a trailing `...` standing for anything."""
    shown = _collapse(shown)
    if shown.endswith("...") and not shown.endswith("(...)"):
        shown = shown[:-3] + "(...)"
    parts = [p.strip() for p in shown.split("(...)")]
    actual = _collapse(actual)
    if not actual.startswith(parts[0]):
        return False
    position = len(parts[0])
    for part in parts[1:]:
        found = actual.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return not parts[-1] or actual.endswith(parts[-1]) or len(parts) == 1


def assert_shown(shown: tuple[str, ...], actual: str) -> None:
    """Every shown line matches an actual line, in order."""
    lines = actual.splitlines()
    position = 0
    for want in (line for line in shown if line.strip()):
        found = next((i for i in range(position, len(lines)) if line_matches(want, lines[i])), None)
        assert found is not None, f"not in the output (from line {position}): {want!r}\n{actual}"
        position = found + 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """The environment the commands run in: a HOME whose kubeconfig names the double, the
    pastes under their page names, the package's scripts and kubectl on PATH."""
    base = tmp_path_factory.mktemp("docs")
    certificate = make_certificate(base)
    double = ApiServerDouble(certificate=certificate)
    for node in NODES:
        double.add_node(node)
    with double:
        agent = write_kubeconfig(
            base / "agent", double.url, "agent-token", ca_cert=certificate.cert
        )
        home = base / "home"
        (home / ".kube").mkdir(parents=True)
        write_kubeconfig(
            home / ".kube" / "config", double.url, "admin-token", ca_cert=certificate.cert
        )
        dgx = machines()["profile dgx-h100"]
        policies = KubeletPolicies("best-effort", "container", "static")
        wire_agent(
            agent, FakeScanner([ok(dgx)]), kubelet=lambda: KubeletReading(policies)
        ).agent.step()
        # The other nodes carry what the same agent would publish on them.
        for node in NODES:
            if node != NODE:
                want = SchemaProjection(PREFIX, node).desired(dgx, kubelet_labels(policies, PREFIX))
                metadata = {"labels": dict(want.labels), "annotations": dict(want.annotations)}
                double.edit_node(node, {"metadata": metadata})
            double.add_pod("gpu-system", f"topo-reporter-{node}", node=node, labels=AGENT)
        # dgx-01 publishes availability (opt-in): GPUs 4, 5 and 7 are taken.
        free = encode_availability(compute_availability(dgx, [0, 1, 2, 3, 6]))
        double.edit_node(
            "dgx-01", {"metadata": {"annotations": {f"{PREFIX}/{keys.AVAILABILITY}": free}}}
        )
        # dgx-07 is the doctor page's example: no device plugin, single-numa-node admission.
        double.edit_node(
            "dgx-07",
            {
                "metadata": {"labels": {f"{PREFIX}/topology-manager-policy": "single-numa-node"}},
                "status": {"allocatable": {"nvidia.com/gpu": None}},
            },
        )
        work = base / "work"
        work.mkdir()
        for name, source in FILES.items():
            shutil.copy(source, work / name)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_REPORTER_")}
        environment.pop("KUBECONFIG", None)
        environment.update(
            HOME=str(home),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), environment.get("PATH", "")]),
        )
        yield Shell(environment, work)


AGENT = {"app.kubernetes.io/name": "topo-reporter"}


def run_segment(segment: str, shell: Shell) -> subprocess.CompletedProcess[str]:
    for placeholder, value in PLACEHOLDERS.items():
        segment = segment.replace(placeholder, value)
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {segment}"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=shell.cwd,
        env=shell.env,
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_every_command_in_the_docs_runs_and_prints_what_it_shows(
    command: Command, cluster: Shell
) -> None:
    parts = [s for s in segments(command.text) if runnable(s)]
    if not parts:
        pytest.skip(f"not run here: {command.text}")
    for segment in parts:
        result = run_segment(segment, cluster)
        expected = EXIT_STATUS.get(segment, 0)
        assert result.returncode == expected, f"{segment}\n{result.stdout}\n{result.stderr}"
    if command.output:
        assert_shown(command.output, result.stdout)


def test_every_command_not_run_is_still_shown() -> None:
    shown = {s for c in COMMANDS for s in segments(c.text)}
    assert set(NOT_RUN) <= shown, f"no page shows these any more: {set(NOT_RUN) - shown}"
    for tool in NOT_RUN_TOOLS:
        assert any(s.startswith(tool) for s in shown), f"no page shows a {tool} command any more"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^(```|~~~)", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page: Path) -> list[tuple[int, str]]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#+) (.*)$", text, re.M)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in {slug(h) for _, h in headings(resolved)}, f"{page.name}: {target}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_page_has_one_title_and_no_skipped_heading_level(page: Path) -> None:
    levels = [level for level, _ in headings(page)]
    assert levels[:1] == [1], levels
    assert levels.count(1) == 1, levels
    assert all(b <= a + 1 for a, b in itertools.pairwise(levels)), levels


def test_the_readme_stays_short_with_the_two_commands_on_its_first_screen() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024
    first_screen = "\n".join(text.splitlines()[:40])
    assert "topo-reporter run --simulate dgx-h100 --once --dry-run" in first_screen
    assert "&& pytest" in first_screen
