"""How long the console scripts take to answer `--help`, against a bare interpreter.

Method. Each row runs in a fresh interpreter what the console script runs (`topo-reporter` is
`reporter.cli:main`, `kubectl-gpu_topology` is `reporter.kubectl_plugin:main`, as pyproject.toml
declares them), RUNS times after one warm-up run (the page cache and the bytecode cache warm),
timed from spawn to exit; the table gives the median and the fastest. The baseline row is
`python -c pass`, the interpreter's own start; "x bare" is a row's median over the baseline's.
Modules: how many `reporter` and `parsers` modules, and how many modules in all, the same
command has in sys.modules when it exits (one more run, counted at exit). With `--checkout DIR`
the commands import the package from another checkout (the code before a change): `-c` puts the
working directory first on sys.path.

    python bench/cli_startup.py [--runs 15] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import table

ENTRY = "import sys; from {module} import main; sys.exit(main())"
COUNT = (
    "import atexit, sys; atexit.register(lambda: print("
    "sum(m.split('.')[0] in ('reporter', 'parsers') for m in sys.modules), len(sys.modules), "
    "file=sys.__stderr__)); "
)
ROWS = [
    ("python -c pass", "pass", []),
    ("import reporter (the public API)", "import reporter", []),
    ("topo-reporter --help", ENTRY.format(module="reporter.cli"), ["--help"]),
    ("topo-reporter run --help", ENTRY.format(module="reporter.cli"), ["run", "--help"]),
    (
        "kubectl-gpu_topology --help",
        ENTRY.format(module="reporter.kubectl_plugin"),
        ["--help"],
    ),
]


def spawn(code: str, argv: list[str], checkout: Path | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=checkout,
        check=False,
    )


def timed(code: str, argv: list[str], checkout: Path | None) -> float:
    started = time.perf_counter()
    result = spawn(code, argv, checkout)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{code} {argv}: exit {result.returncode}\n{result.stderr}")
    return elapsed


def modules(code: str, argv: list[str], checkout: Path | None) -> tuple[str, str]:
    ours, every = spawn(COUNT + code, argv, checkout).stderr.split()[-2:]
    return ours, every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each command")
    parser.add_argument("--checkout", type=Path, help="import the package from this checkout")
    args = parser.parse_args()
    rows: list[list[object]] = []
    bare = 0.0
    for name, code, argv in ROWS:
        timed(code, argv, args.checkout)
        times = [timed(code, argv, args.checkout) for _ in range(args.runs)]
        median = statistics.median(times)
        bare = bare or median
        ours, every = modules(code, argv, args.checkout)
        rows.append(
            [
                name,
                f"{median * 1000:.0f}",
                f"{min(times) * 1000:.0f}",
                f"{median / bare:.1f}",
                ours,
                every,
            ]
        )
    headers = ["command", "median ms", "fastest ms", "x bare", "reporter+parsers modules"]
    print(table([*headers, "modules in all"], rows))


if __name__ == "__main__":
    main()
