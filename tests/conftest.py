"""Fixtures shared across test modules."""

import functools

import pytest

from tests.agent_support import NODE_CLIENTS, NodeClientFactory, WireAgent, wire_agent
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
    "node_client",
    "wire",
]


@pytest.fixture(params=sorted(NODE_CLIENTS))
def node_client(request: pytest.FixtureRequest) -> NodeClientFactory:
    """Each API client the agent can run with: a test using it runs once per client."""
    return NODE_CLIENTS[request.param]


@pytest.fixture
def wire(node_client: NodeClientFactory) -> WireAgent:
    """`wire_agent` through each client in turn."""
    return functools.partial(wire_agent, client=node_client)
