"""Write a kubeconfig that points the real client and kubectl at the API server double."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path, server: str, token: str, *, ca_cert: Path | None, context: str = "double"
) -> Path:
    """A kubeconfig with one cluster (trusting `ca_cert`), one token user and one context."""
    cluster: dict[str, str] = {"server": server}
    if ca_cert is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
