"""MCP servers as contributors: what a registration reads, the calls of one prepare or validate,
and the endpoints kept per tenant.

An MCP contributor (``kind = "mcp"`` in ``[contributors.NAME]``, docs/contributors.md) names an
MCP server's Streamable HTTP endpoint, the resources read every prepare (pinned URIs, or
``"listed"``), and at most one tool called every prepare. Each prepare, within the one deadline
the webhooks share:

1. the session (``mcp_session.py``): opened once per tenant and server, and opened again when
   the server forgot it;
2. ``resources/list`` (pinned resources: only when the server declares resources, for their
   annotations; ``"listed"``: always, to choose them), the reads and the tool call, concurrently.
   A listing is bounded and validated off the event loop (``mcp_listing.py``); no page is asked
   for once the deadline has passed;
3. the ``resource_link`` items of the tool result, read next;
4. the answers mapped to blocks (``mcp_mapping.py``).

All requests of one prepare share one byte budget (``max_contributor_response_bytes``: the memory
a webhook answer may take) and one ``asyncio.timeout``. The first failure of any request ends the
source's call: ``timeout``, ``error`` (a JSON-RPC error, an ``isError`` tool result, HTTP and
transport failures), ``invalid`` (not the protocol's shapes) or ``too_large``, as for a webhook.

Sessions are kept per tenant and registration (a server never sees two tenants on one session),
in :class:`McpEndpoints`, which drops them when a reload removes or changes the registration, when
more than ``MAX_ENDPOINTS`` are kept, and at shutdown (``mcp_session.py`` says how a dropped
session ends). An MCP server named by an inline URL is reached at the address the SSRF guard
checked for this call: its endpoint serves one call (a prepare's or a validate's), and its
session is ended after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

import aiohttp
import structlog
from mcp_types import CallToolResult, ReadResourceResult, Resource

from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.failures import classify
from context_assembly.contributors.mcp_exchange import (
    ByteBudget,
    McpFailure,
    SessionExpired,
    parse_result,
)
from context_assembly.contributors.mcp_listing import (
    MAX_LIST_PAGES,
    MAX_LISTING_RESOURCES,
    listed_off_loop,
    listing_page,
    listing_screen,
)
from context_assembly.contributors.mcp_mapping import (
    Mapped,
    add_resource,
    add_tool_result,
    needs_read_for_revision,
    resource_revision,
    source_revision,
    unread_links,
)
from context_assembly.contributors.mcp_session import (
    CLOSE_SESSION_SECONDS,
    SHUTDOWN_GRACE_SECONDS,
    McpSession,
    SharedState,
)
from context_assembly.contributors.outcomes import (
    MIN_SEND_SECONDS,
    SKIPPED_FAILURE,
    ContributorOutcome,
    PacketFields,
    Status,
)
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.core.request import Message, Revision, TextPart

log = structlog.get_logger("context_assembly.contributors.mcp")

MAX_CONCURRENT_READS: Final = 8
"""Reads of one source in flight at once."""
MAX_ENDPOINTS: Final = 1024
"""Sessions kept (tenant × registration); past it the least recently used is dropped."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class McpSpec:
    """What an MCP contributor reads every prepare: its endpoint, the resources (pinned URIs or
    ``"listed"``), the tool and its argument template, and the resolved header values."""

    url: str
    resources: tuple[str, ...] | Literal["listed"] = ()
    tool: str | None = None
    tool_arguments: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def latest_user_text(messages: Sequence[Message]) -> str:
    """The text of the last ``user`` message of the input (its text parts, one per line)."""
    for message in reversed(messages):
        if message.role == "user":
            if isinstance(message.content, str):
                return message.content
            return "\n".join(p.text for p in message.content if isinstance(p, TextPart))
    return ""


def fill_arguments(template: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The tool's arguments: ``{input}`` in every string of ``template`` replaced by ``text``."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{input}", text)
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return {key: fill(value) for key, value in template.items()}


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


@contextlib.asynccontextmanager
async def _together() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group whose first failure cancels the other tasks and is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup as failures:
        raise _first_leaf(failures) from None


def _released(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of every exception chained to it or grouped in it.

    A failure inside a task group is kept by its task, and its traceback holds the frame that
    holds the task: a cycle that would keep the answer read so far (up to the cap) until the
    cyclic collector runs. Without the tracebacks, reference counting frees it at once.
    """
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            pending += current.exceptions


async def _settle(
    flow: Callable[[float], Coroutine[Any, Any, T]], remaining: float
) -> T | McpFailure:
    """Run ``flow`` within ``remaining`` seconds (it is handed the deadline, a loop time); a
    failure comes back as an ``McpFailure``."""
    deadline = asyncio.timeout(remaining)
    try:
        async with deadline:
            until = deadline.when()
            assert until is not None
            return await flow(until)
    except (McpFailure, SessionExpired, TimeoutError, aiohttp.ClientError, OSError) as exc:
        _released(exc)
        if isinstance(exc, McpFailure):
            return McpFailure(exc.status, exc.failure)
        if isinstance(exc, SessionExpired):
            return McpFailure.of("error", "session_lost", "the server forgot the session")
        if isinstance(exc, TimeoutError) and deadline.expired():
            return McpFailure.of("timeout", "timeout", "deadline reached")
        return McpFailure(*classify(exc))


class McpEndpoint:
    """One MCP server as one tenant reaches it: the calls of a prepare and of a validate, in
    the session kept across them (:class:`~.mcp_session.McpSession`)."""

    def __init__(
        self,
        spec: McpSpec,
        *,
        name: str = "",
        pin: CheckedTarget | None = None,
        shared: SharedState | None = None,
        once: bool = False,
    ) -> None:
        """``shared``: what the endpoints of one registry share (:class:`SharedState`); ``once``:
        an endpoint for one call (an inline URL), whose session is ended when the call is over."""
        self.spec = spec
        self.name = name
        self.pin = pin
        self.session = McpSession(
            spec.url,
            spec.headers,
            name=name,
            pin=pin,
            shared=shared if shared is not None else SharedState(),
            once=once,
        )

    @property
    def dropped(self) -> bool:
        """Whether the endpoint is out of use: its session is ended once its calls are over."""
        return self.session.dropped

    def drop(self) -> None:
        """Take the endpoint out of use: its session is ended on the server now, or when the
        calls still under way are over (a later call, if any, would open a new one)."""
        self.session.drop()

    # ------------------------------------------------------------------ the calls of a prepare

    async def contribute(
        self,
        source: str,
        client: ContributorClient,
        packet_fields: PacketFields,
        deadline_monotonic: float,
        max_response_bytes: int,
        clock: Callable[[], float],
    ) -> ContributorOutcome:
        """Read the resources and call the tool within the deadline: one settled outcome."""
        started = clock()
        remaining = deadline_monotonic - started
        if remaining < MIN_SEND_SECONDS:
            return ContributorOutcome.failed(source, "skipped_deadline", 0.0, SKIPPED_FAILURE)
        # The wall time the deadline was set from, read off the same clock (no second clock).
        now_ms = packet_fields.deadline_unix_ms - int(remaining * 1000)
        text = latest_user_text(packet_fields.input)
        budget = ByteBudget(max_response_bytes)
        with self.session.in_use():
            result = await _settle(
                lambda until: self._contribute(client, budget, text, now_ms, until), remaining
            )
        duration_ms = (clock() - started) * 1000.0
        if isinstance(result, McpFailure):
            return ContributorOutcome.failed(source, result.status, duration_ms, result.failure)
        revision, mapped = result
        if mapped.skipped:
            log.info(
                "mcp_binary_skipped",
                source=source,
                endpoint=self.name,
                items=len(mapped.skipped),
                bytes=sum(item.size for item in mapped.skipped),
            )
        return ContributorOutcome(
            source,
            "ok",
            duration_ms,
            revision,
            tuple(mapped.blocks),
            skipped=tuple(mapped.skipped),
        )

    async def _contribute(
        self, client: ContributorClient, budget: ByteBudget, text: str, now_ms: int, until: float
    ) -> tuple[str, Mapped]:
        session = await self.session.open(client, budget)
        spec = self.spec
        reads = asyncio.Semaphore(MAX_CONCURRENT_READS)

        async def read(uri: str) -> ReadResourceResult:
            async with reads:
                return parse_result(
                    ReadResourceResult,
                    await self.session.request(client, budget, "resources/read", {"uri": uri}),
                )

        listing: dict[str, Resource] = {}
        if spec.resources == "listed":
            listing = await self._list(client, budget, until)
            uris = await listed_off_loop(listing)
        else:
            uris = list(spec.resources)
        async with _together() as group:
            listed = (
                group.create_task(self._list(client, budget, until))
                if uris and spec.resources != "listed" and session.lists_resources
                else None
            )
            read_tasks = [group.create_task(read(uri)) for uri in uris]
            called = (
                group.create_task(self._call_tool(client, budget, spec.tool, text))
                if spec.tool is not None
                else None
            )
        if listed is not None:
            listing = listed.result()
        mapped = Mapped()
        revisions: dict[str, str] = {}
        for uri, task in zip(uris, read_tasks, strict=True):
            about = listing.get(uri)
            revisions[uri] = resource_revision(about, task.result())
            annotations = about.annotations if about else None
            add_resource(mapped, task.result(), annotations, now_ms, session.protocol_version)
        if called is not None and spec.tool is not None:
            links = unread_links(add_tool_result(mapped, spec.tool, called.result()), set(uris))
            async with _together() as group:
                linked = [group.create_task(read(link.uri)) for link in links]
            for link, task in zip(links, linked, strict=True):
                add_resource(
                    mapped, task.result(), link.annotations, now_ms, session.protocol_version
                )
        return source_revision(revisions), mapped

    async def _call_tool(
        self, client: ContributorClient, budget: ByteBudget, tool: str, text: str
    ) -> CallToolResult:
        arguments = fill_arguments(self.spec.tool_arguments, text)
        params = {"name": tool, "arguments": arguments}
        result = parse_result(
            CallToolResult, await self.session.request(client, budget, "tools/call", params)
        )
        if result.is_error:
            raise McpFailure.of("error", "tool_error", "the tool answered with isError")
        return result

    async def _list(
        self, client: ContributorClient, budget: ByteBudget, until: float
    ) -> dict[str, Resource]:
        """``resources/list``, every page up to ``MAX_LIST_PAGES``, by URI: at most
        ``MAX_LISTING_RESOURCES`` resources over the pages, no page asked for once the deadline
        (``until``, a loop time) has passed."""
        loop = asyncio.get_running_loop()
        resources: dict[str, Resource] = {}
        received = 0
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            if loop.time() >= until:  # the last page took the time left: ask for no more
                raise McpFailure.of("timeout", "timeout", "deadline reached")
            params = {"cursor": cursor} if cursor is not None else {}
            room = MAX_LISTING_RESOURCES - received
            data = await self.session.request(
                client, budget, "resources/list", params, screen=listing_screen(room)
            )
            page = await listing_page(data, room)
            received += len(page.resources)
            for resource in page.resources:
                resources.setdefault(resource.uri, resource)
            cursor = page.next_cursor
            if not cursor:
                break
        return resources

    # ------------------------------------------------------------------ validate

    async def revision(
        self,
        client: ContributorClient,
        deadline_monotonic: float,
        max_response_bytes: int,
        clock: Callable[[], float],
    ) -> tuple[Status, Revision | None]:
        """The source's revision as a prepare now would compute it: the listing's
        ``lastModified`` where there is one, a read of the other resources. A source of a tool
        alone has a constant revision and is not called."""
        if not self.spec.resources:
            return "ok", source_revision({})
        remaining = deadline_monotonic - clock()
        if remaining < MIN_SEND_SECONDS:
            return "skipped_deadline", None
        budget = ByteBudget(max_response_bytes)
        with self.session.in_use():
            result = await _settle(lambda until: self._revision(client, budget, until), remaining)
        if isinstance(result, McpFailure):
            return result.status, None
        return "ok", result

    async def _revision(self, client: ContributorClient, budget: ByteBudget, until: float) -> str:
        session = await self.session.open(client, budget)
        spec = self.spec
        listing: dict[str, Resource] = {}
        if spec.resources == "listed" or session.lists_resources:
            listing = await self._list(client, budget, until)
        uris = (
            await listed_off_loop(listing) if spec.resources == "listed" else list(spec.resources)
        )
        unread = [uri for uri in uris if needs_read_for_revision(listing.get(uri))]
        async with _together() as group:
            reads = {
                uri: group.create_task(
                    self.session.request(client, budget, "resources/read", {"uri": uri})
                )
                for uri in unread
            }
        revisions = {
            uri: resource_revision(
                listing.get(uri),
                parse_result(ReadResourceResult, reads[uri].result()) if uri in reads else None,
            )
            for uri in uris
        }
        return source_revision(revisions)


class McpEndpoints:
    """The MCP endpoints in use, one per tenant and registration, each with its session; and the
    endpoints of inline URLs, one per call."""

    def __init__(self, max_endpoints: int = MAX_ENDPOINTS) -> None:
        self.max_endpoints = max_endpoints
        self._endpoints: OrderedDict[tuple[str, str], McpEndpoint] = OrderedDict()
        self._shared = SharedState()

    def _new(self, spec: McpSpec, name: str, **kw: Any) -> McpEndpoint:
        return McpEndpoint(spec, name=name, shared=self._shared, **kw)

    def registered(self, tenant: str, name: str, spec: McpSpec) -> McpEndpoint:
        """The endpoint of registration ``name`` for ``tenant``; a changed registration gets a
        new one (and so a new session)."""
        key = (tenant, name)
        endpoint = self._endpoints.get(key)
        if endpoint is not None and endpoint.spec == spec:
            self._endpoints.move_to_end(key)
            return endpoint
        if endpoint is not None:
            endpoint.drop()
        endpoint = self._new(spec, name)
        self._endpoints[key] = endpoint
        while len(self._endpoints) > self.max_endpoints:
            _, oldest = self._endpoints.popitem(last=False)
            oldest.drop()
        return endpoint

    def inline(self, spec: McpSpec, pin: CheckedTarget) -> McpEndpoint:
        """An endpoint for one call of an inline URL, connected to ``pin``'s addresses only; its
        session is ended when the call is over."""
        return self._new(spec, "inline", pin=pin, once=True)

    def retain(self, specs: Mapping[str, McpSpec]) -> None:
        """Drop the endpoints whose registration a reload removed or changed."""
        for key, endpoint in list(self._endpoints.items()):
            if specs.get(key[1]) != endpoint.spec:
                endpoint.drop()
                del self._endpoints[key]

    def __len__(self) -> int:
        return len(self._endpoints)

    def open_sessions(self) -> int:
        """Sessions open on servers (with an ``Mcp-Session-Id``, not yet ended): the gauge."""
        return len(self._shared.open_sessions)

    async def aclose(self) -> None:
        """At shutdown: end every session held (``DELETE``), those of the calls still under way
        and of inline servers included, and open no new one; then wait for what is still being
        sent, each within its own bound (``CLOSE_SESSION_SECONDS``), and cut what is left after
        ``SHUTDOWN_GRACE_SECONDS`` more. Every end is logged: answered, failed or cut."""
        shared = self._shared
        shared.closed = True
        for endpoint in self._endpoints.values():
            endpoint.drop()
        self._endpoints.clear()
        for session in list(shared.open_sessions):
            session.close()
        loop = asyncio.get_running_loop()
        until = loop.time() + CLOSE_SESSION_SECONDS + SHUTDOWN_GRACE_SECONDS
        # A call under way may still end a session it was opening: wait for those sends too.
        while shared.background and (left := until - loop.time()) > 0:
            await asyncio.wait(set(shared.background), timeout=left)
        late = set(shared.background)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
