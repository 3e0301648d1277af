"""A fault-injecting proxy on loopback in front of the real kube-apiserver (tests/controlplane).

It is not a double of the server: every request it does not fault is forwarded to the real
kube-apiserver and the server's own answer is relayed unchanged, streamed watches included (the
body is relayed chunk by chunk as it arrives). The test plans faults for the requests it names:

- `Reply(429, retry_after="1")`, `Reply(503)`: answer with that status and a `metav1.Status` body
  instead of forwarding;
- `Reset.BEFORE_BODY`, `Reset.AFTER_REQUEST`: close the connection with a TCP reset (SO_LINGER 0)
  before the request body is read, or after it is read and before it is forwarded: the server never
  sees the request;
- `Reset.AFTER_FORWARD`: forward, then reset instead of relaying the answer: the server acted on
  the request and the client never hears how;
- `Reset.MID_RESPONSE`: forward, relay the status, headers and the first piece of the body, then
  reset (a watch cut after its first events, a read cut short);
- `Delay(seconds)`: wait, then forward (a server slower than the client's read timeout; the request
  still reaches the server after the client has given up on it);
- `Lag(seconds)`: forward, relay the status and headers at once, and each piece of the body
  `seconds` after it came (a watch whose events reach its client late: a client slower than the
  server's other clients).

Every request is recorded (`requests`): method, path, the status the client got, the status the
real server answered, the fault injected if any, whether the answer reached the client.

TLS, both ways. Toward the client the proxy serves a certificate for IP 127.0.0.1 that it makes
with `openssl` (self-signed: the proxy kubeconfig trusts it as its CA). Toward the server it
verifies the apiserver's CA from the admin kubeconfig. The client's `Authorization` header is
passed through unchanged. A client certificate cannot be passed through a TLS-terminating proxy:
a client that presents one the apiserver's CA signed (the harness issues only the admin's) is
forwarded with the admin's client certificate, so the identity the server sees is the admin's; a
client without one is forwarded without a client certificate.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import http.client
import json
import re
import socket
import ssl
import struct
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.support.kube_double.tls import make_certificate

UPSTREAM_TIMEOUT_S = 60.0
"""A plain request the real server has not answered in this long is a hung test."""
WATCH_UPSTREAM_TIMEOUT_S = 600.0
"""A watch waits for events up to the client's timeoutSeconds; stop() ends it sooner."""
RELAY_PIECE_BYTES = 64 * 1024
SETTLE_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0

# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own business on each side.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer `status` (a `metav1.Status` as the apiserver writes it) instead of forwarding."""

    status: int
    retry_after: str | None = None

    def __str__(self) -> str:
        after = f" Retry-After: {self.retry_after}" if self.retry_after is not None else ""
        return f"{self.status}{after}"


class Reset(enum.Enum):
    """When to close the client's connection with a TCP reset."""

    BEFORE_BODY = "reset before the body"
    AFTER_REQUEST = "reset after the request"
    AFTER_FORWARD = "reset after forwarding"
    MID_RESPONSE = "reset mid-response"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Delay:
    """Wait `seconds`, then forward."""

    seconds: float

    def __str__(self) -> str:
        return f"delay {self.seconds:g} s"


@dataclass(frozen=True, slots=True)
class Lag:
    """Forward, and relay each piece of the answer's body `seconds` after it came."""

    seconds: float

    def __str__(self) -> str:
        return f"lag {self.seconds:g} s"


Fault = Reply | Reset | Delay | Lag


@dataclass
class _Rule:
    method: str
    path: re.Pattern[str]
    query: re.Pattern[str] | None
    fault: Fault
    remaining: int


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request as the proxy handled it."""

    method: str
    path: str
    """Without the query."""
    query: str
    injected: Fault | None
    status: int | None
    """What the proxy answered (the client may have left before it came); None when it reset
    the connection before any answer."""
    upstream: int | None
    """What the real server answered; None when the request was not forwarded."""
    delivered: bool
    """Whether the whole answer was written to the client."""


class FaultProxy:
    """Start it on the admin kubeconfig; `kubeconfig()` points a client at it; `inject()` faults."""

    def __init__(self, admin_kubeconfig: Path, workdir: Path) -> None:
        self._workdir = workdir
        admin = yaml.safe_load(admin_kubeconfig.read_text())
        (cluster,) = (c["cluster"] for c in admin["clusters"])
        (user,) = (u["user"] for u in admin["users"])
        self._ca_pem = base64.b64decode(cluster["certificate-authority-data"])
        self._cert_pem = base64.b64decode(user["client-certificate-data"])
        self._key_pem = base64.b64decode(user["client-key-data"])
        upstream = urlsplit(cluster["server"])
        self._upstream_host = upstream.hostname or "127.0.0.1"
        self._upstream_port = upstream.port or 443
        self._with_cert, self._without_cert = self._upstream_contexts()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._rules: list[_Rule] = []
        self._exchanges: list[Exchange] = []
        self._open_upstream: set[http.client.HTTPSConnection] = set()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._port = 0
        self._thread: threading.Thread | None = None
        self.certificate = make_certificate(workdir)

    # -- the test's side ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._port, "start() the proxy first"
        return f"https://127.0.0.1:{self._port}"

    def inject(
        self, method: str, path: str, fault: Fault, *, times: int = 1, query: str | None = None
    ) -> None:
        """The next `times` requests whose method is `method`, whose path (without the query)
        fully matches the regex `path` and whose query contains a match of the regex `query` get
        `fault`; rules are tried in the order given."""
        pattern = re.compile(query) if query is not None else None
        with self._lock:
            self._rules.append(_Rule(method.upper(), re.compile(path), pattern, fault, times))

    def requests(self, method: str | None = None, path: str | None = None) -> list[Exchange]:
        """The exchanges so far, in the order they ended; optionally those matching `method` and
        the regex `path`."""
        pattern = re.compile(path) if path is not None else None
        with self._lock:
            return [
                e
                for e in self._exchanges
                if (method is None or e.method == method.upper())
                and (pattern is None or pattern.fullmatch(e.path))
            ]

    def unused(self) -> list[str]:
        """The faults planned but not (all) served yet."""
        with self._lock:
            return [f"{r.method} {r.path.pattern}: {r.fault} x{r.remaining}" for r in self._rules]

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Wait until no request is in flight (a delayed one reaches the server after its client
        gave up on it: its effect must land before the test reads the server)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout_s):
                raise TimeoutError(f"{self._in_flight} proxied requests still in flight")

    def kubeconfig(self, path: Path, *, exec_plugin: bool = False) -> Path:
        """A kubeconfig for the proxy: its certificate as the CA, the admin's client certificate.

        `exec_plugin`: the certificate comes from an exec credential plugin, as client-go's
        plugins can hand one out; only the official client runs plugins, so the agent uses it."""
        user: dict[str, Any]
        if exec_plugin:
            credential = {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "kind": "ExecCredential",
                "status": {
                    "clientCertificateData": self._cert_pem.decode(),
                    "clientKeyData": self._key_pem.decode(),
                },
            }
            user = {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": sys.executable,
                    "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
                    "interactiveMode": "Never",
                }
            }
        else:
            user = {
                "client-certificate-data": base64.b64encode(self._cert_pem).decode(),
                "client-key-data": base64.b64encode(self._key_pem).decode(),
            }
        ca = base64.b64encode(self.certificate.cert.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "proxy",
                    "cluster": {"server": self.url, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": "proxy", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self) -> FaultProxy:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate.cert, self.certificate.key)
        # Asked for, not required: a token client has none. The apiserver's CA signs the admin's.
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cadata=self._ca_pem.decode())
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        server.block_on_close = False
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._server, self._port = server, server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            upstream = list(self._open_upstream)
        for connection in upstream:
            # A relayed watch blocks reading the server: cutting its socket ends it.
            with contextlib.suppress(OSError):
                if connection.sock is not None:
                    connection.sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
        # Each exchange is recorded when its handler ends: let the cut ones end.
        with contextlib.suppress(TimeoutError):
            self.settle(STOP_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the proxy's side ----------------------------------------------------------------------

    def _upstream_contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        with_cert = ssl.create_default_context(cadata=self._ca_pem.decode())
        cert, key = self._workdir / "upstream-client.crt", self._workdir / "upstream-client.key"
        cert.write_bytes(self._cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self._key_pem)
        with_cert.load_cert_chain(cert, key)
        return with_cert, ssl.create_default_context(cadata=self._ca_pem.decode())

    def _take(self, method: str, path: str, query: str) -> Fault | None:
        with self._lock:
            for rule in self._rules:
                if (
                    rule.method == method
                    and rule.path.fullmatch(path)
                    and (rule.query is None or rule.query.search(query))
                ):
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
                    return rule.fault
            return None

    def _begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def _end(self, exchange: Exchange) -> None:
        with self._lock:
            self._exchanges.append(exchange)
            self._in_flight -= 1
            self._idle.notify_all()

    def _connect(self, client_certified: bool, watch: bool) -> http.client.HTTPSConnection:
        connection = http.client.HTTPSConnection(
            self._upstream_host,
            self._upstream_port,
            context=self._with_cert if client_certified else self._without_cert,
            timeout=WATCH_UPSTREAM_TIMEOUT_S if watch else UPSTREAM_TIMEOUT_S,
        )
        with self._lock:
            self._open_upstream.add(connection)
        return connection

    def _disconnect(self, connection: http.client.HTTPSConnection) -> None:
        with self._lock:
            self._open_upstream.discard(connection)
        connection.close()


def _status_body(status: int, message: str, retry_after: str | None) -> bytes:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(status, "Unknown"),
        "code": status,
    }
    if retry_after is not None and retry_after.isdigit():
        body["details"] = {"retryAfterSeconds": int(retry_after)}
    return json.dumps(body).encode()


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            # Quiet: the test reads proxy.requests() instead.
            return

        def _serve(self) -> None:
            path, _, query = self.path.partition("?")
            method = self.command
            fault = proxy._take(method, path, query)
            proxy._begin()
            status: int | None = None
            upstream: int | None = None
            delivered = False
            try:
                if fault is Reset.BEFORE_BODY:
                    self._reset()
                    return
                body = self._body()
                if isinstance(fault, Reply):
                    status = fault.status
                    delivered = self._reply(fault)
                    return
                if fault is Reset.AFTER_REQUEST:
                    self._reset()
                    return
                if isinstance(fault, Delay) and proxy._stopping.wait(fault.seconds):
                    self._reset()
                    return
                upstream, status, delivered = self._forward(method, body, fault)
            finally:
                proxy._end(Exchange(method, path, query, fault, status, upstream, delivered))

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve  # noqa: N815

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _reset(self) -> None:
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # The socket's fd closes when its last file object does: close rfile as well, now.
            self.rfile.close()
            self.connection.close()

        def _reply(self, fault: Reply) -> bool:
            payload = _status_body(
                fault.status, f"injected by the fault proxy: {fault}", fault.retry_after
            )
            try:
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if fault.retry_after is not None:
                    self.send_header("Retry-After", fault.retry_after)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                self.close_connection = True
                return False
            return True

        def _forward(
            self, method: str, body: bytes, fault: Fault | None
        ) -> tuple[int, int | None, bool]:
            """(the server's status, the status the client got, whether it got it all)."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers.pop("Host", None)
            certified = bool(self.connection.getpeercert())
            watch = "watch=1" in self.path or "watch=true" in self.path
            connection = proxy._connect(certified, watch)
            try:
                connection.request(method, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                if fault is Reset.AFTER_FORWARD:
                    response.read()
                    self._reset()
                    return response.status, None, False
                return response.status, response.status, self._relay(response, fault)
            finally:
                proxy._disconnect(connection)

        def _relay(self, response: http.client.HTTPResponse, fault: Fault | None) -> bool:
            length = response.getheader("Content-Length")
            try:
                # The server's own Date (and no Server header of the proxy's).
                self.send_response_only(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                if length is None:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while piece := response.read1(RELAY_PIECE_BYTES):
                    if isinstance(fault, Lag) and proxy._stopping.wait(fault.seconds):
                        self.close_connection = True
                        return False
                    if length is None:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    else:
                        self.wfile.write(piece)
                    if fault is Reset.MID_RESPONSE:
                        self._reset()
                        return False
                if length is None:
                    self.wfile.write(b"0\r\n\r\n")
            except (OSError, http.client.HTTPException):
                # The client left (it timed out), or stop() cut the server's side of a watch.
                self.close_connection = True
                return False
            return True

    return Handler
