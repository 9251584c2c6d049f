"""The contributor fast path: HTTP/1.1 POST over asyncio protocols, parsed by httptools.

Why a client of our own. A contribution is one small POST with a JSON answer, eight of them per
preparation. Measured on the project machine (8 loopback servers answering in 20 ms, uvloop):
aiohttp spends ~1.2–1.6 ms of CPU per fan-out of eight, this client ~0.4–0.5 ms, and the
fan-out's latency overhead drops from ~2 ms to ~1.3 ms (``bench/bench_fanout.py`` prints both).
At 128 requests in flight that CPU is what bounds the service on two cores. httpx remains the
client API of the service (``client.py``: respx, the httpx request/response types, the
``AsyncClient`` that tests and tools use); this module only carries the calls of ``calls.py``.

What it does, and nothing more:

* ``POST`` with a ``Content-Length`` body; the answer is framed by ``Content-Length``, chunked
  transfer coding or, without either, the end of the connection (httptools parses the framing).
* Keep-alive pools by ``(scheme, host, port, pinned addresses)``: a connection goes back to its
  pool only after a complete answer that allows keep-alive; anything else (a cap, a deadline, a
  cancel, a bad status, a parse error) closes it, so a half-read answer is never reused. Idle
  connections expire after ``keepalive_expiry`` (4 s: below the 5 s that common servers, uvicorn
  included, keep an idle connection, so we close first).
* Pinning: an inline target is connected only to the addresses its :class:`CheckedTarget`
  carries (no lookup here at all); a registered one resolves its configured name. TLS checks the
  certificate against the URL's host name (SNI too), whatever address was dialled.
* Caps: the response head (status line + headers) is bounded by ``max_head_bytes``; the body by
  the caller's cap, counted on the wire bytes as they arrive. Compressed bodies are refused by
  the caller's head check (we ask for ``identity``), so wire bytes are body bytes.
* Never: redirects, cookies, proxies, retries of a request that may have been read. One retry is
  made only when a *reused* idle connection turns out closed before any byte of the answer and
  within ``RACE_SECONDS`` of the write (the keep-alive race); the repeated request has the same
  ``webhook-id``, which Standard Webhooks receivers use to drop duplicates.

Deadlines are the caller's (one ``asyncio.timeout`` around ``post``; for ``begin``, the caller
aborts the exchange at its deadline); a cancelled or aborted call closes its connection.
``begin`` sends on an idle connection without a task or a wait (``calls._Burst``); ``post``
connects when it must and waits for a free connection slot.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast
from urllib.parse import urlsplit

import httptools

from context_assembly.contributors.ssrf import CheckedTarget

KEEPALIVE_EXPIRY = 4.0
MAX_HEAD_BYTES = 64 * 1024
MAX_CONNECTIONS = 100
MAX_ENDPOINTS = 1024

_RACE_CAUSES = frozenset({"server closed the connection", "connection reset"})
# The keep-alive race is a close the server sent before our request reached it: its FIN or
# reset arrives within about a round trip of the write. A close later than this after the write
# may follow a request the server read and worked on, and is the contributor's answer, not
# retried (contributors sit near the service: a sidecar, the same region).
RACE_SECONDS = 0.1

HeadCheck = Callable[[int, Mapping[str, str]], None]


class WireError(Exception):
    """A transport failure, with the cause the manifest reports (never quoting the body)."""

    def __init__(self, cause: str, status: Literal["error", "too_large"] = "error") -> None:
        super().__init__(cause)
        self.cause = cause
        self.status = status


@dataclass(frozen=True, slots=True)
class _Endpoint:
    scheme: str
    host: str
    port: int
    target: bytes  # the request target: path and query, as sent
    host_header: bytes
    addresses: tuple[str, ...] | None  # pinned addresses, or None to resolve ``host``

    @property
    def key(self) -> tuple[str, str, int, tuple[str, ...] | None]:
        return (self.scheme, self.host, self.port, self.addresses)


def _endpoint(url: str, pin: CheckedTarget | None) -> _Endpoint:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WireError(f"unsupported URL scheme {scheme!r}")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise WireError("the URL has no host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as err:
            raise WireError("the URL host is not a valid name") from err
    default = 443 if scheme == "https" else 80
    try:
        port = parts.port or default
    except ValueError as err:
        raise WireError("the URL has an invalid port") from err
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n\t") or not target.isascii():
        raise WireError("the URL path must be percent-encoded ASCII")
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    addresses: tuple[str, ...] | None = None
    if pin is not None:
        if (scheme, host, port) != (pin.scheme, pin.host, pin.port):
            raise WireError("request URL does not match its pinned target")
        addresses = pin.addresses
    return _Endpoint(scheme, host, port, target.encode(), host_header.encode(), addresses)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset(None, 0)

    def _reset(self, loop: asyncio.AbstractEventLoop | None, cap: int) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] | None = loop.create_future() if loop else None
        self.done: asyncio.Future[None] | None = loop.create_future() if loop else None
        self.headers: dict[str, str] = {}
        self.head_bytes = 0
        self.body = bytearray()
        self.cap = cap
        self.status = 0
        self.received = False
        self.complete = False
        self.keep_alive = False
        self.sent_at = time.monotonic()  # reset right before each request is written

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            # A callback's own error (a cap) arrives wrapped, as the context of the parser's.
            inner = err.__context__
            self._fail(inner if isinstance(inner, WireError) else WireError("HTTP protocol error"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is None or self.done.done():
            return
        if self.head is not None and self.head.done() and self._ends_at_close():
            self.complete = True
            self.done.set_result(None)
            return
        if not self.received:
            err = WireError("server closed the connection")
        elif self.head is not None and self.head.done():
            err = WireError("connection closed before the body was complete")
        else:
            err = WireError("server closed the connection")
        if isinstance(exc, ConnectionResetError):
            err = WireError("connection reset")
        self._fail(err)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEAD_BYTES:
            raise WireError(f"response headers over {MAX_HEAD_BYTES} bytes")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body += body
        if len(self.body) > self.cap:
            raise WireError(f"body over the {self.cap}-byte cap", "too_large")

    def on_message_complete(self) -> None:
        # Read here: the parser resets its flags once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    # -- helpers
    def _ends_at_close(self) -> bool:
        return "content-length" not in self.headers and "transfer-encoding" not in self.headers

    def _fail(self, err: WireError) -> None:
        for waiter in (self.head, self.done):
            if waiter is not None and not waiter.done():
                waiter.set_exception(err)
                # Mark retrieved: only the future being awaited reports it.
                waiter.exception()
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed

    def lost_race(self, err: WireError) -> bool:
        """Whether ``err`` is the keep-alive race: this idle connection was closed by the server
        before it answered anything, within ``RACE_SECONDS`` of the write, so the request may be
        sent again on a new connection."""
        return (
            not self.received
            and err.cause in _RACE_CAUSES
            and time.monotonic() - self.sent_at <= RACE_SECONDS
        )


@dataclass(slots=True)
class WireClient:
    """Pooled HTTP/1.1 POSTs for ``calls.py``. Create once per app; ``await aclose()`` at the end."""

    ssl_context: ssl.SSLContext
    # Sent on every request before the caller's own (client.py passes DEFAULT_HEADERS: among
    # them ``accept-encoding: identity``, which the body cap on wire bytes relies on).
    default_headers: Mapping[str, str] = field(default_factory=dict)
    keepalive_expiry: float = KEEPALIVE_EXPIRY
    max_connections: int = MAX_CONNECTIONS
    _idle: dict[tuple[str, str, int, tuple[str, ...] | None], list[_Connection]] = field(
        default_factory=dict
    )
    _slots: asyncio.Semaphore | None = None
    _closed: bool = False
    # Parsed endpoints by (url, pin): the same few contributors are called on every prepare.
    _endpoints: dict[tuple[str, CheckedTarget | None], _Endpoint] = field(default_factory=dict)

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        pin: CheckedTarget | None,
        *,
        check_head: HeadCheck,
        max_bytes: int,
    ) -> bytes:
        """POST ``body``; ``check_head(status, headers)`` runs on the head and may raise to stop
        the exchange (its exception propagates); returns the body, at most ``max_bytes``.

        Raises:
            WireError: a transport failure (``status`` "error", or "too_large" over the cap).
            OSError: connecting failed (refused, unreachable, name resolution, TLS).
        """
        endpoint = self._endpoint_for(url, pin)
        request = self._request_bytes(endpoint, body, {**self.default_headers, **headers})
        async with self._slots_():
            conn = self._pooled(endpoint)
            if conn is not None:
                try:
                    return await self._exchange(endpoint, conn, request, check_head, max_bytes)
                except WireError as err:
                    if not conn.lost_race(err):
                        raise  # anything but the keep-alive race is the contributor's answer
            conn = await self._connect(endpoint)
            return await self._exchange(endpoint, conn, request, check_head, max_bytes)

    async def begin(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        pin: CheckedTarget | None,
        *,
        max_bytes: int,
    ) -> Started | None:
        """Write the POST on an idle keep-alive connection and return the exchange under way,
        or ``None`` when the endpoint has no idle connection or no connection slot is free (then
        ``post`` is the way). Never waits.

        No task and no timer: the caller watches ``Started.head`` and ``Started.done`` and ends
        the exchange with ``finish`` or ``abort`` (each releases the connection slot once). The
        keep-alive race is the caller's to retry (``Started.raced``), on a new connection.

        Raises:
            WireError: the client is closed, the URL cannot be sent, a header has a line break.
        """
        endpoint = self._endpoint_for(url, pin)
        if not self._idle.get(endpoint.key):
            return None
        request = self._request_bytes(endpoint, body, {**self.default_headers, **headers})
        slots = self._slots_()
        if slots.locked():
            return None  # every slot taken: ``post`` waits for one under the caller's deadline
        await slots.acquire()  # free: returns at once, never suspends
        conn = self._pooled(endpoint)
        if conn is None:
            slots.release()
            return None
        conn._reset(asyncio.get_running_loop(), max_bytes)
        assert conn.transport is not None
        conn.transport.write(request)
        return Started(self, endpoint, conn)

    async def aclose(self) -> None:
        """Close every idle connection; later calls fail."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()

    # -- internals
    def _endpoint_for(self, url: str, pin: CheckedTarget | None) -> _Endpoint:
        if self._closed:
            raise WireError("the contributor client is closed")
        endpoint = self._endpoints.get((url, pin))
        if endpoint is None:
            endpoint = _endpoint(url, pin)
            if len(self._endpoints) >= MAX_ENDPOINTS:
                self._endpoints.clear()
            self._endpoints[(url, pin)] = endpoint
        return endpoint

    def _slots_(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        return self._slots

    def _keep(self, endpoint: _Endpoint, conn: _Connection) -> None:
        """Pool ``conn`` after a complete exchange if it may carry another, else close it."""
        if conn.reusable() and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(endpoint.key, []).append(conn)
        else:
            conn.abort()

    @staticmethod
    def _request_bytes(endpoint: _Endpoint, body: bytes, headers: Mapping[str, str]) -> bytes:
        lines = [b"POST " + endpoint.target + b" HTTP/1.1", b"host: " + endpoint.host_header]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise WireError("a request header contains a line break")
            lines.append(f"{name}: {value}".encode("latin-1"))
        lines.append(b"content-length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def _pooled(self, endpoint: _Endpoint) -> _Connection | None:
        conns = self._idle.get(endpoint.key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry:
                return conn
            conn.abort()
        return None

    async def _connect(self, endpoint: _Endpoint) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self.ssl_context if endpoint.scheme == "https" else None
        server_hostname = endpoint.host if tls is not None else None
        hosts = endpoint.addresses if endpoint.addresses is not None else (endpoint.host,)
        last: OSError | None = None
        for host in hosts:
            try:
                _, conn = await loop.create_connection(
                    _Connection, host, endpoint.port, ssl=tls, server_hostname=server_hostname
                )
                return conn
            except OSError as err:  # ssl.SSLError and socket.gaierror are OSErrors too
                last = err
        assert last is not None
        raise last

    async def _exchange(
        self,
        endpoint: _Endpoint,
        conn: _Connection,
        request: bytes,
        check_head: HeadCheck,
        max_bytes: int,
    ) -> bytes:
        loop = asyncio.get_running_loop()
        conn._reset(loop, max_bytes)
        assert conn.transport is not None and conn.head is not None and conn.done is not None
        ok = False
        try:
            if conn.closed:
                raise WireError("server closed the connection")
            conn.transport.write(request)
            await conn.head
            check_head(conn.status, conn.headers)
            await conn.done
            ok = True
            return bytes(conn.body)
        finally:
            if ok:
                self._keep(endpoint, conn)
            else:
                conn.abort()


@dataclass(slots=True, eq=False)
class Started:
    """A POST written by ``WireClient.begin`` whose answer is under way on ``conn``.

    ``head`` resolves when the response head is in (``status``, ``headers``), ``done`` when the
    answer is complete; either fails with ``WireError``. End it with ``finish`` (the body; the
    connection is pooled when it can carry another exchange) or ``abort`` (closed): each
    releases the client's connection slot, once.
    """

    client: WireClient
    endpoint: _Endpoint
    conn: _Connection
    open: bool = True

    @property
    def head(self) -> asyncio.Future[None]:
        assert self.conn.head is not None
        return self.conn.head

    @property
    def done(self) -> asyncio.Future[None]:
        assert self.conn.done is not None
        return self.conn.done

    @property
    def status(self) -> int:
        return self.conn.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self.conn.headers

    def raced(self, err: WireError) -> bool:
        """Whether ``err`` is the keep-alive race (``_Connection.lost_race``)."""
        return self.conn.lost_race(err)

    def finish(self) -> bytes:
        """The body of the complete answer (``done`` resolved without error)."""
        body = bytes(self.conn.body)
        if self._end():
            self.client._keep(self.endpoint, self.conn)
        return body

    def abort(self) -> None:
        """Close the connection (a deadline, a failed check, a cancel); idempotent."""
        if self._end():
            self.conn.abort()

    def _end(self) -> bool:
        if not self.open:
            return False
        self.open = False
        self.client._slots_().release()
        return True
