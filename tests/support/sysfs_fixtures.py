"""On-disk sysfs fixture trees, built from machine descriptions transcribed from real captures.

    python -m tests.support.sysfs_fixtures

rewrites tests/fixtures/machines/*/sysfs from each machine's profile.yaml.

The trees are committed (with real symlinks) so the sysfs collector is tested through the real
`DirHostFS`; review the diff before committing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from reporter.collect.simulate.machine import load_machine
from reporter.collect.simulate.sysfs_tree import write_tree

MACHINES = Path(__file__).parents[1] / "fixtures" / "machines"


def regenerate() -> None:
    for profile in sorted(MACHINES.glob("*/profile.yaml")):
        root = profile.parent / "sysfs"
        shutil.rmtree(root, ignore_errors=True)
        write_tree(load_machine(str(profile)), root)


if __name__ == "__main__":
    regenerate()
