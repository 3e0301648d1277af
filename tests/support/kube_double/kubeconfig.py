"""Write a kubeconfig that points the real client and kubectl at the API server double."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def _exec_plugin(token: str) -> dict[str, Any]:
    """A client-go exec credential plugin (as EKS's `aws eks get-token`) that prints `token`."""
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    return {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
        "interactiveMode": "Never",
    }


def write_kubeconfig(
    path: Path,
    server: str,
    token: str,
    *,
    ca_cert: Path | None,
    context: str = "double",
    exec_plugin: bool = False,
) -> Path:
    """A kubeconfig with one cluster (trusting `ca_cert`), one token user and one context.

    `exec_plugin`: the token comes from an exec plugin, which only the official client runs.
    """
    cluster: dict[str, str] = {"server": server}
    if ca_cert is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [
            {
                "name": context,
                "user": {"exec": _exec_plugin(token)} if exec_plugin else {"token": token},
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
