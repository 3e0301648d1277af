"""Both ApiClients (official, lean) against the API server double: errors mapped once."""

from __future__ import annotations

import re
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
import urllib3
import yaml

import reporter.publish
from reporter.errors import ApiPermanentError, ApiTransientError, CredentialsError, PublishError
from reporter.publish.api import EVENTS, NODES, ApiClient
from reporter.publish.client import EventType, event_body
from reporter.publish.kube import load_configuration
from reporter.publish.patch import desired, node_metadata
from reporter.publish.sink import NodePatchSink
from tests.support.agent_support import FAST, ApiClientFactory
from tests.support.kube_double import AGENT_PERMISSIONS, ApiServerDouble, Fault, write_kubeconfig
from tests.support.kube_double.tls import Certificate

NODE = "gpu-node-1"


def client(factory: ApiClientFactory, kubeconfig: Path, timeout: float = 2.0) -> ApiClient:
    return factory(kubeconfig, (timeout, timeout))


def get_node(api: ApiClient, name: str = NODE) -> dict[str, Any]:
    node = api.get(NODES, name)
    assert node is not None
    return node


def test_get_node_reads_labels_annotations_and_version(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    node = node_metadata(get_node(client(node_client, kubeconfig)))
    assert node.name == NODE
    assert node.labels["kubernetes.io/hostname"] == NODE
    assert node.resource_version == apiserver.node(NODE)["metadata"]["resourceVersion"]
    assert node.uid == apiserver.node(NODE)["metadata"]["uid"]


def test_patch_is_a_json_merge_patch_and_returns_the_new_version(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    kube = client(node_client, kubeconfig)
    before = node_metadata(get_node(kube))
    after = node_metadata(
        kube.merge_patch(
            NODES,
            NODE,
            {
                "metadata": {
                    "labels": {"gpu.topology.io/count": "8"},
                    "resourceVersion": before.resource_version,
                }
            },
        )
    )
    assert after.labels["gpu.topology.io/count"] == "8"
    assert after.resource_version != before.resource_version
    (write,) = apiserver.writes()
    assert write.content_type == "application/merge-patch+json"


def test_event_names_the_node_as_involved_object(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    kube = client(node_client, kubeconfig)
    node = node_metadata(get_node(kube))
    now = datetime.now(UTC)
    kube.create(
        EVENTS,
        event_body(node, EventType.WARNING, "GPUTopologyChanged", "GPU6 lost", now),
        "default",
    )
    (event,) = apiserver.list_events("default", "involvedObject.kind=Node")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": node.uid,
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "GPUTopologyChanged",
        "GPU6 lost",
    )
    assert event["source"]["component"] == "topo-reporter"


TRANSIENT = [
    ("429 with Retry-After in seconds", Fault(429, retry_after="7"), 429, 7.0),
    ("500 internal error", Fault(500), 500, None),
    ("502 bad gateway", Fault(502), 502, None),
    ("503 with Retry-After", Fault(503, retry_after="2"), 503, 2.0),
    ("504 gateway timeout", Fault(504), 504, None),
    ("409 conflict", Fault(409), 409, None),
    ("a dropped connection", Fault(drop=True), None, None),
]


@pytest.mark.parametrize(
    ("fault", "status", "retry_after"), [c[1:] for c in TRANSIENT], ids=[c[0] for c in TRANSIENT]
)
def test_transient_faults_become_api_transient_error(
    apiserver: ApiServerDouble,
    kubeconfig: Path,
    fault: Fault,
    status: int | None,
    retry_after: float | None,
    node_client: ApiClientFactory,
) -> None:
    apiserver.plan(fault)
    with pytest.raises(ApiTransientError) as e:
        client(node_client, kubeconfig).get(NODES, NODE)
    assert e.value.status == status
    assert e.value.retry_after == retry_after


def test_a_retry_after_date_is_turned_into_seconds(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    apiserver.plan(Fault(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT"))
    with pytest.raises(ApiTransientError) as e:
        client(node_client, kubeconfig).get(NODES, NODE)
    assert e.value.retry_after == 0.0  # a date in the past: retry now


def test_a_read_slower_than_the_timeout_is_transient(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    apiserver.plan(Fault(delay_s=1.0))
    with pytest.raises(ApiTransientError, match="timed out"):
        client(node_client, kubeconfig, timeout=0.2).get(NODES, NODE)


def test_connection_refused_is_transient(
    apiserver_certificate: Certificate, tmp_path: Path, node_client: ApiClientFactory
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_kubeconfig(
        tmp_path / "kc", f"https://127.0.0.1:{port}", "t", ca_cert=apiserver_certificate.cert
    )
    with pytest.raises(ApiTransientError, match="cannot connect"):
        client(node_client, config).get(NODES, NODE)


def test_an_untrusted_certificate_is_permanent_and_says_to_check_the_ca(
    apiserver: ApiServerDouble, tmp_path: Path, node_client: ApiClientFactory
) -> None:
    config = write_kubeconfig(tmp_path / "kc", apiserver.url, "agent-token", ca_cert=None)
    with pytest.raises(ApiPermanentError, match="check the cluster CA"):
        client(node_client, config).get(NODES, NODE)


@pytest.mark.parametrize(
    ("cause", "error", "match"),
    [
        (
            ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:2427)"),
            ApiTransientError,
            r"connection was cut: SSLEOFError",
        ),
        (
            ssl.SSLCertVerificationError(1, "certificate verify failed"),
            ApiPermanentError,
            "check the cluster CA",
        ),
    ],
    ids=[
        "a connection reset while the request is written is transient",
        "a certificate the CA does not sign is permanent",
    ],
)
def test_a_tls_error_is_retried_only_when_the_connection_was_cut(
    kubeconfig: Path,
    node_client: ApiClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    cause: ssl.SSLError,
    error: type[PublishError],
    match: str,
) -> None:
    # What urllib3 raises when the server resets the connection under a TLS write (seen through
    # tests/support/fault_proxy.py in front of the real kube-apiserver), or refuses its certificate.
    def fail(*args: object, **kwargs: object) -> None:
        raise urllib3.exceptions.SSLError(cause)

    kube = client(node_client, kubeconfig)
    monkeypatch.setattr(urllib3.PoolManager, "urlopen", fail)
    with pytest.raises(error, match=match):
        kube.merge_patch(NODES, NODE, LABELS_8)


LABELS_8 = {"metadata": {"labels": {"gpu.topology.io/count": "8"}}}
BAD_LABEL = {"metadata": {"labels": {"gpu.topology.io/count": "8 GPUs"}}}
PERMANENT: list[tuple[str, str, Callable[[ApiClient], object], str]] = [
    ("401: no valid token", "wrong-token", lambda k: k.get(NODES, NODE), "credentials (401)"),
    (
        "403: a token without patch",
        "reader-token",
        lambda k: k.merge_patch(NODES, NODE, LABELS_8),
        "grant the agent's ClusterRole `patch`",
    ),
    (
        "404: a missing node",
        "agent-token",
        lambda k: k.merge_patch(NODES, "absent", LABELS_8),
        "check --node",
    ),
    (
        "422: a label value the apiserver refuses",
        "agent-token",
        lambda k: k.merge_patch(NODES, NODE, BAD_LABEL),
        "refused the metadata (422)",
    ),
]


@pytest.mark.parametrize(
    ("token", "call", "message"), [c[1:] for c in PERMANENT], ids=[c[0] for c in PERMANENT]
)
def test_permanent_refusals_say_what_to_fix(
    apiserver: ApiServerDouble,
    kubeconfig_with_token: Callable[[str], Path],
    token: str,
    call: Callable[[ApiClient], object],
    message: str,
    node_client: ApiClientFactory,
) -> None:
    apiserver.tokens["reader-token"] = frozenset({"get nodes"})
    kube = client(node_client, kubeconfig_with_token(token))
    with pytest.raises(ApiPermanentError, match=re.escape(message)):
        call(kube)


def test_a_node_that_does_not_exist_reads_as_none(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    assert client(node_client, kubeconfig).get(NODES, "absent") is None


def test_a_422_message_carries_the_apiservers_causes(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    with pytest.raises(ApiPermanentError) as e:
        client(node_client, kubeconfig).merge_patch(
            NODES, NODE, {"metadata": {"annotations": {"gpu.topology.io/big": "x" * 262_144}}}
        )
    assert e.value.status == 422
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in str(e.value)


def test_no_error_message_contains_the_token(
    apiserver: ApiServerDouble,
    apiserver_certificate: Certificate,
    tmp_path: Path,
    node_client: ApiClientFactory,
) -> None:
    secret = "s3cr3t-token-value"
    config = write_kubeconfig(
        tmp_path / "kc", apiserver.url, secret, ca_cert=apiserver_certificate.cert
    )
    with pytest.raises(PublishError) as e:
        client(node_client, config).get(NODES, NODE)
    assert secret not in str(e.value)
    assert secret not in repr(e.value.__cause__)


def test_an_unreadable_kubeconfig_is_a_credentials_error_naming_the_path(tmp_path: Path) -> None:
    """The lean client's words for it, so every command says one thing (test_publish_rest.py)."""
    path = tmp_path / "absent.kubeconfig"
    with pytest.raises(CredentialsError, match=f"from {path} \\(FileNotFoundError\\): pass"):
        load_configuration(str(path))


def test_the_kubeconfig_kubeconfig_names_is_the_one_read_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as the command runs, not as the client module was imported."""
    path = tmp_path / "from-the-environment.kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CredentialsError, match=f"from {path} "):
        load_configuration(None)


# -- a kubeconfig user with both `token` and `tokenFile` ------------------------------------------


def token_and_file(kubeconfig: Path, apiserver: ApiServerDouble) -> Path:
    """Give the kubeconfig's user an inline token and a token file, each known to the double."""
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["users"][0]["user"] = {"token": "inline-token", "tokenFile": "token"}
    kubeconfig.write_text(yaml.safe_dump(doc))
    token_file = kubeconfig.parent / "token"
    token_file.write_text("file-token\n")
    apiserver.tokens["file-token"] = AGENT_PERMISSIONS
    apiserver.tokens["inline-token"] = AGENT_PERMISSIONS
    del apiserver.tokens["agent-token"]
    return token_file


def rotate(token_file: Path, token: str) -> None:
    """As the kubelet swaps a projected token: a new file renamed over the old one."""
    new = token_file.with_name("token.new")
    new.write_text(token)
    new.replace(token_file)


def test_with_a_token_and_a_token_file_the_file_wins_and_is_read_again_as_in_client_go(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    token_file = token_and_file(kubeconfig, apiserver)
    kube = client(node_client, kubeconfig)
    del apiserver.tokens["inline-token"]
    assert get_node(kube)["metadata"]["name"] == NODE
    rotate(token_file, "rotated-token")
    apiserver.tokens["rotated-token"] = AGENT_PERMISSIONS
    del apiserver.tokens["file-token"]
    assert get_node(kube)["metadata"]["name"] == NODE


def test_a_token_file_that_cannot_be_read_leaves_its_last_good_token_in_use(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    token_file = token_and_file(kubeconfig, apiserver)
    kube = client(node_client, kubeconfig)
    del apiserver.tokens["inline-token"]
    assert get_node(kube)["metadata"]["name"] == NODE
    token_file.unlink()
    assert get_node(kube)["metadata"]["name"] == NODE
    rotate(token_file, "")
    assert get_node(kube)["metadata"]["name"] == NODE  # client-go refuses an empty token file too


def test_the_inline_token_stands_in_until_the_token_file_can_be_read(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    token_file = token_and_file(kubeconfig, apiserver)
    token_file.unlink()
    kube = client(node_client, kubeconfig)
    del apiserver.tokens["file-token"]
    assert get_node(kube)["metadata"]["name"] == NODE
    rotate(token_file, "file-token")
    apiserver.tokens["file-token"] = AGENT_PERMISSIONS
    del apiserver.tokens["inline-token"]
    assert get_node(kube)["metadata"]["name"] == NODE


class AnswerLost:
    """A double around a real ApiClient: its first merge patch reaches the server and the answer
    is lost, as a connection reset after forwarding loses it (tests/support/fault_proxy.py shows the
    real server and clients doing so)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def merge_patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = self._api.merge_patch(*args, **kwargs)
        if not self.lost:
            self.lost += 1
            raise ApiTransientError("patch node gpu-node-1: the connection was cut")
        return answer


def test_a_patch_whose_answer_was_lost_is_a_write_once_the_node_shows_it(
    apiserver: ApiServerDouble, kubeconfig: Path, node_client: ApiClientFactory
) -> None:
    api = AnswerLost(client(node_client, kubeconfig))
    sink = NodePatchSink(
        cast(ApiClient, api),
        node=NODE,
        prefix="gpu.topology.io",
        stop=threading.Event(),
        backoff=FAST,
        log=structlog.get_logger(),
    )
    want = desired({"gpu.topology.io/count": "8"}, {}, "gpu.topology.io")
    # True: the agent posts its "published" Event, though the second read found nothing to send.
    assert sink.publish(want) is True
    assert api.lost == 1
    assert [r.method for r in apiserver.writes(f"/api/v1/nodes/{NODE}")] == ["PATCH"]
    assert sink.publish(want) is False


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--all", "--kubeconfig", "/nonexistent"],
        ["run", "--kubeconfig", "EXEC", "--once"],
    ],
    ids=["the doctor", "an agent whose kubeconfig only the official client reads"],
)
def test_without_the_official_client_a_command_that_needs_it_says_so_in_one_line(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The image leaves `kubernetes` out (image/lock.py). Its absence is injected here (a None in
    sys.modules makes `import kubernetes` fail as an uninstalled package does); the image test runs
    the same commands in the real image."""
    from reporter import cli  # noqa: PLC0415  # imported after the fault is in place

    exec_kubeconfig = tmp_path / "exec.kubeconfig"
    exec_kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"exec": {"command": "true"}}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    argv = [str(exec_kubeconfig) if a == "EXEC" else a for a in argv]
    if argv[0] == "run":
        argv += ["--simulate", "dgx-h100", "--node", NODE]
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    monkeypatch.delitem(sys.modules, "reporter.publish.kube", raising=False)
    # `from reporter.publish import kube` finds a loaded submodule as the package's attribute.
    monkeypatch.delattr(reporter.publish, "kube", raising=False)
    assert cli.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "this needs the official kubernetes client, which is not installed (the topo-reporter "
        "image leaves it out: docs/image.md): it serves exec and auth-provider kubeconfigs, "
        "`doctor` and `kubectl gpu-topology`; pip install 'kubernetes>=29' here, or run it where "
        "`pip install topo-reporter` installed it"
    ), err
