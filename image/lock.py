"""Write image/requirements.txt: the Python packages of the image, pinned, with the SHA-256 of the
wheel of every architecture the image is built for.

    python3 image/lock.py        (network: PyPI, or the index pip is configured for)

The set is the package's own dependencies (pyproject.toml) resolved for CPython 3.11 on glibc
(manylinux2014, as Debian 12's Python is), wheels only, less what the image leaves out on purpose
(EXCLUDED), plus pip, which the build runs from its wheel and does not install. Both architectures
must resolve to the same versions: one lock serves both images. Run it after a dependency changes;
tests/image/test_lock.py says when the lock and pyproject.toml disagree.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "image" / "requirements.txt"
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
EXCLUDED = {
    # The agent talks to the API server with its own lean client (reporter.publish.rest); the
    # official one (126 MB installed) serves only exec/auth-provider kubeconfigs, `doctor` and
    # the kubectl plugin, none of which a DaemonSet's in-cluster agent uses (docs/image.md).
    "kubernetes": "the official client: 126 MB, for exec kubeconfigs, doctor and kubectl",
}
BUILD_TOOLS = ("pip",)
"""Run from its wheel during the build (python pip.whl/pip install ...), never installed."""


def requirements() -> list[str]:
    """The package's dependencies less EXCLUDED, then the build tools."""
    with (REPO / "pyproject.toml").open("rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
    kept = [d for d in deps if _name(d) not in EXCLUDED]
    return [*kept, *BUILD_TOOLS]


def _name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower().replace("_", "-")
    return requirement.lower().replace("_", "-")


def download(machine: str, into: Path) -> dict[str, tuple[str, str]]:
    """{name: (version, sha256)} of the wheels pip resolves for one architecture."""
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
            "--abi", "cp311", "--platform", f"manylinux2014_{machine}",
            "--platform", f"manylinux_2_17_{machine}", "--platform", f"manylinux_2_28_{machine}",
            *requirements(),
        ],
        check=True,
    )  # fmt: skip
    found: dict[str, tuple[str, str]] = {}
    for wheel in sorted(into.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        found[name.lower().replace("_", "-")] = (version, digest)
    return found


def main() -> int:
    per_arch: dict[str, dict[str, tuple[str, str]]] = {}
    for arch, machine in ARCHES.items():
        with tempfile.TemporaryDirectory() as tmp:
            per_arch[arch] = download(machine, Path(tmp))
    names = sorted(set().union(*per_arch.values()))
    lines = [
        "# The image's Python packages (image/lock.py wrote this; do not edit by hand).",
        "# Left out on purpose: " + "; ".join(f"{name} ({why})" for name, why in EXCLUDED.items()),
        "# pip is the build's installer, run from its wheel: it is not installed in the image.",
    ]
    for name in names:
        versions = {arch: found[name][0] for arch, found in per_arch.items() if name in found}
        if len(set(versions.values())) != 1 or len(versions) != len(ARCHES):
            print(f"image/lock.py: {name} resolves differently per architecture: {versions}")
            return 1
        digests = sorted({found[name][1] for found in per_arch.values()})
        hashes = " ".join(f"--hash=sha256:{d}" for d in digests)
        lines.append(f"{name}=={versions['amd64']} {hashes}")
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"image/lock.py: {len(names)} packages pinned in {LOCK.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
