"""The extender's capacity gauges over simulated NVL72 racks: the time one /metrics scrape takes to
count connected-capable nodes and whole free nodes per partition from the cache.

    python -m bench.capacity [--repeat 20]
"""

from __future__ import annotations

import argparse
import logging

from bench.common import median_seconds, quiet_logs, table
from reporter.extender.cache import NodeCache
from reporter.extender.server import ExtenderMetrics
from reporter.publish.watch import node_annotation
from tests.extender.test_capacity import PREFIX, node_objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    quiet_logs(logging.ERROR)
    objects, _ = node_objects(0)
    cache = NodeCache(PREFIX)
    cache.replace(node_annotation(o, f"{PREFIX}/availability") for o in objects)
    metrics = ExtenderMetrics(cache)
    rows = []
    median, best = median_seconds(cache.capacity, args.repeat)
    rows.append(("capacity counts", f"{median * 1000:.2f}", f"{best * 1000:.2f}"))
    median, best = median_seconds(metrics.render, args.repeat)
    rows.append(("whole /metrics render", f"{median * 1000:.2f}", f"{best * 1000:.2f}"))
    print(f"{len(objects)} nodes in 20 racks")
    print(table(("what", "median ms", "min ms"), rows))


if __name__ == "__main__":
    main()
