"""What the maximal-clique search costs on the worst wiring the schema admits, before and after
its bound (issue 41, item 2).

    python bench/clique_bound.py      # prints one Markdown table

Moon and Moser's graph: GPUs in triples, each NVLinked to every GPU outside its triple and to none
inside, has 3^(n/3) maximal cliques, the most any graph of n vertices has. `before` is the search
as it was (Bron-Kerbosch with pivoting on Python sets, no bound), run in a child process under a
wall-clock and memory cap; `after` is reporter.schema.dra_template.maximal_cliques, which refuses
the topology past MAX_CLIQUES cliques or MAX_CLIQUE_STEPS calls. `dra-template` is the whole
builder (`build`) over two DGX H100 nodes and one such forged node at their bus IDs, which it
leaves out. Peak memory after is tracemalloc's (the Python heap, measured in a second, untimed
run); before, the child's peak RSS.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.common import table
from bench.dra_template import nodes_of, scanned
from reporter.schema import dra_template
from reporter.schema.dra_template import CliqueBoundError, Machine
from tests.cli.test_dra_template import moon_moser

BEFORE_WALL_S = 60
BEFORE_MEMORY = 2 << 30
OUT_OF_MEMORY = 3
"""The child's exit status where the search ran out of its memory cap."""


def unbounded(topology: Any) -> list[frozenset[int]]:
    """The search before issue 41: every maximal clique, however many."""
    usable = {g.index for g in topology.gpus if not g.lost}
    adjacent = {a: {b for b in usable if b != a and topology.link(a, b).is_nvlink} for a in usable}
    found: list[frozenset[int]] = []

    def extend(clique: set[int], candidates: set[int], excluded: set[int]) -> None:
        if not candidates and not excluded:
            if len(clique) >= 2:
                found.append(frozenset(clique))
            return
        pivot = max(candidates | excluded, key=lambda v: len(adjacent[v] & candidates))
        for v in sorted(candidates - adjacent[pivot]):
            extend(clique | {v}, candidates & adjacent[v], excluded & adjacent[v])
            candidates = candidates - {v}
            excluded = excluded | {v}

    extend(set(), set(usable), set())
    return found


def _before_child(parts: int, out: Any) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (BEFORE_MEMORY, BEFORE_MEMORY))
    started = time.perf_counter()
    found: int | None = None
    with contextlib.suppress(MemoryError):  # out of the handler, the search's memory is freed
        found = len(unbounded(moon_moser(parts)))
    if found is None:
        os._exit(OUT_OF_MEMORY)  # nothing is left to send a message with
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    out.send(f"{found:,} cliques in {time.perf_counter() - started:.1f} s, {peak} MiB RSS")


def before(parts: int) -> str:
    # A pipe, not a queue: a queue's feeder thread cannot start under the child's memory cap.
    reader, writer = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_before_child, args=(parts, writer))
    started = time.perf_counter()
    child.start()
    child.join(BEFORE_WALL_S)
    if child.is_alive():
        child.kill()
        child.join()
        return f"no answer in {BEFORE_WALL_S} s"
    if child.exitcode == OUT_OF_MEMORY:
        return f"MemoryError after {time.perf_counter() - started:.1f} s (cap 2 GiB)"
    return str(reader.recv()) if reader.poll() else f"died ({child.exitcode})"


def after(run: Callable[[], object]) -> str:
    """The outcome and time of one run, then the peak of another under tracemalloc (which slows
    every allocation, so it is not timed)."""
    started = time.perf_counter()
    try:
        run()
        outcome = "answered"
    except CliqueBoundError as e:
        outcome = "refused: " + str(e).split(",")[0].removeprefix("its NVLink wiring has ")
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    with contextlib.suppress(CliqueBoundError):
        run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return f"{outcome} in {elapsed * 1000:.0f} ms, peak {peak / (1 << 20):.1f} MiB"


def cliques_of(parts: int) -> Callable[[], object]:
    topology = moon_moser(parts)
    return lambda: dra_template.maximal_cliques(topology)


def template_with(parts: int) -> Callable[[], object]:
    forged = moon_moser(parts)
    h100 = scanned("dgx-h100")
    h100 = replace(
        h100,
        gpus=tuple(
            replace(g, model=forged.gpus[0].model, pci=forged.gpus[g.index].pci) for g in h100.gpus
        ),
    )
    cluster = [nodes_of("h100", h100, 0, 2), Machine("forged", (forged,), ("forged",))]
    return lambda: dra_template.build(cluster, 2, uuids_known=True)


def main() -> None:
    rows = []
    for gpus, parts in ((27, 9), (30, 10), (33, 11), (48, 16), (255, 85)):
        cliques = f"3^{parts}"
        rows.append(
            [
                gpus,
                cliques,
                before(parts) if parts <= 16 else "not run",
                after(cliques_of(parts)),
                after(template_with(parts)),
            ]
        )
    print(table(["GPUs", "maximal cliques", "before", "after", "dra-template after"], rows))


if __name__ == "__main__":
    main()
