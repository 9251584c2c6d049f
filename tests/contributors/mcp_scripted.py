"""A hand-written MCP server for the faults the SDK's servers never commit: a session id with a
control character, a ``404`` to ``notifications/initialized``, a protocol version nobody speaks,
a ``ttlMs`` at a handshake revision, a listing of 40,000 resources, a ``DELETE`` that never
answers.

:class:`ScriptedMcp` serves Streamable HTTP with JSON answers on a loopback port, from a thread of
its own (a ``context_assembly_client.testing.ScriptedContributor`` with this server as its
handler: its own event loop, so that what this process's loop does is measured without the
server's work). Every answer is the protocol's unless the test replaces the one of a JSON-RPC
method (``answers``), or of ``DELETE`` (``on_delete``); a replaced answer may be a coroutine that
never returns until the server is closed. Each request is recorded as ``(HTTP method, JSON-RPC
method, headers)``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
import orjson
from context_assembly_client.testing import ScriptedContributor

Answer = Callable[[dict[str, Any]], httpx.Response | Awaitable[httpx.Response]]


@dataclass(frozen=True)
class Seen:
    """One request as the server read it."""

    http_method: str
    method: str  # the JSON-RPC method, ``-`` for a DELETE
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)  # when it was read


def result(
    message: dict[str, Any], value: dict[str, Any], headers: dict[bytes, bytes] | None = None
) -> httpx.Response:
    """The JSON answer to ``message`` with ``value`` as its result (``headers`` as raw bytes)."""
    body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": value})
    return raw(body, headers=headers)


def raw(
    body: bytes, status: int = 200, headers: dict[bytes, bytes] | None = None
) -> httpx.Response:
    """An answer of ``body`` as given (a pre-built listing, say)."""
    head = [(b"content-type", b"application/json"), *(headers or {}).items()]
    return httpx.Response(status, headers=head, content=body)


@dataclass
class ScriptedMcp:
    """A loopback MCP server that answers like the protocol says, except where told."""

    session_id: bytes | None = b"session-1"
    protocol_version: str = "2025-11-25"
    answers: dict[str, Answer] = field(default_factory=dict)
    on_delete: Callable[[], httpx.Response | Awaitable[httpx.Response]] | None = None
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ScriptedContributor(handler=self._handle, record=False)
        self.port: int = self._server.port

    @property
    def url(self) -> str:
        return self._server.url("/mcp")

    def methods(self) -> list[str]:
        """``<HTTP method> <JSON-RPC method>`` of each request so far, in order."""
        with self._lock:
            return [f"{s.http_method} {s.method}" for s in self.seen]

    def requests(self, entry: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if f"{s.http_method} {s.method}" == entry]

    async def hang(self) -> httpx.Response:
        """An answer that never comes: the server's close ends the connection."""
        await asyncio.Event().wait()
        raise AssertionError("never set")

    def close(self) -> None:
        """End every connection (pending answers included) and stop the server's thread."""
        self._server.close()

    def __enter__(self) -> ScriptedMcp:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        headers = {name.lower(): value for name, value in request.headers.items()}
        if request.method == "DELETE":
            self._note(Seen("DELETE", "-", headers))
            answer = self.on_delete() if self.on_delete is not None else httpx.Response(200)
            return await answer if isinstance(answer, Awaitable) else answer
        message = orjson.loads(request.content)
        method = message.get("method", "?")
        self._note(Seen(request.method, method, headers))
        if method in self.answers:
            answer = self.answers[method](message)
            return await answer if isinstance(answer, Awaitable) else answer
        if "id" not in message:  # a notification
            return httpx.Response(202)
        if method == "initialize":
            session = {b"mcp-session-id": self.session_id} if self.session_id is not None else {}
            capabilities: dict[str, Any] = {"resources": {}, "tools": {}}
            return result(
                message,
                {
                    "protocolVersion": self.protocol_version,
                    "capabilities": capabilities,
                    "serverInfo": {"name": "scripted", "version": "1"},
                },
                session,
            )
        if method == "resources/list":
            return result(message, {"resources": []})
        if method == "resources/read":
            uri = message["params"]["uri"]
            return result(message, {"contents": [{"uri": uri, "text": f"text of {uri}"}]})
        if method == "tools/call":
            return result(message, {"content": [{"type": "text", "text": "a hit"}]})
        return raw(
            orjson.dumps(
                {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "?"}}
            )
        )

    def _note(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)
