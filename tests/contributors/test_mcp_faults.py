"""MCP contributors against faulty MCP servers (the official SDK's, in subprocesses): a server
that hangs, one that streams without end, one that answers 50 MB, one that is gone; the same
deadline, caps and failure policies as webhooks."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from faults import CAP, DEADLINE, FaultServer, closed_port, registered
from mcp_servers import BIG_BYTES, McpProcess, mcp_server

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
    raise_for_failures,
)
from context_assembly.contributors.calls import FailurePolicy
from context_assembly.contributors.mcp import McpEndpoint, McpSpec
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError


@pytest.fixture(scope="module", params=["sse", "json"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[McpProcess]:
    """The test server answering with event streams, and with JSON bodies."""
    with mcp_server(tmp_path_factory.mktemp("mcp"), answers=request.param) as process:
        yield process


def mcp_target(
    url: str, policy: FailurePolicy = "omit", source: str = "docs", **spec: object
) -> ContributorTarget:
    endpoint = McpEndpoint(McpSpec(url=url, **spec))  # type: ignore[arg-type]
    return ContributorTarget(source=source, url=url, mcp=endpoint, failure_policy=policy)


HANG: dict[str, Any] = {"tool": "hang", "tool_arguments": {"query": "{input}"}}


async def test_a_hanging_server_is_cut_at_the_deadline_and_told(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A tool that never answers is ``timeout`` by the deadline; a server with a session gets
    ``notifications/cancelled`` for it and stops the tool."""
    notices = server.lines().count("POST notifications/cancelled")
    cancelled = server.lines().count("hang cancelled")
    [outcome] = await contribute_all(
        client, [mcp_target(server.url, **HANG)], fields, time.monotonic() + DEADLINE, CAP
    )
    assert (outcome.status, outcome.cause) == ("timeout", "deadline reached")
    await server.recorded("POST notifications/cancelled", notices + 1)
    await server.recorded("hang cancelled", cancelled + 1)


@pytest.mark.parametrize(("policy", "error"), [("omit", None), ("fail", AssemblyTimeoutError)])
async def test_a_hanging_server_fails_like_a_hanging_webhook(
    client: ContributorClient,
    fields: PacketFields,
    server: McpProcess,
    policy: FailurePolicy,
    error: type[AssemblyTimeoutError] | None,
) -> None:
    """Beside a hanging webhook, a hanging MCP server is cut by the same deadline with the
    same status (the webhook's connection closed, the MCP tool cancelled on the server); under
    ``fail`` both are the one 504 (``AssemblyTimeoutError``) naming them."""
    cancelled = server.lines().count("hang cancelled")
    async with FaultServer("hang") as webhook:
        targets = [
            mcp_target(server.url, policy, **HANG),
            registered(webhook, "notes", failure_policy=policy),
        ]
        outcomes = await contribute_all(client, targets, fields, time.monotonic() + DEADLINE, CAP)
        await asyncio.wait_for(webhook.peer_closed.wait(), timeout=5.0)  # bounded: a hang guard
    assert [o.status for o in outcomes] == ["timeout", "timeout"]
    assert all((o.cause or "").startswith("deadline reached") for o in outcomes), outcomes
    await server.recorded("hang cancelled", cancelled + 1)
    if error is None:
        raise_for_failures(outcomes, targets)
    else:
        with pytest.raises(error) as raised:
            raise_for_failures(outcomes, targets)
        assert raised.value.extensions["sources"] == ["docs", "notes"]


async def test_a_failed_mcp_source_under_fail_ends_the_fan_out(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """An MCP error under ``fail`` ends the fan-out at once with 502 naming the source, while
    a hanging webhook beside it is abandoned (its call cancelled, its connection closed), not
    waited for to its deadline (its outcome is not among the settled calls)."""
    async with FaultServer("hang") as webhook:
        targets = [
            mcp_target(server.url, "fail", tool="failing", tool_arguments={"query": "q"}),
            registered(webhook, "notes", failure_policy="omit"),
        ]
        with pytest.raises(ContributorFailedError) as raised:
            await contribute_all(
                client, targets, fields, time.monotonic() + 30.0, CAP, fail_fast=True
            )
        await asyncio.wait_for(webhook.peer_closed.wait(), timeout=5.0)  # bounded: a hang guard
    assert raised.value.extensions["source"] == "docs"
    assert raised.value.extensions["contributor_status"] == "error"
    assert [source for source, _, _ in raised.value.calls] == ["docs"]


async def traced_call(
    client: ContributorClient, target: ContributorTarget, fields: PacketFields, cap: int
) -> tuple[ContributorOutcome, int, int]:
    """One call of ``target`` under ``cap``, with the bytes this process allocated for it:
    ``(outcome, kept afterwards, peak)``. The collector is off during the call, so what is kept
    must be freed by reference counting, not by a later collection."""
    gc.disable()
    tracemalloc.start()
    try:
        [outcome] = await contribute_all(client, [target], fields, time.monotonic() + 30.0, cap)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    return outcome, kept, peak


async def test_an_endless_event_stream_is_cut_by_the_byte_cap(
    client: ContributorClient, fields: PacketFields, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A tool that streams notifications without end is ``too_large`` once the stream passes
    the cap, long before the deadline, with memory bounded by the cap; the server is told to
    stop the tool."""
    cap = 64 * 1024
    with mcp_server(tmp_path_factory.mktemp("mcp")) as streaming:
        target = mcp_target(streaming.url, tool="flood", tool_arguments={"query": "q"})
        await contribute_all(client, [target], fields, time.monotonic() + 30.0, cap)  # the session
        outcome, kept, peak = await traced_call(client, target, fields, cap)
        await streaming.recorded("POST notifications/cancelled")
        await streaming.recorded("flood cancelled")
    assert (outcome.status, outcome.cause) == ("too_large", f"answers over the {cap}-byte cap")
    assert peak < 4 * 1024 * 1024
    assert kept < cap // 2


async def test_a_50_mb_answer_is_refused_without_memory_growth(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A 50 MB resource is ``too_large`` under a 1 MiB cap: as a JSON body it is refused on its
    ``Content-Length``, as an event stream once the counted bytes pass the cap; this process
    never holds more than a few MiB of it, and keeps none of it afterwards."""
    cap = 1024 * 1024
    target = mcp_target(server.url, resources=("big://50mb",))
    await contribute_all(client, [target], fields, time.monotonic() + 30.0, cap)  # warm pools
    outcome, kept, peak = await traced_call(client, target, fields, cap)
    assert outcome.status == "too_large", outcome.cause
    assert peak < 8 * 1024 * 1024 < BIG_BYTES
    assert kept < cap // 4  # nothing of the refused answer stays referenced


async def test_a_server_that_is_gone_is_an_error(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Nothing listening: ``error`` with the connect failure as cause."""
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    [outcome] = await contribute_all(
        client, [mcp_target(url, tool="search")], fields, time.monotonic() + 5.0, CAP
    )
    assert (outcome.status, outcome.cause) == ("error", "connect refused")


async def test_a_webhook_answer_is_not_mcp(client: ContributorClient, fields: PacketFields) -> None:
    """An endpoint that answers like a webhook, not with JSON-RPC, is ``invalid``."""
    async with FaultServer() as webhook:
        [outcome] = await contribute_all(
            client, [mcp_target(webhook.url, tool="search")], fields, time.monotonic() + 5.0, CAP
        )
    assert (outcome.status, outcome.cause) == ("invalid", "not a JSON-RPC message")


async def test_with_no_time_left_nothing_is_sent(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A call with no time left before the deadline is ``skipped_deadline`` and never sent."""
    requests = len(server.lines())
    [outcome] = await contribute_all(
        client, [mcp_target(server.url, tool="search")], fields, time.monotonic() - 1.0, CAP
    )
    assert outcome.status == "skipped_deadline"
    assert len(server.lines()) == requests
