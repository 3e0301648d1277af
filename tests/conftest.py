"""Fixtures shared across test modules."""

import functools
import sys
from collections.abc import Iterator

import pytest
import structlog

from tests.support.agent_support import API_CLIENTS, ApiClientFactory, WireAgent, wire_agent
from tests.support.consumer_fixtures import (
    rack_cluster,
    rack_scheduler,
    real_controller_manager,
    real_kueue,
    real_yunikorn,
)
from tests.support.controlplane_fixtures import (
    build_before_tests,
    consumers_bin,
    controlplane_bin,
    dracel_bin,
    kueue_bin,
    plugins_bin,
    prometheus_bin,
    promtool_bin,
    real_apiserver,
    real_koordinator_device_crd,
    real_namespace,
    real_nfd_crds,
    real_node_factory,
    real_nrt_crd,
    yunikorn_bin,
)
from tests.support.fuzz import PROFILE
from tests.support.kube_double.fixtures import (
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
    "consumers_bin",
    "controlplane_bin",
    "dracel_bin",
    "kubeconfig",
    "kubeconfig_with_token",
    "kueue_bin",
    "node_client",
    "plugins_bin",
    "prometheus_bin",
    "promtool_bin",
    "rack_cluster",
    "rack_scheduler",
    "real_apiserver",
    "real_controller_manager",
    "real_koordinator_device_crd",
    "real_kueue",
    "real_namespace",
    "real_nfd_crds",
    "real_node_factory",
    "real_nrt_crd",
    "real_yunikorn",
    "wire",
    "yunikorn_bin",
]


@pytest.fixture(params=sorted(API_CLIENTS))
def node_client(request: pytest.FixtureRequest) -> ApiClientFactory:
    """Each API client the agent can run with: a test using it runs once per client."""
    return API_CLIENTS[request.param]


@pytest.fixture
def wire(node_client: ApiClientFactory) -> WireAgent:
    """`wire_agent` through each client in turn."""
    return functools.partial(wire_agent, client=node_client)


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


@pytest.fixture(params=["normal", "lowered"])
def recursion_limit(request: pytest.FixtureRequest) -> Iterator[int]:
    """The recursion limit as it is, and lowered to leave only 150 frames above this test."""
    before = sys.getrecursionlimit()
    if request.param == "lowered":
        sys.setrecursionlimit(_stack_depth() + 150)
    try:
        yield sys.getrecursionlimit()
    finally:
        sys.setrecursionlimit(before)


def pytest_collection_finish(session: pytest.Session) -> None:
    build_before_tests(session)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """structlog's defaults again after each test: a command run in-process (`main([...])`)
    configures logging for the process, and a level above info left behind would hide the info
    events the next test's capture_logs() expects, in whatever order the tests run."""
    yield
    structlog.reset_defaults()


def pytest_report_header() -> str:
    return f"hypothesis profile: {PROFILE} (HYPOTHESIS_PROFILE=fuzz-long for a randomized run)"
