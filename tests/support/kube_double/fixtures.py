"""pytest fixtures around the double: a started server with one GPU node, kubeconfigs, a client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .kubeconfig import write_kubeconfig
from .server import ApiServerDouble
from .tls import Certificate, make_certificate

NODE = "gpu-node-1"


@pytest.fixture(scope="session")
def apiserver_certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return make_certificate(tmp_path_factory.mktemp("apiserver-tls"))


@pytest.fixture
def apiserver(apiserver_certificate: Certificate) -> Iterator[ApiServerDouble]:
    """A running double holding NODE, with a kubelet's labels and one foreign annotation."""
    double = ApiServerDouble(certificate=apiserver_certificate)
    double.add_node(NODE)
    with double:
        yield double


@pytest.fixture
def kubeconfig(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> Path:
    """A kubeconfig with the agent's token: get/list/patch nodes, create events."""
    return write_kubeconfig(
        tmp_path / "agent.kubeconfig",
        apiserver.url,
        "agent-token",
        ca_cert=apiserver_certificate.cert,
    )


@pytest.fixture
def admin_kubeconfig(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> Path:
    return write_kubeconfig(
        tmp_path / "admin.kubeconfig",
        apiserver.url,
        "admin-token",
        ca_cert=apiserver_certificate.cert,
    )


@pytest.fixture
def kubeconfig_with_token(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> Callable[[str], Path]:
    """Makes a kubeconfig for the double with any bearer token."""

    def make(token: str) -> Path:
        return write_kubeconfig(
            tmp_path / f"{token}.kubeconfig",
            apiserver.url,
            token,
            ca_cert=apiserver_certificate.cert,
        )

    return make
