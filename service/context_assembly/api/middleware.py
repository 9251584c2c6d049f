"""Pure ASGI middleware: request id + access log line, and the request body size limit."""

from __future__ import annotations

import secrets
import time
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from context_assembly.api.problems import problem_response
from context_assembly.errors import PayloadTooLargeError
from context_assembly.metrics import Metrics

log = structlog.get_logger("context_assembly.http")
REQUEST_ID = "x-request-id"


class RequestContext:
    """Binds a request id (the caller's ``X-Request-Id`` or a new one), echoes it, logs one line."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = incoming[:128] if incoming and incoming.isprintable() else secrets.token_hex(8)
        status = {"code": 500}
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route: Any = scope.get("route")
            path = getattr(route, "path", "unmatched")
            self.metrics.requests.labels(path, str(status["code"])).inc()
            log.info(
                "request",
                method=scope["method"],
                route=path,
                status=status["code"],
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )
            structlog.contextvars.unbind_contextvars("request_id")


class BodyLimit:
    """Refuses bodies over ``max_bytes`` with 413 problem+json, by header or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = {"response": False}

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                started["response"] = True
            await send(message)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started["response"]:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = PayloadTooLargeError(
            f"request body is over the limit of {self.max_bytes} bytes (limits.max_body_bytes)",
            max_body_bytes=self.max_bytes,
        )
        await problem_response(err, scope.get("path"))(scope, receive, send)


class _TooLarge(Exception):
    pass
