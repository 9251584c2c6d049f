"""Pure ASGI middleware: request id + access log line, and the request body size limit."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from context_assembly.api.problems import InternalError, problem_response
from context_assembly.errors import InvalidError, PayloadTooLargeError
from context_assembly.logs import frames
from context_assembly.metrics import Metrics

log = structlog.get_logger("context_assembly.http")
REQUEST_ID = "x-request-id"
# The scope key under which ``BodyLimit`` leaves the body it has read, whole.
BODY = "context_assembly.body"
# The scope key under which prepare leaves the id of the preparation it made, for the access line
# (the lifecycle routes have theirs in the path).
PREPARATION_ID = "context_assembly.preparation_id"
# The status an access line and the request counter show for a request that got no answer
# because its client disconnected first (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


class RequestContext:
    """Binds a request id (the caller's ``X-Request-Id``, or a new one when that is not 1-128
    visible ASCII characters), echoes it, and once the answer is sent counts the request and
    logs one line for it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method == "HEAD":
            # HEAD is GET without the body (RFC 9110 §9.3.2): routed as GET (load balancers
            # probe /healthz so); the server, which keeps its own scope, sends the head only.
            scope = {**scope, "method": "GET"}
        incoming = dict(scope["headers"]).get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = incoming if _usable_id(incoming) else secrets.token_hex(8)
        status = {"code": 0, "bytes": 0}  # the answer's status once its head is sent, its size
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID.encode(), request_id.encode("ascii")))
                message = {**message, "headers": headers}
            else:
                status["bytes"] += len(message.get("body", b""))
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            # Answered here, not by Starlette's outer error middleware: so the 500 carries the
            # request id, and its log line too (the type and where it was raised; not the
            # message, which could hold input).
            log.error(
                "unhandled_error",
                request_id=request_id,
                path=scope.get("path"),
                error_type=type(exc).__name__,
                frames=frames(exc),
            )
            if status["code"]:
                raise  # the head is out: nothing more can be said on this connection
            internal = InternalError("internal error; see the service log (X-Request-Id)")
            await problem_response(internal, scope.get("path"))(scope, receive, send_with_id)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
            route: Any = scope.get("route")
            self._account(
                method,
                getattr(route, "path", "unmatched"),
                # No answer at all: the client went away before one (nginx's 499).
                status["code"] or CLIENT_CLOSED_REQUEST,
                round((time.perf_counter() - started) * 1000, 3),
                request_id,
                len(scope.get(BODY, b"")),
                status["bytes"],
                scope.get(PREPARATION_ID) or scope.get("path_params", {}).get("preparation_id"),
            )

    def _account(
        self,
        method: str,
        path: str,
        status: int,
        duration_ms: float,
        request_id: str,
        bytes_in: int,
        bytes_out: int,
        preparation_id: object,
    ) -> None:
        """The request's counter and access line: ids, sizes (the body read, the body sent) and
        timings only. ``preparation_id`` is the
        one prepare made, or the path's as sent when it could be one of ours (1-128 visible
        ASCII characters: a caller's may be anything)."""
        self.metrics.count_request(path, status)
        shown = (
            preparation_id
            if isinstance(preparation_id, str) and _usable_id(preparation_id)
            else None
        )
        log.info(
            "request",
            request_id=request_id,
            method=method,
            route=path,
            status=status,
            duration_ms=duration_ms,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            **({"preparation_id": shown} if shown is not None else {}),
        )


MAX_REQUEST_ID = 128


def _usable_id(incoming: str) -> bool:
    """A caller's request id is used as sent when it is 1-128 visible ASCII characters (it is
    echoed and logged byte for byte); any other gets a new id, which the answer's header names."""
    return 0 < len(incoming) <= MAX_REQUEST_ID and incoming.isascii() and incoming.isprintable()


class BodyLimit:
    """Refuses bodies over ``max_bytes`` with 413 problem+json, by header or while reading.

    The body is read here, up to the limit, before the app sees it, and then replayed: an error
    raised inside the app's own body read would be reported by FastAPI as a parsing error. Its
    size is left in the scope (``BODY``) for the access line.
    """

    def __init__(self, app: ASGIApp, max_bytes: Callable[[], int]) -> None:
        self.app = app
        self._max_bytes = max_bytes  # read per request: a configuration reload may change it

    @property
    def max_bytes(self) -> int:
        return self._max_bytes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in {"GET", "HEAD", "OPTIONS"}:
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._refuse(scope, receive, send, limit)
            return
        coding = headers.get(b"content-encoding", b"identity").strip().lower()
        if coding not in (b"identity", b""):
            # Read as JSON it would fail with a misleading parse error, or pass unread.
            err = InvalidError(
                "invalid request: (body): Content-Encoding "
                f"{coding.decode('latin-1')!r} is not supported; send the body uncompressed",
                field="(body)",
            )
            await problem_response(err, scope.get("path"))(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client is gone (or the server's body time limit closed the connection)
                # before the body was whole: there is no one to answer, and nothing to run.
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(scope, receive, send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        scope[BODY] = body
        await self.app(
            scope,
            _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
            send,
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        err = PayloadTooLargeError(
            f"request body is over the limit of {limit} bytes (limits.max_body_bytes)",
            max_body_bytes=limit,
        )
        await problem_response(err, scope.get("path"))(scope, receive, send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive callable that yields ``messages`` first, then defers to ``then`` (disconnects)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
