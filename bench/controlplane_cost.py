"""What the real control plane (tests/controlplane) costs the test suite: build, start, stop.

Method. Build: `go build -o OUT .` in the harness, as the `controlplane_bin` fixture runs it, timed
from spawn to exit; "warm, unchanged" is a second build into the same OUT (Go finds the binary up
to date and neither compiles nor links), "warm, relinked" builds into a fresh OUT (every package
from Go's build cache, only the link runs). A cold build (empty build cache) is not repeated here:
it means compiling kube-apiserver, kube-scheduler and etcd from source, measured once by hand with
`GOCACHE=$(mktemp -d) go build -o OUT .` and reported in bench/README.md. Start: from spawning
`BIN apiserver --kubeconfig FILE` to the moment FILE exists (the harness writes it once /readyz
answers and the default namespace exists), RUNS times, median and max; stop: from SIGTERM to exit.

    python bench/controlplane_cost.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.controlplane_fixtures import HARNESS, go_binary


def timed_build(out: Path) -> float:
    started = time.monotonic()
    subprocess.run(
        [go_binary(), "build", "-o", str(out), "."],
        cwd=HARNESS,
        env={**os.environ, "GOTOOLCHAIN": "local"},
        check=True,
    )
    return time.monotonic() - started


def start_stop(binary: Path, work: Path) -> tuple[float, float]:
    kubeconfig = work / "admin.kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    with (work / "apiserver.log").open("wb") as log:
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(binary), "apiserver", "--kubeconfig", str(kubeconfig)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:
            while not kubeconfig.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"apiserver exited {proc.returncode}; see {work}")
                time.sleep(0.01)
            ready = time.monotonic() - started
            stopping = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            return ready, time.monotonic() - stopping
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        binary = work / "controlplane"
        relinked = timed_build(binary)
        unchanged = timed_build(binary)
        starts, stops = zip(*(start_stop(binary, work) for _ in range(args.runs)), strict=True)
        size_mib = binary.stat().st_size / 2**20
    print("| step | seconds |")
    print("|---|---|")
    print(f"| build, warm, relinked (fresh output) | {relinked:.1f} |")
    print(f"| build, warm, unchanged (the fixture's usual case) | {unchanged:.1f} |")
    median, worst = statistics.median(starts), max(starts)
    runs = f"{args.runs} runs"
    print(f"| apiserver start to kubeconfig, {runs} | median {median:.2f}, max {worst:.2f} |")
    print(f"| apiserver SIGTERM to exit | median {statistics.median(stops):.2f} |")
    print(f"| binary size | {size_mib:.0f} MiB |")


if __name__ == "__main__":
    main()
