"""A Kubernetes API server double for tests: real HTTP on loopback, real client, real kubectl."""

from .kubeconfig import write_kubeconfig
from .server import (
    AGENT_PERMISSIONS,
    ALL,
    EXTENDER_PERMISSIONS,
    ApiServerDouble,
    Fault,
    Recorded,
    status_body,
)
from .tls import Certificate, make_certificate

__all__ = [
    "AGENT_PERMISSIONS",
    "ALL",
    "EXTENDER_PERMISSIONS",
    "ApiServerDouble",
    "Certificate",
    "Fault",
    "Recorded",
    "make_certificate",
    "status_body",
    "write_kubeconfig",
]
