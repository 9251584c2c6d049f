"""One JSON-RPC message to an MCP server over Streamable HTTP, through the contributor client.

An MCP call is a POST of one JSON-RPC message to the server's endpoint, answered by a JSON body
or by a Server-Sent Events stream that carries the answer among notifications. Both go through
:class:`~.client.ContributorClient`, the webhooks' aiohttp client, so an MCP call has the same
transport rules: inline URLs connect only to their checked addresses, redirects are never
followed, no proxy, no cookie, no decompression, a bounded response head.

Every byte of every answer is counted against one :class:`ByteBudget` (the source's share of
``max_contributor_response_bytes``) as it arrives, an event stream included, so an endless or
oversized answer is ``too_large`` before it can fill memory. The events are parsed by httpx2's
``EventSource`` (the parser of the official SDK's own client) over those counted chunks; nothing
here reads SSE by hand. JSON-RPC envelopes are the SDK's wire types (``mcp_types``), and so are
the results a caller reads from them (:func:`parse_result`).

A caller may ``screen`` each answer's raw message before it is parsed (a listing is counted so, see
``contributors/mcp_listing.py``). A session id the server sets must match ``SESSION_ID_RULE`` (visible
ASCII) before the caller sends it back. A session is ended by a ``DELETE`` of the endpoint with
its id (:func:`end_session`), through the same client. The caller owns the deadline (one ``asyncio.timeout`` around its whole flow,
``contributors/mcp.py``) and the session (``contributors/mcp_session.py``). Failures are raised as :class:`McpFailure` with a manifest status and
a classified failure (``SourceFailure``: the cause's name and words) that never quotes the answer; a ``404`` to a request that carried a session id is
:class:`SessionExpired`, so that the caller can open a new session.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import aiohttp
import httpx2
from mcp_types import (
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import BaseModel, ValidationError

from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.failures import schema_failure
from context_assembly.contributors.outcomes import Status
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.core.sources import FailureCause, SourceFailure

SESSION_HEADER: Final = "mcp-session-id"
VERSION_HEADER: Final = "mcp-protocol-version"
ACCEPT: Final = "application/json, text/event-stream"
SESSION_ID_RULE: Final = re.compile(r"[\x21-\x7e]+")
"""What a session id may be (the transport's rule): visible ASCII characters only."""

Screen = Callable[[bytes], None]
"""A check of an answer's raw JSON-RPC message before it is parsed; raises ``McpFailure``."""

M = TypeVar("M", bound=BaseModel)

# Names of the JSON-RPC and MCP error codes a cause may name (the server's message is not
# quoted: it is free text, and could carry what the request sent).
_CODE_NAMES: Final = {
    -32700: "parse error",
    -32600: "invalid request",
    -32601: "method not found",
    -32602: "invalid params",
    -32603: "internal error",
    -32002: "resource not found",
}


class McpFailure(Exception):
    """A settled non-ok result of an MCP call: a manifest status and the failure classified
    (``cause``: its words)."""

    def __init__(self, status: Status, failure: SourceFailure) -> None:
        super().__init__(failure.detail)
        self.status = status
        self.failure = failure
        self.cause = failure.detail

    @classmethod
    def of(
        cls, status: Status, cause: FailureCause, detail: str, http_status: int | None = None
    ) -> McpFailure:
        """The failure of ``status`` with the cause's name, its words and the HTTP status."""
        return cls(status, SourceFailure(cause, detail, http_status))


class ReadInFull(McpFailure):
    """A failure judged on an answer read in full: the server has nothing left to stop."""


class SessionExpired(Exception):
    """The server answered ``404`` to a request that carried a session id: it forgot the
    session (the MCP transport's signal to initialise again)."""


@dataclass(slots=True)
class ByteBudget:
    """The bytes the answers of one call flow may still take; shared by its concurrent
    requests, counted on the wire bytes as each chunk arrives."""

    cap: int
    used: int = 0

    def take(self, size: int) -> None:
        """Count ``size`` more bytes; ``too_large`` once the answers together pass the cap."""
        self.used += size
        if self.used > self.cap:
            raise McpFailure.of("too_large", "too_large", f"answers over the {self.cap}-byte cap")


@dataclass(frozen=True, slots=True)
class Answer:
    """What a POST produced: the JSON-RPC ``result`` of a request (``None`` for a notification)
    and the session id the server set on the answer, if any."""

    result: dict[str, Any] | None
    session_id: str | None


def error_cause(code: int, http_status: int | None = None) -> str:
    """``JSON-RPC error -32602 (invalid params)``, with the HTTP status when it was not 2xx."""
    name = _CODE_NAMES.get(code)
    text = f"JSON-RPC error {code}" + (f" ({name})" if name else "")
    return f"HTTP {http_status}: {text}" if http_status is not None else text


async def post(
    client: ContributorClient,
    url: str,
    pin: CheckedTarget | None,
    message: JSONRPCRequest | JSONRPCNotification,
    headers: Mapping[str, str],
    budget: ByteBudget,
    screen: Screen | None = None,
) -> Answer:
    """POST one JSON-RPC ``message`` and read its answer within ``budget``; ``screen`` sees each
    message's raw bytes before they are parsed.

    A request returns its ``result``; a notification returns once the server accepted it
    (``202``). The connection goes back to the pool only after a complete, accepted answer; any
    failure or cancellation closes it, so a late answer is never read.
    """
    request_id = message.id if isinstance(message, JSONRPCRequest) else None
    sent = {**headers, "accept": ACCEPT, "content-type": "application/json"}
    body = message.model_dump_json(by_alias=True, exclude_none=True).encode()
    response = await client.post(url, body, sent, pin)
    try:
        answer = await _read(response, request_id, SESSION_HEADER in headers, budget, screen)
    except BaseException:
        response.close()
        raise
    response.release()
    return answer


async def end_session(
    client: ContributorClient,
    url: str,
    pin: CheckedTarget | None,
    headers: Mapping[str, str],
) -> int:
    """DELETE the session that ``headers`` name (the transport's way to end one) and return the
    answer's status (``405``: the server does not end sessions on request). The answer's body is
    not read: the connection is closed with it."""
    response = await client.delete(url, dict(headers), pin)
    response.close()
    return response.status


async def _read(
    response: aiohttp.ClientResponse,
    request_id: int | str | None,
    had_session: bool,
    budget: ByteBudget,
    screen: Screen | None,
) -> Answer:
    code = response.status
    session_id = response.headers.get(SESSION_HEADER)
    if 300 <= code < 400:
        raise McpFailure.of("error", "http_status", f"HTTP {code} redirect (not followed)", code)
    if code == 404 and had_session:
        raise SessionExpired()
    if code == 504:
        raise McpFailure.of(
            "timeout", "http_status", "HTTP 504: the server reported its deadline", code
        )
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise McpFailure.of(
            "invalid", "content_encoding", "compressed body (content-encoding) not accepted"
        )
    mime = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not 200 <= code < 300:
        # A JSON-RPC error may come with a 4xx: name its code, else the status alone.
        error = None
        if mime == "application/json":
            error = _parse(await _read_body(response, budget))
        if isinstance(error, JSONRPCError):
            raise McpFailure.of("error", "jsonrpc_error", error_cause(error.error.code, code), code)
        raise McpFailure.of("error", "http_status", f"HTTP {code}", code)
    if request_id is None:  # a notification: accepted, nothing to read
        return Answer(None, session_id)
    if mime == "application/json":
        message = _parse(await _read_body(response, budget), screen)
        return Answer(_result(message, request_id), session_id)
    if mime == "text/event-stream":
        return Answer(await _result_from_events(response, request_id, budget, screen), session_id)
    raise McpFailure.of(
        "invalid", "content_type", "content-type is neither JSON nor an event stream"
    )


async def _chunks(response: aiohttp.ClientResponse, budget: ByteBudget) -> AsyncIterator[bytes]:
    """The body's wire bytes as they arrive, each counted against ``budget`` before use."""
    async for chunk in response.content.iter_any():
        budget.take(len(chunk))
        yield chunk


async def _read_body(response: aiohttp.ClientResponse, budget: ByteBudget) -> bytes:
    length = response.headers.get("content-length", "").strip()
    if length.isdigit() and budget.used + int(length) > budget.cap:
        raise McpFailure.of(
            "too_large",
            "too_large",
            f"Content-Length {int(length)} over the {budget.cap}-byte cap",
        )
    buffer = bytearray()
    try:
        async for chunk in _chunks(response, budget):
            buffer += chunk
    except BaseException:
        del buffer  # the failure's traceback keeps this frame: not the bytes read so far
        raise
    return bytes(buffer)


async def _result_from_events(
    response: aiohttp.ClientResponse,
    request_id: int | str,
    budget: ByteBudget,
    screen: Screen | None,
) -> dict[str, Any]:
    """The answer to ``request_id`` among the stream's events; the server's notifications and
    requests on the stream are passed over (this client declares no capability they need)."""
    # EventSource reads an httpx2 response: one is built around the counted aiohttp chunks (no
    # second connection; httpx2 only frames lines and events).
    stream = httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=_chunks(response, budget),
        request=httpx2.Request("POST", str(response.url)),
    )
    try:
        async for event in httpx2.EventSource(stream, max_event_size=budget.cap):
            if event.event != "message" or not event.data:
                continue
            message = _parse(event.data.encode(), screen)
            if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id == request_id:
                return _result(message, request_id)
    except httpx2.SSEError as err:  # an event larger than the cap (the budget stops the rest)
        raise McpFailure.of(
            "too_large", "too_large", f"an event over the {budget.cap}-byte cap"
        ) from err
    raise McpFailure.of("error", "no_answer", "the event stream ended without an answer")


def _parse(data: bytes, screen: Screen | None = None) -> Any:
    if screen is not None:
        screen(data)
    try:
        return jsonrpc_message_adapter.validate_json(data)
    except ValidationError as err:
        raise McpFailure.of("invalid", "invalid_answer", "not a JSON-RPC message") from err


def _result(message: Any, request_id: int | str) -> dict[str, Any]:
    if isinstance(message, JSONRPCError):
        raise McpFailure.of("error", "jsonrpc_error", error_cause(message.error.code))
    if not isinstance(message, JSONRPCResponse) or message.id != request_id:
        raise McpFailure.of(
            "invalid", "invalid_answer", "the answer is not the response to this request"
        )
    return message.result


def parse_result(cls: type[M], data: dict[str, Any] | None) -> M:
    """A request's ``result`` as the SDK's type ``cls``; ``invalid`` when it is not that shape."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise McpFailure("invalid", schema_failure(err)) from err
