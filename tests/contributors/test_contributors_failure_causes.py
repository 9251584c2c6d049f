"""Each failed contributor call carries its classified failure (``SourceFailure``): the cause's
name, the HTTP status or the path of the offending field, and the words that were already its
``cause``; against real loopback servers (nothing listening, a hang, a 503, an invalid answer)
and MCP servers alike."""

from __future__ import annotations

import time
from collections.abc import Iterator

import orjson
import pytest
from faults import CAP, FaultServer, closed_port, fan_out, registered
from mcp_servers import McpProcess, mcp_server

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
)
from context_assembly.contributors.mcp import McpEndpoint, McpSpec
from context_assembly.core.sources import SourceFailure

SECRET_TEXT = "ZZ-answer-text-ZZ"


def _checked(outcome: ContributorOutcome) -> SourceFailure:
    """The outcome's failure, whose words are the outcome's cause."""
    assert outcome.failure is not None, outcome
    assert outcome.cause == outcome.failure.detail
    return outcome.failure


async def test_nothing_listening_is_connect_refused(
    client: ContributorClient, fields: PacketFields
) -> None:
    target = ContributorTarget(source="memory", url=f"http://127.0.0.1:{closed_port()}/c")
    [outcome] = await fan_out(client, fields, [target])
    assert outcome.status == "error"
    assert _checked(outcome) == SourceFailure("connect_refused", "connect refused")


async def test_a_hanging_server_is_a_timeout(
    client: ContributorClient, fields: PacketFields
) -> None:
    async with FaultServer("hang") as server:
        [outcome] = await fan_out(client, fields, [registered(server)])
    assert outcome.status == "timeout"
    failure = _checked(outcome)
    assert (failure.cause, failure.status, failure.field) == ("timeout", None, None)
    assert failure.detail == "deadline reached while waiting for the response headers"


@pytest.mark.parametrize(("code", "status"), [(503, "error"), (504, "timeout"), (404, "error")])
async def test_a_status_other_than_2xx_is_http_status_with_the_code(
    client: ContributorClient, fields: PacketFields, code: int, status: str
) -> None:
    async with FaultServer(status=code, body=SECRET_TEXT.encode()) as server:
        [outcome] = await fan_out(client, fields, [registered(server)])
    assert outcome.status == status
    failure = _checked(outcome)
    assert (failure.cause, failure.status, failure.field) == ("http_status", code, None)
    assert SECRET_TEXT not in failure.detail


async def test_a_redirect_is_http_status_with_the_code(
    client: ContributorClient, fields: PacketFields
) -> None:
    async with FaultServer("redirect") as server:
        [outcome] = await fan_out(client, fields, [registered(server)])
    failure = _checked(outcome)
    assert (failure.cause, failure.status) == ("http_status", 302)


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"revision": 1, "blocks": [{"id": 5, "text": SECRET_TEXT}]}, "blocks.0.id"),
        (
            {"revision": 1, "blocks": [{"id": "a", "text": "t"}, {"id": "b", "priority": "x"}]},
            "blocks.1.text",
        ),
        ({"blocks": []}, "revision"),
        ({"revision": 1, "blocks": [{"id": "a", "text": SECRET_TEXT, "role": "x"}]}, "blocks.0"),
        ([1, 2], None),
    ],
)
async def test_an_invalid_answer_names_the_field(
    client: ContributorClient, fields: PacketFields, answer: object, field: str | None
) -> None:
    """The first offending field's path (an unknown member: the object that holds it, as its
    name is the answer's own), never the answer's text."""
    async with FaultServer(body=orjson.dumps(answer)) as server:
        [outcome] = await fan_out(client, fields, [registered(server)])
    assert outcome.status == "invalid"
    failure = _checked(outcome)
    assert (failure.cause, failure.field, failure.status) == ("invalid_answer", field, None)
    assert failure.detail.startswith("schema: ")
    assert SECRET_TEXT not in failure.detail and "role" not in failure.detail


@pytest.mark.parametrize(
    ("behaviour", "content_type", "cause", "status"),
    [
        ("invalid_json", "application/json", "invalid_json", "invalid"),
        ("ok", "text/html", "content_type", "invalid"),
        ("oversize", "application/json", "too_large", "too_large"),
        ("reset", "application/json", None, "error"),
    ],
)
async def test_the_other_faults_have_their_causes(
    client: ContributorClient,
    fields: PacketFields,
    behaviour: str,
    content_type: str,
    cause: str | None,
    status: str,
) -> None:
    async with FaultServer(behaviour, content_type=content_type) as server:  # type: ignore[arg-type]
        [outcome] = await fan_out(client, fields, [registered(server)], timeout=2.0)
    assert outcome.status == status
    failure = _checked(outcome)
    if cause is None:  # a reset is seen as one or the other, by when it lands
        assert failure.cause in {"connection_reset", "connection_closed"}
    else:
        assert failure.cause == cause


async def test_no_time_left_is_said(client: ContributorClient, fields: PacketFields) -> None:
    async with FaultServer() as server:
        [outcome] = await fan_out(client, fields, [registered(server)], timeout=-1.0)
    assert outcome.status == "skipped_deadline"
    assert _checked(outcome).cause == "no_time_left"


async def test_an_ok_answer_has_no_failure(client: ContributorClient, fields: PacketFields) -> None:
    async with FaultServer() as server:
        [outcome] = await fan_out(client, fields, [registered(server)])
    assert (outcome.status, outcome.failure, outcome.cause) == ("ok", None, None)


# --------------------------------------------------------------------------- MCP servers


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    with mcp_server(tmp_path_factory.mktemp("mcp")) as process:
        yield process


def mcp_target(url: str, tool: str) -> ContributorTarget:
    endpoint = McpEndpoint(McpSpec(url=url, tool=tool, tool_arguments={"query": "{input}"}))
    return ContributorTarget(source="docs", url=url, mcp=endpoint, failure_policy="omit")


async def _one_mcp(
    client: ContributorClient, fields: PacketFields, target: ContributorTarget, seconds: float
) -> ContributorOutcome:
    [outcome] = await contribute_all(client, [target], fields, time.monotonic() + seconds, CAP)
    return outcome


async def test_mcp_failures_have_their_causes(
    client: ContributorClient, fields: PacketFields, server: McpProcess
) -> None:
    """A tool result with ``isError``, a tool that hangs past the deadline, a server that is
    gone, and an endpoint that answers like a webhook."""
    failing = await _one_mcp(client, fields, mcp_target(server.url, "failing"), 10.0)
    assert (failing.status, _checked(failing).cause) == ("error", "tool_error")
    hanging = await _one_mcp(client, fields, mcp_target(server.url, "hang"), 0.3)
    assert (hanging.status, _checked(hanging).cause) == ("timeout", "timeout")
    gone = f"http://127.0.0.1:{closed_port()}/mcp"
    refused = await _one_mcp(client, fields, mcp_target(gone, "search"), 5.0)
    assert (refused.status, _checked(refused).cause) == ("error", "connect_refused")
    async with FaultServer() as webhook:
        wrong = await _one_mcp(client, fields, mcp_target(webhook.url, "search"), 5.0)
    assert (wrong.status, _checked(wrong).cause) == ("invalid", "invalid_answer")
