"""Serve a contributor webhook (docs/contract.md, "Webhook protocol") from one Python function, as a plain ASGI app.

::

    from context_assembly_client.contributor import make_contributor_app

    async def contribute(packet):
        notes = await load_notes(packet.scope.account_id)   # authorise against the scope yourself
        return {"revision": notes.version, "blocks": [{"id": n.key, "text": n.text} for n in notes]}

    app = make_contributor_app(contribute, secret="whsec_...")   # uvicorn module:app

What the app does for each ``POST`` (any path):

1. Reads the body, refusing more than ``max_body_bytes`` (413).
2. With a secret, verifies the Standard Webhooks signature over the exact body bytes: the
   ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` headers must be present, the
   timestamp within ``tolerance_seconds`` of now (replay window), and one of the space-separated
   ``v1,<base64>`` signatures must equal HMAC-SHA256(key, ``"{id}.{timestamp}.{body}"``),
   compared in constant time. Anything else is 401. (Spec: standard-webhooks/standard-webhooks,
   ``spec/standard-webhooks.md``; the secret is ``whsec_`` + the base64 key.)
3. Parses the packet (400 on bad JSON or an unknown ``type``).
4. Runs the user function under the deadline of ``X-Contributor-Timeout-Ms`` (the service's
   remaining budget, relative, so no clock sync is needed). An ``async`` function is cancelled
   at the deadline; a plain function runs in a worker thread that is abandoned at the deadline
   (Python cannot stop a thread: it finishes in the background and its result is dropped).
   Either way the answer is 504, which the service records as a failed contributor.
5. Answers ``200 {revision, blocks}`` for ``contribute`` and ``200 {revision}`` for
   ``revision`` (from ``revision(packet)`` when given, else from ``contribute`` called with a
   stand-in packet of ``type="revision"``, the check's source and scope, and no input), with
   ``content-type: application/json``. A function that raises or returns a malformed answer
   gives 500 (logged, nothing of it sent back).

The packet carries no credentials and grants no authority: the function must authorise what it
reads against ``packet.scope`` itself.

The packets and answers are the OpenAPI document's (its ``webhooks``; the models of
:mod:`context_assembly_client.types`, generated from it): a field the service adds to a packet
reaches the function with the next ``make client-types``, and a packet from a newer service keeps
the members this version does not know.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, Literal, TypeAlias

import anyio
import anyio.to_thread
import pydantic_core
from pydantic import BaseModel, Field, ValidationError

from context_assembly_client import types
from context_assembly_client.types import Block, Revision

__all__ = [
    "TIMEOUT_HEADER",
    "ContributePacket",
    "ContributionAnswer",
    "ContributorApp",
    "RevisionPacket",
    "make_contributor_app",
]

log = logging.getLogger("context_assembly_client.contributor")

TIMEOUT_HEADER = "x-contributor-timeout-ms"
"""The service's remaining budget for this call, in integer milliseconds."""

SECRET_PREFIX = "whsec_"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

ASGIScope: TypeAlias = MutableMapping[str, Any]
ASGIMessage: TypeAlias = MutableMapping[str, Any]
ASGIReceive: TypeAlias = Callable[[], Awaitable[ASGIMessage]]
ASGISend: TypeAlias = Callable[[ASGIMessage], Awaitable[None]]


class ContributePacket(types.ContributePacket):
    """A ``contribute`` packet (the document's ``ContributePacket``): what the service asks a
    contributor for.

    ``type`` is ``"revision"`` only when a revision check is answered by ``contribute`` (no
    ``revision`` function was given): then ``source`` and ``scope`` are the check's, ``input`` is
    empty, ``data_budget_tokens`` is 0, ``deadline_unix_ms`` is ``None``, and only the returned
    revision is used. Those two fields are widened for that stand-in; the others are the
    document's.
    """

    # Wider than the document's, for the stand-in alone: what the service sends still reads.
    type: Literal["contribute", "revision"]  # type: ignore[assignment]
    deadline_unix_ms: int | None  # type: ignore[assignment]


RevisionPacket = types.RevisionPacket
"""A ``revision`` packet (the document's): the dispatch-time check of a source's current
revision."""


class ContributionAnswer(types.ContributorAnswer):
    """What ``contribute`` returns (or an equivalent dict): the document's ``ContributorAnswer``,
    the source's revision and blocks, with ``blocks`` optional (none is ``[]``)."""

    blocks: list[Block] = Field(default_factory=list)


ContributeResult: TypeAlias = ContributionAnswer | Mapping[str, Any]
ContributeFn: TypeAlias = Callable[
    [ContributePacket], ContributeResult | Awaitable[ContributeResult]
]
RevisionResult: TypeAlias = Revision | Mapping[str, Any] | BaseModel
RevisionFn: TypeAlias = Callable[[RevisionPacket], RevisionResult | Awaitable[RevisionResult]]


class _Reply(Exception):
    """An early answer (error status) raised out of the request handling."""

    def __init__(self, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _decode_secret(secret: str) -> bytes:
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw, validate=True)
    except binascii.Error as err:
        raise ValueError("a contributor secret is 'whsec_' followed by base64") from err
    if not key:
        raise ValueError("a contributor secret must not be empty")
    return key


def _is_async(fn: Callable[..., Any]) -> bool:
    # Also an object whose ``__call__`` is a coroutine function.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def _invoke(fn: Callable[[Any], Any], packet: BaseModel) -> Any:
    if _is_async(fn):
        result = await fn(packet)
    else:
        # abandon_on_cancel: at the deadline the await ends; the thread itself cannot be stopped.
        result = await anyio.to_thread.run_sync(fn, packet, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        result = await result
    return result


def _as_data(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return value


def _valid_revision(value: Any) -> Revision:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"a revision is a string or a number, not {type(value).__name__}")
    return value


class ContributorApp:
    """The ASGI app built by :func:`make_contributor_app` (see the module docstring)."""

    def __init__(
        self,
        contribute: ContributeFn,
        *,
        revision: RevisionFn | None = None,
        secret: str | Sequence[str] | None = None,
        tolerance_seconds: float = 300,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        secrets = [secret] if isinstance(secret, str) else list(secret or ())
        self._keys = [_decode_secret(s) for s in secrets]
        self._contribute = contribute
        self._revision = revision
        self._tolerance = tolerance_seconds
        self._max_body = max_body_bytes
        self._clock = clock

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        """Serve one ASGI connection (``http``; ``lifespan`` is acknowledged)."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            status, payload = await self._handle(scope, receive)
        except _Reply as reply:
            await _send_json(send, reply.status, {"error": reply.message}, reply.headers)
            return
        await _send_json(send, status, payload)

    @staticmethod
    async def _lifespan(receive: ASGIReceive, send: ASGISend) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(self, scope: ASGIScope, receive: ASGIReceive) -> tuple[int, Any]:
        started = anyio.current_time()
        if scope["method"] != "POST":
            raise _Reply(405, "use POST", [(b"allow", b"POST")])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await self._read_body(receive)
        if self._keys:
            self._verify(headers, body)
        timeout = _timeout_seconds(headers.get(TIMEOUT_HEADER))
        try:
            packet_data = pydantic_core.from_json(body)
        except ValueError as err:
            raise _Reply(400, "body is not valid JSON") from err
        kind = packet_data.get("type") if isinstance(packet_data, dict) else None
        try:
            packet: ContributePacket | RevisionPacket
            if kind == "contribute":
                packet = ContributePacket.model_validate(packet_data)
            elif kind == "revision":
                packet = RevisionPacket.model_validate(packet_data)
            else:
                raise _Reply(400, "packet type must be 'contribute' or 'revision'")
        except ValidationError as err:
            raise _Reply(400, f"malformed {kind} packet: {err.error_count()} error(s)") from err

        deadline = None if timeout is None else started + timeout
        with anyio.CancelScope(deadline=deadline if deadline is not None else float("inf")) as cs:
            answer = await self._answer(packet)
        if cs.cancelled_caught:
            raise _Reply(504, "the contributor did not finish before the deadline")
        return 200, answer

    async def _answer(self, packet: ContributePacket | RevisionPacket) -> Any:
        try:
            if isinstance(packet, RevisionPacket):
                if self._revision is not None:
                    value = _as_data(await _invoke(self._revision, packet))
                    if isinstance(value, Mapping):
                        value = value["revision"]
                    return {"revision": _valid_revision(value)}
                stand_in = ContributePacket(
                    type="revision",
                    preparation_id="",
                    source=packet.source,
                    model="",
                    input=[],
                    data_budget_tokens=0,
                    source_token_limit=None,
                    scope=packet.scope,
                    deadline_unix_ms=None,
                )
                answer = await self._contribution(stand_in)
                return {"revision": answer["revision"]}
            return await self._contribution(packet)
        except Exception:  # cancellation is a BaseException and passes through
            log.exception("contributor function failed")
            raise _Reply(500, "the contributor function failed") from None

    async def _contribution(self, packet: ContributePacket) -> dict[str, Any]:
        result = _as_data(await _invoke(self._contribute, packet))
        answer = ContributionAnswer.model_validate(result)
        data: dict[str, Any] = answer.model_dump(mode="json", exclude_none=True)
        return data

    async def _read_body(self, receive: ASGIReceive) -> bytes:
        chunks = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Reply(400, "client disconnected")
            chunks += message.get("body", b"")
            if len(chunks) > self._max_body:
                raise _Reply(413, f"body over {self._max_body} bytes")
            if not message.get("more_body", False):
                return bytes(chunks)

    def _verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Check the Standard Webhooks headers of ``body``; raise a 401 reply if they fail."""
        msg_id = headers.get("webhook-id")
        timestamp = headers.get("webhook-timestamp")
        signatures = headers.get("webhook-signature")
        if not msg_id or not timestamp or not signatures:
            raise _Reply(401, "missing webhook signature headers")
        try:
            sent_at = int(timestamp)
        except ValueError:
            raise _Reply(401, "invalid webhook-timestamp") from None
        if abs(self._clock() - sent_at) > self._tolerance:
            raise _Reply(401, "webhook-timestamp outside the replay window")
        signed = f"{msg_id}.{sent_at}.".encode() + body
        expected = [
            base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()) for key in self._keys
        ]
        for item in signatures.split():
            version, _, value = item.partition(",")
            if version != "v1":
                continue
            given = value.encode("latin-1")
            matched = False
            for candidate in expected:  # every key is compared: no early exit to time
                matched |= hmac.compare_digest(given, candidate)
            if matched:
                return
        raise _Reply(401, "no valid webhook signature")


def _timeout_seconds(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        millis = int(raw.strip())
    except ValueError:
        raise _Reply(400, f"{TIMEOUT_HEADER} must be integer milliseconds") from None
    return max(millis, 0) / 1000.0


async def _send_json(
    send: ASGISend, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = pydantic_core.to_json(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def make_contributor_app(
    contribute: ContributeFn,
    *,
    revision: RevisionFn | None = None,
    secret: str | Sequence[str] | None = None,
    tolerance_seconds: float = 300,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> ContributorApp:
    """An ASGI app serving ``contribute`` (and ``revision``) as a contributor webhook.

    Args:
        contribute: ``(ContributePacket) -> {revision, blocks}`` (a dict or
            :class:`ContributionAnswer`), plain or ``async``.
        revision: ``(RevisionPacket) -> revision`` for the dispatch-time check; when omitted,
            ``contribute`` is called and its revision answered.
        secret: the Standard Webhooks secret (``whsec_<base64>``) shared with the service, or
            several during a rotation; ``None`` accepts unsigned calls (loopback sidecars only).
        tolerance_seconds: the replay window: how far ``webhook-timestamp`` may be from now.
        max_body_bytes: the largest packet accepted.

    Raises:
        ValueError: when a secret is not ``whsec_`` + base64.
    """
    return ContributorApp(
        contribute,
        revision=revision,
        secret=secret,
        tolerance_seconds=tolerance_seconds,
        max_body_bytes=max_body_bytes,
    )
