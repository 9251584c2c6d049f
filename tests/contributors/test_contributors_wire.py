"""The contributor fast path's HTTP/1.1 client (contributors/wire.py) against scripted loopback
servers: framing, keep-alive, caps, protocol errors, the keep-alive race, pinning and TLS."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

import pytest
import trustme

from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.contributors.wire import MAX_HEAD_BYTES, WireClient, WireError

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
OK = b'{"revision":1,"blocks":[]}'


class Script:
    """A loopback server answering each request with the next reply; counts connections."""

    def __init__(self, *replies: Reply, tls: ssl.SSLContext | None = None) -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []
        self.tls = tls
        self.port = 0

    async def _read(self, reader: asyncio.StreamReader) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        self.requests.append(head + await reader.readexactly(length))
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies and await self._read(reader):
                if not await self.replies.pop(0)(reader, writer):
                    break
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Script]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


def send(data: bytes, keep: bool = True) -> Reply:
    async def reply(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return reply


def close_now() -> Reply:
    async def reply(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        return False

    return reply


def length_framed(body: bytes = OK) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def chunked(*parts: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    for part in parts:
        out += b"%x\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


def accept_all(status: int, headers: Mapping[str, str]) -> None:
    assert status == 200, status


async def post(
    client: WireClient, url: str, pin: CheckedTarget | None = None, cap: int = 1 << 20
) -> bytes:
    return await client.post(
        url, b"{}", {"content-type": "application/json"}, pin, check_head=accept_all, max_bytes=cap
    )


@pytest.fixture
async def wire() -> AsyncIterator[WireClient]:
    client = WireClient(ssl.create_default_context())
    yield client
    await client.aclose()


async def test_length_framed_answers_reuse_one_connection(wire: WireClient) -> None:
    async with Script(send(length_framed()), send(length_framed())).running() as srv:
        url = f"http://127.0.0.1:{srv.port}/c?x=1"
        assert await post(wire, url) == OK
        assert await post(wire, url) == OK
    assert srv.connections == 1
    assert srv.requests[0].startswith(b"POST /c?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
    assert srv.requests[0].endswith(b"content-length: 2\r\n\r\n{}")


async def test_chunked_answers_are_joined(wire: WireClient) -> None:
    async with Script(send(chunked(b'{"revision":1,', b'"blocks":[]}'))).running() as srv:
        assert await post(wire, f"http://127.0.0.1:{srv.port}/") == OK


async def test_answer_ending_at_close_is_complete_and_not_reused(wire: WireClient) -> None:
    eof = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n" + OK
    async with Script(send(eof, keep=False), send(length_framed())).running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        assert await post(wire, url) == OK
        assert await post(wire, url) == OK
    assert srv.connections == 2


async def test_connection_close_header_is_honoured(wire: WireClient) -> None:
    closing = length_framed().replace(b"200 OK\r\n", b"200 OK\r\nconnection: close\r\n")
    async with Script(send(closing), send(length_framed())).running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        assert await post(wire, url) == OK
        assert await post(wire, url) == OK
    assert srv.connections == 2


async def test_body_over_the_cap_is_too_large(wire: WireClient) -> None:
    async with Script(send(chunked(b"[" * 600, b"[" * 600))).running() as srv:
        with pytest.raises(WireError) as info:
            await post(wire, f"http://127.0.0.1:{srv.port}/", cap=1000)
    assert info.value.status == "too_large"


async def test_head_over_its_cap_is_an_error(wire: WireClient) -> None:
    filler = b"".join(
        b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(MAX_HEAD_BYTES // 1000 + 2)
    )
    head = b"HTTP/1.1 200 OK\r\n" + filler + b"content-length: 2\r\n\r\n{}"
    async with Script(send(head)).running() as srv:
        with pytest.raises(WireError, match="response headers over"):
            await post(wire, f"http://127.0.0.1:{srv.port}/")


async def test_garbage_is_a_protocol_error(wire: WireClient) -> None:
    async with Script(send(b"SMTP ready\r\n\r\n", keep=False)).running() as srv:
        with pytest.raises(WireError, match="HTTP protocol error"):
            await post(wire, f"http://127.0.0.1:{srv.port}/")


async def test_truncated_body_is_an_error(wire: WireClient) -> None:
    cut = length_framed()[:-5]
    async with Script(send(cut, keep=False)).running() as srv:
        with pytest.raises(WireError, match="before the body was complete"):
            await post(wire, f"http://127.0.0.1:{srv.port}/")


async def test_head_check_stops_the_exchange_and_closes_the_connection(wire: WireClient) -> None:
    def refuse(status: int, headers: Mapping[str, str]) -> None:
        raise ValueError(f"refused {status} {headers['content-type']}")

    async with Script(send(length_framed()), send(length_framed())).running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        with pytest.raises(ValueError, match="refused 200 application/json"):
            await wire.post(url, b"{}", {}, None, check_head=refuse, max_bytes=100)
        assert await post(wire, url) == OK
    assert srv.connections == 2  # the refused answer's connection was not reused


async def test_reused_connection_closed_before_answering_is_retried_once(wire: WireClient) -> None:
    """The keep-alive race: an idle connection that turns out closed is replaced, once."""
    async with Script(send(length_framed()), close_now(), send(length_framed())).running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        assert await post(wire, url) == OK
        assert await post(wire, url) == OK
    assert srv.connections == 2 and len(srv.requests) == 3


async def test_new_connection_closed_before_answering_is_not_retried(wire: WireClient) -> None:
    async with Script(close_now(), send(length_framed())).running() as srv:
        with pytest.raises(WireError, match="server closed the connection"):
            await post(wire, f"http://127.0.0.1:{srv.port}/")
    assert srv.connections == 1 and len(srv.requests) == 1


async def test_pinned_target_connects_to_its_checked_address_only(wire: WireClient) -> None:
    async with Script(send(length_framed())).running() as srv:
        url = f"http://contributor.invalid:{srv.port}/"
        pin = CheckedTarget(url, "http", "contributor.invalid", srv.port, ("127.0.0.1",))
        assert await post(wire, url, pin) == OK
        assert srv.requests[0].split(b"\r\n")[1] == f"host: contributor.invalid:{srv.port}".encode()
        other = CheckedTarget(url, "http", "elsewhere.invalid", srv.port, ("127.0.0.1",))
        with pytest.raises(WireError, match="does not match its pinned target"):
            await post(wire, url, other)


async def test_header_with_a_line_break_is_refused(wire: WireClient) -> None:
    with pytest.raises(WireError, match="line break"):
        await wire.post(
            "http://127.0.0.1:9/", b"", {"x": "a\r\nb"}, None, check_head=accept_all, max_bytes=1
        )


async def test_tls_checks_the_certificate_against_the_url_host() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("contributor.test").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    client = WireClient(client_ctx)
    try:
        async with Script(send(length_framed()), tls=server_ctx).running() as srv:
            url = f"https://contributor.test:{srv.port}/"
            pin = CheckedTarget(url, "https", "contributor.test", srv.port, ("127.0.0.1",))
            assert await post(client, url, pin) == OK
        async with Script(send(length_framed()), tls=server_ctx).running() as srv:
            url = f"https://wrong.test:{srv.port}/"
            pin = CheckedTarget(url, "https", "wrong.test", srv.port, ("127.0.0.1",))
            with pytest.raises(ssl.SSLCertVerificationError):
                await post(client, url, pin)
    finally:
        await client.aclose()


async def test_begin_sends_on_an_idle_connection_only_and_reports_the_race(
    wire: WireClient,
) -> None:
    """``begin`` writes on a pooled connection (else ``None``: no new connection, no wait);
    ``finish`` pools it again; a pooled connection closed before answering is the race."""
    script = Script(
        send(length_framed()), send(length_framed()), close_now(), send(length_framed())
    )
    async with script.running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        headers = {"content-type": "application/json"}
        assert await wire.begin(url, b"{}", headers, None, max_bytes=1 << 20) is None
        assert srv.connections == 0
        assert await post(wire, url) == OK
        started = await wire.begin(url, b"{}", headers, None, max_bytes=1 << 20)
        assert started is not None
        await started.head
        assert started.status == 200 and started.headers["content-type"] == "application/json"
        await started.done
        assert started.finish() == OK
        raced = await wire.begin(url, b"{}", headers, None, max_bytes=1 << 20)
        assert raced is not None  # the same connection, pooled again
        with pytest.raises(WireError) as info:
            await raced.done
        assert raced.raced(info.value)
        raced.abort()
        raced.abort()  # idempotent: the slot is released once
        assert await post(wire, url) == OK  # a new connection
    assert srv.connections == 2 and len(srv.requests) == 4
    assert wire._slots is not None and wire._slots._value == wire.max_connections


def close_after(seconds: float) -> Reply:
    """Read the request, work on it for ``seconds``, then close without answering."""

    async def reply(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(seconds)
        return False

    return reply


async def test_a_close_long_after_the_write_is_not_the_race(wire: WireClient) -> None:
    """A reused connection the server closes unanswered 250 ms after our write may have had
    the request read and worked on: not the keep-alive race, so ``post`` does not send it
    again (once it did, and the contributor received the same delivery twice)."""
    script = Script(send(length_framed()), close_after(0.25), send(length_framed()))
    async with script.running() as srv:
        url = f"http://127.0.0.1:{srv.port}/"
        assert await post(wire, url) == OK
        with pytest.raises(WireError) as info:
            await post(wire, url)
        assert info.value.cause == "server closed the connection"
    assert len(srv.requests) == 2, "the request was sent once"
