"""Soak test: the real `topo-reporter run` against the API server double with random faults.

Not in CI (it takes minutes); run it before a release or after touching the loop, the sink or the
retry policy. Method. The API server double (HTTPS on 127.0.0.1, the agent's token and RBAC) holds
one Node. `topo-reporter run --simulate dgx-h100 --interval 1s --resync 5s` runs as its own
process, as in the DaemonSet, so threads and RSS are the real process's. Three threads act on it:

- faults: bursts of 15-45 s in which 30-50% of the Node requests get a random fault (429 with
  Retry-After: 1; 500, 502, 503, 504; 409 on a PATCH; a delay of up to 3 s before the real answer;
  the connection dropped without an answer), separated by 10-30 s of calm;
- drift: every 5-15 s, someone else edits the Node: changes or deletes one of our labels, garbles
  or deletes the topology annotation, deletes `owned`, or adds a foreign label and annotation
  (which must survive); each edit of ours is timed until the Node carries the right data again;
- sampling: every 10 s the process's RSS and thread count (psutil) and /metrics.

At the end the faults and drift stop, the Node must converge within two resyncs (plus the longest
retry sequence already under way), and these checks run: the Node carries exactly what
`topo-reporter collect --simulate dgx-h100 --format labels` prints (labels, topology and matrix
annotations; no stale key of ours), every foreign key intact, RSS growth and slope after warm-up
small, the thread count back where it was after warm-up, and the metrics equal to what the double
and the agent's log recorded. Exits 1 if any check fails.

    python bench/soak.py [--minutes 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RandomFaultDouble, table
from reporter.publish.patch import under_prefix
from reporter.schema import keys
from tests.support.kube_double import Fault, make_certificate, write_kubeconfig

NODE = "gpu-soak"
PREFIX = keys.DEFAULT_PREFIX
INTERVAL_S = 1.0
RESYNC_S = 5.0
SAMPLE_S = 10.0
LONGEST_RETRY_S = 16.0
"""Longest wait of one retry sequence: full jitter, 0.5 s doubling, five waits (retry.Backoff)."""
RSS_GROWTH_LIMIT_MIB = 4.0
RSS_SLOPE_LIMIT_KIB_MIN = 128.0
COLLECT = [sys.executable, "-m", "reporter.cli", "collect", "--simulate", "dgx-h100"]
ROOT = Path(__file__).resolve().parent.parent


def choose_fault(rng: random.Random, method: str, path: str) -> Fault | None:
    """A random fault for a Node request; Events are left alone (best effort, not counted)."""
    if not path.startswith("/api/v1/nodes"):
        return None
    kinds = ["429", "5xx", "delay", "drop"] + (["409"] if method == "PATCH" else [])
    kind = rng.choices(kinds, weights=[3, 3, 2, 1, 2][: len(kinds)])[0]
    if kind == "429":
        return Fault(429, retry_after="1", message="too many requests")
    if kind == "5xx":
        return Fault(rng.choice([500, 502, 503, 504]), message="soak: server error")
    if kind == "409":
        return Fault(409, message="soak: the object has been modified")
    if kind == "delay":
        return Fault(delay_s=rng.uniform(0.1, 3.0))
    return Fault(drop=True, delay_s=rng.uniform(0.0, 0.5))


@dataclass
class Sample:
    at: float
    rss_mib: float
    threads: int


@dataclass
class Drift:
    """What the drift thread did: edits by action, and how long each repair of ours took."""

    actions: Counter[str] = field(default_factory=Counter)
    repairs_s: list[float] = field(default_factory=list)
    unrepaired: int = 0
    interrupted: int = 0
    """Edits whose repair the end of the soak cut short (judged by the final check instead)."""
    foreign_labels: dict[str, str] = field(default_factory=dict)
    foreign_annotations: dict[str, str] = field(default_factory=dict)


def expected_data(env: dict[str, str]) -> dict[str, str]:
    """What `collect --format labels` prints: key to value, labels and annotations together."""
    text = subprocess.run(
        [*COLLECT, "--format", "labels"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    out = {}
    for line in text.splitlines():
        key, value = line.split("=", 1)
        out[key] = json.loads(value) if value.startswith('"') else value
    return out


def mismatches(double: RandomFaultDouble, expected: dict[str, str]) -> list[str]:
    """How the Node differs from `expected` under our prefix (`owned` aside); [] when equal."""
    node = double.node(NODE)["metadata"]
    carried = {
        k: v
        for section in ("labels", "annotations")
        for k, v in (node.get(section) or {}).items()
        if under_prefix(k, PREFIX) and k != keys.key(PREFIX, keys.OWNED)
    }
    wrong = [k for k in expected if carried.get(k) != expected[k]]
    stale = [k for k in carried if k not in expected]
    return [f"{k}: {'missing' if k not in carried else 'wrong'}" for k in wrong] + [
        f"{k}: stale" for k in stale
    ]


def inject_faults(
    double: RandomFaultDouble, rng: random.Random, stop: threading.Event, bursts: list[float]
) -> None:
    while not stop.is_set():
        double.rate = rng.uniform(0.3, 0.5)
        length = rng.uniform(15, 45)
        bursts.append(length)
        stop.wait(length)
        double.rate = 0.0
        stop.wait(rng.uniform(10, 30))
    double.rate = 0.0


def drift(
    double: RandomFaultDouble,
    expected: dict[str, str],
    rng: random.Random,
    stop: threading.Event,
    record: Drift,
) -> None:
    ours = sorted(k for k in expected if k not in (keys.key(PREFIX, keys.TOPOLOGY),))
    labels = [k for k in ours if k != keys.key(PREFIX, keys.MATRIX)]
    topology = keys.key(PREFIX, keys.TOPOLOGY)
    n = 0
    while not stop.wait(rng.uniform(5, 15)):
        n += 1
        action = rng.choice(
            ["edit label", "delete label", "garble topology", "delete topology", "delete owned"]
            + ["add foreign"] * 2
        )
        record.actions[action] += 1
        if action == "add foreign":
            label, value = f"soak.example.com/label-{n}", f"v{n}"
            annotation = f"soak.example.com/note-{n}"
            record.foreign_labels[label] = value
            record.foreign_annotations[annotation] = f"written by someone else, {n}"
            patch: dict[str, dict[str, str | None]] = {
                "labels": {label: value},
                "annotations": {annotation: record.foreign_annotations[annotation]},
            }
            double.edit_node(NODE, {"metadata": patch})
            continue
        if action == "edit label":
            patch = {"labels": {rng.choice(labels): "tampered"}}
        elif action == "delete label":
            patch = {"labels": {rng.choice(labels): None}}
        elif action == "garble topology":
            patch = {"annotations": {topology: '{"v":1,"gpus":['}}
        elif action == "delete topology":
            patch = {"annotations": {topology: None}}
        else:
            patch = {"annotations": {keys.key(PREFIX, keys.OWNED): None}}
        double.edit_node(NODE, {"metadata": patch})
        start = time.monotonic()
        # Our keys must come back: within a resync, plus retries while a fault burst lasts.
        while mismatches(double, expected) and action != "delete owned":
            if stop.is_set():
                # The soak ended mid-repair: the final convergence check judges this edit.
                record.interrupted += 1
                break
            if time.monotonic() - start > 3 * RESYNC_S + 2 * LONGEST_RETRY_S:
                record.unrepaired += 1
                break
            time.sleep(0.05)
        else:
            if action == "delete owned":
                owned = keys.key(PREFIX, keys.OWNED)
                while owned not in double.annotations(NODE) and not stop.is_set():
                    time.sleep(0.05)
                if stop.is_set():
                    record.interrupted += 1
                    continue
            record.repairs_s.append(time.monotonic() - start)


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def counters(text: str) -> dict[tuple[str, str], float]:
    """Counter samples as (name, label value) to value: `topo_reporter_scans_total`, `ok`."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_total"):
                out[(s.name, next(iter(s.labels.values()), ""))] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(process: psutil.Process, start: float) -> Sample:
    # Taken before /metrics is scraped: the health server's request thread is not counted.
    return Sample(
        time.monotonic() - start, process.memory_info().rss / 2**20, process.num_threads()
    )


def slope_kib_per_min(samples: list[Sample]) -> float:
    """Least-squares slope of RSS against time."""
    if len(samples) < 2:
        return 0.0
    fit = statistics.linear_regression([s.at for s in samples], [s.rss_mib for s in samples])
    return fit.slope * 1024 * 60


def joined(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def log_events(path: Path) -> Counter[str]:
    events: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events[json.loads(line)["event"]] += 1
        except (ValueError, KeyError):
            events["(not json)"] += 1
    return events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    duration = args.minutes * 60
    warm_up = min(120.0, duration / 3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_REPORTER_")}
    env["PYTHONPATH"] = str(ROOT)
    expected = expected_data(env)
    rng = random.Random(args.seed)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        certificate = make_certificate(Path(tmp))
        double = RandomFaultDouble(
            certificate=certificate, choose=choose_fault, rng=random.Random(args.seed + 1)
        )
        double.add_node(NODE, labels={"team": "ml"}, annotations={"example.com/owner": "ops"})
        with double:
            kubeconfig = write_kubeconfig(
                Path(tmp) / "kubeconfig", double.url, "agent-token", ca_cert=certificate.cert
            )
            log_path = Path(tmp) / "agent.log"
            argv = [sys.executable, "-m", "reporter.cli", "run", "--node", NODE]
            argv += ["--kubeconfig", str(kubeconfig), "--simulate", "dgx-h100"]
            argv += ["--interval", f"{INTERVAL_S:g}s", "--resync", f"{RESYNC_S:g}s"]
            argv += ["--listen", f"127.0.0.1:{port}", "--log-format", "json"]
            argv += ["--log-level", "debug", "--kubelet-config", str(Path(tmp) / "absent.yaml")]
            with log_path.open("w", encoding="utf-8") as log:
                agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env)
            process = psutil.Process(agent.pid)
            try:
                result = soak(double, expected, rng, process, port, duration, warm_up)
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(10)
            events = log_events(log_path)
    return report(result, events, expected, args, warm_up)


@dataclass
class Result:
    samples: list[Sample]
    drift: Drift
    bursts: list[float]
    converged_s: float
    final_mismatches: list[str]
    node: dict[str, Any]
    metrics: dict[tuple[str, str], float]
    readyz: int
    requests: Counter[str]
    statuses: Counter[str]
    served: Counter[str]
    patch_ok: int
    elapsed_s: float


def soak(
    double: RandomFaultDouble,
    expected: dict[str, str],
    rng: random.Random,
    process: psutil.Process,
    port: int,
    duration: float,
    warm_up: float,
) -> Result:
    start = time.monotonic()
    deadline = time.monotonic() + 30
    while mismatches(double, expected):
        if time.monotonic() > deadline:
            raise SystemExit("soak: the agent did not publish within 30 s: see its log")
        time.sleep(0.05)
    stop = threading.Event()
    record = Drift()
    bursts: list[float] = []
    threads = [
        threading.Thread(target=inject_faults, args=(double, rng, stop, bursts), daemon=True),
        threading.Thread(
            target=drift, args=(double, expected, random.Random(rng.random()), stop, record)
        ),
    ]
    for t in threads:
        t.start()
    samples: list[Sample] = []
    while time.monotonic() - start < duration:
        samples.append(
            Sample(
                time.monotonic() - start, process.memory_info().rss / 2**20, process.num_threads()
            )
        )
        scrape(port)
        time.sleep(min(SAMPLE_S, max(0.0, duration - (time.monotonic() - start))))
    stop.set()
    for t in threads:
        t.join()
    calm = time.monotonic()
    limit = 2 * RESYNC_S + LONGEST_RETRY_S
    while mismatches(double, expected) and time.monotonic() - calm < limit:
        time.sleep(0.05)
    converged_s = time.monotonic() - calm
    # One more interval, so the metrics include the last publish, and settled threads.
    time.sleep(2 * INTERVAL_S)
    samples.append(sample(process, start))
    readyz, _ = scrape(port, "/readyz")
    _, text = scrape(port)
    requests: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    patch_ok = 0
    for r in list(double.requests):
        if not r.path.startswith("/api/v1/nodes"):
            requests[f"{r.method} event"] += 1
            continue
        requests[f"{r.method} node"] += 1
        statuses[str(r.status)] += 1
        patch_ok += r.method == "PATCH" and r.status == 200
    return Result(
        samples=samples,
        drift=record,
        bursts=bursts,
        converged_s=converged_s,
        final_mismatches=mismatches(double, expected),
        node=double.node(NODE)["metadata"],
        metrics=counters(text),
        readyz=readyz,
        requests=requests,
        statuses=statuses,
        served=Counter(double.served),
        patch_ok=patch_ok,
        elapsed_s=time.monotonic() - start,
    )


def report(
    r: Result, events: Counter[str], expected: dict[str, str], args: Any, warm_up: float
) -> int:
    m = r.metrics

    def metric(name: str, label: str) -> int:
        return int(m.get((f"topo_reporter_{name}_total", label), 0))

    statuses = r.statuses
    errors_seen = {
        "throttled": statuses["429"],
        "server": sum(statuses[s] for s in ("500", "502", "503", "504")),
        "conflict": statuses["409"],
        "unreachable": statuses["-1"],
    }
    errors_counted = {k: metric("api_errors", k) for k in errors_seen}
    other_errors = sum(
        v for (n, k), v in m.items() if n.endswith("api_errors_total") and k not in errors_seen
    )
    warm = [s for s in r.samples if s.at >= warm_up]
    first, last = warm[0], warm[-1]
    slope = slope_kib_per_min(warm)
    # A few samples a minute apart fit any line: the slope says something only over minutes.
    judged = last.at - first.at >= 240
    growth = last.rss_mib - first.rss_mib
    scans = sum(metric("scans", k) for k in ("ok", "degraded", "failed"))
    failed_logged = events["publish_failed"] + events["node_read_failed"]
    foreign_labels = {"team": "ml", **r.drift.foreign_labels}
    foreign_annotations = {"example.com/owner": "ops", **r.drift.foreign_annotations}
    lost = [k for k, v in foreign_labels.items() if (r.node.get("labels") or {}).get(k) != v]
    lost += [
        k for k, v in foreign_annotations.items() if (r.node.get("annotations") or {}).get(k) != v
    ]
    repairs = r.drift.repairs_s
    n_foreign = len(foreign_labels) + len(foreign_annotations)
    written, failed_count = metric("publishes", "written"), metric("publishes", "failed")
    rss = f"{r.samples[0].rss_mib:.1f} / {first.rss_mib:.1f} / {last.rss_mib:.1f}"
    threads = f"{r.samples[0].threads} / {first.threads} / {last.threads}"
    threads += f" (min {min(s.threads for s in warm)}, max {max(s.threads for s in warm)})"
    print(
        f"Soak: {r.elapsed_s / 60:.1f} min, seed {args.seed}, interval {INTERVAL_S:g} s, "
        f"resync {RESYNC_S:g} s, warm-up {warm_up:.0f} s\n"
    )
    summary: list[list[object]] = [
        ["scan cycles (scans_total)", scans],
        ["node requests served", sum(v for k, v in r.requests.items() if "node" in k)],
        ["requests by kind", joined(r.requests)],
        ["fault bursts", f"{len(r.bursts)}, {sum(r.bursts):.0f} s in all"],
        ["faults served", f"{sum(r.served.values())}: {joined(r.served)}"],
        ["node answers by status", joined(statuses)],
        ["drift edits", joined(r.drift.actions)],
        [
            "drift repairs (ours)",
            f"{len(repairs)}, median {statistics.median(repairs or [0]):.1f} s, "
            f"max {max(repairs or [0]):.1f} s; {events['drift_repaired']} logged drift_repaired",
        ],
        [
            "publishes by result",
            joined({k: metric("publishes", k) for k in ("written", "unchanged", "failed")}),
        ],
        ["api errors by kind", joined(errors_counted)],
        ["api_retry log lines", events["api_retry"]],
        ["RSS MiB at 0 s / warm-up / end", rss],
        ["threads at 0 s / warm-up / end", threads],
    ]
    print(table(["what", "value"], summary))
    checks = [
        (
            "Node data == collect --format labels",
            "; ".join(r.final_mismatches) or "equal",
            not r.final_mismatches,
        ),
        (
            "converged after faults stopped",
            f"{r.converged_s:.1f} s",
            r.converged_s < 2 * RESYNC_S + LONGEST_RETRY_S,
        ),
        ("foreign keys intact", f"{n_foreign - len(lost)} of {n_foreign}", not lost),
        (
            "every drift of ours repaired",
            f"{len(repairs)} of {len(repairs) + r.drift.unrepaired}"
            + (f" (+{r.drift.interrupted} cut short by the end)" if r.drift.interrupted else ""),
            r.drift.unrepaired == 0,
        ),
        ("/readyz at the end", str(r.readyz), r.readyz == 200),
        ("RSS growth after warm-up", f"{growth:+.2f} MiB", growth <= RSS_GROWTH_LIMIT_MIB),
        (
            "RSS slope after warm-up",
            f"{slope:+.1f} KiB/min" + ("" if judged else " (window under 4 min: not judged)"),
            slope <= RSS_SLOPE_LIMIT_KIB_MIN or not judged,
        ),
        (
            "threads end == after warm-up",
            f"{last.threads} vs {first.threads}",
            last.threads == first.threads,
        ),
        (
            "api_errors_total == faults the double answered",
            f"{joined(errors_counted)} vs {joined(errors_seen)}",
            errors_counted == errors_seen and other_errors == 0,
        ),
        ("publishes written == PATCH 200s", f"{written} vs {r.patch_ok}", written == r.patch_ok),
        (
            "publishes failed == failures logged",
            f"{failed_count} vs {failed_logged}",
            failed_count == failed_logged,
        ),
        (
            "scans_total == scans logged (+0..2 after the scrape)",
            f"{scans} vs {events['scanned']}",
            0 <= events["scanned"] - scans <= 2,
        ),
        ("scans failed", str(metric("scans", "failed")), metric("scans", "failed") == 0),
    ]
    print()
    rows = [[c, v, "pass" if ok else "FAIL"] for c, v, ok in checks]
    print(table(["check", "measured", "result"], rows))
    failed = [c for c, _, ok in checks if not ok]
    print(f"\n{len(checks) - len(failed)} of {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
