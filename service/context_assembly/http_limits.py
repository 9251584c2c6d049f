"""The HTTP/1.1 edge, where uvicorn reads requests: bounds on each request's head and body, and
problem+json for what uvicorn refuses before any application runs.

uvicorn's httptools protocol buffers a request head of any size and waits for a head or a body
for ever (its only timer is the keep-alive one between requests; h11's
``h11_max_incomplete_event_size`` has no httptools counterpart). :class:`LimitedHttpToolsProtocol`
adds the three ``[limits]`` bounds to it, per connection:

* ``max_head_bytes``: a head still incomplete after that many bytes, or a complete one whose
  target and header fields add up to more, is refused with 431 and the connection closed, so a
  connection holds at most the limit plus one socket read of head;
* ``head_timeout_seconds``: from the connection's opening (first request) or a request's first
  byte (later requests on a kept-alive connection) to the end of its head;
* ``body_timeout_seconds``: from the end of the head to the end of the body (for a pipelined
  request, from when the answers before it are done: uvicorn reads no more until then).

Over a time limit the answer is 408 and the connection is closed (when an answer is already
under way on the connection, the connection is only closed). A request the HTTP parser refuses (an
invalid request line, a control character in a header, a ``Content-Length`` that is not a
number, a malformed chunk) gets 400 instead of uvicorn's plain-text one, and the connection is
closed. Every refusal is problem+json (``errors.RequestHeadTooLargeError``,
``errors.RequestTimeoutError``, ``errors.BadRequestError``) with an ``X-Request-Id``: the caller's
own when the head read so far holds a usable one (the rule of ``api.middleware``), else a new one.
uvicorn's own lines about the connection (``uvicorn.error``: "Invalid HTTP request received." and
the like) carry the same ``request_id``; ``logs.configure_logging`` makes them JSON lines.
``server.serve`` selects the class with ``uvicorn.run(http=...)``; a reverse proxy in front can
hold the same bounds (docs/operations.md, Limits).

What this relies on in uvicorn, beyond its public API: ``HttpToolsProtocol``'s constructor
signature, its ``data_received``, ``send_400_response`` and parser callbacks (``on_message_begin``,
``on_headers_complete``, ``on_body``, ``on_message_complete``) and ``on_response_complete``; its
attributes ``transport``, ``loop``, ``cycle``, ``pipeline``, ``url``, ``headers``, ``logger`` and
``server_state.default_headers``; ``STATUS_LINE``; and ``RequestResponseCycle``'s
``response_started``, ``response_complete``, ``disconnected``, ``message_event`` and ``logger``.
None of these is a documented interface, so ``pyproject.toml`` pins uvicorn to the minor version
this module is tested with (tests/e2e/test_e2e_limits.py, tests/e2e/test_e2e_http_edge.py); moving
the pin means running those tests against the new version first.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from context_assembly.api.middleware import REQUEST_ID, _usable_id
from context_assembly.config import LimitSettings
from context_assembly.errors import (
    BadRequestError,
    RequestHeadTooLargeError,
    RequestTimeoutError,
    ServiceError,
)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size cap on the request head and time limits on the
    head and the body. uvicorn builds one per connection."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: LimitSettings,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        # Bytes received of the head being read; None while no head is being read (a body).
        self._head_bytes: int | None = 0
        self._limit_timer: asyncio.TimerHandle | None = None
        # The id of the request being read, once a refusal or a line of uvicorn's needs one.
        self._request_id: str | None = None
        # uvicorn logs about the connection through ``self.logger``: the same logger, with the
        # request's id on each line. (The application's own runs keep the plain one: see
        # ``on_headers_complete``.)
        self._plain_logger = self.logger
        self.logger = _RequestLog(self.logger, self._current_request_id)  # type: ignore[assignment]

    def _current_request_id(self) -> str:
        """The id of the request being read: the caller's ``X-Request-Id`` among the header
        fields read so far when it is usable, else a new one; the same until the next request."""
        if self._request_id is None:
            sent = next((v for n, v in self.headers or () if n == REQUEST_ID.encode()), b"")
            caller = sent.decode("latin-1")
            self._request_id = caller if _usable_id(caller) else secrets.token_hex(8)
        return self._request_id

    def _arm(self, seconds: float, error: Callable[[LimitSettings], ServiceError]) -> None:
        self._disarm()
        self._limit_timer = self.loop.call_later(seconds, self._time_out, error)

    def _time_out(self, error: Callable[[LimitSettings], ServiceError]) -> None:
        self._limit_timer = None
        self._refuse(error(self._limits))

    def _disarm(self) -> None:
        if self._limit_timer is not None:
            self._limit_timer.cancel()
            self._limit_timer = None

    def _refuse(self, error: ServiceError) -> None:
        """Answer ``error`` if no other answer is under way on the connection, then close."""
        self._disarm()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._head_bytes is None:
            # Reading a body: the refusal answers its request, unless the application has.
            may_answer = not cycle.response_started
        else:
            # Reading a head: unless an earlier request on the connection is still answered.
            may_answer = cycle is None or cycle.response_complete
        if may_answer:
            body = orjson.dumps(error.to_problem())
            head = [STATUS_LINE[error.status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/problem+json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"%s: %s\r\n" % (REQUEST_ID.encode(), self._current_request_id().encode("ascii")),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
        if cycle is not None and not cycle.response_complete:
            # As the connection's loss would: the application's receive() ends with a
            # disconnect and what it sends from now on is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._limits.head_timeout_seconds, _head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: nothing more is read
        if self._head_bytes is not None:
            # The whole read counts, even the part that turns out to be body: checked only if
            # the head is still incomplete once the read is parsed.
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_bytes is not None and self._head_bytes > self._limits.max_head_bytes:
            self._refuse(_head_too_large(self._limits))

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls it when the parser refuses the bytes (after logging ``msg`` through
        # ``self.logger``, so with the id the answer carries): problem+json instead of its text.
        self._refuse(
            BadRequestError(
                "the request is not valid HTTP/1.1 (its request line, a header field, its "
                "Content-Length or a chunk is malformed); the connection is closed"
            )
        )

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._request_id = None
        super().on_message_begin()
        if self._limit_timer is None:  # a later request on a kept-alive connection
            self._arm(self._limits.head_timeout_seconds, _head_timeout)

    def on_headers_complete(self) -> None:
        if self.transport.is_closing():
            return
        fields = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if fields > self._limits.max_head_bytes:
            self._refuse(_head_too_large(self._limits))
            return
        self._head_bytes = None
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None:
            # The lines uvicorn logs about an application's run carry no id of ours: the
            # application's middleware names that request with its own id, in its own lines.
            self.cycle.logger = self._plain_logger
        if not self.pipeline:  # served now, not waiting behind an earlier request's answer
            self._arm(self._limits.body_timeout_seconds, _body_timeout)

    def on_body(self, body: bytes) -> None:
        if not self.transport.is_closing():
            super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if (
            self._head_bytes is None
            and self._limit_timer is None
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            # A pipelined request whose body is still to be read has just been started: its
            # reading was paused while it waited, so its body time counts from now.
            self._arm(self._limits.body_timeout_seconds, _body_timeout)

    def on_message_complete(self) -> None:
        if self.transport.is_closing():
            return
        self._disarm()
        self._head_bytes = 0  # the next request's head
        super().on_message_complete()


class _RequestLog(logging.LoggerAdapter[logging.Logger]):
    """``uvicorn.error`` for one connection: each line carries the ``request_id`` of the request
    being read (asked for only when a line is logged)."""

    def __init__(self, logger: logging.Logger, request_id: Callable[[], str]) -> None:
        super().__init__(logger)
        self._request_id = request_id

    @property
    def level(self) -> int:
        # uvicorn reads ``self.logger.level`` to skip its trace lines.
        return self.logger.level

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**kwargs.get("extra", {}), "request_id": self._request_id()}
        return msg, kwargs


def _head_too_large(limits: LimitSettings) -> ServiceError:
    return RequestHeadTooLargeError(
        f"request head is over the limit of {limits.max_head_bytes} bytes (limits.max_head_bytes)",
        max_head_bytes=limits.max_head_bytes,
    )


def _head_timeout(limits: LimitSettings) -> ServiceError:
    return RequestTimeoutError(
        f"request head not received within {limits.head_timeout_seconds:g} s "
        "(limits.head_timeout_seconds)",
        timeout_seconds=limits.head_timeout_seconds,
    )


def _body_timeout(limits: LimitSettings) -> ServiceError:
    return RequestTimeoutError(
        f"request body not received within {limits.body_timeout_seconds:g} s "
        "(limits.body_timeout_seconds)",
        timeout_seconds=limits.body_timeout_seconds,
    )
