"""The NVIDIA kernel module's per-GPU procfs file: `/proc/driver/nvidia/gpus/<bdf>/information`.

The driver writes it (open-gpu-kernel-modules `kernel-open/nvidia/nv-procfs.c`,
`nv_procfs_read_gpu_info`) as `Name: \\t value` lines; `Device Minor` is the N of the GPU's
`/dev/nvidia<N>`, what NVML's `nvmlDeviceGetMinorNumber` returns and what NVIDIA's DRA driver
names its devices by (`gpu-<N>`). This only judges the text; the caller reads the file.
"""

from __future__ import annotations

import re

from parsers.errors import ParseError

_MINOR = re.compile(r"^Device Minor:[ \t]*([0-9]{1,7})[ \t]*$", re.MULTILINE)
MAX_MINOR = (1 << 20) - 1
"""Linux minor numbers are 20 bits wide."""


def parse_device_minor(text: str, *, field: str = "information") -> int:
    """The `Device Minor` of an `information` file. Raises ParseError naming `field` when the
    line is missing or not a minor number."""
    match = _MINOR.search(text)
    if match is None:
        raise ParseError("no `Device Minor: <n>` line", field=field)
    minor = int(match.group(1))
    if minor > MAX_MINOR:
        raise ParseError(f"{minor} is not a minor number (at most {MAX_MINOR})", field=field)
    return minor
