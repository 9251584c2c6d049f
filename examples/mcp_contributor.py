"""An MCP server as a contributor: a small server built with the official MCP SDK, a service of
its own that registers it, and the manifest of a prepare.

The MCP server is registered in the service's configuration (``kind = "mcp"``, with a header
whose value comes from the environment, which a request naming a server by URL cannot carry), so
this example starts its own ``context-assembly serve`` on a free port with a temporary TOML file
instead of using ``CONTEXT_ASSEMBLY_URL``. Everything stays on loopback:

1. the ``handbook`` MCP server (``MCPServer`` under uvicorn, in a thread of this process) offers
   two annotated text resources, a binary one and a ``search`` tool;
2. the service registers it with the documented keys (pinned resources, the tool with
   ``{input}``, a header whose value comes from the environment) and a second MCP contributor,
   ``archive``, whose server is not running (``failure_policy = "omit"``);
3. a prepare prints each source's status and each block's decision (ids, priorities as mapped
   from MCP's 0..1, token counts; never texts; the binary resource omitted as
   ``binary_content``), the service's log lines about the MCP session and the binary content,
   and a validate of the frame.

    .venv/bin/python examples/mcp_contributor.py
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from context_assembly_client import Client
from context_assembly_client.testing import free_port, start_service
from mcp.server.mcpserver import MCPServer
from mcp_types import Annotations, TextContent

TOKEN = "example-token-" + os.urandom(8).hex()  # the server's bearer token, never printed


def handbook() -> MCPServer:
    """The MCP server: what a documentation index would offer."""
    server = MCPServer("handbook", log_level="WARNING")  # the SDK configures logging: quiet

    @server.resource(
        "handbook://refunds",
        annotations=Annotations(
            priority=0.9, audience=["assistant"], last_modified="2026-11-02T10:00:00Z"
        ),
    )
    def refunds() -> str:
        return "Refunds are accepted within 30 days of delivery, with the receipt."

    @server.resource("handbook://limits", annotations=Annotations(priority=0.3))
    def limits() -> str:
        return "A refund above 500 EUR needs a second approval. " * 20

    @server.resource("handbook://logo.png", mime_type="image/png")
    def logo() -> bytes:
        return b"\x89PNG\r\n\x1a\n" + bytes(2040)

    @server.tool(structured_output=False)
    def search(query: str, top_k: int = 2) -> list[TextContent]:
        hits = ["Refund desk: refunds@example.com.", "Refunds are paid to the original card."]
        return [
            TextContent(
                type="text",
                text=f"{hit} (for: {query[:40]})",
                annotations=Annotations(priority=0.7 - 0.4 * i),
            )
            for i, hit in enumerate(hits[:top_k])
        ]

    return server


def bearer(app: Any, token: str) -> Any:
    """The check a proxy in front of the server would make: ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


@contextmanager
def serve_mcp(port: int) -> Iterator[str]:
    """The MCP server under uvicorn in a background thread (its session manager runs in the
    app's lifespan); stopped on exit."""
    app = bearer(handbook().streamable_http_app(), TOKEN)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="mcp-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:  # bounded polling for the bind
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the MCP server did not start on 127.0.0.1:{port}")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def config_toml(folder: Path, mcp_url: str, closed_port: int) -> str:
    return f"""\
[store]
path = "{folder / "example.db"}"

[contributors.handbook]
kind = "mcp"
url = "{mcp_url}"
resources = ["handbook://refunds", "handbook://limits", "handbook://logo.png"]
tool = "search"
tool_arguments = {{ query = "{{input}}", top_k = 2 }}
headers = {{ authorization = "env:HANDBOOK_MCP_TOKEN" }}
failure_policy = "omit"

[contributors.archive]
kind = "mcp"
url = "http://127.0.0.1:{closed_port}/mcp"
resources = ["archive://2025"]
failure_policy = "omit"
"""


@contextmanager
def serve_service(folder: Path, config: str) -> Iterator[tuple[str, Path]]:
    """``context-assembly serve`` with ``config`` on a free port, ready once ``/healthz``
    answers (``context_assembly_client.testing.start_service``); its JSON log lines go to a
    file. The header's value reaches it through the environment only."""
    (folder / "service.toml").write_text(config)
    log = folder / "service.log"
    env = {"HANDBOOK_MCP_TOKEN": f"Bearer {TOKEN}"}
    with start_service(folder / "service.toml", env=env, log=log) as service:
        yield service.url, log


def log_events(log: Path, name: str) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = orjson.loads(line)
            if event.get("event") == name:
                events.append(event)
    return events


REQUEST = {
    "model": "gpt-4o-mini",
    "assembly": {"max_data_tokens": 160, "timeout_ms": 2000},
    "instructions": "You are a support assistant.",
    "plugins": [
        {"name": "handbook", "instructions": "Excerpts of the support handbook."},
        {"name": "archive", "instructions": "Past cases."},
    ],
    "contributors": [
        {"source": "handbook", "endpoint": "handbook"},
        {"source": "archive", "endpoint": "archive"},
    ],
    "input": [{"role": "user", "content": "How do refunds work?"}],
}


def main() -> int:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the archive server is down
    with (
        tempfile.TemporaryDirectory(prefix="ca-mcp-example-") as tmp,
        serve_mcp(free_port()) as mcp_url,
        serve_service(Path(tmp), config_toml(Path(tmp), mcp_url, closed.getsockname()[1])) as (
            base,
            log,
        ),
        Client(base, timeout=10.0) as client,
    ):
        print(f"mcp server: {mcp_url} (official SDK, event-stream answers, sessions)")
        print('service: its own, registering [contributors.handbook] kind = "mcp"')
        prep = client.prepare(REQUEST)
        print(f"prepare: {prep.preparation_id}")
        for source in prep.selection.sources:
            print(f"  source {source.source}: status={source.status} blocks={source.block_count}")
        for block in sorted(prep.selection.blocks, key=lambda b: (-b.priority, b.id)):
            print(
                f"  block {block.source}/{block.id}: {block.status} ({block.reason}) "
                f"priority={block.priority} tokens={block.tokens}"
            )
        client.prepare(REQUEST)  # a second turn: the same session
        for event in log_events(log, "mcp_binary_skipped")[:1]:
            print(
                f"log: mcp_binary_skipped source={event['source']} items={event['items']}"
                f" bytes={event['bytes']}"
            )
        opened = log_events(log, "mcp_session_opened")
        print(
            f"log: mcp_session_opened x{len(opened)} after 2 prepares"
            f" (protocol {opened[0]['protocol_version']})"
        )
        valid = client.validate(prep.preparation_id, model=prep.model, frame=prep.frame)
        print(f"validate: valid={valid.valid} (the handbook's revisions read again)")
        token_seen = TOKEN in log.read_text()
    closed.close()
    print(f"header value in the service log: {token_seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
