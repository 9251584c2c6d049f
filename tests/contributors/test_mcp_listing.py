"""A large ``resources/list`` cannot hold the process: a listing is bounded by its count as well as
its bytes (``MAX_LISTING_RESOURCES`` over its pages; more is ``too_large``, a large page counted
before it is parsed), a page of many resources is validated in a worker thread, and no page is
asked for once the deadline has passed. Meanwhile the other sources' calls, another tenant's
through a healthy server, answer within their own deadlines.

Against hand-written loopback servers (``mcp_scripted.ScriptedMcp``, serving from a thread of
its own), through the production client and ``contribute_all``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from mcp_scripted import ScriptedMcp, raw

from context_assembly.contributors import (
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
    mcp_listing,
)
from context_assembly.contributors.mcp import McpEndpoint, McpEndpoints, McpSpec
from context_assembly.contributors.mcp_listing import MAX_LISTED_RESOURCES, MAX_LISTING_RESOURCES
from context_assembly.server import GC_THRESHOLDS

CAP = 8 * 1024 * 1024  # max_contributor_response_bytes' default
DEADLINE = 0.3  # seconds: the deadline of the prepares


def resources(count: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` resources for the assistant, of varied priorities (about 110 bytes each)."""
    return [
        {
            "uri": f"docs://guide/page-{i:06d}",
            "name": f"page {i}",
            "annotations": {"audience": ["assistant"], "priority": (i % 100) / 100},
        }
        for i in range(start, start + count)
    ]


def listing(pages: list[bytes]) -> Any:
    """The ``resources/list`` answer of pre-built page results, the cursor naming the next."""

    def answer(message: dict[str, Any]) -> httpx.Response:
        index = int((message.get("params") or {}).get("cursor") or 0)
        return raw(b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (message["id"], pages[index]))

    return answer


def page(entries: list[dict[str, Any]], cursor: int | None) -> bytes:
    result: dict[str, Any] = {"resources": entries}
    if cursor is not None:
        result["nextCursor"] = str(cursor)
    return orjson.dumps(result)


@pytest.fixture(scope="module")
def forty_thousand() -> bytes:
    """One page of 40,000 resources, about 4.5 MB."""
    return page(resources(40_000), None)


@pytest.fixture
def serving_gc() -> Iterator[None]:
    """The cyclic collector as a serving process tunes it (``server.tune_gc``): what was built
    before is frozen out of its reach, young collections are rarer. Restored afterwards."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@pytest.fixture
def healthy() -> Iterator[ScriptedMcp]:
    with ScriptedMcp() as server:
        yield server


@pytest.fixture
async def endpoints(healthy: ScriptedMcp) -> AsyncIterator[McpEndpoints]:
    """The registry of the test's endpoints, closed (its sessions ended, its notices sent)
    before the servers stop."""
    registry = McpEndpoints()
    try:
        yield registry
    finally:
        await registry.aclose()


def registered(
    endpoints: McpEndpoints, url: str, resources: Any, tenant: str = "t1"
) -> McpEndpoint:
    return endpoints.registered(tenant, "docs", McpSpec(url=url, resources=resources))


def target(endpoint: McpEndpoint, source: str = "docs") -> ContributorTarget:
    return ContributorTarget(source=source, url=endpoint.spec.url, mcp=endpoint)


async def call(
    client: ContributorClient, fields: PacketFields, endpoint: McpEndpoint, timeout: float
) -> ContributorOutcome:
    [outcome] = await contribute_all(
        client, [target(endpoint)], fields, time.monotonic() + timeout, CAP
    )
    return outcome


class LoopWatch:
    """The longest time the event loop went without running this ticker (every 5 ms)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_listing_of_forty_thousand_is_too_large_and_other_tenants_are_served(
    client: ContributorClient,
    fields: PacketFields,
    forty_thousand: bytes,
    healthy: ScriptedMcp,
    endpoints: McpEndpoints,
    serving_gc: None,
) -> None:
    """A ``"listed"`` source whose server lists 40,000 resources in one 4.5 MB page is
    ``too_large`` (the cause says the count); it is refused before its page is parsed, so
    another tenant's prepares through a healthy MCP server, each under a 300 ms deadline, all
    answer ``ok`` meanwhile, and the loop is never held for a whole deadline."""
    with ScriptedMcp() as large:
        large.answers["resources/list"] = listing([forty_thousand])
        flood = registered(endpoints, large.url, "listed", tenant="t1")
        other = registered(endpoints, healthy.url, ("docs://a",), tenant="t2")
        assert (await call(client, fields, other, 5.0)).ok  # its session, as in steady state
        try:
            with LoopWatch() as watch:
                for _ in range(3):
                    outcomes = await asyncio.gather(
                        call(client, fields, flood, DEADLINE),
                        *(call(client, fields, other, DEADLINE) for _ in range(5)),
                    )
                    refused, *served = outcomes
                    assert (refused.status, refused.failure and refused.failure.cause) == (
                        "too_large",
                        "too_large",
                    )
                    assert refused.cause == (
                        f"the listing holds more than {MAX_LISTING_RESOURCES} resources"
                    )
                    assert [o.status for o in served] == ["ok"] * 5, [o.cause for o in served]
            # Its answer was read in full: nothing to tell the server to stop.
            assert not large.requests("POST notifications/cancelled")
        finally:
            await endpoints.aclose()
    assert watch.longest < DEADLINE, watch.longest  # never held for a whole deadline


async def test_a_listing_under_the_bound_is_validated_off_the_loop_and_read(
    client: ContributorClient,
    fields: PacketFields,
    healthy: ScriptedMcp,
    endpoints: McpEndpoints,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three pages of 1,300 resources (3,900, under the bound) are validated in a worker thread,
    and the 64 with the highest priority are read, as before."""
    threads: list[bool] = []
    validate = mcp_listing._validate_listing

    def spied(*args: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return validate(*args)

    monkeypatch.setattr(mcp_listing, "_validate_listing", spied)
    pages = [page(resources(1300, 1300 * i), i + 1 if i < 2 else None) for i in range(3)]
    healthy.answers["resources/list"] = listing(pages)
    outcome = await call(client, fields, registered(endpoints, healthy.url, "listed"), 10.0)
    assert outcome.ok, outcome.failure
    assert threads == [False, False, False]  # every page, none on the loop's thread
    assert len(outcome.blocks) == MAX_LISTED_RESOURCES
    priorities = [b.priority for b in outcome.blocks]  # 39 resources at 0.99, then 0.98
    assert (priorities.count(980), priorities.count(960)) == (39, 25)


async def test_the_bound_counts_every_page_of_a_listing(
    client: ContributorClient, fields: PacketFields, healthy: ScriptedMcp, endpoints: McpEndpoints
) -> None:
    """Four pages of 1,300 resources pass the bound on the fourth: ``too_large``, for pinned
    resources' listing as for ``"listed"``."""
    pages = [page(resources(1300, 1300 * i), i + 1 if i < 3 else None) for i in range(4)]
    healthy.answers["resources/list"] = listing(pages)
    for resources_ in ("listed", ("docs://guide/page-000001",)):
        endpoint = registered(endpoints, healthy.url, resources_)
        outcome = await call(client, fields, endpoint, 10.0)
        assert (outcome.status, outcome.failure and outcome.failure.cause) == (
            "too_large",
            "too_large",
        )
    assert len(healthy.requests("POST resources/list")) == 8


async def test_no_page_is_asked_for_after_the_deadline(
    client: ContributorClient, fields: PacketFields, healthy: ScriptedMcp, endpoints: McpEndpoints
) -> None:
    """A server that pages without end, each page a while in coming, is cut by the deadline
    (``timeout``); it receives no request for a page once the deadline has passed."""

    async def slow(message: dict[str, Any]) -> httpx.Response:
        await asyncio.sleep(0.06)  # the server's own pace: the fault being modelled
        index = int((message.get("params") or {}).get("cursor") or 0)
        body = page(resources(300, 300 * index), index + 1)
        return raw(b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (message["id"], body))

    healthy.answers["resources/list"] = slow
    endpoint = registered(endpoints, healthy.url, "listed")
    started = time.monotonic()
    outcome = await call(client, fields, endpoint, DEADLINE)
    assert (outcome.status, outcome.cause) == ("timeout", "deadline reached")
    asked = healthy.requests("POST resources/list")
    assert 1 <= len(asked) < 16
    assert all(seen.at < started + DEADLINE for seen in asked)
