"""The one HTTP server of the agent (health, metrics) and of the extender (its verbs too).

uvicorn, on the h11 parser, serves in a thread of its own with its own event loop; the handlers are
plain functions from a `Request` to a `Response`, which know nothing of HTTP framing. Why uvicorn:
measured against waitress in bench/README.md ("HTTP server"), and the only one of the two that
serves TLS. What it brings: h11's strict framing (a `Content-Length` of anything but ASCII digits,
or of more than 20 digits, is a 400), non-blocking TLS, a listen backlog, and asyncio's accept
loop, which waits a second at the file-descriptor limit instead of spinning. What this module adds,
because a process that any pod can reach must outlive any client:

- at most `max_connections` connections (and fewer than the file-descriptor limit), counted from
  accept, before any TLS handshake (asyncio gives each TLS connection a 256 KiB buffer then). At
  the cap a new connection takes the place of the oldest idle one (no request, a head still
  incomplete, or a body still arriving: what a silent or stalled client holds), so that probes
  and the scheduler's calls get in; with none idle, accepting pauses and the next connections
  wait in the listen backlog until one closes or turns idle;
- a request head must arrive within `header_timeout_s` of the connection (or of its first byte
  after an answer), a TLS handshake too; an idle keep-alive connection closes after `idle_s`;
- a head over 16 KiB is refused: h11 refuses one still incomplete at 16 KiB (400), and a longer
  one that came in one read is answered 431 here;
- a body must state its length (411), stay within `max_body_bytes` (413) and arrive within
  `body_timeout_s` (408); `Content-Length` with `Transfer-Encoding` is a 400 (request smuggling,
  RFC 9112 section 6.1). Bodies being read, and read ones waiting for a slot, share
  `buffered_bodies` times `max_body_bytes` of memory, counted by the bytes that came: a client
  that sends nothing costs nothing; one more byte past that is a 503;
- at most `concurrent_requests` requests with a body handled at once, a slot taken only once the
  body is read whole, so that a slow or stalled client holds none; a read body waits up to
  `slot_wait_s` for a slot, then is answered 503. Memory is bounded by the slots times what one
  body costs to answer, plus the bodies' share above.

A GET without a body (health, metrics) is never queued behind the verbs. It is answered on the
loop, except on the `offloaded` paths (the extender's /metrics): those are built in one thread of
their own, never on the loop, and at most once per `OFFLOADED_EVERY_S`; every request waits for
the first build that starts after it came, and shares it with the others that came meanwhile.
So however many clients loop on such a path, it costs a bounded share of the process (issue
41, item 5), and no answer is older than its request.

A handler's exception is a 500 with one line, logged; it never reaches the client or kills the
server. Nothing here reads cluster state: the handlers do.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from parsers.errors import ParseError
from parsers.integers import parse_decimal

TEXT = "text/plain; charset=utf-8"
_FD_RESERVE = 64
"""File descriptors kept out of the connection cap: the API client, log files, TLS files."""
_STOP_WAIT_S = 5.0
MAX_HEAD_BYTES = 16 * 1024
"""A request head's size, as h11 counts it while the head is incomplete (its default)."""
OFFLOADED_EVERY_S = 0.1
"""The least time between the starts of two builds of an offloaded path's answer: ten a second
at most, whatever the number of clients (a scraper asks every 15 to 60 s)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may cost the server. Every field is a bound, not a target."""

    max_body_bytes: int = 64 * 1024
    """Largest request body read; a larger `Content-Length` is answered 413 unread."""
    concurrent_requests: int = 4
    """Requests with a body handled at once, each from the moment its body is read whole."""
    slot_wait_s: float = 1.0
    """How long a read body waits for a slot before it is answered 503."""
    buffered_bodies: int = 4
    """Bodies of `max_body_bytes` that fit in what bodies being read or waiting for a slot may
    hold together (counted by the bytes that came); one byte more is answered 503."""
    max_connections: int = 1024
    """Open connections, counted from accept; at the cap a new one replaces the oldest idle one,
    and with none idle the next ones wait in the listen backlog."""
    header_timeout_s: float = 10.0
    """From a connection (or the first byte of its next request) to a complete request head."""
    body_timeout_s: float = 10.0
    """From a complete request head to a complete body."""
    idle_s: float = 60.0
    """A keep-alive connection with no request for this long is closed (Go's client: 90 s)."""
    backlog: int = 1024
    """Connections the kernel queues before they are accepted."""


@dataclass(frozen=True, slots=True)
class Request:
    """What a handler sees of one request: no headers, since none of ours needs any."""

    method: str
    path: str
    """The path without the query string."""
    body: bytes


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = TEXT


def text(status: int, line: str) -> Response:
    """A one-line plain-text answer."""
    return Response(status, (line + "\n").encode())


Handler = Callable[[Request], Response]


class HttpServer:
    """Serves `handler` on `address`; bound (and listening) once constructed.

    Raises OSError when the address cannot be bound.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler: Handler,
        *,
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        name: str = "topo-reporter-http",
        log: structlog.typing.FilteringBoundLogger | None = None,
        too_large_hint: str = "",
        on_refused: Callable[[Request, int], None] = lambda request, status: None,
        offloaded: frozenset[str] = frozenset(),
    ) -> None:
        """`offloaded`: the paths whose GET is built off the loop, shared, and at most once per
        OFFLOADED_EVERY_S."""
        self._handler = handler
        self._offloaded = offloaded
        # The loop's own, by method and path: the build the next requests share (not started
        # yet), and when the last one started (the loop's clock).
        self._next_build: dict[tuple[str, str], asyncio.Task[Response]] = {}
        self._built_at: dict[tuple[str, str], float] = {}
        self._limits = limits
        self._too_large_hint = too_large_hint
        self._on_refused = on_refused
        self._log = log or structlog.get_logger("topo_reporter.http")
        self._socket = _listen(address, limits.backlog)
        # The loop's own counts, read from other threads (one int each).
        self._in_flight = 0  # requests holding a slot
        self._waiting = 0  # read bodies waiting for a slot
        self._buffered = 0  # bytes of bodies being read or waiting for a slot
        self._busy_at = -float("inf")  # when a request was last refused for want of room
        self._slots = asyncio.Semaphore(limits.concurrent_requests)
        self._pool = ThreadPoolExecutor(limits.concurrent_requests, thread_name_prefix=name)
        self._builder = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-get")
        self._loop = _Loop(limits.header_timeout_s, _connection_cap(limits.max_connections))
        _quiet_uvicorn(self._log)
        config = uvicorn.Config(
            self._asgi,
            http=_protocol(limits),
            interface="asgi3",
            proxy_headers=False,
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            backlog=limits.backlog,
            timeout_keep_alive=max(1, round(limits.idle_s)),
            timeout_graceful_shutdown=1,
            ssl_context_factory=None if tls is None else lambda config, default: tls,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def connections(self) -> int:
        """Open connections, those in a TLS handshake too."""
        return len(self._loop.open)

    @property
    def in_flight(self) -> int:
        """Requests holding a slot (at most `concurrent_requests`)."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Read bodies waiting for a slot."""
        return self._waiting

    def busy_within(self, seconds: float) -> bool:
        """Whether a request was refused for want of a slot or of room for its body in the last
        `seconds`: the server is starved, by load or by clients that hold what it has."""
        return time.monotonic() - self._busy_at < seconds

    def start(self) -> HttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and the connections; returns within a few seconds."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(_STOP_WAIT_S)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()  # never started: the thread that closes it never ran
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._builder.shutdown(wait=False, cancel_futures=True)
        self._socket.close()

    def _serve(self) -> None:
        loop = self._loop
        loop.set_exception_handler(self._loop_error)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._socket]))
        finally:
            loop.close()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio's default handler prints a traceback to stderr; at the file-descriptor limit
        # that is once a second. One structured line instead.
        error = context.get("exception")
        self._log.warning(
            "http_server_error", error=str(context.get("message")), cause=repr(error)[:200]
        )

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        response, close = await self._answer(scope, receive)
        if close:
            # Refused before the handler saw it: the handler's metrics never count it.
            refused = Request(str(scope["method"]), str(scope["path"]), b"")
            self._on_refused(refused, response.status)
        headers = [
            (b"content-type", response.content_type.encode()),
            (b"content-length", str(len(response.body)).encode()),
        ]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    async def _answer(self, scope: Any, receive: Any) -> tuple[Response, bool]:
        """The response, and whether the connection must close after it (a body left unread)."""
        method, path = str(scope["method"]), str(scope["path"])
        if _head_bytes(scope) > MAX_HEAD_BYTES:
            # h11 bounds only a head still incomplete: one that came whole in one read gets here.
            return text(431, f"the request head is over {MAX_HEAD_BYTES} bytes"), True
        headers: dict[bytes, bytes] = dict(scope["headers"])
        if b"transfer-encoding" in headers and b"content-length" in headers:
            return text(400, "Content-Length and Transfer-Encoding together: send one"), True
        length_text = headers.get(b"content-length")
        if method in ("GET", "HEAD") and length_text in (None, b"0"):
            # Health and metrics: never queued behind the verbs; cheap ones on the loop.
            request = Request(method, path, b"")
            if path in self._offloaded:
                return await self._shared(request), False
            return self._handle(request), False
        if length_text is None:
            return text(411, "the request must state its Content-Length"), True
        try:
            # h11 let through only ASCII digits, at most 20 of them.
            length = parse_decimal(length_text.decode("ascii"), field="Content-Length")
        except (ParseError, UnicodeDecodeError):
            return text(400, "Content-Length is not a number"), True
        if length > self._limits.max_body_bytes:
            line = f"the body is {length} bytes, more than {self._limits.max_body_bytes}"
            return text(413, line + self._too_large_hint), True
        body = await self._read_and_wait(receive)
        if isinstance(body, Response):
            return body, True
        try:
            self._in_flight += 1
            request = Request(method, path, body)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._handle, request), False
        finally:
            self._in_flight -= 1
            self._slots.release()

    async def _shared(self, request: Request) -> Response:
        """The answer to an offloaded GET: the next build to start, shared."""
        key = (request.method, request.path)
        build = self._next_build.get(key)
        if build is None:
            build = self._next_build[key] = asyncio.create_task(self._build(key, request))
        # Shielded: a client that goes away stops its own wait, not the build the others share.
        return await asyncio.shield(build)

    async def _build(self, key: tuple[str, str], request: Request) -> Response:
        loop = asyncio.get_running_loop()
        wait = self._built_at.get(key, -OFFLOADED_EVERY_S) + OFFLOADED_EVERY_S - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        # Started: a request that comes from now on waits for the next build.
        del self._next_build[key]
        self._built_at[key] = loop.time()
        return await loop.run_in_executor(self._builder, self._handle, request)

    async def _read_and_wait(self, receive: Any) -> bytes | Response:
        """The whole body, with a slot taken for it; or the answer that refuses it.

        Until it holds a slot, the body counts against the bodies' share of memory by the bytes
        that came; from then on, against what a slot costs."""
        held = 0
        try:
            chunks: list[bytes] = []
            try:
                async with asyncio.timeout(self._limits.body_timeout_s):
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            return text(400, "the client went away")
                        chunk = message.get("body", b"")
                        if self._buffered + len(chunk) > self._buffer_bytes:
                            self._busy_at = time.monotonic()
                            return text(503, "busy: too many bodies being read at once, retry")
                        self._buffered += len(chunk)
                        held += len(chunk)
                        chunks.append(chunk)
                        if not message.get("more_body", False):
                            break
            except TimeoutError:
                return text(408, "the body did not arrive in time")
            self._waiting += 1
            try:
                async with asyncio.timeout(self._limits.slot_wait_s):
                    await self._slots.acquire()
            except TimeoutError:
                self._busy_at = time.monotonic()
                return text(503, "busy: too many requests at once, retry")
            finally:
                self._waiting -= 1
            return b"".join(chunks)
        finally:
            self._buffered -= held

    @property
    def _buffer_bytes(self) -> int:
        return self._limits.buffered_bodies * self._limits.max_body_bytes

    def _handle(self, request: Request) -> Response:
        try:
            return self._handler(request)
        except Exception:
            # A defect of ours, not of the request: say so in one line, keep serving.
            self._log.exception("http_handler_failed", method=request.method, path=request.path)
            return text(500, "internal error: see the server's log")


def _listen(address: tuple[str, int], backlog: int) -> socket.socket:
    """A listening TCP socket. Raises OSError.

    Made with IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    whose protocol says TCP, and with it on, an answer's head and body (two writes) wait for
    the client's delayed ACK: 40 ms a request.
    """
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def _head_bytes(scope: Any) -> int:
    """The size of a request head as it came (give or take the spaces h11 strips)."""
    target = len(scope["raw_path"]) + len(scope["query_string"]) + 1
    fields = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
    return len(scope["method"]) + target + len(" HTTP/1.1\r\n") + fields + 2


def _connection_cap(wanted: int) -> int:
    """`wanted`, lowered below the file-descriptor limit: the server stops accepting at the cap,
    so it never meets EMFILE on its connections' account."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - _FD_RESERVE))


class _Idle(Protocol):
    """What the loop needs of a connection's protocol to count it and to choose whom to close."""

    made: bool
    """connection_made was called: from then on its connection_lost will be."""

    def idle(self) -> bool: ...


def _protocol(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the request-head deadline, counted in the loop's connections."""

    class Capped(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        made = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.made = True
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                # The first byte of a new request: its head has header_timeout_s to arrive.
                self._arm()
            super().data_received(data)
            if not self.idle() and isinstance(self.loop, _Loop):
                # Now being answered: it can no longer make room, and may have been the last
                # connection that could.
                self.loop.settle()

        def on_response_complete(self) -> None:
            self._disarm()
            super().on_response_complete()
            if isinstance(self.loop, _Loop):
                self.loop.settle()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
            if isinstance(self.loop, _Loop):
                self.loop.forget(self)

        def idle(self) -> bool:
            """Nothing of this connection's is being answered: no request yet, a head still
            incomplete, a body still arriving, or the last answer sent."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._expire, self.cycle)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, cycle: object) -> None:
            self._deadline = None
            if self.cycle is cycle:
                # No request head since the deadline was set: a stalled or trickling client.
                self.transport.close()

    return Capped


class _Loop(asyncio.SelectorEventLoop):
    """asyncio's loop with bounds of its own.

    - The connection cap, counted from accept: a TLS connection costs its 256 KiB buffer from
      then on, not from the end of its handshake, where uvicorn would first see it.
    - At the cap, the oldest idle connection is closed for the new one; with none idle, accepting
      pauses.
    - TLS handshakes (and the closing exchange) get the request-head deadline (asyncio's
      defaults are 60 and 30 s), so that a client that connects and never says hello holds its
      descriptor no longer than one that sends no request.
    - accept() fails once a second at the descriptor limit, not a thousand times.
    """

    def __init__(self, handshake_timeout_s: float, cap: int) -> None:
        super().__init__()
        self._handshake_timeout_s = handshake_timeout_s
        self._cap = cap
        self._listener: tuple[Any, ...] | None = None
        self._paused = False
        self.open: dict[_Idle, asyncio.Transport] = {}
        """The open connections, oldest first."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self._handshake_timeout_s)
            kwargs.setdefault("ssl_shutdown_timeout", self._handshake_timeout_s)
        return await super().create_server(*args, **kwargs)

    async def _accept_connection2(
        self, protocol_factory: Callable[[], Any], *args: Any, **kwargs: Any
    ) -> None:
        # Returns once the connection is made, or once its TLS handshake failed or timed out:
        # then its protocol never hears of it (no connection_lost), and is forgotten here.
        made: list[_Idle] = []

        def factory() -> Any:
            protocol = protocol_factory()
            made.append(protocol)
            return protocol

        try:
            await super()._accept_connection2(factory, *args, **kwargs)  # type: ignore[misc]
        finally:
            for protocol in made:
                if not protocol.made:
                    self.forget(protocol)

    def _make_socket_transport(self, sock: Any, protocol: Any, *args: Any, **kwargs: Any) -> Any:
        transport = super()._make_socket_transport(  # type: ignore[misc]
            sock, protocol, *args, **kwargs
        )
        if kwargs.get("server") is not None:
            self._admit(protocol, transport)
        return transport

    def _make_ssl_transport(self, sock: Any, protocol: Any, *args: Any, **kwargs: Any) -> Any:
        transport = super()._make_ssl_transport(  # type: ignore[misc]
            sock, protocol, *args, **kwargs
        )
        if kwargs.get("server") is not None:
            self._admit(protocol, transport)
        return transport

    def _admit(self, protocol: _Idle, transport: asyncio.Transport) -> None:
        self.open[protocol] = transport
        if len(self.open) > self._cap:
            victim = next((p for p in self.open if p is not protocol and p.idle()), None)
            if victim is not None:
                # Closed at once (a TLS one too: no closing exchange with a silent client).
                self.open.pop(victim).abort()
        self.settle()

    def forget(self, protocol: _Idle) -> None:
        if self.open.pop(protocol, None) is not None:
            self.settle()

    def settle(self) -> None:
        """Accept while under the cap, or while an idle connection can make room."""
        if len(self.open) < self._cap or any(p.idle() for p in self.open):
            self.resume_accepting()
        else:
            self.pause_accepting()

    def _start_serving(
        self, factory: Any, sock: Any, context: Any, server: Any, *rest: Any
    ) -> None:
        # After each wake-up on the listener, asyncio calls accept() up to `backlog` times (its
        # next argument, here 1024); when accept() fails for want of a descriptor it goes on
        # (CPython 3.11 to 3.13), logging each failure and scheduling one more retry for each: a
        # thousand refusals a second at the limit. One accept() per wake-up: one a second. The
        # listen backlog itself is set elsewhere (Server), unchanged. asyncio calls this again to
        # retry after a refusal: while paused, the retry waits for resume_accepting.
        self._listener = (factory, sock, context, server, 1, *rest[1:])
        if not self._paused:
            super()._start_serving(*self._listener)  # type: ignore[misc]

    def pause_accepting(self) -> None:
        """Accept nothing until resume_accepting: connections wait in the listen backlog, where
        they cost the process neither a descriptor nor memory (as Go's LimitListener does)."""
        if self._listener is not None and not self._paused:
            self._paused = True
            self.remove_reader(self._listener[1].fileno())

    def resume_accepting(self) -> None:
        if self._listener is not None and self._paused:
            self._paused = False
            super()._start_serving(*self._listener)  # type: ignore[misc]


def _quiet_uvicorn(log: structlog.typing.FilteringBoundLogger) -> None:
    """uvicorn logs through `logging`: its startup lines and one warning per malformed request
    would be plain text among our JSON lines. Keep its errors, as structured lines, and drop the
    rest (the client got its 400; a flood of them must not become a flood of log lines)."""

    class ToStructlog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log.error("http_server_error", error=record.getMessage()[:500])

    logger = logging.getLogger("uvicorn")
    logger.handlers = [ToStructlog(logging.ERROR)]
    logger.propagate = False
