"""A bug of the service's own code inside a contributor call is not silent: the call still settles
as an ``error`` outcome (the fan-out and validate go on), and the exception is counted in
``context_assembly_internal_errors_total{where}`` and logged as ``internal_error`` with its type
and frames, never its message (which could quote a block's text).

The contributor is a real loopback server reached through the production client; the bug is a
function of the call path patched to raise.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, NoReturn

import pytest
import structlog
from context_assembly_client.testing import ScriptedContributor, Step
from structlog.typing import EventDict

from context_assembly.contributors import (
    ContributorClient,
    ContributorTarget,
    PacketFields,
    calls,
    contribute_all,
    query_revision,
)
from context_assembly.contributors.mcp import McpEndpoint, McpSpec
from context_assembly.core.request import Scope
from context_assembly.metrics import InternalErrorSite, Metrics
from loopback_client import LoopbackClient

MARKER = "ZZ-block-text-ZZ"
CAP = 4096


@pytest.fixture
def server() -> Iterator[ScriptedContributor]:
    """A loopback contributor that answers every call well (one valid block, revision 1)."""
    with ScriptedContributor(
        default=Step(revision=1, blocks=[{"id": "a", "text": "x"}])
    ) as serving:
        yield serving


@pytest.fixture
async def client(server: ScriptedContributor) -> AsyncIterator[ContributorClient]:
    """The production client, every name resolving to the loopback server."""
    async with LoopbackClient(server.port) as shared:
        yield shared


def _counted(where: InternalErrorSite) -> float:
    """The internal errors counted at ``where``, as an app's ``/metrics`` shows them."""
    value = Metrics().registry.get_sample_value(
        "context_assembly_internal_errors_total", {"where": where}
    )
    assert value is not None  # every site's series exists from the start
    return value


def _buggy(*args: Any, **kwargs: Any) -> NoReturn:
    """A bug: raises with a message that quotes a block's text."""
    raise RuntimeError(f"cannot handle {MARKER}")


async def _async_buggy(*args: Any, **kwargs: Any) -> NoReturn:
    _buggy()


def _mcp_target(source: str) -> ContributorTarget:
    """An MCP target with a pinned resource (its endpoint's flows are patched, never called)."""
    spec = McpSpec(url="http://docs.example/mcp", resources=("docs://guide/refunds",))
    return ContributorTarget(source=source, url=spec.url, mcp=McpEndpoint(spec, name=source))


def _only_bug_line(logs: list[EventDict], where: str, source: str) -> EventDict:
    """The one ``internal_error`` line, which names the type and frames and quotes no text."""
    assert MARKER not in repr(logs)
    [line] = [entry for entry in logs if entry["event"] == "internal_error"]
    assert (line["log_level"], line["where"], line["source"]) == ("error", where, source)
    assert line["error_type"] == "RuntimeError"
    assert line["frames"][-1].endswith(" _buggy")  # where it was raised
    assert any(f.startswith("context_assembly.contributors.") for f in line["frames"])
    return line


@pytest.mark.parametrize("kind", ["webhook", "mcp"])
async def test_a_bug_in_a_contribute_call_is_logged_counted_and_settled_as_error(
    client: ContributorClient,
    fields: PacketFields,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """The buggy call is an ``error`` outcome (``unexpected RuntimeError``), the other source
    still answers ``ok``, and the bug is counted once at ``contribute`` and logged by type."""
    healthy = ContributorTarget(source="docs", url="http://docs.example/c")
    if kind == "webhook":
        # After a real exchange; the healthy call goes through the real function.
        answer_outcome = calls._answer_outcome

        def buggy_for_memory(source: str, *args: Any) -> Any:
            if source == "memory":
                _buggy()
            return answer_outcome(source, *args)

        monkeypatch.setattr(calls, "_answer_outcome", buggy_for_memory)
        buggy = ContributorTarget(source="memory", url="http://memory.example/c")
    else:
        monkeypatch.setattr(McpEndpoint, "_contribute", _async_buggy)
        buggy = _mcp_target("memory")
    before = _counted("contribute")
    with structlog.testing.capture_logs() as logs:
        outcomes = await contribute_all(client, [buggy, healthy], fields, time.monotonic() + 5, CAP)
    assert [(o.source, o.status, o.cause) for o in outcomes] == [
        ("memory", "error", "unexpected RuntimeError"),
        ("docs", "ok", None),
    ]
    assert _counted("contribute") == before + 1
    _only_bug_line(logs, "contribute", "memory")


@pytest.mark.parametrize("kind", ["webhook", "mcp"])
async def test_a_bug_in_a_revision_query_is_logged_counted_and_answered_as_error(
    client: ContributorClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """validate's revision query answers ``error`` as before, and the bug is counted once at
    ``revision`` and logged by type."""
    if kind == "webhook":
        monkeypatch.setattr(calls, "_parse_json", _buggy)  # after a real exchange
        target = ContributorTarget(source="memory", url="http://memory.example/c")
    else:
        monkeypatch.setattr(McpEndpoint, "_revision", _async_buggy)
        target = _mcp_target("memory")
    before = _counted("revision")
    with structlog.testing.capture_logs() as logs:
        answer = await query_revision(client, target, Scope(), time.monotonic() + 5)
    assert answer == ("error", None)
    assert _counted("revision") == before + 1
    _only_bug_line(logs, "revision", "memory")


async def test_what_a_contributor_does_is_not_counted_as_a_bug(
    client: ContributorClient, fields: PacketFields, server: ScriptedContributor
) -> None:
    """A contributor that resets the connection is an ``error`` outcome of the contributor's,
    not an internal error: nothing is counted or logged as a bug."""
    server.script("/c", Step(fault="reset"))
    target = ContributorTarget(source="memory", url="http://memory.example/c")
    before = (_counted("contribute"), _counted("revision"))
    with structlog.testing.capture_logs() as logs:
        [outcome] = await contribute_all(client, [target], fields, time.monotonic() + 5, CAP)
        revision = await query_revision(client, target, Scope(), time.monotonic() + 5)
    assert outcome.status == "error" and not (outcome.cause or "").startswith("unexpected")
    assert revision == ("error", None)
    assert (_counted("contribute"), _counted("revision")) == before
    assert not [entry for entry in logs if entry["event"] == "internal_error"]
