"""The kubelet's configuration file on the host, read for its Topology Manager policies.

An absent file means unknown (the chart may not mount it, a kubelet may be configured by flags):
no labels, no error. A file that does not read is one clear error, logged once by the caller.
"""

from __future__ import annotations

from pathlib import Path

from parsers.errors import ParseError
from parsers.kubelet import MAX_INPUT_BYTES, KubeletPolicies, parse_kubelet_config
from reporter.errors import InputError
from reporter.inputs import read_bounded


def read_kubelet_policies(path: Path) -> KubeletPolicies | None:
    """The policies in the kubelet config at `path`; None when there is no such file.

    Raises InputError naming the file when it exists but cannot be read or parsed.
    """
    try:
        text = read_bounded(path, limit=MAX_INPUT_BYTES, what="kubelet config")
    except InputError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise
    try:
        return parse_kubelet_config(text)
    except ParseError as e:
        raise InputError(f"kubelet config {path}: {e}") from None
