"""Fixtures shared across test modules."""

from tests.kube_double.fixtures import (
    admin_kubeconfig,
    apiserver,
    apiserver_certificate,
    kubeconfig,
    kubeconfig_with_token,
)

__all__ = [
    "admin_kubeconfig",
    "apiserver",
    "apiserver_certificate",
    "kubeconfig",
    "kubeconfig_with_token",
]
