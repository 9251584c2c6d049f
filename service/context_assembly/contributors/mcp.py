"""MCP servers as contributors: what a registration reads, its session, and the calls of one
prepare or validate.

An MCP contributor (``kind = "mcp"`` in ``[contributors.NAME]``, docs/contributors.md) names an
MCP server's Streamable HTTP endpoint, the resources read every prepare (pinned URIs, or
``"listed"``), and at most one tool called every prepare. Each prepare, within the one deadline
the webhooks share:

1. the session: ``initialize`` (the handshake revisions of the pinned SDK, ``mcp_types``) and
   ``notifications/initialized``, once per tenant and server; its ``Mcp-Session-Id`` is sent on
   every later request, and a ``404`` to it (the server forgot the session) opens a new one and
   sends the request again, once. A server that sets no session id (stateless) works the same;
2. ``resources/list`` (pinned resources: only when the server declares resources, for their
   annotations; ``"listed"``: always, to choose them), the reads and the tool call, concurrently.
   A listing holds at most ``MAX_LISTING_RESOURCES`` resources over its pages (more is
   ``too_large``, a large page counted before it is parsed); a page of many resources is
   validated in a worker thread, a chunk at a time, so that the event loop serves the other
   requests meanwhile; no page is asked for once the deadline has passed;
3. the ``resource_link`` items of the tool result, read next;
4. the answers mapped to blocks (``mcp_mapping.py``).

All requests of one prepare share one byte budget (``max_contributor_response_bytes``: the memory
a webhook answer may take) and one ``asyncio.timeout``. The first failure of any request ends the
source's call: ``timeout``, ``error`` (a JSON-RPC error, an ``isError`` tool result, HTTP and
transport failures), ``invalid`` (not the protocol's shapes) or ``too_large``, as for a webhook.
A request abandoned while under way (the deadline, another request's failure, or its own answer
over the cap) is announced to a session-based server with ``notifications/cancelled``, sent in
the background; the rest of its answer is never read. What a server does is its outcome, never
an internal error: a session id that is not visible ASCII is ``invalid``, a session forgotten as
soon as it was opened ``error`` (``session_lost``).

Sessions are kept per tenant and registration (a server never sees two tenants on one session),
in :class:`McpEndpoints`, which drops them when a reload removes or changes the registration, when
more than ``MAX_ENDPOINTS`` are kept, and at shutdown. A dropped session is ended on the server
(``DELETE`` with its ``Mcp-Session-Id``, in the background, within ``CLOSE_SESSION_SECONDS``) once
no call uses it any more; so is a session the service refuses at its opening (a protocol version
it lacks, an invalid answer). At shutdown every session is ended at once, calls still under way
or not, no new one is opened, and each end is logged, whether it was answered, failed or was cut
short. An MCP server named by an inline URL is reached at the address the SSRF
guard checked for this call: its endpoint serves one call (a prepare's or a validate's), and its
session is ended after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

import aiohttp
import structlog
from mcp_types import (
    CallToolResult,
    ClientCapabilities,
    Implementation,
    InitializeRequestParams,
    InitializeResult,
    JSONRPCNotification,
    JSONRPCRequest,
    ListResourcesResult,
    ReadResourceResult,
    Resource,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from context_assembly import __version__
from context_assembly.contributors.calls import (
    MIN_SEND_SECONDS,
    SKIPPED_FAILURE,
    ContributorOutcome,
    PacketFields,
    Status,
    _classify,
    _schema_failure,
)
from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.mcp_exchange import (
    SESSION_HEADER,
    SESSION_ID_RULE,
    VERSION_HEADER,
    ByteBudget,
    McpFailure,
    Screen,
    SessionExpired,
    end_session,
    post,
)
from context_assembly.contributors.mcp_mapping import (
    Mapped,
    add_resource,
    add_tool_result,
    listed_for_assistant,
    needs_read_for_revision,
    resource_revision,
    source_revision,
    unread_links,
)
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.core.request import Message, Revision, TextPart
from context_assembly.core.sources import SourceFailure

log = structlog.get_logger("context_assembly.contributors.mcp")

MAX_LIST_PAGES: Final = 16
"""``resources/list`` pages read at most (a server that pages forever cannot hold a call)."""
MAX_LISTED_RESOURCES: Final = 64
"""Resources read at most with ``resources = "listed"``: the first by priority, then URI."""
MAX_LISTING_RESOURCES: Final = 4096
"""Resources one ``resources/list`` may hold over all its pages; a listing of more is
``too_large`` (validating and sorting it would hold the process for the other requests)."""
SKIM_BYTES: Final = 64 * 1024
"""A listing page at least this large is counted (a skim that builds no resource) before it is
parsed; a smaller one cannot hold enough resources to matter."""
VALIDATE_CHUNK: Final = 256
"""Listed resources validated at once: a page of more is validated in a worker thread, a chunk
at a time (pydantic holds the GIL while it validates; between chunks the loop gets it)."""
MAX_CONCURRENT_READS: Final = 8
"""Reads of one source in flight at once."""
CANCEL_NOTICE_SECONDS: Final = 1.0
"""How long a ``notifications/cancelled`` may take; it is a courtesy, the outcome is settled."""
NOTICE_BYTES: Final = 64 * 1024
CLOSE_SESSION_SECONDS: Final = 1.0
"""How long the ``DELETE`` that ends a dropped session may take (at shutdown too)."""
SHUTDOWN_GRACE_SECONDS: Final = 0.25
"""At shutdown, how much longer than ``CLOSE_SESSION_SECONDS`` the ends are waited for before
those still under way are cut (each end's own bound normally settles it first)."""
SHUTTING_DOWN: Final = "the service is shutting down"
MAX_ENDPOINTS: Final = 1024
"""Sessions kept (tenant × registration); past it the least recently used is dropped."""

CLIENT_INFO: Final = Implementation(name="context-assembly", version=__version__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class McpSpec:
    """What an MCP contributor reads every prepare: its endpoint, the resources (pinned URIs or
    ``"listed"``), the tool and its argument template, and the resolved header values."""

    url: str
    resources: tuple[str, ...] | Literal["listed"] = ()
    tool: str | None = None
    tool_arguments: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Session:
    session_id: str | None  # None: a stateless server
    protocol_version: str
    lists_resources: bool  # the server declares the resources capability


@dataclass(eq=False, slots=True)
class _Shared:
    """What the endpoints of one registry share: the tasks sent in the background (cancel
    notices, session ends), the endpoints holding a session with an id (the gauge), and whether
    the registry is closed (shutdown: no session is opened any more)."""

    background: set[asyncio.Task[None]] = field(default_factory=set)
    open_sessions: set[McpEndpoint] = field(default_factory=set)
    closed: bool = False


class _Empty(TypedDict, total=False):
    """A listed resource, none of its fields read."""


class _SkimResult(TypedDict, total=False):
    resources: list[_Empty]


class _Skim(TypedDict, total=False):
    result: _SkimResult


_SKIM: Final = TypeAdapter(_Skim)
_RESOURCES: Final = TypeAdapter(list[Resource])


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


def _model(cls: type[M], data: dict[str, Any] | None) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise McpFailure("invalid", _schema_failure(err)) from err


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
        return McpFailure(*_classify(exc))


class McpEndpoint:
    """One MCP server as one tenant reaches it, with the session kept across prepares."""

    def __init__(
        self,
        spec: McpSpec,
        *,
        name: str = "",
        pin: CheckedTarget | None = None,
        shared: _Shared | None = None,
        once: bool = False,
    ) -> None:
        """``shared``: what the endpoints of one registry share (:class:`_Shared`); ``once``: an
        endpoint for one call (an inline URL), whose session is ended when the call is over."""
        self.spec = spec
        self.name = name
        self.pin = pin
        self._shared = shared if shared is not None else _Shared()
        self._session: _Session | None = None
        self._client: ContributorClient | None = None  # the one that opened the session
        self._opening = asyncio.Lock()
        self._ids = itertools.count(1)
        self._calls = 0  # calls under way
        self._dropped = once  # the session is ended as soon as no call uses it

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
        with self._in_use():
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
        session = await self._open(client, budget)
        spec = self.spec
        reads = asyncio.Semaphore(MAX_CONCURRENT_READS)

        async def read(uri: str) -> ReadResourceResult:
            async with reads:
                return _model(
                    ReadResourceResult,
                    await self._request(client, budget, "resources/read", {"uri": uri}),
                )

        listing: dict[str, Resource] = {}
        if spec.resources == "listed":
            listing = await self._list(client, budget, until)
            uris = await _listed_off_loop(listing)
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
        result = _model(CallToolResult, await self._request(client, budget, "tools/call", params))
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
            data = await self._request(
                client, budget, "resources/list", params, screen=_listing_screen(room)
            )
            page = await _listing_page(data, room)
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
        with self._in_use():
            result = await _settle(lambda until: self._revision(client, budget, until), remaining)
        if isinstance(result, McpFailure):
            return result.status, None
        return "ok", result

    async def _revision(self, client: ContributorClient, budget: ByteBudget, until: float) -> str:
        session = await self._open(client, budget)
        spec = self.spec
        listing: dict[str, Resource] = {}
        if spec.resources == "listed" or session.lists_resources:
            listing = await self._list(client, budget, until)
        uris = (
            await _listed_off_loop(listing) if spec.resources == "listed" else list(spec.resources)
        )
        unread = [uri for uri in uris if needs_read_for_revision(listing.get(uri))]
        async with _together() as group:
            reads = {
                uri: group.create_task(
                    self._request(client, budget, "resources/read", {"uri": uri})
                )
                for uri in unread
            }
        revisions = {
            uri: resource_revision(
                listing.get(uri),
                _model(ReadResourceResult, reads[uri].result()) if uri in reads else None,
            )
            for uri in uris
        }
        return source_revision(revisions)

    # ------------------------------------------------------------------ session and requests

    def _headers(self, session: _Session | None) -> dict[str, str]:
        headers = dict(self.spec.headers)
        if session is not None:
            if session.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:  # else: a refused one
                headers[VERSION_HEADER] = session.protocol_version
            if session.session_id is not None:
                headers[SESSION_HEADER] = session.session_id
        return headers

    async def _open(self, client: ContributorClient, budget: ByteBudget) -> _Session:
        """The session, initialised first if there is none (one initialisation at a time; a
        prepare waiting for another's is bounded by its own deadline)."""
        session = self._session
        if session is not None:
            return session
        async with self._opening:
            if self._session is None:
                if self._shared.closed:
                    raise McpFailure.of("error", "transport_refused", SHUTTING_DOWN)
                opened = await self._initialize(client, budget)
                if self._shared.closed:  # shut down meanwhile: the session is not kept
                    if opened.session_id is not None:
                        log.info("mcp_session_refused", endpoint=self.name, cause="shutdown")
                        self._end(opened, client)
                    raise McpFailure.of("error", "transport_refused", SHUTTING_DOWN)
                self._hold(opened, client)
            assert self._session is not None
            return self._session

    async def _initialize(self, client: ContributorClient, budget: ByteBudget) -> _Session:
        """The handshake. A session the server opened but the service refuses (an invalid
        answer, a protocol version it lacks, a failure before the handshake is over) is ended
        on the server; a session id that could not be sent back is refused unsent."""
        params = InitializeRequestParams(
            protocol_version=LATEST_HANDSHAKE_VERSION,
            capabilities=ClientCapabilities(),
            client_info=CLIENT_INFO,
        ).model_dump(mode="json", by_alias=True, exclude_none=True)
        request = JSONRPCRequest(
            jsonrpc="2.0", id=next(self._ids), method="initialize", params=params
        )
        answer = await post(client, self.spec.url, self.pin, request, self._headers(None), budget)
        # An empty id is none (as the SDK's own client reads it): a stateless server.
        session_id = answer.session_id or None
        if session_id is not None and not SESSION_ID_RULE.fullmatch(session_id):
            # It cannot be sent back, not even to end it: the server drops it at its own time.
            log.info("mcp_session_refused", endpoint=self.name, cause="invalid_answer")
            raise McpFailure.of(
                "invalid", "invalid_answer", "the session id is not visible ASCII characters"
            )
        version = ""  # none known yet: the DELETE of a refused session names none
        try:
            result = _model(InitializeResult, answer.result)
            version = result.protocol_version
            if version not in HANDSHAKE_PROTOCOL_VERSIONS:
                raise McpFailure.of(
                    "error",
                    "protocol_version",
                    "the server chose a protocol version this client lacks",
                )
            session = _Session(session_id, version, result.capabilities.resources is not None)
            initialized = JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")
            try:
                await post(
                    client, self.spec.url, self.pin, initialized, self._headers(session), budget
                )
            except SessionExpired:
                session_id = None  # the server forgot it already: nothing to end
                raise McpFailure.of(
                    "error", "session_lost", "the server forgot the session as it opened it"
                ) from None
        except BaseException as exc:
            if session_id is not None:
                log.info("mcp_session_refused", endpoint=self.name, cause=_cause_name(exc))
                self._end(_Session(session_id, version, lists_resources=False), client)
            raise
        log.info(
            "mcp_session_opened",
            endpoint=self.name,
            protocol_version=session.protocol_version,
            stateful=session.session_id is not None,
        )
        return session

    async def _request(
        self,
        client: ContributorClient,
        budget: ByteBudget,
        method: str,
        params: dict[str, Any],
        screen: Screen | None = None,
    ) -> dict[str, Any]:
        """One request's ``result`` (``screen``: a check of the answer before it is parsed); a
        forgotten session is opened again and the request sent once more."""
        for _ in range(2):
            session = await self._open(client, budget)
            request = JSONRPCRequest(
                jsonrpc="2.0", id=next(self._ids), method=method, params=params
            )
            try:
                answer = await post(
                    client, self.spec.url, self.pin, request, self._headers(session), budget, screen
                )
            except SessionExpired:
                if self._session is session:
                    self._hold(None, None)  # the server forgot it: nothing to end
                    log.info("mcp_session_expired", endpoint=self.name)
                continue
            except asyncio.CancelledError:
                self._announce_cancel(client, session, request.id)
                raise
            except McpFailure as failure:
                if failure.status == "too_large" and not isinstance(failure, _ReadInFull):
                    self._announce_cancel(client, session, request.id)  # it may still be writing
                raise
            if answer.result is None:  # pragma: no cover - post returns a result for a request
                raise McpFailure.of("invalid", "invalid_answer", "no result")
            return answer.result
        raise McpFailure.of("error", "session_lost", "the server forgot the session again")

    def _announce_cancel(
        self, client: ContributorClient, session: _Session, request_id: int | str
    ) -> None:
        """Tell a session-based server that ``request_id`` was abandoned, in the background."""
        if session.session_id is None:
            return
        notice = JSONRPCNotification(
            jsonrpc="2.0",
            method="notifications/cancelled",
            params={"requestId": request_id, "reason": "the caller's deadline or another failure"},
        )

        async def send() -> None:
            # A courtesy: the outcome is settled whatever happens to it.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CANCEL_NOTICE_SECONDS):
                    headers = self._headers(session)
                    await post(
                        client, self.spec.url, self.pin, notice, headers, ByteBudget(NOTICE_BYTES)
                    )

        self._spawn(send())

    # ------------------------------------------------------------------ the session's end

    def _hold(self, session: _Session | None, client: ContributorClient | None) -> None:
        """Keep ``session`` (opened through ``client``) as this endpoint's, or none."""
        self._session, self._client = session, client
        if session is not None and session.session_id is not None:
            self._shared.open_sessions.add(self)
        else:
            self._shared.open_sessions.discard(self)

    @contextlib.contextmanager
    def _in_use(self) -> Iterator[None]:
        """Count a call under way; the last one out of a dropped endpoint ends its session."""
        self._calls += 1
        try:
            yield
        finally:
            self._calls -= 1
            if self._dropped and self._calls == 0:
                self._end_session()

    @property
    def dropped(self) -> bool:
        """Whether the endpoint is out of use: its session is ended once its calls are over."""
        return self._dropped

    def drop(self) -> None:
        """Take the endpoint out of use: its session is ended on the server now, or when the
        calls still under way are over (a later call, if any, would open a new one)."""
        self._dropped = True
        if self._calls == 0:
            self._end_session()

    def close(self) -> None:
        """At shutdown: take the endpoint out of use and end its session now, even while a call
        still uses it (that call opens no new one: the registry is closed)."""
        self._dropped = True
        self._end_session()

    def _end_session(self) -> None:
        """End the session on the server in the background (``DELETE``), within
        ``CLOSE_SESSION_SECONDS``; a stateless server has nothing to end."""
        session, client = self._session, self._client
        self._hold(None, None)
        if session is not None and client is not None:
            self._end(session, client)

    def _end(self, session: _Session, client: ContributorClient) -> None:
        """Send the ``DELETE`` that ends ``session`` in the background; its outcome is logged
        whatever it is: answered, failed, out of time, or cut short at shutdown. A stateless
        server has nothing to end."""
        if session.session_id is None:
            return
        headers = self._headers(session)

        async def send() -> None:
            # The session is gone from here whatever the server answers: a failure is logged
            # with what it was, never with the session id or a header value.
            try:
                async with asyncio.timeout(CLOSE_SESSION_SECONDS):
                    status = await end_session(client, self.spec.url, self.pin, headers)
            except asyncio.CancelledError:
                log.info("mcp_session_end_failed", endpoint=self.name, cause="cut at shutdown")
                raise
            except Exception as exc:  # nothing waits on its outcome
                cause = (
                    "no answer in time"
                    if isinstance(exc, TimeoutError)
                    else _classify(exc)[1].detail
                )
                log.info("mcp_session_end_failed", endpoint=self.name, cause=cause)
                return
            log.info("mcp_session_ended", endpoint=self.name, status=status)

        self._spawn(send())

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._shared.background.add(task)
        task.add_done_callback(self._shared.background.discard)


def _cause_name(exc: BaseException) -> str:
    """The failure cause's name of what ended a handshake (a cancellation: the deadline, or
    another request's failure)."""
    if isinstance(exc, McpFailure):
        return exc.failure.cause
    if isinstance(exc, asyncio.CancelledError | TimeoutError):
        return "timeout"
    return _classify(exc)[1].cause


def _listed(listing: Mapping[str, Resource]) -> list[str]:
    """The listed resources meant for the assistant, by priority (highest first), then URI, at
    most ``MAX_LISTED_RESOURCES``."""
    kept = [r for r in listing.values() if listed_for_assistant(r.annotations)]
    kept.sort(key=lambda r: (-(r.annotations.priority or 0.0) if r.annotations else 0.0, r.uri))
    return [r.uri for r in kept[:MAX_LISTED_RESOURCES]]


async def _listed_off_loop(listing: Mapping[str, Resource]) -> list[str]:
    """:func:`_listed`, in a worker thread for a listing of many resources."""
    if len(listing) <= VALIDATE_CHUNK:
        return _listed(listing)
    return await asyncio.to_thread(_listed, listing)


class _ReadInFull(McpFailure):
    """A failure judged on an answer read in full: the server has nothing left to stop."""


def _too_many() -> McpFailure:
    return _ReadInFull(
        "too_large",
        SourceFailure(
            "too_large", f"the listing holds more than {MAX_LISTING_RESOURCES} resources"
        ),
    )


def _listing_screen(room: int) -> Screen:
    """Count a large listing page's resources before it is parsed: a page of more than
    ``room`` is ``too_large`` at a small fraction of the parse's cost."""

    def screen(raw: bytes) -> None:
        # Every resource names its "uri": fewer such keys than ``room`` (the common case) need
        # no skim. A key written with escapes escapes this count, not the one after the parse.
        if len(raw) < SKIM_BYTES or raw.count(b'"uri"') <= room:
            return
        try:
            skim = _SKIM.validate_json(raw)
        except ValidationError:
            return  # the parse names the problem
        if len(skim.get("result", {}).get("resources", ())) > room:
            raise _too_many()

    return screen


async def _listing_page(data: dict[str, Any], room: int) -> ListResourcesResult:
    """One ``resources/list`` result validated: on the loop when it lists few resources, else
    in a worker thread, a chunk at a time, given up once the call no longer waits for it."""
    entries = data.get("resources")
    if isinstance(entries, list) and len(entries) > room:
        raise _too_many()
    if not isinstance(entries, list) or len(entries) <= VALIDATE_CHUNK:
        return _model(ListResourcesResult, data)
    abandoned = threading.Event()
    try:
        return await asyncio.to_thread(_validate_listing, data, entries, abandoned)
    finally:
        abandoned.set()  # the deadline or another failure: the thread stops at its next chunk


def _validate_listing(
    data: dict[str, Any], entries: list[Any], abandoned: threading.Event
) -> ListResourcesResult:
    """``ListResourcesResult`` of ``data``, its resources validated ``VALIDATE_CHUNK`` at a
    time; an invalid page is validated again whole, for the failure's exact path."""
    page = _model(ListResourcesResult, {**data, "resources": []})
    resources: list[Resource] = []
    for start in range(0, len(entries), VALIDATE_CHUNK):
        if abandoned.is_set():
            raise McpFailure.of("timeout", "timeout", "deadline reached")
        try:
            resources += _RESOURCES.validate_python(entries[start : start + VALIDATE_CHUNK])
        except ValidationError:
            return _model(ListResourcesResult, data)
    return page.model_copy(update={"resources": resources})


class McpEndpoints:
    """The MCP endpoints in use, one per tenant and registration, each with its session; and the
    endpoints of inline URLs, one per call."""

    def __init__(self, max_endpoints: int = MAX_ENDPOINTS) -> None:
        self.max_endpoints = max_endpoints
        self._endpoints: OrderedDict[tuple[str, str], McpEndpoint] = OrderedDict()
        self._shared = _Shared()

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
        for endpoint in list(shared.open_sessions):
            endpoint.close()
        loop = asyncio.get_running_loop()
        until = loop.time() + CLOSE_SESSION_SECONDS + SHUTDOWN_GRACE_SECONDS
        # A call under way may still end a session it was opening: wait for those sends too.
        while shared.background and (left := until - loop.time()) > 0:
            await asyncio.wait(set(shared.background), timeout=left)
        late = set(shared.background)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
