"""MCP call overhead: a prepare with one MCP source against the same content from a webhook.

One service (``context-assembly serve``, SQLite, uvloop) registers three contributors with the
same content, two text resources and one search result of about 400 characters each:

- ``mcp_sse``: an MCP server built with the official SDK (``MCPServer`` under uvicorn), in its
  default form (event-stream answers, sessions); the source pins the 2 resources and calls the
  ``search`` tool, so each prepare sends ``resources/list``, 2 ``resources/read`` and a
  ``tools/call`` (the session is opened once, in the warm-up);
- ``mcp_json``: the same server answering JSON bodies, stateless;
- ``webhook``: a webhook answering the same 3 blocks in one body (the scripted contributor double
  of ``context_assembly_client.testing`` in a process of its own, on uvloop).

For reference, each round also sends the same four MCP requests straight to the event-stream
server through the official SDK's own client (``mcp.Client``, handshake mode), with no service
in the path: the part of an MCP prepare that is the server's and the protocol's.

Each prepare names one source. The three kinds run interleaved (one of each per round, at
concurrency 1, from one aiohttp session on uvloop) after a warm-up, so that machine noise falls
on all three alike; p50 and p99 of each and the ratios to the webhook are printed, with a
``FIGURE`` line for each MCP form (reference figures, no target).

Bounded: fixed request counts, loopback only, every process stopped at the end.
Run: ``make bench`` or ``.venv/bin/python bench/bench_mcp.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import uvicorn
import uvloop
from context_assembly_client.testing import ServedProcess, Step, start_contributor, start_service
from figures import report
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import Annotations, TextContent

HERE = Path(__file__).resolve().parent
ROUNDS = 300
WARMUP = 30
TEXTS = {
    "bench://guide/refunds": "Refunds are accepted within 30 days of delivery. " * 8,
    "bench://guide/limits": "A refund above 500 EUR needs a second approval. " * 8,
}
HIT = "Refund desk: refunds@example.com, open on weekdays. " * 8
SOURCES = ("mcp_sse", "mcp_json", "webhook")


# --------------------------------------------------------------------------- the servers


def serve_mcp(port: int, answers: str) -> None:
    """The MCP server (run in its own process): 2 resources and a search tool."""
    server = MCPServer("bench", log_level="WARNING")
    refunds, limits = TEXTS

    @server.resource(refunds, annotations=Annotations(priority=0.9))
    def read_refunds() -> str:
        return TEXTS[refunds]

    @server.resource(limits, annotations=Annotations(priority=0.2))
    def read_limits() -> str:
        return TEXTS[limits]

    @server.tool(structured_output=False)
    def search(query: str) -> list[TextContent]:
        return [TextContent(type="text", text=HIT, annotations=Annotations(priority=1.0))]

    app = server.streamable_http_app(
        json_response=answers == "json", stateless_http=answers == "json"
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop")


WEBHOOK_BLOCKS = [
    {"id": "bench://guide/refunds", "text": TEXTS["bench://guide/refunds"], "priority": 800},
    {"id": "bench://guide/limits", "text": TEXTS["bench://guide/limits"], "priority": -600},
    {"id": "search#0", "text": HIT, "priority": 1000},
]
"""The webhook's answer: the MCP sources' content as blocks."""


# --------------------------------------------------------------------------- processes


def config(folder: Path, sse: int, json_: int, webhook: int) -> str:
    mcp = (
        'kind = "mcp"\nresources = {resources}\ntool = "search"\n'
        'tool_arguments = {{ query = "{{input}}" }}\n'
    )
    resources = "[" + ", ".join(f'"{uri}"' for uri in TEXTS) + "]"
    return (
        f'[store]\npath = "{folder / "bench.db"}"\n\n'
        f'[contributors.mcp_sse]\nurl = "http://127.0.0.1:{sse}/mcp"\n'
        + mcp.format(resources=resources)
        + f'\n[contributors.mcp_json]\nurl = "http://127.0.0.1:{json_}/mcp"\n'
        + mcp.format(resources=resources)
        + f'\n[contributors.webhook]\nurl = "http://127.0.0.1:{webhook}/contribute"\n'
    )


def request(source: str) -> bytes:
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "assembly": {"max_data_tokens": 2000, "timeout_ms": 2000},
            "plugins": [{"name": "docs"}],
            "contributors": [{"source": "docs", "endpoint": source}],
            "input": [{"role": "user", "content": "How do refunds work?"}],
        }
    )


# --------------------------------------------------------------------------- load


async def sdk_round(client: Client) -> None:
    """The same four requests through the official SDK's own client, straight to the server."""
    refunds, limits = TEXTS
    await asyncio.gather(
        client.list_resources(),
        client.read_resource(refunds),
        client.read_resource(limits),
        client.call_tool("search", {"query": "How do refunds work?"}),
    )


async def measure(base: str, sse_url: str) -> dict[str, list[float]]:
    bodies = {source: request(source) for source in SOURCES}
    latencies: dict[str, list[float]] = {source: [] for source in (*SOURCES, "sdk_client")}
    headers = {"content-type": "application/json"}
    async with (
        aiohttp.ClientSession(base) as session,
        Client(sse_url, mode="legacy") as sdk,
    ):
        for round_ in range(WARMUP + ROUNDS):
            started = time.perf_counter()
            await sdk_round(sdk)
            if round_ >= WARMUP:
                latencies["sdk_client"].append((time.perf_counter() - started) * 1000)
            for source in SOURCES:
                started = time.perf_counter()
                async with session.post(
                    "/v1/prepare", data=bodies[source], headers=headers
                ) as answer:
                    body = await answer.read()
                elapsed = (time.perf_counter() - started) * 1000
                if answer.status != 200:
                    raise RuntimeError(f"{source}: HTTP {answer.status} {body[:300]!r}")
                statuses = [s["status"] for s in orjson.loads(body)["selection"]["sources"]]
                if statuses != ["ok"]:
                    raise RuntimeError(f"{source}: source status {statuses}")
                if round_ >= WARMUP:
                    latencies[source].append(elapsed)
    return latencies


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "serve-mcp":
        serve_mcp(int(sys.argv[2]), sys.argv[3])
        return
    procs: list[ServedProcess] = []
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        try:
            servers: dict[str, ServedProcess] = {}
            for source, answers in (("mcp_sse", "sse"), ("mcp_json", "json")):
                cmd = [sys.executable, str(HERE / "bench_mcp.py"), "serve-mcp", "{port}", answers]
                servers[source] = ServedProcess(cmd, ready=None)
                procs.append(servers[source])
            servers["webhook"] = start_contributor(default=Step(blocks=WEBHOOK_BLOCKS), uvloop=True)
            procs.append(servers["webhook"])
            folder = Path(tmp)
            ports = {source: server.port for source, server in servers.items()}
            (folder / "service.toml").write_text(
                config(folder, ports["mcp_sse"], ports["mcp_json"], ports["webhook"])
            )
            service = start_service(folder / "service.toml")
            procs.append(service)
            sse_url = f"http://127.0.0.1:{ports['mcp_sse']}/mcp"
            latencies = uvloop.run(measure(service.url, sse_url))
        finally:
            for proc in reversed(procs):
                proc.stop()
    print(
        f"prepare with one source of 2 resources + 1 search result, c=1, {ROUNDS} rounds,"
        " interleaved"
    )
    webhook = latencies["webhook"]
    for source in SOURCES:
        values = latencies[source]
        print(
            f"  {source:9} p50 {pct(values, 0.5):6.2f} ms  p99 {pct(values, 0.99):6.2f} ms"
            f"  ratio to the webhook: p50 {pct(values, 0.5) / pct(webhook, 0.5):.2f}x"
            f"  p99 {pct(values, 0.99) / pct(webhook, 0.99):.2f}x"
        )
    sdk = latencies["sdk_client"]
    print(
        f"  sdk_client p50 {pct(sdk, 0.5):6.2f} ms  p99 {pct(sdk, 0.99):6.2f} ms"
        "  (the same 4 requests, the SDK's own client straight to the mcp_sse server)"
    )
    for source, form in (("mcp_sse", "event streams, sessions"), ("mcp_json", "JSON, stateless")):
        values = latencies[source]
        report(
            f"prepare with one MCP source (2 resources + 1 tool; SDK server, {form}), c=1: "
            "p50 / p99, and p50 ratio to the same content from a webhook",
            f"{pct(values, 0.5):.2f} / {pct(values, 0.99):.2f} ms; "
            f"{pct(values, 0.5) / pct(webhook, 0.5):.2f}x (webhook p50 {pct(webhook, 0.5):.2f} ms;"
            f" the SDK's own client straight to the server p50 {pct(sdk, 0.5):.2f} ms)",
            "reference",
            None,
        )


if __name__ == "__main__":
    os.chdir(HERE)
    main()
