"""MCP contributors against real MCP servers (the official SDK's ``MCPServer`` under uvicorn, in
subprocesses): the mapping to blocks, sessions, revisions, headers and pinning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from doubles import RecordingResolver
from faults import CAP
from mcp_servers import LIMITS, PINNED_HOST, REFUNDS, McpProcess, mcp_server

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    UrlPolicy,
    check_url,
    contribute_all,
    query_revision,
)
from context_assembly.contributors.mcp import McpEndpoint, McpSpec
from context_assembly.contributors.mcp_mapping import Skipped
from context_assembly.core.request import Scope

MODES = [("sse", "stateful"), ("json", "stateless"), ("json", "stateful"), ("sse", "stateless")]


@pytest.fixture(scope="module", params=MODES, ids=["-".join(mode) for mode in MODES])
def any_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[McpProcess]:
    """The test server in each answer form (JSON or event stream) and session mode."""
    answers, sessions = request.param
    with mcp_server(tmp_path_factory.mktemp("mcp"), answers=answers, sessions=sessions) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    """The SDK's default form: event-stream answers, sessions."""
    with mcp_server(tmp_path_factory.mktemp("mcp")) as process:
        yield process


def target(endpoint: McpEndpoint, source: str = "docs") -> ContributorTarget:
    return ContributorTarget(
        source=source, url=endpoint.spec.url, mcp=endpoint, failure_policy="omit"
    )


async def call(
    client: ContributorClient, fields: PacketFields, endpoint: McpEndpoint, timeout: float = 5.0
) -> ContributorOutcome:
    """One prepare's call of ``endpoint`` through the production fan-out."""
    [outcome] = await contribute_all(
        client, [target(endpoint)], fields, time.monotonic() + timeout, CAP
    )
    return outcome


def blocks(outcome: ContributorOutcome) -> list[tuple[str, int, str]]:
    return [(b.id, b.priority, b.text) for b in outcome.blocks]


async def test_resources_and_tool_results_become_blocks(
    client: ContributorClient, fields: PacketFields, any_server: McpProcess
) -> None:
    """Pinned resources and a search tool's items become blocks with their priorities scaled
    (0.9 → 800, 0.2 → −600, 1 → 1000, 0.5 → 0), ``{input}`` filled with the latest user text, the
    binary resource skipped with its reason; the same answers give the same revision."""
    spec = McpSpec(
        url=any_server.url,
        resources=("docs://guide/refunds", "docs://guide/limits", "docs://logo.png"),
        tool="search",
        tool_arguments={"query": "{input}", "top_k": 2},
    )
    endpoint = McpEndpoint(spec)
    first = await call(client, fields, endpoint)
    second = await call(client, fields, endpoint)
    assert first.status == "ok", first.cause
    search = [b.id for b in first.blocks if b.id.startswith("search#")]
    assert blocks(first) == [
        ("docs://guide/refunds", 800, REFUNDS),
        ("docs://guide/limits", -600, LIMITS),
        (search[0], 1000, "hit 0 for what is due today?"),
        (search[1], 0, "hit 1 for what is due today?"),
    ]
    assert first.skipped == (Skipped("docs://logo.png", "binary_content", "image/png", 1008),)
    assert isinstance(first.revision, str) and first.revision.startswith("mcp:")
    assert (second.status, second.revision, blocks(second)) == ("ok", first.revision, blocks(first))


async def test_listed_resources_are_those_meant_for_the_assistant(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """``resources = "listed"`` reads the listed resources whose audience names the assistant,
    by priority: not the user-only one, nor those without annotations."""
    outcome = await call(client, fields, McpEndpoint(McpSpec(url=server.url, resources="listed")))
    assert [b.id for b in outcome.blocks] == ["docs://guide/refunds", "docs://guide/limits"]


async def test_structured_content_is_one_json_block(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A tool result with ``structuredContent`` is one block of that JSON, not its text copy."""
    spec = McpSpec(url=server.url, tool="lookup", tool_arguments={"query": "refunds"})
    outcome = await call(client, fields, McpEndpoint(spec))
    [(block_id, priority, text)] = blocks(outcome)
    assert block_id.startswith("lookup#") and len(block_id) == len("lookup#") + 12
    assert (priority, text) == (0, '{"query":"refunds","hits":["refunds","limits"]}')


async def test_links_are_read_and_embedded_text_is_kept(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A tool's ``resource_link`` is read in the same call (its priority from the link), an
    embedded text resource is a block under its URI, and an image is skipped, never text."""
    spec = McpSpec(url=server.url, tool="links", tool_arguments={"query": "{input}"})
    outcome = await call(client, fields, McpEndpoint(spec))
    assert outcome.status == "ok", outcome.cause
    assert blocks(outcome) == [
        ("docs://embedded/note", 0, "An embedded note."),
        ("docs://guide/limits", 1000, LIMITS),
    ]
    [image] = outcome.skipped
    assert (image.reason, image.mime_type) == ("binary_content", "image/png")


async def test_a_link_to_a_resource_already_read_is_not_read_twice(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A linked URI that is also pinned is one block (the pinned read's)."""
    spec = McpSpec(
        url=server.url,
        resources=("docs://guide/limits",),
        tool="links",
        tool_arguments={"query": "q"},
    )
    outcome = await call(client, fields, McpEndpoint(spec))
    assert [b.id for b in outcome.blocks] == ["docs://guide/limits", "docs://embedded/note"]
    assert outcome.blocks[0].priority == -600


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        (
            {"tool": "failing", "tool_arguments": {"query": "q"}},
            "the tool answered with isError",
        ),
        ({"resources": ("docs://broken",)}, "JSON-RPC error -32603 (internal error)"),
        ({"resources": ("docs://missing",)}, "JSON-RPC error -32602 (invalid params)"),
        ({"tool": "no_such_tool"}, "the tool answered with isError"),
    ],
)
async def test_errors_of_the_server_are_errors(
    client: ContributorClient,
    fields: PacketFields,
    server: McpProcess,
    spec: dict[str, Any],
    cause: str,
) -> None:
    """An ``isError`` tool result and a JSON-RPC error answer are the source's ``error``, with a
    cause naming the code, never the server's message."""
    outcome = await call(client, fields, McpEndpoint(McpSpec(url=server.url, **spec)))
    assert (outcome.status, outcome.cause, outcome.blocks) == ("error", cause, ())


async def test_one_session_serves_every_prepare(
    client: ContributorClient, fields: PacketFields, any_server: McpProcess
) -> None:
    """The session is initialised once and reused by later prepares of the same endpoint."""
    before = any_server.lines().count("POST initialize")
    endpoint = McpEndpoint(McpSpec(url=any_server.url, resources=("docs://guide/refunds",)))
    with structlog.testing.capture_logs() as logs:
        outcomes = [await call(client, fields, endpoint) for _ in range(3)]
    assert [o.status for o in outcomes] == ["ok"] * 3
    assert any_server.lines().count("POST initialize") == before + 1
    [opened] = [line for line in logs if line["event"] == "mcp_session_opened"]
    assert opened["stateful"] is (any_server.sessions == "stateful")


async def test_a_server_that_forgets_its_sessions_gets_a_new_one(
    client: ContributorClient, fields: PacketFields, tmp_path: Path
) -> None:
    """A server restarted since the last prepare answers 404 to the old session id: the call
    initialises again and succeeds."""
    with mcp_server(tmp_path) as restarting:
        endpoint = McpEndpoint(McpSpec(url=restarting.url, resources=("docs://guide/refunds",)))
        assert (await call(client, fields, endpoint)).status == "ok"
        restarting.restart()
        with structlog.testing.capture_logs() as logs:
            again = await call(client, fields, endpoint)
        assert again.status == "ok", again.cause
        assert [line["event"] for line in logs] == ["mcp_session_expired", "mcp_session_opened"]
        assert restarting.lines().count("POST initialize") == 2


async def test_validate_reads_the_revision_a_prepare_recorded(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A revision query gives the prepare's revision while nothing changed, and another once a
    resource without ``lastModified`` changed its text."""
    resources = ("docs://guide/refunds", "docs://counter")
    endpoint = McpEndpoint(McpSpec(url=server.url, resources=resources))
    outcome = await call(client, fields, endpoint)
    checked = await query_revision(client, target(endpoint), Scope(), time.monotonic() + 5)
    assert checked == ("ok", outcome.revision)
    bump = McpEndpoint(McpSpec(url=server.url, tool="bump"))
    assert (await call(client, fields, bump)).status == "ok"
    status, revision = await query_revision(client, target(endpoint), Scope(), time.monotonic() + 5)
    assert status == "ok" and revision != outcome.revision
    assert (await call(client, fields, endpoint)).revision == revision


async def test_a_tool_alone_has_a_constant_revision_and_validate_calls_nothing(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A source of a tool alone has no resource to re-read: validate answers without a call."""
    endpoint = McpEndpoint(McpSpec(url=server.url, tool="search", tool_arguments={"query": "q"}))
    outcome = await call(client, fields, endpoint)
    requests = len(server.lines())
    assert await query_revision(client, target(endpoint), Scope(), time.monotonic() + 5) == (
        "ok",
        outcome.revision,
    )
    assert len(server.lines()) == requests


async def test_header_values_reach_the_server_and_nothing_else(
    client: ContributorClient, fields: PacketFields, tmp_path: Path
) -> None:
    """The registration's headers are sent on every request; a refusal's cause names the HTTP
    status, never a header value."""
    token = "tok-" + "s3cr3t" * 4
    with mcp_server(tmp_path, token=token) as guarded:
        resources = ("docs://guide/refunds",)
        bare = await call(
            client, fields, McpEndpoint(McpSpec(url=guarded.url, resources=resources))
        )
        headers = {"authorization": f"Bearer {token}"}
        with structlog.testing.capture_logs() as logs:
            spec = McpSpec(url=guarded.url, resources=resources, headers=headers)
            good = await call(client, fields, McpEndpoint(spec))
    assert (bare.status, bare.cause) == ("error", "HTTP 401")
    assert good.status == "ok", good.cause
    assert token not in repr(logs) and token not in repr(good)


async def test_an_inline_mcp_url_connects_only_to_its_pinned_address(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """An MCP server named by an inline URL is reached through the address the SSRF guard
    checked once, never through a second lookup, with the URL's host in ``Host`` (which the
    SDK's DNS-rebinding check on the server accepts)."""
    resolver = RecordingResolver({PINNED_HOST: ["127.0.0.1"]}, later={PINNED_HOST: ["10.0.0.1"]})
    policy = UrlPolicy(allow=[f"http://{PINNED_HOST}:{server.port}/"], allow_private=True)
    url = f"http://{PINNED_HOST}:{server.port}/mcp"
    checked = await check_url(url, policy, resolver, source="docs")
    endpoint = McpEndpoint(McpSpec(url=url, resources=("docs://guide/refunds",)), pin=checked)
    outcomes = [await call(client, fields, endpoint) for _ in range(2)]
    assert [o.status for o in outcomes] == ["ok", "ok"], outcomes[0].cause
    assert resolver.calls == [(PINNED_HOST, server.port)]
