"""The image image/build.sh builds: build time (cold: the Debian base too; the image alone on the
base; up to date), its size, whether two builds from one checkout give the same layer, and the dry
run's wall time in the container.

    python bench/image.py [--cold]

`--cold` removes this checkout's base image first, so the first build makes it again (2 to 5 min).
Then: the image is removed and built twice from the same files (the base kept); the two builds'
layers are compared (the image is one layer: what image/rootfs.py gathers from the base and the
wheels). Needs podman, runc and mmdebstrap (tests/prereqs.sh) and root.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.image_support import IMAGE, PODMAN_RUN  # noqa: E402  # the path above first


def podman(*args: str) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=True, timeout=600
    ).stdout.strip()


def build() -> float:
    started = time.monotonic()
    built = subprocess.run(
        ["sh", "image/build.sh"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        sys.exit(f"bench/image.py: image/build.sh failed:\n{built.stderr}")
    return time.monotonic() - started


def remove_image() -> None:
    image_id = podman("image", "inspect", "--format", "{{.Id}}", IMAGE)
    podman("rmi", "--force", image_id)


def layers() -> list[str]:
    found: list[str] = json.loads(
        podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", IMAGE)
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="make the Debian base again first")
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    if args.cold:
        for line in podman("images", "--format", "{{.Repository}}:{{.Tag}}").splitlines():
            if line.startswith("localhost/topo-reporter"):
                podman("rmi", "--force", line)
        cold_s = build()
        rows.append(("cold build (Debian base + the image + archive + SBOM)", f"{cold_s:.0f} s"))
    else:
        build()
    remove_image()
    first_s = build()
    first = layers()
    rows.append(("build, base reused (the image + archive + SBOM)", f"{first_s:.0f} s"))
    remove_image()
    second_s = build()
    second = layers()
    rows.append(("the same again, from the same files", f"{second_s:.0f} s"))
    rows.append(("up to date (nothing built)", f"{build():.1f} s"))
    rows.append(("layers", str(len(second))))
    rows.append(("the same layers in both", str(first == second)))
    rows.append(("layer digest", f"`{second[-1][:19]}...`"))
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE))
    rows.append(("image size, uncompressed", f"{size / 1e6:.1f} MB"))
    dry = [
        *PODMAN_RUN,
        "--rm",
        "--network=none",
        "--read-only",
        "--cap-drop=ALL",
        IMAGE,
        "run",
        "--simulate",
        "dgx-h100",
        "--once",
        "--dry-run",
    ]
    walls = []
    for _ in range(3):
        started = time.monotonic()
        subprocess.run(dry, check=True, capture_output=True, timeout=120)
        walls.append(time.monotonic() - started)
    rows.append(("`run --simulate dgx-h100 --once --dry-run`, wall (3 runs)", _seconds(walls)))
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


def _seconds(values: list[float]) -> str:
    return " / ".join(f"{v:.2f} s" for v in values)


if __name__ == "__main__":
    sys.exit(main())
