"""A loopback contributor that answers with an httpx-style handler, and a client that reaches it.

``HandlerServer(handler)`` serves on 127.0.0.1 (random port) from a thread of its own, so that it
works beside a ``TestClient`` (whose app runs in another thread and event loop) and beside async
tests alike. Each request is handed to ``handler`` as an ``httpx.Request`` (URL rebuilt from the
``Host`` header, so a test sees the host the service meant to call); the returned
``httpx.Response`` goes back on the socket as written: its status line, its headers as given
(even a lying ``Content-Length``), its body (chunked if the response says so), then the
connection is closed. A handler that raises aborts the connection with a TCP reset.

``LoopbackClient(port)`` is the production :class:`ContributorClient` with one change: every
name, registered or inline, resolves to that loopback port. The rest (the pin check of inline
URLs, caps, no redirects) is the production path.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType

import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from context_assembly.contributors import ContributorClient

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class HandlerServer:
    """Serves ``handler`` on a loopback port until ``close()`` (or the ``with`` block's end)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop
        ).result()
        self.port: int = self._server.sockets[0].getsockname()[1]

    def url(self, path: str = "/contribute") -> str:
        """A URL on this server."""
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        """Stop serving and end the server's thread."""

        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        self.loop.close()

    def __enter__(self) -> HandlerServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            fields = (line.partition(":") for line in lines[1:] if line)
            headers = [(name.strip(), value.strip()) for name, _, value in fields]
            length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
            body = await reader.readexactly(length)
            host = next((v for k, v in headers if k.lower() == "host"), "localhost")
            request = httpx.Request(
                method, f"http://{host}{target}", headers=list(headers), content=body
            )
            try:
                result = self.handler(request)
                response = await result if inspect.isawaitable(result) else result
                content = await response.aread()
            except Exception:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            writer.write(_encode(response, content))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _encode(response: httpx.Response, content: bytes) -> bytes:
    chunked = response.headers.get("transfer-encoding", "").lower() == "chunked"
    lines = [f"HTTP/1.1 {response.status_code} X".encode()]
    lines += [name + b": " + value for name, value in response.headers.raw]
    lines.append(b"connection: close")
    if chunked:
        content = (b"%x\r\n%s\r\n" % (len(content), content) if content else b"") + b"0\r\n\r\n"
    return b"\r\n".join(lines) + b"\r\n\r\n" + content


class _ToLoopback(AbstractResolver):
    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": self.port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
        ]

    async def close(self) -> None:
        return None


class LoopbackClient(ContributorClient):
    """The production contributor client, with every name resolving to one loopback port."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    def _resolver(self, *, inline: bool) -> AbstractResolver | None:
        return _ToLoopback(self.port)
