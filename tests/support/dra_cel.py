"""GPUs as NVIDIA's DRA driver publishes them, and Kubernetes' own DRA CEL code run on them.

`nvidia_attributes` shapes a GPU of our topology as a device of NVIDIA's `gpu.nvidia.com` driver
(kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go: `type`, `uuid`,
`productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion`, and the standard `resource.kubernetes.io/pciBusID` and `pcieRoot`); `evaluate`
hands an expression and devices to tests/controlplane/dracel, which compiles and evaluates them
with k8s.io/dynamic-resource-allocation/cel.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reporter.schema.model import Gpu

DRACEL_TIMEOUT_S = 120.0

# deviceinfo.go takes the architecture from the compute capability; our profiles name products.
_ARCHITECTURE = (
    ("V100", "Volta", "7.0.0"),
    ("A100", "Ampere", "8.0.0"),
    ("A6000", "Ampere", "8.6.0"),
    ("Ada", "Ada Lovelace", "8.9.0"),
    ("GB200", "Blackwell", "10.0.0"),
    ("H100", "Hopper", "9.0.0"),
    ("H200", "Hopper", "9.0.0"),
)


def nvidia_attributes(gpu: Gpu, *, bus_id: bool = True) -> dict[str, dict[str, Any]]:
    """A whole GPU's attributes in a ResourceSlice of NVIDIA's driver; `bus_id=False`: a GPU the
    driver could not read the PCI bus ID of (it then publishes neither standard attribute)."""
    model = gpu.model or "NVIDIA GPU"
    architecture, capability = next(
        ((a, c) for part, a, c in _ARCHITECTURE if part in model), ("Unknown", "0.0.0")
    )
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid or ""},
        "productName": {"string": model},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": architecture},
        "cudaComputeCapability": {"version": capability},
        "driverVersion": {"version": "570.133.20"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }
    if bus_id and gpu.pci is not None:
        attributes["resource.kubernetes.io/pciBusID"] = {"string": gpu.pci}
        attributes["resource.kubernetes.io/pcieRoot"] = {"string": f"pci{gpu.pci[:7]}"}
    return attributes


@dataclass(frozen=True, slots=True)
class Evaluation:
    cost: int
    """The compiler's worst-case cost estimate of `(E) == want` (E's own, plus the comparison)."""
    outcomes: list[tuple[bool, str | None]]
    """Per device: whether E gave exactly `want`, and the CEL runtime error if there was one."""
    costs: list[int]
    """Per device: the cost its evaluation ran up (of E and the comparison)."""


def evaluate(
    binary: Path, expression: str, devices: Sequence[tuple[dict[str, Any], list[str]]]
) -> Evaluation:
    """Compile `expression` with Kubernetes' DRA CEL compiler and evaluate it on each device
    (attributes, the clique IDs it must give). Raises AssertionError with the compiler's error."""
    request = {
        "expression": expression,
        "devices": [{"attributes": a, "want": want} for a, want in devices],
    }
    done = subprocess.run(
        [str(binary)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=DRACEL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    results = answer["results"]
    return Evaluation(
        int(answer["cost"]),
        [(bool(r["matches"]), r.get("error")) for r in results],
        [int(r["cost"]) for r in results],
    )
