"""An MCP server's session as one tenant holds it: the handshake, the requests sent in it, the
notices of abandoned requests, and its end on the server.

The session is opened on first use: ``initialize`` (the handshake revisions of the pinned SDK,
``mcp_types``) and ``notifications/initialized``, once per tenant and server; its
``Mcp-Session-Id`` is sent on every later request, and a ``404`` to it (the server forgot the
session) opens a new one and sends the request again, once. A server that sets no session id
(stateless) works the same. A request abandoned while under way (the deadline, another
request's failure, or its own answer over the cap) is announced to a session-based server with
``notifications/cancelled``, sent in the background; the rest of its answer is never read. What
a server does is its outcome, never an internal error: a session id that is not visible ASCII is
``invalid``, a session forgotten as soon as it was opened ``error`` (``session_lost``).

A dropped session (``McpEndpoints`` in ``mcp.py`` drops them) is ended on the server
(``DELETE`` with its ``Mcp-Session-Id``, in the background, within ``CLOSE_SESSION_SECONDS``) once
no call uses it any more; so is a session the service refuses at its opening (a protocol version
it lacks, an invalid answer). At shutdown every session is ended at once, calls still under way
or not, no new one is opened, and each end is logged, whether it was answered, failed or was cut
short.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from mcp_types import (
    ClientCapabilities,
    Implementation,
    InitializeRequestParams,
    InitializeResult,
    JSONRPCNotification,
    JSONRPCRequest,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from context_assembly import __version__
from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.failures import classify
from context_assembly.contributors.mcp_exchange import (
    SESSION_HEADER,
    SESSION_ID_RULE,
    VERSION_HEADER,
    ByteBudget,
    McpFailure,
    ReadInFull,
    Screen,
    SessionExpired,
    end_session,
    parse_result,
    post,
)
from context_assembly.contributors.ssrf import CheckedTarget

log = structlog.get_logger("context_assembly.contributors.mcp")

CANCEL_NOTICE_SECONDS: Final = 1.0
"""How long a ``notifications/cancelled`` may take; it is a courtesy, the outcome is settled."""
NOTICE_BYTES: Final = 64 * 1024
CLOSE_SESSION_SECONDS: Final = 1.0
"""How long the ``DELETE`` that ends a dropped session may take (at shutdown too)."""
SHUTDOWN_GRACE_SECONDS: Final = 0.25
"""At shutdown, how much longer than ``CLOSE_SESSION_SECONDS`` the ends are waited for before
those still under way are cut (each end's own bound normally settles it first)."""
SHUTTING_DOWN: Final = "the service is shutting down"

CLIENT_INFO: Final = Implementation(name="context-assembly", version=__version__)


@dataclass(frozen=True, slots=True)
class Handshake:
    """What the handshake settled: the session's id, its protocol version, and whether the
    server declares resources."""

    session_id: str | None  # None: a stateless server
    protocol_version: str
    lists_resources: bool  # the server declares the resources capability


@dataclass(eq=False, slots=True)
class SharedState:
    """What the sessions of one registry share: the tasks sent in the background (cancel
    notices, session ends), the sessions open with an id (the gauge), and whether the registry
    is closed (shutdown: no session is opened any more)."""

    background: set[asyncio.Task[None]] = field(default_factory=set)
    open_sessions: set[McpSession] = field(default_factory=set)
    closed: bool = False


class McpSession:
    """The session of one MCP server as one tenant reaches it, kept across calls."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        name: str,
        pin: CheckedTarget | None,
        shared: SharedState,
        once: bool,
    ) -> None:
        """``url``, ``headers`` and ``pin``: where the server is and what every request to it
        carries; ``name``: the registration, in the log; ``shared``: what the sessions of one
        registry share; ``once``: the session of one call (an inline URL), ended when the call
        is over."""
        self.url = url
        self.base_headers = headers
        self.name = name
        self.pin = pin
        self._shared = shared
        self._session: Handshake | None = None
        self._client: ContributorClient | None = None  # the one that opened the session
        self._opening = asyncio.Lock()
        self._ids = itertools.count(1)
        self._calls = 0  # calls under way
        self._dropped = once  # the session is ended as soon as no call uses it

    def _headers(self, session: Handshake | None) -> dict[str, str]:
        headers = dict(self.base_headers)
        if session is not None:
            if session.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:  # else: a refused one
                headers[VERSION_HEADER] = session.protocol_version
            if session.session_id is not None:
                headers[SESSION_HEADER] = session.session_id
        return headers

    async def open(self, client: ContributorClient, budget: ByteBudget) -> Handshake:
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

    async def _initialize(self, client: ContributorClient, budget: ByteBudget) -> Handshake:
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
        answer = await post(client, self.url, self.pin, request, self._headers(None), budget)
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
            result = parse_result(InitializeResult, answer.result)
            version = result.protocol_version
            if version not in HANDSHAKE_PROTOCOL_VERSIONS:
                raise McpFailure.of(
                    "error",
                    "protocol_version",
                    "the server chose a protocol version this client lacks",
                )
            session = Handshake(session_id, version, result.capabilities.resources is not None)
            initialized = JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")
            try:
                await post(client, self.url, self.pin, initialized, self._headers(session), budget)
            except SessionExpired:
                session_id = None  # the server forgot it already: nothing to end
                raise McpFailure.of(
                    "error", "session_lost", "the server forgot the session as it opened it"
                ) from None
        except BaseException as exc:
            if session_id is not None:
                log.info("mcp_session_refused", endpoint=self.name, cause=_cause_name(exc))
                self._end(Handshake(session_id, version, lists_resources=False), client)
            raise
        log.info(
            "mcp_session_opened",
            endpoint=self.name,
            protocol_version=session.protocol_version,
            stateful=session.session_id is not None,
        )
        return session

    async def request(
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
            session = await self.open(client, budget)
            request = JSONRPCRequest(
                jsonrpc="2.0", id=next(self._ids), method=method, params=params
            )
            try:
                answer = await post(
                    client, self.url, self.pin, request, self._headers(session), budget, screen
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
                if failure.status == "too_large" and not isinstance(failure, ReadInFull):
                    self._announce_cancel(client, session, request.id)  # it may still be writing
                raise
            if answer.result is None:  # pragma: no cover - post returns a result for a request
                raise McpFailure.of("invalid", "invalid_answer", "no result")
            return answer.result
        raise McpFailure.of("error", "session_lost", "the server forgot the session again")

    def _announce_cancel(
        self, client: ContributorClient, session: Handshake, request_id: int | str
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
                        client, self.url, self.pin, notice, headers, ByteBudget(NOTICE_BYTES)
                    )

        self._spawn(send())

    # ------------------------------------------------------------------ the session's end

    def _hold(self, session: Handshake | None, client: ContributorClient | None) -> None:
        """Keep ``session`` (opened through ``client``) as this one, or none."""
        self._session, self._client = session, client
        if session is not None and session.session_id is not None:
            self._shared.open_sessions.add(self)
        else:
            self._shared.open_sessions.discard(self)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Count a call under way; the last one out of a dropped session ends it."""
        self._calls += 1
        try:
            yield
        finally:
            self._calls -= 1
            if self._dropped and self._calls == 0:
                self._end_session()

    @property
    def dropped(self) -> bool:
        """Whether the session is out of use: it is ended once its calls are over."""
        return self._dropped

    def drop(self) -> None:
        """Take the session out of use: it is ended on the server now, or when the calls still
        under way are over (a later call, if any, would open a new one)."""
        self._dropped = True
        if self._calls == 0:
            self._end_session()

    def close(self) -> None:
        """At shutdown: take the session out of use and end it now, even while a call still
        uses it (that call opens no new one: the registry is closed)."""
        self._dropped = True
        self._end_session()

    def _end_session(self) -> None:
        """End the session on the server in the background (``DELETE``), within
        ``CLOSE_SESSION_SECONDS``; a stateless server has nothing to end."""
        session, client = self._session, self._client
        self._hold(None, None)
        if session is not None and client is not None:
            self._end(session, client)

    def _end(self, session: Handshake, client: ContributorClient) -> None:
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
                    status = await end_session(client, self.url, self.pin, headers)
            except asyncio.CancelledError:
                log.info("mcp_session_end_failed", endpoint=self.name, cause="cut at shutdown")
                raise
            except Exception as exc:  # nothing waits on its outcome
                cause = (
                    "no answer in time"
                    if isinstance(exc, TimeoutError)
                    else classify(exc)[1].detail
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
    return classify(exc)[1].cause
