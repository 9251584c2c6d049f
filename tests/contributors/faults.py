"""A loopback fault server for contributor tests: raw ``asyncio.start_server``, minimal HTTP/1.1.

Each server has one behaviour, modelled on Toxiproxy's toxics:

``ok``            answer ``status`` with ``body`` once ``gate`` is set (when given), after
                  ``delay`` seconds (keep-alive aware)
``hang``          read the request, never answer; wait for the client to close
``drip``          send the headers, then one body byte every ``interval`` seconds
``slow_headers``  send the status line, then one header line every ``interval`` seconds
``reset``         read the request, then abort the connection with a TCP RST
``oversize``      stream ``size`` bytes, chunked, or with an honest ``Content-Length`` (``declare``)
``redirect``      answer ``302`` with ``Location: <location>``
``long_header``   send the status line, then one header line of ``size`` bytes that never ends
``two_answers``   answer the first request with two responses in one write (the second says
                  revision ``extra``); later requests on any connection get ``body``
``informational`` send ``100 Continue`` and ``103 Early Hints`` before the answer
``unframed``      answer ``body`` without ``Content-Length``: chunked (``declare=True``) or
                  delimited by the close of the connection

Events let tests wait without sleeping: ``request_seen`` (a request was read), ``answered`` (the
server finished an ``ok`` answer, even a late one), ``peer_closed`` (the client closed the
connection). Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
)

CAP = 256 * 1024
DEADLINE = 0.3  # seconds: the deadline of the fault scenarios

Behaviour = Literal[
    "ok",
    "hang",
    "drip",
    "slow_headers",
    "reset",
    "oversize",
    "redirect",
    "invalid_json",
    "long_header",
    "two_answers",
    "informational",
    "unframed",
]

OK_BODY = b'{"revision":"r1","blocks":[{"id":"a","text":"hello","priority":5}]}'


@dataclass(frozen=True)
class Recorded:
    """One request as the server read it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FaultServer:
    """An async context manager serving one fault behaviour on 127.0.0.1 (random port)."""

    behaviour: Behaviour = "ok"
    delay: float = 0.0
    status: int = 200
    body: bytes = OK_BODY
    content_type: str = "application/json"
    interval: float = 0.05
    size: int = 10 * 1024 * 1024
    declare: bool = False
    location: str = "http://10.0.0.1/"
    tls: ssl.SSLContext | None = None
    gate: asyncio.Event | None = None
    requests: list[Recorded] = field(default_factory=list)
    connections: int = 0
    bytes_sent: int = 0

    def __post_init__(self) -> None:
        self.request_seen = asyncio.Event()
        self.answered = asyncio.Event()
        self.peer_closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """The server's base URL with path ``/contribute``."""
        return f"http://127.0.0.1:{self.port}/contribute"

    async def __aenter__(self) -> FaultServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    # ------------------------------------------------------------------ connection handling

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.peer_closed.set()
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        recorded = Recorded(method, path, headers, body)
        self.requests.append(recorded)
        self.request_seen.set()
        return recorded

    async def _until_closed(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):  # a reset is a close too
            while await reader.read(65536):
                pass
        self.peer_closed.set()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await self._read_request(reader)
            if request is None:
                self.peer_closed.set()
                return
            keep_alive = await self._respond(reader, writer)
            if not keep_alive:
                return

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        b = self.behaviour
        if b in ("ok", "invalid_json"):
            body = b"{not json" if b == "invalid_json" else self.body
            if self.gate is not None:
                await self.gate.wait()  # the test opens it (an event, not a time)
            if self.delay:
                await asyncio.sleep(self.delay)  # server-side delay: the fault being modelled
            head = (
                f"HTTP/1.1 {self.status} X\r\ncontent-type: {self.content_type}\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            ).encode()
            try:
                await self._write(writer, head + body)
            finally:
                self.answered.set()
            return True
        if b == "long_header":
            await self._write(writer, b"HTTP/1.1 200 OK\r\nx-long: ")
            await self._stream(reader, writer, self.size)
            return False
        if b == "two_answers":
            first = self.answered.is_set()
            extra = b'{"revision":"extra","blocks":[]}'
            reply = self._ok_head(len(self.body)) + self.body
            if not first:
                reply += self._ok_head(len(extra)) + extra
            self.answered.set()
            await self._write(writer, reply)
            return True
        if b == "informational":
            early = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
            await self._write(writer, early + self._ok_head(len(self.body)) + self.body)
            return True
        if b == "unframed":
            framing = "transfer-encoding: chunked\r\n" if self.declare else "connection: close\r\n"
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n".encode()
            await self._write(writer, head)
            await self._stream(reader, writer, len(self.body), chunked=self.declare)
            with contextlib.suppress(ConnectionError):
                if self.declare:
                    await self._write(writer, b"0\r\n\r\n")
                else:
                    writer.write_eof()  # the end of the body
                await asyncio.wait_for(self._until_closed(reader), timeout=5.0)
            return False
        if b == "redirect":
            found = f"HTTP/1.1 302 Found\r\nlocation: {self.location}\r\ncontent-length: 0\r\n\r\n"
            await self._write(writer, found.encode())
            return True
        if b == "hang":
            await self._until_closed(reader)
            return False
        if b == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if b == "drip":
            await self._write(
                writer,
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n",
            )
            await self._trickle(reader, writer, (b" " for _ in range(100000)))
            return False
        if b == "slow_headers":
            await self._write(writer, b"HTTP/1.1 200 OK\r\n")
            await self._trickle(reader, writer, (f"x-h{i}: v\r\n".encode() for i in range(100000)))
            return False
        if b == "oversize":
            framing = (
                f"content-length: {self.size}" if self.declare else "transfer-encoding: chunked"
            )
            await self._write(
                writer,
                f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode(),
            )
            chunk = b"[" * 65536
            sent = 0
            closed = asyncio.ensure_future(self._until_closed(reader))
            try:
                while sent < self.size and not closed.done():
                    piece = chunk if self.declare else b"10000\r\n" + chunk + b"\r\n"
                    await self._write(writer, piece)
                    sent += len(chunk)
                if not self.declare and not closed.done():
                    await self._write(writer, b"0\r\n\r\n")
                await closed
            finally:
                closed.cancel()
            return False
        raise AssertionError(f"unknown behaviour {b}")

    def _ok_head(self, length: int) -> bytes:
        return (
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
        ).encode()

    async def _stream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        size: int,
        chunked: bool = False,
    ) -> None:
        """Write ``size`` bytes (of ``body``, or ``a``s when ``body`` is shorter) in 64 KiB
        pieces, each a chunk if ``chunked``, until done or the client closes."""
        source = self.body if len(self.body) >= size else b"a" * 65536
        closed = asyncio.ensure_future(self._until_closed(reader))
        sent = 0
        try:
            while sent < size and not closed.done():
                piece = source[sent : sent + 65536] if source is self.body else source
                piece = piece[: size - sent]
                with contextlib.suppress(ConnectionError):
                    framed = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                    await self._write(writer, framed)
                sent += len(piece)
        finally:
            closed.cancel()

    async def _trickle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pieces: Iterable[bytes]
    ) -> None:
        """Write one piece per ``interval`` until the client closes the connection."""
        closed = asyncio.ensure_future(self._until_closed(reader))
        try:
            for piece in pieces:
                if closed.done():
                    return
                with contextlib.suppress(ConnectionError):
                    await self._write(writer, piece)
                await asyncio.wait({closed}, timeout=self.interval)
        finally:
            closed.cancel()


_HELD: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port with nothing listening (connections are refused). The port stays bound,
    never listening, for the rest of the test run, so that no other server can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    port: int = sock.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def servers(count: int, **behaviour: Any) -> AsyncIterator[list[FaultServer]]:
    """Start ``count`` fault servers with one behaviour and stop them afterwards."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(FaultServer(**behaviour)) for _ in range(count)]


async def fan_out(
    client: ContributorClient,
    fields: PacketFields,
    targets: Sequence[ContributorTarget],
    timeout: float = DEADLINE,
    **kw: Any,
) -> list[ContributorOutcome]:
    """Run one fan-out under a deadline ``timeout`` seconds away (``kw``: ``contribute_all``'s
    options) and return its outcomes."""
    return await contribute_all(client, targets, fields, time.monotonic() + timeout, CAP, **kw)


def registered(server: FaultServer, source: str = "memory", **kw: Any) -> ContributorTarget:
    """A registered target pointing at a fault server."""
    return ContributorTarget(source=source, url=server.url, **kw)
