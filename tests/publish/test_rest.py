"""The lean client's own parts: credentials from a kubeconfig or the pod, token rotation, and the
Event it posts compared with the official client's.

What both clients share (every fault, 401/403/404/409/422, Retry-After, timeouts) runs against
each of them in tests/publish/test_kube.py, test_agent_loop.py and test_publish_nodefeature.py.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from reporter.errors import ApiPermanentError, ApiTransientError, CredentialsError
from reporter.publish.api import EVENTS, NODES
from reporter.publish.client import EventType, event_body
from reporter.publish.kube import KubeApiClient, load_configuration
from reporter.publish.patch import NodeMetadata, node_metadata
from reporter.publish.rest import (
    TOKEN_REFRESH_S,
    LeanClientUnsupportedError,
    RestApiClient,
    RestConfig,
    load_rest_config,
)
from tests.support.kube_double import AGENT_PERMISSIONS, ApiServerDouble, write_kubeconfig
from tests.support.kube_double.tls import Certificate

NODE = "gpu-node-1"


def kubeconfig_file(
    path: Path,
    cluster: dict[str, Any],
    user: dict[str, Any],
    *,
    current: str | None = "c",
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class Lean:
    """The lean ApiClient, with the one call these tests make on a Node."""

    def __init__(self, config: RestConfig, clock: Callable[[], float] | None = None) -> None:
        if clock is None:
            self.api = RestApiClient(config, request_timeout_s=(2.0, 2.0))
        else:
            self.api = RestApiClient(config, request_timeout_s=(2.0, 2.0), clock=clock)

    def get_node(self, name: str) -> NodeMetadata:
        node = self.api.get(NODES, name)
        assert node is not None
        return node_metadata(node)


def lean(config: RestConfig, clock: Callable[[], float] | None = None) -> Lean:
    return Lean(config, clock)


# -- the kubeconfig ------------------------------------------------------------------------------


def test_a_token_and_ca_data_kubeconfig_reaches_the_double(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    config = load_rest_config(str(kubeconfig))
    assert (config.server, config.token, config.insecure) == (apiserver.url, "agent-token", False)
    assert config.ca_data is not None
    assert config.ca_data.startswith("-----BEGIN CERTIFICATE-----")
    assert lean(config).get_node(NODE).name == NODE


def test_token_file_and_ca_file_are_read_relative_to_the_kubeconfig(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("agent-token\n")
    (tmp_path / "ca.crt").write_bytes(apiserver_certificate.cert.read_bytes())
    path = kubeconfig_file(
        tmp_path / "kc",
        {"server": apiserver.url, "certificate-authority": "ca.crt"},
        {"tokenFile": "token"},
    )
    config = load_rest_config(str(path))
    assert (config.ca_file, config.token_file) == (
        str(tmp_path / "ca.crt"),
        str(tmp_path / "token"),
    )
    assert lean(config).get_node(NODE).name == NODE


def test_client_certificate_data_is_loaded_through_private_files_removed_at_once(
    apiserver: ApiServerDouble,
    apiserver_certificate: Certificate,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Any certificate and its key make a client certificate; the double does not ask for one.
    path = kubeconfig_file(
        tmp_path / "kc",
        {"server": apiserver.url, "certificate-authority-data": b64(apiserver_certificate.cert)},
        {
            "token": "agent-token",
            "client-certificate-data": b64(apiserver_certificate.cert),
            "client-key-data": b64(apiserver_certificate.key),
        },
    )
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    config = load_rest_config(str(path))
    assert config.client_key_data == apiserver_certificate.key.read_bytes()
    assert "PRIVATE KEY" not in repr(config)
    assert lean(config).get_node(NODE).name == NODE
    assert list(private.iterdir()) == []


def test_client_certificate_files_are_loaded_as_they_are(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    path = kubeconfig_file(
        tmp_path / "kc",
        {"server": apiserver.url, "certificate-authority-data": b64(apiserver_certificate.cert)},
        {
            "token": "agent-token",
            "client-certificate": str(apiserver_certificate.cert),
            "client-key": str(apiserver_certificate.key),
        },
    )
    assert lean(load_rest_config(str(path))).get_node(NODE).name == NODE


def test_a_client_key_that_does_not_load_is_a_credentials_error_without_the_key(
    tmp_path: Path,
) -> None:
    path = kubeconfig_file(
        tmp_path / "kc",
        {"server": "https://127.0.0.1:1"},
        {"client-certificate-data": b64(Path(__file__)), "client-key-data": "c2VjcmV0"},
    )
    with pytest.raises(CredentialsError, match="cannot load the TLS files of") as e:
        lean(load_rest_config(str(path)))
    assert "secret" not in str(e.value)


def test_insecure_skip_tls_verify_connects_without_a_ca_and_warns(
    apiserver: ApiServerDouble, tmp_path: Path
) -> None:
    path = kubeconfig_file(
        tmp_path / "kc",
        {"server": apiserver.url, "insecure-skip-tls-verify": True},
        {"token": "agent-token"},
    )
    config = load_rest_config(str(path))
    assert config.insecure
    # urllib3 warns on every unverified request, as it does for the official client.
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):
        assert lean(config).get_node(NODE).name == NODE


def test_where_a_file_and_its_data_are_both_given_the_file_wins_as_in_the_official_client(
    tmp_path: Path,
) -> None:
    path = kubeconfig_file(
        tmp_path / "kc",
        {
            "server": "https://h",
            "certificate-authority": "ca.crt",
            "certificate-authority-data": "Y2E=",
        },
        {
            "token": "inline",
            "tokenFile": "token",
            "client-certificate": "c.crt",
            "client-certificate-data": "Yw==",
            "client-key": "c.key",
            "client-key-data": "aw==",
        },
    )
    config = load_rest_config(str(path))
    assert (config.ca_file, config.token_file) == (
        str(tmp_path / "ca.crt"),
        str(tmp_path / "token"),
    )
    assert (config.ca_data, config.client_cert_data, config.client_key_data) == (None, None, None)
    # The token stays beside its file: client-go sends it while the file cannot be read.
    assert config.token == "inline"


CONFIG_ERRORS = [
    (
        "no current-context",
        lambda p: kubeconfig_file(p, {"server": "https://h"}, {"token": "t"}, current=None),
        "sets no current-context: run `kubectl config use-context NAME`",
    ),
    (
        "a current-context it does not define",
        lambda p: kubeconfig_file(p, {"server": "https://h"}, {"token": "t"}, current="other"),
        "names context 'other', which it does not define",
    ),
    (
        "a cluster without a server",
        lambda p: kubeconfig_file(p, {"certificate-authority": "ca"}, {"token": "t"}),
        "cluster 'k' has no server",
    ),
    ("no such file", lambda p: p, "(FileNotFoundError)"),
    (
        "not YAML",
        lambda p: (p.write_text("clusters: [\n"), p)[1],
        "(not YAML)",
    ),
]


@pytest.mark.parametrize(
    ("make", "said"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS]
)
def test_a_kubeconfig_that_cannot_work_is_one_line_naming_the_file(
    tmp_path: Path, make: Callable[[Path], Path], said: str
) -> None:
    path = make(tmp_path / "kc")
    with pytest.raises(CredentialsError) as e:
        load_rest_config(str(path))
    assert not isinstance(e.value, LeanClientUnsupportedError)
    assert said in str(e.value)
    assert str(path) in str(e.value)
    assert "\n" not in str(e.value)


PLUGINS = [
    (
        "an exec plugin (EKS)",
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws"}},
        {},
    ),
    ("an auth-provider (GKE, OIDC)", {"auth-provider": {"name": "oidc"}}, {}),
    ("basic auth", {"username": "u", "password": "p"}, {}),
    ("a proxy-url", {"token": "t"}, {"proxy-url": "http://proxy:3128"}),
    ("a tls-server-name", {"token": "t"}, {"tls-server-name": "kubernetes"}),
]


@pytest.mark.parametrize(("user", "cluster"), [c[1:] for c in PLUGINS], ids=[c[0] for c in PLUGINS])
def test_what_only_the_official_client_does_is_refused_so_the_caller_falls_back(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any]
) -> None:
    path = kubeconfig_file(tmp_path / "kc", {"server": "https://h", **cluster}, user)
    with pytest.raises(LeanClientUnsupportedError, match=str(path)):
        load_rest_config(str(path))


def test_a_list_of_kubeconfigs_to_merge_is_left_to_the_official_client(tmp_path: Path) -> None:
    with pytest.raises(LeanClientUnsupportedError, match="a list of kubeconfigs"):
        load_rest_config(f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")


def test_a_proxy_in_the_environment_is_left_to_the_official_client(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(LeanClientUnsupportedError, match="proxy"):
        load_rest_config(str(kubeconfig))


# -- in a pod --------------------------------------------------------------------------------


@pytest.fixture
def service_account(apiserver_certificate: Certificate, tmp_path: Path) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("agent-token")
    (directory / "ca.crt").write_bytes(apiserver_certificate.cert.read_bytes())
    (directory / "namespace").write_text("gpu-topology")
    return directory


def in_pod(apiserver: ApiServerDouble) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(apiserver.port)}


def test_in_a_pod_the_service_account_is_used(
    apiserver: ApiServerDouble, service_account: Path
) -> None:
    config = load_rest_config(None, environ=in_pod(apiserver), service_account_dir=service_account)
    assert config.server == apiserver.url
    assert config.token_file == str(service_account / "token")
    assert lean(config).get_node(NODE).name == NODE


def test_a_named_kubeconfig_wins_over_the_pod(
    apiserver: ApiServerDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    environ = in_pod(apiserver)
    config = load_rest_config(str(kubeconfig), environ=environ, service_account_dir=tmp_path)
    assert config.source == str(kubeconfig)


def test_an_ipv6_service_address_is_bracketed(service_account: Path) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_rest_config(None, environ=environ, service_account_dir=service_account)
    assert config.server == "https://[fd00::1]:443"


@pytest.mark.parametrize("missing", ["token", "ca.crt"])
def test_a_pod_without_its_service_account_token_is_a_credentials_error(
    apiserver: ApiServerDouble, service_account: Path, missing: str
) -> None:
    (service_account / missing).unlink()
    with pytest.raises(CredentialsError, match=f"{missing} is missing"):
        load_rest_config(None, environ=in_pod(apiserver), service_account_dir=service_account)


# -- token rotation ----------------------------------------------------------------------------


def test_a_rotated_token_file_is_read_again_before_the_next_request(
    apiserver: ApiServerDouble, service_account: Path
) -> None:
    client = lean(
        load_rest_config(None, environ=in_pod(apiserver), service_account_dir=service_account)
    )
    assert client.get_node(NODE).name == NODE
    # The kubelet swaps the projected token atomically; the old one stops working.
    rotated = service_account / "token.new"
    rotated.write_text("rotated-token")
    rotated.replace(service_account / "token")
    apiserver.tokens["rotated-token"] = AGENT_PERMISSIONS
    del apiserver.tokens["agent-token"]
    assert client.get_node(NODE).name == NODE


def test_a_token_file_that_looks_unchanged_is_still_read_every_minute(
    apiserver: ApiServerDouble, service_account: Path
) -> None:
    now = [0.0]
    token = service_account / "token"
    client = lean(
        load_rest_config(None, environ=in_pod(apiserver), service_account_dir=service_account),
        clock=lambda: now[0],
    )
    client.get_node(NODE)
    # Same inode, size and modification time: only the clock can tell it was rewritten.
    stamp = token.stat()
    with token.open("r+") as f:
        f.write("xgent-token")
    os.utime(token, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    apiserver.tokens["xgent-token"] = AGENT_PERMISSIONS
    del apiserver.tokens["agent-token"]
    with pytest.raises(ApiPermanentError, match=r"\(401\)"):
        client.get_node(NODE)  # the old token, still cached
    now[0] += TOKEN_REFRESH_S
    assert client.get_node(NODE).name == NODE


def test_an_unreadable_token_file_is_a_transient_error_naming_the_mount(
    apiserver: ApiServerDouble, service_account: Path
) -> None:
    config = load_rest_config(None, environ=in_pod(apiserver), service_account_dir=service_account)
    # Before any good read: once one was read, it stands in (as in client-go).
    (service_account / "token").unlink()
    client = lean(config)
    with pytest.raises(ApiTransientError, match="automountServiceAccountToken"):
        client.get_node(NODE)
    (service_account / "token").write_text("agent-token")
    assert client.get_node(NODE).name == NODE


# -- what goes on the wire ---------------------------------------------------------------------


def test_the_event_is_the_one_the_official_client_posts(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    official = KubeApiClient(load_configuration(str(kubeconfig)))
    node = official.get(NODES, NODE)
    assert node is not None
    for api in (official, RestApiClient(load_rest_config(str(kubeconfig)))):
        body = event_body(
            node_metadata(node), EventType.WARNING, "GPULost", "GPU6 lost", datetime.now(UTC)
        )
        api.create(EVENTS, body, "default")
    sent = [r for r in apiserver.requests if r.method == "POST"]
    assert [(r.path, r.status) for r in sent] == [("/api/v1/namespaces/default/events", 201)] * 2
    # The generated client sends no Content-Type here (the apiserver reads JSON then); we say it.
    assert sent[1].content_type == "application/json"
    bodies = [dict(r.body) for r in sent]
    stamps = [(b.pop("firstTimestamp"), b.pop("lastTimestamp")) for b in bodies]
    assert bodies[0] == bodies[1]
    for first, last in stamps:
        assert first == last
        assert first.endswith("+00:00")


def test_a_patch_is_the_same_request_with_either_client(
    apiserver: ApiServerDouble, kubeconfig: Path
) -> None:
    patch = {"metadata": {"labels": {"gpu.topology.io/count": "8"}}}
    KubeApiClient(load_configuration(str(kubeconfig))).merge_patch(NODES, NODE, patch)
    RestApiClient(load_rest_config(str(kubeconfig))).merge_patch(NODES, NODE, patch)
    official, mine = apiserver.writes()
    assert (
        official.method,
        official.path,
        official.content_type,
        official.body,
        official.accept,
    ) == (
        mine.method,
        mine.path,
        mine.content_type,
        mine.body,
        mine.accept,
    )


def test_no_message_or_repr_shows_the_token(
    apiserver: ApiServerDouble, apiserver_certificate: Certificate, tmp_path: Path
) -> None:
    secret = "s3cr3t-token-value"
    path = write_kubeconfig(
        tmp_path / "kc", apiserver.url, secret, ca_cert=apiserver_certificate.cert
    )
    config = load_rest_config(str(path))
    assert secret not in repr(config)
    assert secret not in str(config)
