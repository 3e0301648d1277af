"""A throwaway self-signed certificate for 127.0.0.1, made with the `openssl` command.

kubectl (client-go) sends a bearer token only over TLS, so the double serves HTTPS like a real
apiserver; the certificate authority goes into the kubeconfig it writes.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Certificate:
    cert: Path
    key: Path


def make_certificate(directory: Path) -> Certificate:
    """A one-day EC certificate whose subjectAltName is IP 127.0.0.1."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the API server double needs the openssl command to make its cert")
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return Certificate(cert, key)
