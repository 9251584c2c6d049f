"""What an MCP server does wrong is the server's outcome, never the service's bug: a session
forgotten as soon as it was opened, a session id that cannot be sent back, a ``ttlMs`` at a
handshake revision, a protocol version the service lacks. None of them counts in
``context_assembly_internal_errors_total`` or logs ``internal_error``; a session the service
refuses is ended on the server; at shutdown every session is ended or logged, those of calls
still under way included.

Against hand-written loopback servers (``mcp_scripted.ScriptedMcp``), through the production
client, ``contribute_all`` and ``query_revision``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog
from faults import CAP
from mcp_scripted import ScriptedMcp, raw
from structlog.typing import EventDict

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
    query_revision,
)
from context_assembly.contributors.mcp import McpEndpoint, McpEndpoints, McpSpec
from context_assembly.contributors.mcp_session import CLOSE_SESSION_SECONDS, SHUTDOWN_GRACE_SECONDS
from context_assembly.core.request import Scope
from context_assembly.metrics import Metrics

PINNED = ("docs://a",)


@pytest.fixture
def scripted() -> Iterator[ScriptedMcp]:
    with ScriptedMcp() as server:
        yield server


def internal_errors() -> tuple[float, float]:
    """``context_assembly_internal_errors_total`` at ``contribute`` and ``revision``."""
    registry = Metrics().registry
    found = [
        registry.get_sample_value("context_assembly_internal_errors_total", {"where": where})
        for where in ("contribute", "revision")
    ]
    assert None not in found
    return found[0] or 0.0, found[1] or 0.0


def target(endpoint: McpEndpoint) -> ContributorTarget:
    return ContributorTarget(
        source="docs", url=endpoint.spec.url, mcp=endpoint, failure_policy="omit"
    )


async def call_and_validate(
    client: ContributorClient, fields: PacketFields, endpoint: McpEndpoint, ends: int = 0
) -> tuple[ContributorOutcome, Any, list[EventDict]]:
    """One prepare's call and one validate's revision query of ``endpoint``, with the log lines
    they wrote (until ``ends`` session ends, sent in the background, are logged); neither may
    count or log an internal error."""
    before = internal_errors()
    with structlog.testing.capture_logs() as logs:
        [outcome] = await contribute_all(
            client, [target(endpoint)], fields, time.monotonic() + 5.0, CAP
        )
        revision = await query_revision(client, target(endpoint), Scope(), time.monotonic() + 5.0)
        await asyncio.wait_for(ended(logs, ends), timeout=5.0)  # a hang guard
    assert internal_errors() == before
    assert not [line for line in logs if line["event"] == "internal_error"]
    return outcome, revision, logs


def events(logs: list[EventDict], name: str) -> list[EventDict]:
    return [line for line in logs if line["event"] == name]


async def test_a_server_that_forgets_the_session_at_once_is_an_error_of_the_server(
    client: ContributorClient, fields: PacketFields, scripted: ScriptedMcp
) -> None:
    """A ``404`` to ``notifications/initialized`` (the server forgot the session it had just
    opened) is ``error`` with the cause ``session_lost``, for a prepare and for validate; the
    forgotten session is not ended (there is nothing left of it)."""
    scripted.answers["notifications/initialized"] = lambda message: httpx.Response(404)
    endpoint = McpEndpoint(McpSpec(url=scripted.url, resources=PINNED), name="docs")
    outcome, revision, _ = await call_and_validate(client, fields, endpoint)
    assert (outcome.status, outcome.failure and outcome.failure.cause) == ("error", "session_lost")
    assert outcome.cause == "the server forgot the session as it opened it"
    assert revision == ("error", None)
    assert not scripted.requests("DELETE -")


@pytest.mark.parametrize("session_id", [b"ab\x01cd", b"ab\x7fcd", b"ab cd", b"\xc3\xa9t\xc3\xa9"])
async def test_a_session_id_that_is_not_visible_ascii_is_an_invalid_answer(
    client: ContributorClient, fields: PacketFields, session_id: bytes
) -> None:
    """A session id with a control character, a space or a byte beyond ASCII breaks the
    transport's rule (visible ASCII only): ``invalid`` with the cause ``invalid_answer``, never
    sent back (not even to end it), and logged as a refused session."""
    with ScriptedMcp(session_id=session_id) as scripted:
        endpoint = McpEndpoint(McpSpec(url=scripted.url, tool="search"), name="docs")
        with structlog.testing.capture_logs() as logs:
            before = internal_errors()
            [outcome] = await contribute_all(
                client, [target(endpoint)], fields, time.monotonic() + 5.0, CAP
            )
            assert internal_errors() == before
        assert (outcome.status, outcome.failure and outcome.failure.cause) == (
            "invalid",
            "invalid_answer",
        )
        assert outcome.cause == "the session id is not visible ASCII characters"
        assert scripted.methods() == ["POST initialize"]
    assert [line["cause"] for line in events(logs, "mcp_session_refused")] == ["invalid_answer"]
    assert not events(logs, "internal_error")


async def test_a_ttl_at_a_handshake_revision_gives_no_expiry(
    client: ContributorClient, fields: PacketFields, scripted: ScriptedMcp
) -> None:
    """``ttlMs`` belongs to revision 2026-07-28; a server that sends it at a handshake revision
    (1 ms, or 10^20 ms, which no clock can add) has its resources read as usual: ``ok``, the
    blocks without ``expires_at``."""
    for ttl in (1, 10**20):

        def read(message: dict[str, Any], ttl: int = ttl) -> httpx.Response:
            contents = b'[{"uri":"docs://a","text":"A"}]'
            body = b'{"jsonrpc":"2.0","id":%d,"result":{"contents":%s,"ttlMs":%d}}'
            return raw(body % (message["id"], contents, ttl))

        scripted.answers["resources/read"] = read
        endpoint = McpEndpoint(McpSpec(url=scripted.url, resources=PINNED), name="docs")
        outcome, revision, _ = await call_and_validate(client, fields, endpoint)
        assert outcome.status == "ok", outcome.failure
        assert [(b.id, b.expires_at) for b in outcome.blocks] == [("docs://a", None)]
        assert revision[0] == "ok"


@pytest.mark.parametrize("version", ["2099-01-01", "2026-07-28"])
async def test_a_session_the_service_refuses_is_ended_on_the_server(
    client: ContributorClient, fields: PacketFields, version: str
) -> None:
    """A server that answers ``initialize`` with a protocol version the service does not speak
    fails the source (``error``, ``protocol_version``), and the session it opened is ended: a
    ``DELETE`` with its session id (and no protocol version header, as none was agreed)."""
    with ScriptedMcp(protocol_version=version) as scripted:
        endpoint = McpEndpoint(McpSpec(url=scripted.url, resources=PINNED), name="docs")
        outcome, revision, logs = await call_and_validate(client, fields, endpoint, ends=2)
        deletes = scripted.requests("DELETE -")
    assert (outcome.status, outcome.failure and outcome.failure.cause) == (
        "error",
        "protocol_version",
    )
    assert revision == ("error", None)
    assert [d.headers.get("mcp-session-id") for d in deletes] == ["session-1", "session-1"]
    assert all("mcp-protocol-version" not in d.headers for d in deletes)
    assert [line["cause"] for line in events(logs, "mcp_session_refused")] == [
        "protocol_version",
        "protocol_version",
    ]


async def ended(logs: list[EventDict], count: int) -> None:
    """Until ``count`` session ends (answered or failed) are logged: they are sent in the
    background."""
    while len(events(logs, "mcp_session_ended") + events(logs, "mcp_session_end_failed")) < count:
        await asyncio.sleep(0.01)


async def test_every_session_left_at_shutdown_is_ended_and_logged(
    client: ContributorClient, fields: PacketFields
) -> None:
    """At shutdown the registry ends every session within its bound and logs each end: an idle
    one (``mcp_session_ended``), one whose ``DELETE`` gets no answer (``mcp_session_end_failed``),
    one that a call still uses (ended at once, not after the call) and an inline server's in use;
    the calls under way open no new session afterwards."""
    with ScriptedMcp() as idle, ScriptedMcp() as deaf, ScriptedMcp() as busy:
        deaf.on_delete = deaf.hang
        busy.answers["tools/call"] = lambda message: busy.hang()
        endpoints = McpEndpoints()
        idle_one = endpoints.registered("t1", "idle", McpSpec(url=idle.url, resources=PINNED))
        deaf_one = endpoints.registered("t1", "deaf", McpSpec(url=deaf.url, resources=PINNED))
        busy_one = endpoints.registered("t2", "busy", McpSpec(url=busy.url, tool="hang"))
        for endpoint in (idle_one, deaf_one):
            [outcome] = await contribute_all(
                client, [target(endpoint)], fields, time.monotonic() + 5.0, CAP
            )
            assert outcome.ok, outcome.failure
        running = [
            asyncio.ensure_future(
                contribute_all(client, [target(each)], fields, time.monotonic() + 30.0, CAP)
            )
            for each in (busy_one, endpoints.inline(McpSpec(url=busy.url, tool="hang"), pin=None))  # type: ignore[arg-type]
        ]
        while len(busy.requests("POST tools/call")) < 2:
            await asyncio.sleep(0.01)
        assert endpoints.open_sessions() == 4
        with structlog.testing.capture_logs() as logs:
            started = time.monotonic()
            await endpoints.aclose()
            took = time.monotonic() - started
            assert took < CLOSE_SESSION_SECONDS + SHUTDOWN_GRACE_SECONDS + 0.5
            assert endpoints.open_sessions() == 0
            # The server sees the sessions of the calls under way ended while they still wait.
            while len(busy.requests("DELETE -")) < 2:
                await asyncio.sleep(0.01)
            assert not any(task.done() for task in running)
            for task in running:  # what the server's shutdown does to requests still in flight
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        initializes = [len(s.requests("POST initialize")) for s in (idle, deaf, busy)]
    assert initializes == [1, 1, 2]  # no session opened after the shutdown began
    assert sorted(line["endpoint"] for line in events(logs, "mcp_session_ended")) == [
        "busy",
        "idle",
        "inline",
    ]
    [failed] = events(logs, "mcp_session_end_failed")
    assert (failed["endpoint"], failed["cause"]) == ("deaf", "no answer in time")
    assert not events(logs, "internal_error")


async def test_a_call_after_the_shutdown_opens_no_session(
    client: ContributorClient, fields: PacketFields, scripted: ScriptedMcp
) -> None:
    """Once the registry is closed, a call that would need a new session fails at once
    (``error``) without asking the server for one."""
    endpoints = McpEndpoints()
    endpoint = endpoints.registered("t1", "docs", McpSpec(url=scripted.url, resources=PINNED))
    await endpoints.aclose()
    [outcome] = await contribute_all(
        client, [target(endpoint)], fields, time.monotonic() + 5.0, CAP
    )
    assert (outcome.status, outcome.cause) == ("error", "the service is shutting down")
    assert scripted.methods() == []


async def test_an_unparsable_listing_page_and_a_json_rpc_error_stay_the_servers(
    client: ContributorClient, fields: PacketFields, scripted: ScriptedMcp
) -> None:
    """Guards for the listing's new path: a page that is not JSON-RPC is ``invalid``, a JSON-RPC
    error to ``resources/list`` is ``error`` (``jsonrpc_error``), as before."""
    scripted.answers["resources/list"] = lambda message: raw(b"{not json")
    endpoint = McpEndpoint(McpSpec(url=scripted.url, resources="listed"), name="docs")
    outcome, _, _ = await call_and_validate(client, fields, endpoint)
    assert (outcome.status, outcome.failure and outcome.failure.cause) == (
        "invalid",
        "invalid_answer",
    )
    scripted.answers["resources/list"] = lambda message: raw(
        b'{"jsonrpc":"2.0","id":%d,"error":{"code":-32603,"message":"down"}}' % message["id"]
    )
    outcome, _, _ = await call_and_validate(client, fields, endpoint)
    assert (outcome.status, outcome.failure and outcome.failure.cause) == ("error", "jsonrpc_error")
