"""HTTP/1.1 as the scripted contributor double writes it, by hand, and the faults it injects on
the connection.

A fault double needs the bytes a server library exists to prevent: a TCP reset
(:func:`reset`), headers then a body dripped a byte at a time (:func:`drip`), a chunked body
too large to take (:func:`oversize`), a handler's response written as given, a lying
``Content-Length`` included (:func:`encode`). :func:`watch` tells when the caller hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
import struct
from collections.abc import Iterable

import httpx

__all__ = [
    "CHUNK",
    "DRIP_INTERVAL",
    "drip",
    "encode",
    "head",
    "json_answer",
    "oversize",
    "reset",
    "unwatch",
    "watch",
]

DRIP_INTERVAL = 0.05  # seconds between the bytes of a dripped body: the fault modelled
CHUNK = 65536
"""Bytes read or written at a time."""


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Scripted"


def head(status: int, fields: Iterable[str]) -> bytes:
    """The status line and header ``fields`` of an answer, up to its body."""
    return (
        f"HTTP/1.1 {status} {_reason(status)}\r\n" + "".join(f"{f}\r\n" for f in fields)
    ).encode("latin-1") + b"\r\n"


def json_answer(status: int, body: bytes) -> bytes:
    """A whole answer of JSON ``body``, with its length."""
    fields = ("content-type: application/json", f"content-length: {len(body)}")
    return head(status, fields) + body


def encode(response: httpx.Response, content: bytes) -> bytes:
    """A handler's ``response`` as given (headers as they are; chunked when it says so), with
    ``connection: close``."""
    chunked = response.headers.get("transfer-encoding", "").lower() == "chunked"
    lines = [f"HTTP/1.1 {response.status_code} {_reason(response.status_code)}".encode()]
    lines += [name + b": " + value for name, value in response.headers.raw]
    lines.append(b"connection: close")
    if chunked:
        content = (b"%x\r\n%s\r\n" % (len(content), content) if content else b"") + b"0\r\n\r\n"
    return b"\r\n".join(lines) + b"\r\n\r\n" + content


def reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP reset (``SO_LINGER`` 0), not a close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def watch(reader: asyncio.StreamReader) -> asyncio.Task[None]:
    """A task that ends when the caller closes the connection (or resets it)."""

    async def until_closed() -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(CHUNK):
                pass

    return asyncio.ensure_future(until_closed())


async def unwatch(watching: asyncio.Task[None]) -> None:
    """Cancel a watch and wait until it has let go of the reader (the next request's read)."""
    watching.cancel()
    await asyncio.wait({watching})


async def drip(writer: asyncio.StreamWriter, closed: asyncio.Task[None]) -> None:
    """Headers that promise a body, then a byte of it every ``DRIP_INTERVAL`` seconds until the
    caller hangs up (``closed``, a :func:`watch`)."""
    writer.write(head(200, ("content-type: application/json", "content-length: 100000")))
    with contextlib.suppress(ConnectionError):  # a reset is a hang-up too
        while not closed.done():
            writer.write(b" ")
            await writer.drain()
            await asyncio.wait({closed}, timeout=DRIP_INTERVAL)


async def oversize(writer: asyncio.StreamWriter, size: int, closed: asyncio.Task[None]) -> bool:
    """A chunked JSON answer of ``size`` bytes, cut short when the caller hangs up (``closed``, a
    :func:`watch`); whether it was written whole."""
    writer.write(head(200, ("content-type: application/json", "transfer-encoding: chunked")))
    sent = 0
    with contextlib.suppress(ConnectionError):  # the caller cut it short
        while sent < size and not closed.done():
            piece = b"[" * min(CHUNK, size - sent)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            sent += len(piece)
    if sent < size or closed.done():
        return False
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True
