"""Print the CycloneDX 1.5 SBOM of the topo-reporter image: every Debian package the dpkg database
lists as installed and every Python distribution in /opt/topo-reporter.

image/build.sh runs this inside the image it built (`python3 - IMAGE ARCH REVISION EPOCH <
image/sbom.py`), with the image's own Python and standard library only, so that it reads the
files the image ships, for any architecture the image is built for. It must never read the host.
Deterministic: the same image gives the same bytes (the time is SOURCE_DATE_EPOCH's, the serial
number a UUID of the image's name, revision and architecture).
"""

from __future__ import annotations

import datetime
import json
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

DPKG_STATUS = Path("/var/lib/dpkg/status")
SITE_PACKAGES = next(Path("/opt/topo-reporter/lib").glob("python3*/site-packages"))
OS_RELEASE = Path("/etc/os-release")
DEBIAN_VERSION = Path("/etc/debian_version")


def dpkg_packages() -> Iterator[dict[str, str]]:
    """The installed paragraphs of the dpkg status file, as field -> value."""
    for paragraph in DPKG_STATUS.read_text().split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status") == "install ok installed":
            yield fields


def debian_component(fields: dict[str, str], distro: str) -> dict[str, Any]:
    name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
    purl = f"pkg:deb/debian/{name}@{quote(version, safe='')}?arch={arch}&distro={distro}"
    component: dict[str, Any] = {
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": version,
        "purl": purl,
    }
    source = fields.get("Source", "").split(" ")[0]
    if source and source != name:
        component["properties"] = [{"name": "syft:metadata:source", "value": source}]
    return component


def python_component(dist: metadata.Distribution) -> dict[str, Any]:
    name = dist.metadata["Name"]
    normalized = name.lower().replace("_", "-").replace(".", "-")
    purl = f"pkg:pypi/{normalized}@{dist.version}"
    component: dict[str, Any] = {
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": dist.version,
        "purl": purl,
    }
    expression = dist.metadata.get("License-Expression")
    named = dist.metadata.get("License") or ""
    classifiers = [
        c.rsplit(" :: ", 1)[-1]
        for c in dist.metadata.get_all("Classifier") or []
        if c.startswith("License :: ")
    ]
    if expression:
        component["licenses"] = [{"expression": expression}]
    elif named and "\n" not in named and len(named) <= 100:
        component["licenses"] = [{"license": {"name": named}}]
    elif classifiers:
        component["licenses"] = [{"license": {"name": c}} for c in classifiers]
    return component


def os_release() -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in OS_RELEASE.read_text().splitlines():
        key, _, value = line.partition("=")
        fields[key] = value.strip('"')
    return fields


def main(image: str, arch: str, revision: str, epoch: str) -> int:
    name, _, version = image.rpartition(":")
    release = os_release()
    debian_version = DEBIAN_VERSION.read_text().strip()
    distro = f"debian-{debian_version}"
    debian = sorted(
        (debian_component(f, distro) for f in dpkg_packages()), key=lambda c: str(c["bom-ref"])
    )
    python = sorted(
        (python_component(d) for d in metadata.distributions(path=[str(SITE_PACKAGES)])),
        key=lambda c: str(c["bom-ref"]),
    )
    created = datetime.datetime.fromtimestamp(int(epoch), tz=datetime.UTC)
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{image}@{revision}/{arch}')}",
        "version": 1,
        "metadata": {
            "timestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {
                "components": [{"type": "application", "name": "topo-reporter image/sbom.py"}]
            },
            "component": {
                "type": "container",
                "bom-ref": f"{image}-{arch}",
                "name": name,
                "version": version,
                "properties": [
                    {"name": "arch", "value": arch},
                    {"name": "org.opencontainers.image.revision", "value": revision},
                    {"name": "base", "value": release.get("PRETTY_NAME", "unknown")},
                ],
            },
        },
        # The distribution as its own component: scanners (trivy, grype) match the Debian
        # packages' advisories by it.
        "components": [
            {
                "type": "operating-system",
                "bom-ref": f"os:debian@{debian_version}",
                "name": "debian",
                "version": debian_version,
            },
            *debian,
            *python,
        ],
    }
    json.dump(bom, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
