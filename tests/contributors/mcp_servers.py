"""Real MCP servers for the MCP contributor tests, built with the official SDK (``MCPServer``).

``python mcp_servers.py PORT ANSWERS SESSIONS RECORD`` serves :func:`build`'s server on
127.0.0.1:PORT under uvicorn: ``ANSWERS`` is ``json`` (JSON bodies) or ``sse`` (event streams,
the SDK's default), ``SESSIONS`` is ``stateful`` (``Mcp-Session-Id``) or ``stateless``. With
``MCP_TEST_TOKEN`` in its environment it answers ``401`` to a request without
``Authorization: Bearer <token>`` (the SDK's own bearer auth needs an OAuth verifier; a plain
check is what a deployment's proxy would do in front of it). The server appends one line per
event the tests wait on to the file ``RECORD`` (``hang started``, ``hang cancelled``, ``flood
cancelled``) and one line per HTTP request it receives (``POST initialize``).
:class:`McpProcess` runs one as a subprocess: its memory and its event loop are its own, as a
real server's are, and a restart on the same port is a server that forgot every session.

What it offers:

- resources ``docs://guide/refunds`` (priority 0.9, ``lastModified``, for the assistant),
  ``docs://guide/limits`` (priority 0.2, no ``lastModified``), ``docs://guide/internal`` (for
  the user only), ``docs://logo.png`` (binary), ``docs://broken`` (its read fails: a JSON-RPC
  error), ``big://50mb`` (50 MB of text) and ``docs://counter`` (its text changes with each
  ``bump`` tool call);
- tools ``search`` (two annotated text items), ``lookup`` (structured output), ``links`` (a
  resource link, an embedded text resource and an image), ``failing`` (an ``isError`` result),
  ``hang`` (never answers, records its cancellation), ``flood`` (streams log notifications
  forever, never answers) and ``bump``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from context_assembly_client.testing import ServedProcess, free_port
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import (
    Annotations,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

HERE = Path(__file__).resolve().parent
BIG_BYTES = 50 * 1024 * 1024
PINNED_HOST = "mcp.invalid"  # no real DNS answers this name (RFC 6761)
REFUNDS = "Refunds are accepted within 30 days of delivery."
LIMITS = "A refund above 500 EUR needs a second approval."


def build(record: Path) -> MCPServer:
    """The server; tools and resources append their events to ``record``."""
    server = MCPServer("docs")
    counter = {"value": 0}

    def note(line: str) -> None:
        with record.open("a") as handle:
            handle.write(line + "\n")

    @server.resource(
        "docs://guide/refunds",
        description="Refund rules",
        annotations=Annotations(
            priority=0.9, audience=["assistant"], last_modified="2026-11-02T10:00:00Z"
        ),
    )
    def refunds() -> str:
        return REFUNDS

    @server.resource(
        "docs://guide/limits",
        annotations=Annotations(priority=0.2, audience=["user", "assistant"]),
    )
    def limits() -> str:
        return LIMITS

    @server.resource("docs://guide/internal", annotations=Annotations(audience=["user"]))
    def internal() -> str:
        return "For people only."

    @server.resource("docs://logo.png", mime_type="image/png")
    def logo() -> bytes:
        return b"\x89PNG\r\n\x1a\n" + bytes(1000)

    @server.resource("docs://broken")
    def broken() -> str:
        raise MCPError(-32603, "the document store is down")

    @server.resource("big://50mb")
    def big() -> str:
        return "x" * BIG_BYTES

    @server.resource("docs://counter")
    def counted() -> str:
        return f"counter {counter['value']}"

    @server.tool(structured_output=False)
    def search(query: str, top_k: int = 2) -> list[TextContent]:
        return [
            TextContent(
                type="text",
                text=f"hit {i} for {query}",
                annotations=Annotations(priority=1.0 - i * 0.5),
            )
            for i in range(top_k)
        ]

    @server.tool()
    def lookup(query: str) -> dict[str, object]:
        return {"query": query, "hits": ["refunds", "limits"]}

    @server.tool(structured_output=False)
    def links(query: str) -> list[TextContent | ResourceLink | EmbeddedResource | ImageContent]:
        return [
            ResourceLink(
                type="resource_link",
                uri="docs://guide/limits",
                name="limits",
                annotations=Annotations(priority=1.0),
            ),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="docs://embedded/note", text="An embedded note."),
            ),
            ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
        ]

    @server.tool()
    def failing(query: str) -> str:
        raise ToolError("no index for this query")

    @server.tool()
    async def hang(query: str) -> str:
        note("hang started")
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            note("hang cancelled")
            raise
        return "never"

    @server.tool()
    async def flood(query: str, ctx: Context) -> str:
        try:
            while True:
                await ctx.info("y" * 512)
        except anyio.get_cancelled_exc_class():
            note("flood cancelled")
            raise

    @server.tool()
    def bump() -> str:
        counter["value"] += 1
        return f"counter is {counter['value']}"

    return server


class McpProcess:
    """One server subprocess; :meth:`restart` brings it back on the same port, with no session
    remembered."""

    def __init__(
        self,
        folder: Path,
        *,
        answers: str = "sse",
        sessions: str = "stateful",
        token: str | None = None,
    ) -> None:
        self.token = token
        self.answers, self.sessions = answers, sessions
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.record = folder / f"mcp-{self.port}.log"
        self.record.touch()
        env = {
            **os.environ,
            "PYTHONPATH": str(HERE),
            **({"MCP_TEST_TOKEN": self.token} if self.token else {}),
        }
        command = [sys.executable, str(HERE / "mcp_servers.py"), "{port}", answers, sessions,
                   str(self.record)]  # fmt: skip
        # Ready once it takes connections; its own log lines go to a file, for a failing test.
        self.process = ServedProcess(
            command, port=self.port, ready=None, env=env, log=folder / f"mcp-{self.port}.out"
        )

    def lines(self) -> list[str]:
        return self.record.read_text().splitlines()

    async def recorded(self, line: str, count: int = 1, timeout: float = 10.0) -> None:
        """Bounded polling of the record file until it holds ``count`` of ``line`` (the server
        writes it from its own process; a module's server records the lines of every test, so
        a test counts from what was there before it), yielding to the event loop so that this
        process's background sends go on meanwhile; ``timeout`` is a hang guard."""
        deadline = time.monotonic() + timeout
        while self.lines().count(line) < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the server never recorded {count} x {line!r}: {self.lines()}"
                )
            await asyncio.sleep(0.02)

    def restart(self) -> None:
        self.process.restart()

    def stop(self) -> None:
        self.process.stop()


@contextlib.contextmanager
def mcp_server(
    folder: Path, *, answers: str = "sse", sessions: str = "stateful", token: str | None = None
) -> Iterator[McpProcess]:
    process = McpProcess(folder, answers=answers, sessions=sessions, token=token)
    try:
        yield process
    finally:
        process.stop()


def main() -> None:
    port, answers, sessions, record = sys.argv[1:5]
    server = build(Path(record))
    app = server.streamable_http_app(
        json_response=answers == "json",
        stateless_http=sessions == "stateless",
        # The SDK's DNS-rebinding check, with the name the pinning test reaches it by.
        transport_security=TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*", f"{PINNED_HOST}:*"]
        ),
    )
    token = os.environ.get("MCP_TEST_TOKEN")
    recorded = _recording(app, Path(record))
    uvicorn.run(
        recorded if token is None else _bearer(recorded, token),
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
    )


def _recording(app: Any, record: Path) -> Any:
    """Append ``<HTTP method> <JSON-RPC method>`` for every request the SDK's app receives
    (``POST initialize``, ``POST notifications/cancelled``, ``DELETE -``)."""

    async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        messages = []
        more = True
        while more:
            message = await receive()
            messages.append(message)
            more = message.get("more_body", False)
        body = b"".join(m.get("body", b"") for m in messages)
        try:
            method = json.loads(body).get("method", "-") if body else "-"
        except ValueError:
            method = "?"
        with record.open("a") as handle:
            handle.write(f"{scope['method']} {method}\n")
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await app(scope, replayed, send)

    return recorded


def _bearer(app: Any, token: str) -> Any:
    expected = f"Bearer {token}".encode()

    async def checked(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return checked


if __name__ == "__main__":
    main()
