"""Contributor webhook calls: fan-out under one deadline, size caps, validation, failure policy.

SPEC §3.4. Every call has **one total deadline** around the whole exchange: connect, request,
response headers and the streamed body. httpx's per-phase timeouts are set to the remaining time
as a second line only; a server that drips one byte at a time defeats a per-read timeout, never
this deadline. At the deadline the call is cut, its connection closed, and its outcome settled
as ``timeout``; an outcome once settled is never replaced, so an answer that arrives later has
nothing left to change.

Two ways to run a call, with the same outcomes (``tests/contributors/test_contributors_burst.py``
runs every fault both ways): a contributor with an idle keep-alive connection on the fast path
gets its request written at once and its answer handled by callbacks, under one timer for the
whole fan-out (``_Burst``); any other call is a task (``_contribute_one``) under its own
``asyncio.timeout``, on a new connection or through httpx.

Outcome statuses (the manifest's source statuses): ``ok``; ``timeout`` (deadline or a transport
timeout); ``error`` (connect failure, reset, non-2xx, redirect, which is never followed);
``invalid`` (not JSON, not ``{revision, blocks}``, a non-JSON content type or a compressed body);
``too_large`` (``Content-Length`` or the streamed body over the cap); ``skipped_deadline`` (no
time left to send). A ``cause`` says what happened without quoting the body.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import httpx
import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from context_assembly.contributors.client import PIN_EXTENSION, fast_transport
from context_assembly.contributors.signing import (
    CallType,
    sign_headers,
    validate_secret,
    webhook_id,
)
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.contributors.wire import Started, WireClient, WireError
from context_assembly.core.request import (
    Block,
    Frozen,
    Message,
    Revision,
    Scope,
    finite_revision,
)
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError

TIMEOUT_HEADER = "X-Contributor-Timeout-Ms"
"""Remaining budget in integer milliseconds at send time (like Envoy's
``x-envoy-expected-rq-timeout-ms`` and Connect's ``Connect-Timeout-Ms``): relative, so
contributors need no synchronised clock."""

# ``rejected``: an inline URL refused or not resolved under ``omit`` (preparations._call_inline).
Status = Literal["ok", "timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"]
FailurePolicy = Literal["fail", "omit"]
TargetKind = Literal["registered", "inline"]

# A call with less time than this left before the deadline is not sent: ``skipped_deadline``.
MIN_SEND_SECONDS = 0.001
SKIPPED_CAUSE = "no time left before the deadline"

_DEADLINE_STATUSES = frozenset({"timeout", "skipped_deadline"})
_UNION_TAGS = frozenset({"str", "int", "float"})  # pydantic's location tags for Revision's members


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ContributorTarget:
    """One contributor to call: a registered endpoint (trusted) or an SSRF-checked inline URL."""

    source: str
    url: str
    secret: str | None = None
    failure_policy: FailurePolicy = "fail"
    kind: TargetKind = "registered"
    checked: CheckedTarget | None = None

    def __post_init__(self) -> None:
        if self.kind == "inline" and self.checked is None:
            raise ValueError(f"inline contributor {self.source!r} must be SSRF-checked first")
        if self.secret is not None:
            validate_secret(self.secret)


@dataclass(frozen=True, slots=True)
class ContributorOutcome:
    """What one contributor call produced; a settled value that nothing changes afterwards."""

    source: str
    status: Status
    duration_ms: float
    revision: Revision | None = None
    blocks: tuple[Block, ...] = ()
    cause: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the contributor answered in time with a valid ``{revision, blocks}``."""
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class PacketFields:
    """The parts of a ``contribute`` packet shared by every source of one preparation.

    ``source_token_limits`` maps a source to its ``source_token_limit`` (``null`` when absent);
    ``attempt`` is 1 for prepare and 2 for refresh (it keys the stable ``webhook-id``).
    """

    preparation_id: str
    model: str
    input: Sequence[Message]
    data_budget_tokens: int
    scope: Scope
    deadline_unix_ms: int
    source_token_limits: Mapping[str, int] = field(default_factory=dict)
    attempt: int = 1


class ContributorAnswer(Frozen):
    """A contributor's ``200`` body: exactly ``{revision, blocks}``, blocks as the core models
    them (the request-wide block rules of SPEC §5.1 run later, over every source, in the core).
    """

    revision: Revision
    blocks: list[Block]

    _revision_finite = field_validator("revision")(finite_revision)


class RevisionAnswer(BaseModel):
    """The answer to a ``revision`` packet: ``{revision}`` (other members are ignored, so a
    contributor may answer both packet types with the same body)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    revision: Revision

    _revision_finite = field_validator("revision")(finite_revision)


# --------------------------------------------------------------------------- one exchange


@dataclass(frozen=True, slots=True)
class _Exchange:
    status: Status
    duration_ms: float
    body: bytes | None = None
    cause: str | None = None


class _Failure(Exception):
    """A settled non-ok result raised out of the response reader."""

    def __init__(self, status: Status, cause: str) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _classify(exc: BaseException) -> tuple[Status, str]:
    """Status and cause of a transport exception, judged by its root cause.

    httpx_aiohttp maps every ``aiohttp.ClientConnectionError`` (a reset, a server disconnect) to
    ``httpx.ConnectTimeout``, so the aiohttp/OS exceptions in the chain are consulted first.
    """
    chain = _chain(exc)

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    if has(ConnectionRefusedError):
        return "error", "connect refused"
    if has(aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError):
        return "error", "TLS certificate verification failed"
    if has(aiohttp.ClientSSLError, ssl.SSLError):
        return "error", "TLS error"
    if has(aiohttp.ClientConnectorDNSError, socket.gaierror):
        return "error", "name resolution failed"
    if has(aiohttp.ServerTimeoutError):
        return "timeout", "transport timeout"
    if has(ConnectionResetError):
        return "error", "connection reset"
    if has(aiohttp.ServerDisconnectedError):
        return "error", "server closed the connection"
    if has(aiohttp.ClientPayloadError, httpx.ReadError):
        return "error", "connection closed before the body was complete"
    if has(httpx.RemoteProtocolError, aiohttp.ClientResponseError):
        return "error", "HTTP protocol error"
    if has(aiohttp.ClientConnectorError, httpx.ConnectError):
        return "error", "connect failed"
    if has(httpx.TimeoutException):
        return "timeout", "transport timeout"
    if has(httpx.UnsupportedProtocol):
        return "error", "request refused by the transport"
    return "error", f"transport error ({type(exc).__name__})"


def _check_head(response: httpx.Response, max_bytes: int) -> None:
    _check_status_headers(response.status_code, response.headers, max_bytes)


def _check_status_headers(code: int, headers: Mapping[str, str], max_bytes: int) -> None:
    if 300 <= code < 400:
        raise _Failure("error", f"HTTP {code} redirect (not followed)")
    if code == 504:
        # Gateway Timeout: the contributor (our helper answers so at X-Contributor-Timeout-Ms)
        # or a gateway before it ran out of the time it was given. A deadline failure, like our
        # own timer's, whichever of the two is seen first.
        raise _Failure("timeout", "HTTP 504: the contributor reported its deadline")
    if not 200 <= code < 300:
        raise _Failure("error", f"HTTP {code}")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _Failure("invalid", "compressed body (content-encoding) not accepted")
    content_type = headers.get("content-type")
    if content_type is not None:
        mime = content_type.split(";", 1)[0].strip().lower()
        if mime != "application/json" and not mime.endswith("+json"):
            raise _Failure("invalid", "content-type is not JSON")
    length = headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise _Failure("too_large", f"Content-Length {int(length)} over the {max_bytes}-byte cap")


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    # _check_head admitted identity encoding only, so these bytes are the wire bytes (aiter_bytes
    # also serves a response whose body was read ahead, as mocks do).
    buffer = bytearray()
    async for chunk in response.aiter_bytes():
        buffer += chunk
        if len(buffer) > max_bytes:
            raise _Failure("too_large", f"body over the {max_bytes}-byte cap")
    return bytes(buffer)


def _call_headers(
    target: ContributorTarget, msg_id: str, body: bytes, remaining: float
) -> dict[str, str]:
    return {
        "content-type": "application/json",
        TIMEOUT_HEADER: str(max(1, int(remaining * 1000))),
        **sign_headers(target.secret, msg_id, body),
    }


async def _exchange(
    client: httpx.AsyncClient,
    target: ContributorTarget,
    body: bytes,
    msg_id: str,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float],
) -> _Exchange:
    """POST ``body`` and read a capped 2xx JSON body, all within the one deadline."""
    started = clock()
    remaining = deadline_monotonic - started
    if remaining < MIN_SEND_SECONDS:
        return _Exchange("skipped_deadline", 0.0, cause=SKIPPED_CAUSE)

    def settled(status: Status, cause: str | None = None, data: bytes | None = None) -> _Exchange:
        return _Exchange(status, (clock() - started) * 1000.0, data, cause)

    headers = _call_headers(target, msg_id, body, remaining)
    extensions: dict[str, Any] = {}
    url = target.url
    if target.checked is not None:
        extensions[PIN_EXTENSION] = target.checked
        url = target.checked.url
    phase = "waiting for the response headers"
    deadline = asyncio.timeout(remaining)
    fast = fast_transport(client)
    try:
        async with deadline:
            if fast is not None:

                def check_head(status: int, head: Mapping[str, str]) -> None:
                    nonlocal phase
                    phase = "reading the body"
                    _check_status_headers(status, head, max_response_bytes)

                data = await fast.wire.post(
                    url,
                    body,
                    headers,
                    target.checked,
                    check_head=check_head,
                    max_bytes=max_response_bytes,
                )
                return settled("ok", data=data)
            request = client.build_request(
                "POST",
                url,
                content=body,
                headers=headers,
                # Per-phase timeouts: a second line only, never longer than the deadline.
                timeout=httpx.Timeout(remaining),
                extensions=extensions,
            )
            response = await client.send(request, stream=True)
            try:
                phase = "reading the body"
                _check_head(response, max_response_bytes)
                data = await _read_capped(response, max_response_bytes)
            finally:
                await response.aclose()
    except _Failure as failure:
        return settled(failure.status, failure.cause)
    except WireError as failure:
        return settled(failure.status, failure.cause)
    except TimeoutError as exc:
        if deadline.expired():
            return settled("timeout", f"deadline reached while {phase}")
        return settled(*_classify(exc))
    except (httpx.HTTPError, aiohttp.ClientError, OSError) as exc:
        return settled(*_classify(exc))
    return settled("ok", data=data)


def _schema_cause(err: ValidationError) -> str:
    """``schema: blocks.3.priority: Input should be a valid integer``.

    No body text: inputs are excluded, and the one location part that comes from the body (the
    name of an unexpected member) is replaced by ``<unknown field>``. Union member tags
    (``revision.str``) are dropped so that one bad revision is one entry.
    """
    parts: list[str] = []
    seen: set[str] = set()
    for item in err.errors(include_input=False, include_url=False):
        loc_parts = [p for p in item["loc"] if p not in _UNION_TAGS]
        if item["type"] == "extra_forbidden" and loc_parts:
            loc_parts[-1] = "<unknown field>"
        loc = ".".join(str(p) for p in loc_parts) or "(root)"
        if loc in seen:
            continue
        seen.add(loc)
        parts.append(f"{loc}: {item['msg']}")
    extra = len(seen) - 3
    text = "; ".join(parts[:3]) + (f" (and {extra} more)" if extra > 0 else "")
    return f"schema: {text}"


def _parse_json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise _Failure("invalid", f"invalid JSON at char {err.pos}") from err


def _parse_answer(data: bytes) -> ContributorAnswer:
    """The answer parsed and validated in one pass of pydantic-core, the common valid case.

    Any problem is judged again on the reference path (orjson, then the model), so that a
    failure reads as before: orjson's position for a body that is not strict JSON (NaN, for
    one, which pydantic-core's parser would let through to the schema), else the schema errors.
    """
    try:
        return ContributorAnswer.model_validate_json(data)
    except ValidationError:
        return ContributorAnswer.model_validate(_parse_json(data))


# --------------------------------------------------------------------------- public calls


async def _contribute_one(
    client: httpx.AsyncClient,
    target: ContributorTarget,
    common: Mapping[str, Any],
    packet_fields: PacketFields,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float],
    started: float | None = None,
) -> ContributorOutcome:
    """One call on the per-call path; ``started`` is when it began, if earlier (a retry after
    the keep-alive race counts from the first attempt)."""
    started = clock() if started is None else started
    try:
        body, msg_id = _packet(target, common, packet_fields)
        result = await _exchange(
            client, target, body, msg_id, deadline_monotonic, max_response_bytes, clock
        )
        if result.status != "ok" or result.body is None:
            return ContributorOutcome(
                target.source, result.status, result.duration_ms, cause=result.cause
            )
        return _answer_outcome(target.source, result.body, result.duration_ms)
    except Exception as exc:  # one contributor's surprise must never sink the whole fan-out
        return _unexpected(target.source, exc, (clock() - started) * 1000.0)


def _packet(
    target: ContributorTarget, common: Mapping[str, Any], packet_fields: PacketFields
) -> tuple[bytes, str]:
    """The ``contribute`` packet's bytes for ``target`` and its ``webhook-id``."""
    packet = {
        "type": "contribute",
        "preparation_id": packet_fields.preparation_id,
        "source": target.source,
        "model": packet_fields.model,
        "input": common["input"],
        "data_budget_tokens": packet_fields.data_budget_tokens,
        "source_token_limit": packet_fields.source_token_limits.get(target.source),
        "scope": common["scope"],
        "deadline_unix_ms": packet_fields.deadline_unix_ms,
    }
    msg_id = webhook_id(
        packet_fields.preparation_id, target.source, "contribute", packet_fields.attempt
    )
    return orjson.dumps(packet), msg_id


def _answer_outcome(source: str, data: bytes, duration_ms: float) -> ContributorOutcome:
    """The outcome of a 2xx JSON answer: ``ok`` with its revision and blocks, or ``invalid``."""
    try:
        answer = _parse_answer(data)
    except ValidationError as err:
        return ContributorOutcome(source, "invalid", duration_ms, cause=_schema_cause(err))
    except _Failure as failure:
        return ContributorOutcome(source, failure.status, duration_ms, cause=failure.cause)
    return ContributorOutcome(source, "ok", duration_ms, answer.revision, tuple(answer.blocks))


def _unexpected(source: str, exc: Exception, duration_ms: float) -> ContributorOutcome:
    return ContributorOutcome(
        source, "error", duration_ms, cause=f"unexpected {type(exc).__name__}"
    )


async def contribute_all(
    client: httpx.AsyncClient,
    targets: Sequence[ContributorTarget],
    packet_fields: PacketFields,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float] = time.monotonic,
    check: Callable[[ContributorOutcome], ContributorOutcome] | None = None,
    while_waiting: Callable[[], object] | None = None,
    fail_fast: bool = False,
) -> list[ContributorOutcome]:
    """Call every target concurrently and return one outcome per target, in target order.

    With ``fail_fast``, the first ``fail``-policy call that fails other than by the deadline
    ends the fan-out at once: the calls still under way are abandoned (their late answers change
    nothing) and :func:`raise_for_failures` raises for the outcomes settled so far, instead of
    the prepare waiting out the others only to fail with that cause.

    ``check`` (the caller's block rules) runs on each outcome as soon as its answer is parsed, so
    the answers that arrive early are checked while the others are awaited. ``while_waiting``
    runs once the calls have had their turn to send (one pass of the event loop), before their
    answers are awaited: work of the caller's that no answer changes.

    Each call sends a ``contribute`` packet (SPEC §3.4) with ``X-Contributor-Timeout-Ms`` (the
    remaining integer ms at send time, at least 1), ``content-type: application/json``, a stable
    ``webhook-id`` and, when the target has a secret, Standard Webhooks signature headers. All
    calls share ``deadline_monotonic`` (a ``clock()`` value): a call with no time left is
    ``skipped_deadline`` and never sent; a call still running at the deadline is cancelled and
    ``timeout``. Never raises for a contributor failure; see :func:`raise_for_failures`. The
    client must come from :func:`~.client.create_client` for inline targets to be pinned.
    """
    if not targets:
        if while_waiting is not None:
            while_waiting()  # no call to wait for: the caller's work is done here all the same
        return []
    common = {
        "input": [m.model_dump(mode="json", exclude_none=True) for m in packet_fields.input],
        "scope": packet_fields.scope.model_dump(mode="json"),
    }
    fast = fast_transport(client)
    if fast is not None:
        burst = _Burst(
            client, fast.wire, targets, common, packet_fields, deadline_monotonic,
            max_response_bytes, clock, check, fail_fast,
        )  # fmt: skip
        return await burst.run(while_waiting)
    calls = [
        _contribute_one(
            client, t, common, packet_fields, deadline_monotonic, max_response_bytes, clock
        )
        for t in targets
    ]
    if check is not None:

        async def checked(call: Awaitable[ContributorOutcome]) -> ContributorOutcome:
            return check(await call)

        calls = [checked(call) for call in calls]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        if while_waiting is not None:
            await asyncio.sleep(0)  # the calls take their first steps: connected ones send
            while_waiting()
        index: dict[asyncio.Future[ContributorOutcome], int] = {t: i for i, t in enumerate(tasks)}
        pending: set[asyncio.Future[ContributorOutcome]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                outcome = task.result()  # a check that raised fails the fan-out with it
                if fail_fast and _ends_fan_out(outcome, targets[index[task]]):
                    settled = [t.result() for t in tasks if t.done() and not t.cancelled()]
                    raise_for_failures(settled, targets)
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()


def _ends_fan_out(outcome: ContributorOutcome, target: ContributorTarget) -> bool:
    """Whether ``outcome`` fails the whole prepare whatever the others answer: a ``fail``-policy
    call that failed other than by the deadline (which all calls reach together)."""
    return (
        not outcome.ok
        and outcome.status not in _DEADLINE_STATUSES
        and target.failure_policy == "fail"
    )


def raise_for_failures(
    outcomes: Sequence[ContributorOutcome], targets: Sequence[ContributorTarget]
) -> None:
    """Raise for failed contributors whose policy is ``fail``; ``omit`` failures pass through.

    A non-deadline failure wins (``ContributorFailedError``, 502, naming the first such source
    with its status and cause); if every failure is a deadline one (``timeout`` or
    ``skipped_deadline``) it is ``AssemblyTimeoutError`` (504) naming the sources. Both carry
    ``contributors``: every failed ``fail``-policy source with its status and cause; and
    ``calls``, every outcome given (the settled calls), for the metrics.
    """
    policies = {t.source: t.failure_policy for t in targets}
    failed = [o for o in outcomes if not o.ok and policies.get(o.source, "fail") == "fail"]
    if not failed:
        return
    listing = [{"source": o.source, "status": o.status, "cause": o.cause} for o in failed]
    hard = [o for o in failed if o.status not in _DEADLINE_STATUSES]
    error: ContributorFailedError | AssemblyTimeoutError
    if hard:
        first = hard[0]
        error = ContributorFailedError(
            f"contributor {first.source!r} failed: {first.status} ({first.cause})",
            source=first.source,
            contributor_status=first.status,
            cause=first.cause,
            contributors=listing,
        )
    else:
        names = ", ".join(repr(o.source) for o in failed)
        error = AssemblyTimeoutError(
            f"contributors did not finish before the deadline: {names}",
            sources=[o.source for o in failed],
            contributors=listing,
        )
    error.calls = tuple((o.source, o.status, o.duration_ms) for o in outcomes)
    raise error


async def query_revision(
    client: httpx.AsyncClient,
    target: ContributorTarget,
    scope: Scope,
    deadline_monotonic: float,
    *,
    preparation_id: str = "",
    check_id: str | int | None = None,
    max_response_bytes: int = 65_536,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Status, Revision | None]:
    """Ask a contributor for its current revision (``{type: "revision", source, scope}``).

    Used by validate. Same deadline, header, signing and failure rules as a contribution; the
    answer must be a JSON object with a finite-number or string ``revision``. Returns the status
    and, when ``ok``, the revision. ``check_id`` distinguishes repeated checks of one
    preparation so that each gets its own ``webhook-id`` (default: a random token, because a
    contributor that deduplicates on the id must not drop a later check).
    """
    call: CallType = "revision"
    if check_id is None:
        check_id = secrets.token_hex(8)
    body = orjson.dumps(
        {"type": "revision", "source": target.source, "scope": scope.model_dump(mode="json")}
    )
    msg_id = webhook_id(preparation_id, target.source, call, check_id)
    try:
        result = await _exchange(
            client, target, body, msg_id, deadline_monotonic, max_response_bytes, clock
        )
        if result.status != "ok" or result.body is None:
            return result.status, None
        answer = RevisionAnswer.model_validate(_parse_json(result.body))
    except (_Failure, ValidationError):
        return "invalid", None
    except Exception:  # as in contribute_all: a surprise is an error, not a crash of validate
        return "error", None
    return "ok", answer.revision


class _Burst:
    """One fan-out on the fast wire path, with no task or timer per call.

    Every target with an idle keep-alive connection has its request written at once
    (``WireClient.begin``) and its answer handled by callbacks on the connection's futures: the
    head is checked as it arrives, the answer parsed and ``check``-ed as it completes. One timer
    at the deadline settles whatever is still under way as ``timeout`` and closes its
    connection. A target with no idle connection (the first call, or after the keep-alive
    expiry), and a call that lost the keep-alive race, runs ``_contribute_one`` as a task on a
    new connection under the same deadline. Outcomes, statuses and causes are those of
    ``_contribute_one`` (the loopback tests run every fault both ways). Why: per call, a task,
    a timeout and their scheduling are a good part of the call's CPU; at 16 concurrent
    fan-outs of eight on loopback the fan-out's CPU went from 0.84–1.00 ms to 0.72–0.79 ms, at
    one from 1.31–1.63 ms to 1.15–1.30 ms (docs/performance.md).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        wire: WireClient,
        targets: Sequence[ContributorTarget],
        common: Mapping[str, Any],
        packet_fields: PacketFields,
        deadline: float,
        max_bytes: int,
        clock: Callable[[], float],
        check: Callable[[ContributorOutcome], ContributorOutcome] | None,
        fail_fast: bool = False,
    ) -> None:
        self.client, self.wire, self.targets, self.common = client, wire, targets, common
        self.fields, self.deadline, self.max_bytes = packet_fields, deadline, max_bytes
        self.clock, self.check, self.fail_fast = clock, check, fail_fast
        self.ended_early = False
        self.loop = asyncio.get_running_loop()
        self.outcomes: list[ContributorOutcome | None] = [None] * len(targets)
        self.waiting = len(targets)
        self.all_settled: asyncio.Future[None] = self.loop.create_future()
        self.live: dict[int, tuple[Started, float]] = {}  # index -> (exchange, start)
        self.tasks: set[asyncio.Task[ContributorOutcome]] = set()

    async def run(self, while_waiting: Callable[[], object] | None) -> list[ContributorOutcome]:
        timer = self.loop.call_later(max(self.deadline - self.clock(), 0.0), self._expire)
        try:
            for index, target in enumerate(self.targets):
                if self.ended_early:
                    break  # a fail-policy call failed already: the rest is not sent
                await self._start(index, target)
            if while_waiting is not None:
                if self.tasks:
                    await asyncio.sleep(0)  # the calls on new connections take their first step
                while_waiting()
            await self.all_settled
        except BaseException:
            self._abandon()
            raise
        finally:
            timer.cancel()
        settled = [outcome for outcome in self.outcomes if outcome is not None]
        if self.ended_early:
            self._abandon()
            raise_for_failures(settled, self.targets)
        return settled

    async def _start(self, index: int, target: ContributorTarget) -> None:
        started = self.clock()
        remaining = self.deadline - started
        if remaining < MIN_SEND_SECONDS:
            skipped = ContributorOutcome(
                target.source, "skipped_deadline", 0.0, cause=SKIPPED_CAUSE
            )
            self._settle(index, skipped)
            return
        try:
            body, msg_id = _packet(target, self.common, self.fields)
            headers = _call_headers(target, msg_id, body, remaining)
            url = target.url if target.checked is None else target.checked.url
            exchange = await self.wire.begin(
                url, body, headers, target.checked, max_bytes=self.max_bytes
            )
        except WireError as failure:
            duration = (self.clock() - started) * 1000.0
            self._settle(index, ContributorOutcome(target.source, failure.status, duration,
                                                   cause=failure.cause))  # fmt: skip
            return
        except Exception as exc:  # as in _contribute_one: one surprise never sinks the fan-out
            self._settle(index, _unexpected(target.source, exc, (self.clock() - started) * 1000))
            return
        if exchange is None:
            self._spawn(index, target)
            return
        self.live[index] = (exchange, started)
        exchange.head.add_done_callback(lambda _: self._on_head(index))
        exchange.done.add_done_callback(lambda _: self._on_done(index))

    def _spawn(self, index: int, target: ContributorTarget, started: float | None = None) -> None:
        """The per-call path for ``target``, on a new connection, under the same deadline
        (``started``: the first attempt's start, for a retry)."""
        task = self.loop.create_task(
            _contribute_one(self.client, target, self.common, self.fields, self.deadline,
                            self.max_bytes, self.clock, started)
        )  # fmt: skip
        self.tasks.add(task)

        def done(task: asyncio.Task[ContributorOutcome]) -> None:
            self.tasks.discard(task)
            if not task.cancelled():
                self._settle(index, task.result())  # _contribute_one returns, never raises

        task.add_done_callback(done)

    def _on_head(self, index: int) -> None:
        live = self.live.get(index)
        if live is None or live[0].head.exception() is not None:
            return  # settled already, or the failure is the done callback's to report
        exchange = live[0]
        try:
            _check_status_headers(exchange.status, exchange.headers, self.max_bytes)
        except _Failure as failure:
            self._end(index, failure.status, failure.cause)

    def _on_done(self, index: int) -> None:
        live = self.live.get(index)
        if live is None:
            return
        exchange, started = live
        err = exchange.done.exception()
        if err is not None:
            assert isinstance(err, WireError)
            if exchange.raced(err):
                del self.live[index]
                exchange.abort()
                self._spawn(index, self.targets[index], started)
                return
            self._end(index, err.status, err.cause)
            return
        del self.live[index]
        source = self.targets[index].source
        body = exchange.finish()
        duration = (self.clock() - started) * 1000.0
        try:
            outcome = _answer_outcome(source, body, duration)
        except Exception as exc:
            outcome = _unexpected(source, exc, duration)
        self._settle(index, outcome)

    def _end(self, index: int, status: Status, cause: str | None) -> None:
        """Settle a call still on the wire with a failure and close its connection."""
        exchange, started = self.live.pop(index)
        exchange.abort()
        duration = (self.clock() - started) * 1000.0
        self._settle(index, ContributorOutcome(self.targets[index].source, status, duration,
                                               cause=cause))  # fmt: skip

    def _expire(self) -> None:
        """The deadline: every call still on the wire is a ``timeout``; the calls on new
        connections time out under their own ``asyncio.timeout`` at the same deadline."""
        for index in list(self.live):
            exchange, _ = self.live[index]
            phase = (
                "reading the body" if exchange.head.done() else "waiting for the response headers"
            )
            self._end(index, "timeout", f"deadline reached while {phase}")

    def _settle(self, index: int, outcome: ContributorOutcome) -> None:
        if self.outcomes[index] is not None or self.all_settled.done():
            return
        try:
            checked = self.check(outcome) if self.check is not None else outcome
        except BaseException as err:  # the caller's check failed: the fan-out fails with it
            self.all_settled.set_exception(err)
            return
        self.outcomes[index] = checked
        self.waiting -= 1
        if self.waiting == 0:
            self.all_settled.set_result(None)
        elif self.fail_fast and _ends_fan_out(checked, self.targets[index]):
            self.ended_early = True
            self.all_settled.set_result(None)

    def _abandon(self) -> None:
        """The fan-out is given up (cancelled, or the caller's work failed): close every
        connection still under way and cancel the calls on new connections."""
        for exchange, _ in self.live.values():
            exchange.abort()
        self.live.clear()
        for task in list(self.tasks):
            task.cancel()
        if not self.all_settled.done():
            self.all_settled.cancel()
        elif not self.all_settled.cancelled():
            self.all_settled.exception()  # retrieved: it is being raised or dropped with the rest
