"""The extender over HTTPS (issue 19, item 7): kube-scheduler's `enableHTTPS` with `tlsConfig`.

Certificates are throwaway ones from `openssl`; clients are Python's ssl with verification on, as
kube-scheduler's Go client verifies with `tlsConfig.caFile`. A renewed certificate is written over
the files, as a Secret volume or cert-manager does, and the next connection must see it.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import shutil
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from reporter.cli import main
from reporter.errors import ConfigError
from reporter.extender.cache import NodeCache
from reporter.extender.server import LIMITS, ExtenderMetrics, ExtenderServer
from reporter.serve.tls import ServingCertificate
from tests.extender.test_protocol import pod
from tests.support.kube_double.tls import Certificate, make_certificate

WAIT_S = 10.0
BODY = json.dumps({"Pod": pod(1), "NodeNames": ["a"]}).encode()


def certificate(tmp_path: Path, name: str) -> Certificate:
    directory = tmp_path / name
    directory.mkdir()
    return make_certificate(directory)


@pytest.fixture
def files(tmp_path: Path) -> Certificate:
    """Where the extender reads its certificate and key, as a Secret volume mounts them."""
    first = certificate(tmp_path, "first")
    served = Certificate(tmp_path / "tls.crt", tmp_path / "tls.key")
    shutil.copy(first.cert, served.cert)
    shutil.copy(first.key, served.key)
    return served


Serve = Callable[..., ExtenderServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    started: list[ExtenderServer] = []

    def start(tls: ServingCertificate, **limits: Any) -> ExtenderServer:
        cache = NodeCache("gpu.topology.io")
        server = ExtenderServer(
            ("127.0.0.1", 0),
            cache=cache,
            metrics=ExtenderMetrics(cache),
            tls=tls.context,
            limits=dataclasses.replace(LIMITS, **limits),
        ).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def client_context(ca: Path, client: Certificate | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def call(server: ExtenderServer, context: ssl.SSLContext) -> tuple[int, bytes, bytes]:
    """POST /filter over HTTPS: the status, the body and the certificate the server showed."""
    host, port = server.address
    connection = http.client.HTTPSConnection(host, port, timeout=WAIT_S, context=context)
    try:
        connection.request("POST", "/filter", BODY)
        response = connection.getresponse()
        sock = connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        shown = sock.getpeercert(binary_form=True) or b""
        return response.status, response.read(), shown
    finally:
        connection.close()


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_the_verbs_are_served_over_https_to_a_client_that_verifies(
    serve: Serve, files: Certificate
) -> None:
    server = serve(ServingCertificate(str(files.cert), str(files.key)))
    status, body, shown = call(server, client_context(files.cert))
    assert status == 200
    assert json.loads(body)["NodeNames"] == ["a"]
    assert shown == der(files.cert)
    host, port = server.address
    with socket.create_connection((host, port), timeout=WAIT_S) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not plain.recv(4096).startswith(b"HTTP/")  # a TLS alert, not an answer


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset) before WAIT_S passed."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_in_their_handshake_count_against_the_cap(
    serve: Serve, files: Certificate
) -> None:
    # Issue 28, item 3: a connection counted only once its handshake was done, and each one
    # accepted costs a 256 KiB buffer from the start: 1,000 silent ones took 339 MiB. With a
    # handshake deadline of a minute, none of these would be closed before it.
    server = serve(
        ServingCertificate(str(files.cert), str(files.key)), max_connections=4, header_timeout_s=60
    )
    silent = [socket.create_connection(server.address, timeout=WAIT_S) for _ in range(10)]
    # The server holds at most the cap: each new one took the place of the oldest silent one
    # (the real client's, below, of one more).
    assert all(closed_by_server(sock) for sock in silent[:6])
    status, _, _ = call(server, client_context(files.cert))  # and a real client gets in
    assert status == 200
    for sock in silent[7:]:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1)  # never more closed than the cap needs
    for sock in silent:
        sock.close()


def test_a_client_that_never_says_hello_is_closed_at_the_head_deadline(
    serve: Serve, files: Certificate
) -> None:
    server = serve(ServingCertificate(str(files.cert), str(files.key)), header_timeout_s=0.5)
    with socket.create_connection(server.address, timeout=WAIT_S) as silent:
        assert closed_by_server(silent)


def test_a_renewed_certificate_is_served_from_the_next_connection_on(
    serve: Serve, files: Certificate, tmp_path: Path
) -> None:
    server = serve(ServingCertificate(str(files.cert), str(files.key)))
    old = files.cert.read_bytes()
    renewed = certificate(tmp_path, "renewed")
    # Written as a Secret volume renews: new files, swapped in by rename.
    for source, target in ((renewed.key, files.key), (renewed.cert, files.cert)):
        shutil.copy(source, f"{target}.new")
        os.replace(f"{target}.new", target)
    with capture_logs() as logs:
        status, _, shown = call(server, client_context(renewed.cert))
    assert status == 200
    assert shown == der(renewed.cert) != ssl.PEM_cert_to_DER_cert(old.decode())
    assert [e["event"] for e in logs] == ["tls_certificate_reloaded"]


def test_a_renewal_that_does_not_load_keeps_the_last_good_certificate(
    serve: Serve, files: Certificate, tmp_path: Path
) -> None:
    server = serve(ServingCertificate(str(files.cert), str(files.key)))
    good = files.cert.read_text()
    other = certificate(tmp_path, "other")
    shutil.copy(other.key, files.key)  # half-way through a renewal: the key of another cert
    with capture_logs() as logs:
        first = call(server, client_context(files.cert))
        second = call(server, client_context(files.cert))
    assert first[0] == second[0] == 200
    assert first[2] == second[2] == ssl.PEM_cert_to_DER_cert(good)
    # Said once, not at every connection.
    assert [e["event"] for e in logs] == ["tls_certificate_not_reloaded"]
    assert "do not load" in logs[0]["error"]


def test_with_a_client_ca_only_a_client_it_signed_gets_in(
    serve: Serve, files: Certificate, tmp_path: Path
) -> None:
    scheduler = certificate(tmp_path, "scheduler")
    stranger = certificate(tmp_path, "stranger")
    server = serve(
        ServingCertificate(str(files.cert), str(files.key), client_ca_file=str(scheduler.cert))
    )
    assert call(server, client_context(files.cert, scheduler))[0] == 200
    for client in (None, stranger):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            call(server, client_context(files.cert, client))


def test_a_client_ca_still_applies_after_a_renewal(
    serve: Serve, files: Certificate, tmp_path: Path
) -> None:
    scheduler = certificate(tmp_path, "scheduler")
    server = serve(
        ServingCertificate(str(files.cert), str(files.key), client_ca_file=str(scheduler.cert))
    )
    renewed = certificate(tmp_path, "renewed")
    shutil.copy(renewed.key, files.key)
    shutil.copy(renewed.cert, files.cert)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        call(server, client_context(renewed.cert))
    assert call(server, client_context(renewed.cert, scheduler))[2] == der(renewed.cert)


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (("missing.crt", "tls.key"), "cannot read TLS file"),
        (("tls.key", "tls.crt"), "do not load"),
        (("/dev/zero", "tls.key"), "larger than 1 MiB"),
    ],
    ids=["a missing certificate", "certificate and key swapped", "a file without an end"],
)
def test_tls_files_that_do_not_load_are_one_config_error(
    tmp_path: Path, files: tuple[str, str], said: str
) -> None:
    pair = make_certificate(tmp_path)
    shutil.copy(pair.cert, tmp_path / "tls.crt")
    shutil.copy(pair.key, tmp_path / "tls.key")
    cert, key = (str(tmp_path / f) for f in files)
    with pytest.raises(ConfigError, match=said) as refused:
        ServingCertificate(cert, key)
    assert "\n" not in str(refused.value)


def test_the_cli_needs_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pair = make_certificate(tmp_path)
    status = main(["extender", "--listen", "127.0.0.1:0", "--tls-cert-file", str(pair.cert)])
    assert status == 2
    assert capsys.readouterr().err == (
        "topo-reporter: error: TLS needs both --tls-cert-file and --tls-key-file\n"
    )
