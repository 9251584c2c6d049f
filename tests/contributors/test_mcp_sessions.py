"""MCP sessions end on the server: a session dropped by a reload, by the registry's bound or at
shutdown is ended with a ``DELETE`` once no call uses it; an inline MCP URL gets one session per
call, ended after it. Against real servers built with the official SDK (subprocesses), through
the production client and the service's own :class:`Contributors`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from faults import CAP
from mcp_servers import REFUNDS, McpProcess, mcp_server

from context_assembly.config import Settings
from context_assembly.contributors import ContributorClient, PacketFields, contribute_all
from context_assembly.contributors.calls import ContributorTarget
from context_assembly.contributors.mcp import McpEndpoints, McpSpec
from context_assembly.core.request import ContributorRef, PrepareRequest
from context_assembly.core.sources import plan_sources
from context_assembly.preparations.clock import Clock
from context_assembly.preparations.targets import Contributors

DELETE = "DELETE -"
REFUNDS_URI = "docs://guide/refunds"
LOGO = "docs://logo.png"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    """The SDK's default form: event-stream answers, sessions."""
    with mcp_server(tmp_path_factory.mktemp("mcp")) as process:
        yield process


async def deletes_reach(server: McpProcess, count: int, timeout: float = 10.0) -> None:
    """Bounded polling of the server's record until it has received ``count`` DELETEs (a
    session is ended in the background, after the call that used it)."""
    deadline = time.monotonic() + timeout
    while server.lines().count(DELETE) < count:
        assert time.monotonic() < deadline, f"{count} DELETEs never arrived: {server.lines()}"
        await asyncio.sleep(0.02)


async def call(
    client: ContributorClient, fields: PacketFields, target: ContributorTarget, timeout: float = 5.0
) -> Any:
    [outcome] = await contribute_all(client, [target], fields, time.monotonic() + timeout, CAP)
    return outcome


def registration(url: str, **keys: Any) -> dict[str, Any]:
    return {"kind": "mcp", "url": url, "failure_policy": "omit", **keys}


async def test_a_reload_ends_the_sessions_it_drops(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A reload that changes a registration drops its session and ends it on the server
    (``DELETE`` with its session id); an unchanged registration keeps its session open."""
    docs = registration(server.url, resources=[REFUNDS_URI])
    wiki = registration(server.url, resources=["docs://guide/limits"])
    calls = Contributors(
        Settings(contributors={"docs": docs, "wiki": wiki}), client, resolver=None, clock=Clock()
    )
    for name in ("docs", "wiki"):
        target = calls.registered("default", 0, ContributorRef(source=name, endpoint=name))
        assert (await call(client, fields, target)).status == "ok"
    assert calls.mcp.open_sessions() == 2
    before = server.lines().count(DELETE)
    with structlog.testing.capture_logs() as logs:
        changed = {**docs, "resources": [REFUNDS_URI, "docs://guide/limits"]}
        calls.reconfigure(Settings(contributors={"docs": changed, "wiki": wiki}))
        assert calls.mcp.open_sessions() == 1  # wiki's, kept
        await deletes_reach(server, before + 1)
        await calls.aclose()  # at shutdown: wiki's is ended too, before aclose returns
    assert server.lines().count(DELETE) == before + 2
    assert calls.mcp.open_sessions() == 0
    ended = [line for line in logs if line["event"] == "mcp_session_ended"]
    assert [(line["endpoint"], line["status"]) for line in ended] == [("docs", 200), ("wiki", 200)]


async def test_a_session_in_use_is_ended_when_its_last_call_is_over(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A session dropped while a prepare still uses it stays open until that call is over (here
    cut by its deadline), and is ended then."""
    endpoints = McpEndpoints()
    spec = McpSpec(url=server.url, tool="hang", tool_arguments={"query": "{input}"})
    endpoint = endpoints.registered("default", "hang", spec)
    target = ContributorTarget(source="docs", url=server.url, mcp=endpoint, failure_policy="omit")
    before = server.lines().count(DELETE)
    running = asyncio.ensure_future(call(client, fields, target, timeout=1.0))
    await server.recorded("hang started")
    endpoints.retain({})  # the registration is gone
    assert endpoint.dropped and len(endpoints) == 0
    assert endpoints.open_sessions() == 1  # still the running call's
    assert (await running).status == "timeout"
    assert endpoints.open_sessions() == 0
    await deletes_reach(server, before + 1)
    await endpoints.aclose()


async def test_a_stateless_server_has_no_session_to_end(
    client: ContributorClient, fields: PacketFields, tmp_path: Path
) -> None:
    """A server that sets no session id holds nothing open: no session is counted, and neither
    a reload nor the shutdown sends a DELETE."""
    with mcp_server(tmp_path, answers="json", sessions="stateless") as stateless:
        endpoints = McpEndpoints()
        endpoint = endpoints.registered(
            "default", "docs", McpSpec(url=stateless.url, resources=(REFUNDS_URI,))
        )
        target = ContributorTarget(
            source="docs", url=stateless.url, mcp=endpoint, failure_policy="omit"
        )
        assert (await call(client, fields, target)).status == "ok"
        assert endpoints.open_sessions() == 0
        endpoints.retain({})
        await endpoints.aclose()
        assert DELETE not in stateless.lines()
        assert "POST initialize" in stateless.lines()


def inline_request(url: str, **mcp: Any) -> PrepareRequest:
    return PrepareRequest.model_validate(
        {
            "model": "gpt-4o-mini",
            "plugins": [{"name": "docs"}],
            "contributors": [
                {"source": "docs", "url": url, "kind": "mcp", "failure_policy": "omit", **mcp}
            ],
            "input": [{"role": "user", "content": "What is the refund policy?"}],
        }
    )


async def test_an_inline_mcp_url_is_called_through_the_allowlist_with_a_session_per_call(
    client: ContributorClient, server: McpProcess
) -> None:
    """An inline ``kind: "mcp"`` URL that ``[inline_urls]`` admits is read like a registered MCP
    server: its source goes to the core as ``mcp`` with its blocks and its binary content as a
    skipped item; its session serves that call only and is ended after it."""
    settings = Settings(
        inline_urls={
            "allow": [{"prefix": f"http://127.0.0.1:{server.port}/", "allow_private": True}]
        }
    )
    calls = Contributors(settings, client, resolver=None, clock=Clock())
    request = inline_request(server.url, resources=[REFUNDS_URI, LOGO])
    before = server.lines().count(DELETE), server.lines().count("POST initialize")
    for round_ in (1, 2):
        collected = await calls.collect(
            "default", request, plan_sources(request), "prep_x", budget_ms=5000, attempt=1
        )
        [docs] = collected.inputs
        assert (docs.setup.kind, docs.status) == ("mcp", "ok")
        assert [(b.id, b.text) for b in docs.blocks] == [(REFUNDS_URI, REFUNDS)]
        assert docs.skipped == ((LOGO, "binary_content"),)
        await deletes_reach(server, before[0] + round_)
    assert server.lines().count("POST initialize") == before[1] + 2
    assert calls.mcp.open_sessions() == 0 and len(calls.mcp) == 0


async def test_an_inline_mcp_url_off_the_allowlist_is_rejected_as_mcp(
    client: ContributorClient, server: McpProcess
) -> None:
    """Without an allowlist entry an inline MCP URL is never called: under ``omit`` its source
    is ``rejected``, reported with its kind."""
    calls = Contributors(Settings(), client, resolver=None, clock=Clock())
    request = inline_request(server.url, tool="search", tool_arguments={"query": "{input}"})
    requests = len(server.lines())
    collected = await calls.collect(
        "default", request, plan_sources(request), "prep_x", budget_ms=5000, attempt=1
    )
    [docs] = collected.inputs
    assert (docs.setup.kind, docs.status, docs.blocks, docs.skipped) == ("mcp", "rejected", (), ())
    assert len(server.lines()) == requests
