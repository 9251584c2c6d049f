"""Contributor webhook calls: fan-out under one deadline, size caps, validation, failure policy.

docs/contract.md, "Webhook protocol". Every call is a task under **one total deadline** (one ``asyncio.timeout`` for the
prepare's deadline) around the whole exchange: connect, request, response head and the streamed
body; a server that drips one byte at a time cannot stretch it. At the deadline the call is
cancelled, its connection closed, and its outcome settled as ``timeout``; an outcome once settled
is never replaced, so an answer that arrives later has nothing left to change. The calls go
through :class:`~.client.ContributorClient` (aiohttp; pinning, caps and pool rules are there).

Outcome statuses (the manifest's source statuses): ``ok``; ``timeout`` (the deadline, or a ``504``
from the contributor); ``error`` (connect failure, reset, non-2xx, redirect, which is never followed);
``invalid`` (not JSON, not ``{revision, blocks}``, a non-JSON content type or a compressed body);
``too_large`` (``Content-Length`` or the streamed body over the cap); ``skipped_deadline`` (no
time left to send). A failure is also classified once, where it is seen, as a
:class:`~context_assembly.core.sources.SourceFailure`: a cause's name (``connect_refused``,
``timeout``, ``http_status`` with the status, ``invalid_answer`` with the path of the field...)
and the same in words (the outcome's ``cause``), which never quote the body. An exception of the
service's own code settles the call as ``error`` too (cause ``internal_error``, in words
``unexpected <type>``), and is logged and counted as the bug it is (:func:`_report_bug`).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import orjson
import structlog
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from context_assembly.contributors.client import ContributorClient, PinRefusedError
from context_assembly.contributors.signing import (
    CallType,
    sign_headers,
    validate_secret,
    webhook_id,
)
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.core.request import (
    Block,
    Frozen,
    Message,
    Revision,
    Scope,
    finite_revision,
)
from context_assembly.core.sources import SourceFailure
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError
from context_assembly.metrics import InternalErrorSite, count_internal_error

if TYPE_CHECKING:  # mcp.py imports this module; it is only named in annotations here
    from context_assembly.contributors.mcp import McpEndpoint
    from context_assembly.contributors.mcp_mapping import Skipped

TIMEOUT_HEADER = "X-Contributor-Timeout-Ms"
"""Remaining budget in integer milliseconds at send time (like Envoy's
``x-envoy-expected-rq-timeout-ms`` and Connect's ``Connect-Timeout-Ms``): relative, so
contributors need no synchronised clock."""

# ``rejected``: an inline URL refused or not resolved under ``omit`` (preparations/targets.py, ``Contributors._call_inline``).
Status = Literal["ok", "timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"]
FailurePolicy = Literal["fail", "omit"]
TargetKind = Literal["registered", "inline"]

# A call with less time than this left before the deadline is not sent: ``skipped_deadline``.
MIN_SEND_SECONDS = 0.001
SKIPPED_CAUSE = "no time left before the deadline"
SKIPPED_FAILURE = SourceFailure("no_time_left", SKIPPED_CAUSE)

_DEADLINE_STATUSES = frozenset({"timeout", "skipped_deadline"})
_UNION_TAGS = frozenset({"str", "int", "float"})  # pydantic's location tags for Revision's members

log = structlog.get_logger("context_assembly.contributors")


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ContributorTarget:
    """One contributor to call: a registered endpoint (trusted) or an SSRF-checked inline URL.

    ``mcp``: the target is an MCP server, called through that endpoint (``contributors/mcp.py``)
    instead of with a webhook packet; everything else (policy, deadline, outcome) is the same.
    """

    source: str
    url: str
    secret: str | None = None
    failure_policy: FailurePolicy = "fail"
    kind: TargetKind = "registered"
    checked: CheckedTarget | None = None
    mcp: McpEndpoint | None = None

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
    # Items of an MCP answer that did not become blocks (binary contents), with the reason.
    skipped: tuple[Skipped, ...] = ()
    # The failure classified (``cause`` is its ``detail``); ``None`` for an ``ok`` outcome.
    failure: SourceFailure | None = None

    @property
    def ok(self) -> bool:
        """Whether the contributor answered in time with a valid ``{revision, blocks}``."""
        return self.status == "ok"

    @classmethod
    def failed(
        cls, source: str, status: Status, duration_ms: float, failure: SourceFailure
    ) -> ContributorOutcome:
        """A failed call's outcome: its status, and ``failure`` with its words as the cause."""
        return cls(source, status, duration_ms, cause=failure.detail, failure=failure)


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
    them (the request-wide block rules of docs/contract.md, "Block rules", run later, over every source, in the core).
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
    failure: SourceFailure | None = None


class _Failure(Exception):
    """A settled non-ok result raised out of the response reader."""

    def __init__(self, status: Status, failure: SourceFailure) -> None:
        super().__init__(failure.detail)
        self.status = status
        self.failure = failure
        self.cause = failure.detail


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _classify(exc: BaseException) -> tuple[Status, SourceFailure]:
    """Status and failure of a transport exception, judged by the exceptions in its chain."""
    chain = _chain(exc)

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    if has(ConnectionRefusedError):
        return "error", SourceFailure("connect_refused", "connect refused")
    if has(aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError):
        return "error", SourceFailure("tls_certificate", "TLS certificate verification failed")
    if has(aiohttp.ClientSSLError, ssl.SSLError):
        return "error", SourceFailure("tls", "TLS error")
    if has(aiohttp.ClientConnectorDNSError, socket.gaierror):
        return "error", SourceFailure("name_resolution", "name resolution failed")
    if has(ConnectionResetError):
        return "error", SourceFailure("connection_reset", "connection reset")
    if has(aiohttp.ServerDisconnectedError):
        return "error", SourceFailure("connection_closed", "server closed the connection")
    if has(aiohttp.ClientPayloadError):
        return "error", SourceFailure(
            "connection_closed", "connection closed before the body was complete"
        )
    if has(aiohttp.ClientResponseError):
        return "error", SourceFailure("protocol_error", "HTTP protocol error")
    if has(aiohttp.ClientConnectorError):
        return "error", SourceFailure("connect_failed", "connect failed")
    if has(PinRefusedError):
        return "error", SourceFailure("transport_refused", "request refused by the transport")
    return "error", SourceFailure("transport_error", f"transport error ({type(exc).__name__})")


def _check_head(code: int, headers: Mapping[str, str], max_bytes: int) -> None:
    if 300 <= code < 400:
        raise _Failure(
            "error", SourceFailure("http_status", f"HTTP {code} redirect (not followed)", code)
        )
    if code == 504:
        # Gateway Timeout: the contributor (our helper answers so at X-Contributor-Timeout-Ms)
        # or a gateway before it ran out of the time it was given. A deadline failure, like our
        # own timer's, whichever of the two is seen first.
        raise _Failure(
            "timeout",
            SourceFailure("http_status", "HTTP 504: the contributor reported its deadline", code),
        )
    if not 200 <= code < 300:
        raise _Failure("error", SourceFailure("http_status", f"HTTP {code}", code))
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _Failure(
            "invalid",
            SourceFailure("content_encoding", "compressed body (content-encoding) not accepted"),
        )
    content_type = headers.get("content-type")
    if content_type is not None:
        mime = content_type.split(";", 1)[0].strip().lower()
        if mime != "application/json" and not mime.endswith("+json"):
            raise _Failure("invalid", SourceFailure("content_type", "content-type is not JSON"))
    length = headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise _Failure(
            "too_large",
            SourceFailure(
                "too_large", f"Content-Length {int(length)} over the {max_bytes}-byte cap"
            ),
        )


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, counted on the wire bytes as they arrive (_check_head admitted identity
    encoding only). Over the cap, the bytes read so far are dropped before the failure is
    raised, so that no traceback keeps them alive."""
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        if len(buffer) + len(chunk) > max_bytes:
            del buffer, chunk
            raise _Failure(
                "too_large", SourceFailure("too_large", f"body over the {max_bytes}-byte cap")
            )
        buffer += chunk
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
    client: ContributorClient,
    target: ContributorTarget,
    body: bytes,
    msg_id: str,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float],
) -> _Exchange:
    """POST ``body`` and read a capped 2xx JSON body, all within the one deadline.

    A connection goes back to the pool only after a complete, accepted answer; any failure (a
    status, a cap, the deadline, a cancel) closes it, so a half-read answer is never reused.
    """
    started = clock()
    remaining = deadline_monotonic - started
    if remaining < MIN_SEND_SECONDS:
        return _Exchange("skipped_deadline", 0.0, failure=SKIPPED_FAILURE)

    def settled(
        status: Status, failure: SourceFailure | None = None, data: bytes | None = None
    ) -> _Exchange:
        return _Exchange(status, (clock() - started) * 1000.0, data, failure)

    headers = _call_headers(target, msg_id, body, remaining)
    url = target.url if target.checked is None else target.checked.url
    phase = "waiting for the response headers"
    deadline = asyncio.timeout(remaining)
    try:
        async with deadline:
            response = await client.post(url, body, headers, target.checked)
            try:
                phase = "reading the body"
                _check_head(response.status, response.headers, max_response_bytes)
                data = await _read_capped(response, max_response_bytes)
            except BaseException:
                response.close()
                raise
            response.release()
    except _Failure as failure:
        return settled(failure.status, failure.failure)
    except TimeoutError as exc:
        if deadline.expired():
            return settled("timeout", SourceFailure("timeout", f"deadline reached while {phase}"))
        return settled(*_classify(exc))
    except (aiohttp.ClientError, OSError) as exc:
        return settled(*_classify(exc))
    return settled("ok", data=data)


def _schema_locations(err: ValidationError) -> list[tuple[list[str], str]]:
    """Each distinct location of ``err`` as its parts, with its message, in pydantic's order.

    No body text: inputs are excluded, and the one location part that comes from the body (the
    name of an unexpected member) is replaced by ``<unknown field>``. Union member tags
    (``revision.str``) are dropped so that one bad revision is one entry.
    """
    found: list[tuple[list[str], str]] = []
    seen: set[str] = set()
    for item in err.errors(include_input=False, include_url=False):
        loc_parts = [str(p) for p in item["loc"] if p not in _UNION_TAGS]
        if item["type"] == "extra_forbidden" and loc_parts:
            loc_parts[-1] = "<unknown field>"
        loc = ".".join(loc_parts)
        if loc in seen:
            continue
        seen.add(loc)
        found.append((loc_parts, item["msg"]))
    return found


def _schema_cause(err: ValidationError) -> str:
    """``schema: blocks.3.priority: Input should be a valid integer`` (at most three
    locations; :func:`_schema_locations` says what is left out)."""
    found = _schema_locations(err)
    parts = [f"{'.'.join(loc) or '(root)'}: {msg}" for loc, msg in found]
    extra = len(found) - 3
    text = "; ".join(parts[:3]) + (f" (and {extra} more)" if extra > 0 else "")
    return f"schema: {text}"


def _schema_failure(err: ValidationError) -> SourceFailure:
    """``invalid_answer``, the :func:`_schema_cause` words, and the path of the first offending
    field (an unexpected member: the object that holds it); none for the answer as a whole."""
    found = _schema_locations(err)
    loc = found[0][0] if found else []
    if loc and loc[-1] == "<unknown field>":
        loc = loc[:-1]
    return SourceFailure("invalid_answer", _schema_cause(err), field=".".join(loc) or None)


def _parse_json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise _Failure(
            "invalid", SourceFailure("invalid_json", f"invalid JSON at char {err.pos}")
        ) from err


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
    client: ContributorClient,
    target: ContributorTarget,
    common: Mapping[str, Any],
    packet_fields: PacketFields,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float],
) -> ContributorOutcome:
    """One call, settled as an outcome: it never raises for what the contributor did."""
    started = clock()
    try:
        if target.mcp is not None:
            return await target.mcp.contribute(
                target.source, client, packet_fields, deadline_monotonic, max_response_bytes, clock
            )
        body, msg_id = _packet(target, common, packet_fields)
        result = await _exchange(
            client, target, body, msg_id, deadline_monotonic, max_response_bytes, clock
        )
        if result.status != "ok" or result.body is None:
            failure = result.failure or SourceFailure("internal_error", "no answer body")
            return ContributorOutcome.failed(
                target.source, result.status, result.duration_ms, failure
            )
        return _answer_outcome(target.source, result.body, result.duration_ms)
    except Exception as exc:  # one contributor's surprise must never sink the whole fan-out
        _report_bug("contribute", target.source, exc)
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
        return ContributorOutcome.failed(source, "invalid", duration_ms, _schema_failure(err))
    except _Failure as failure:
        return ContributorOutcome.failed(source, failure.status, duration_ms, failure.failure)
    return ContributorOutcome(source, "ok", duration_ms, answer.revision, tuple(answer.blocks))


def _unexpected(source: str, exc: Exception, duration_ms: float) -> ContributorOutcome:
    failure = SourceFailure("internal_error", f"unexpected {type(exc).__name__}")
    return ContributorOutcome.failed(source, "error", duration_ms, failure)


def _report_bug(where: InternalErrorSite, source: str, exc: Exception) -> None:
    """Log and count an exception of the service's own code that a call settles as ``error``.

    What a contributor does (a status, a body, a fault of the connection) is classified before
    it gets here; what gets here is a bug of ours, so it is counted
    (``context_assembly_internal_errors_total``) and logged with its type and where it was raised
    (module, line and function of each frame). Not its message: a message can quote what the code
    was handed (a block's text, a contributor's answer), and a traceback in the log would carry
    it.
    """
    count_internal_error(where)
    frames = [
        f"{frame.f_globals.get('__name__', '?')}:{line} {frame.f_code.co_qualname}"
        for frame, line in traceback.walk_tb(exc.__traceback__)
    ]
    log.error(
        "internal_error", where=where, source=source, error_type=type(exc).__name__, frames=frames
    )


async def contribute_all(
    client: ContributorClient,
    targets: Sequence[ContributorTarget],
    packet_fields: PacketFields,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float] = time.monotonic,
    check: Callable[[ContributorOutcome], ContributorOutcome] | None = None,
    fail_fast: bool = False,
) -> list[ContributorOutcome]:
    """Call every target concurrently and return one outcome per target, in target order.

    With ``fail_fast``, the first ``fail``-policy call that fails other than by the deadline
    ends the fan-out at once: the calls still under way are cancelled (their late answers change
    nothing) and :func:`raise_for_failures` raises for the outcomes settled so far, instead of
    the prepare waiting out the others only to fail with that cause.

    ``check`` (the caller's block rules) runs on each outcome as soon as its answer is parsed, so
    the answers that arrive early are checked while the others are awaited; a check that raises
    fails the fan-out with its exception.

    Each call sends a ``contribute`` packet (docs/contract.md, "Webhook protocol") with ``X-Contributor-Timeout-Ms`` (the
    remaining integer ms at send time, at least 1), ``content-type: application/json``, a stable
    ``webhook-id`` and, when the target has a secret, Standard Webhooks signature headers. All
    calls share ``deadline_monotonic`` (a ``clock()`` value): a call with no time left is
    ``skipped_deadline`` and never sent; a call still running at the deadline is cancelled and
    ``timeout``. Never raises for a contributor failure; see :func:`raise_for_failures`.
    """
    if not targets:
        return []
    common = {
        "input": [m.model_dump(mode="json", exclude_none=True) for m in packet_fields.input],
        "scope": packet_fields.scope.model_dump(mode="json"),
    }

    settled: list[ContributorOutcome] = []  # in the order the calls end
    # Set when a ``fail``-policy call fails other than by the deadline (with ``fail_fast``).
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def call(target: ContributorTarget) -> ContributorOutcome:
        outcome = await _contribute_one(
            client, target, common, packet_fields, deadline_monotonic, max_response_bytes, clock
        )
        if check is not None:
            outcome = check(outcome)
        settled.append(outcome)
        if fail_fast and _ends_fan_out(outcome, target) and not ended.done():
            ended.set_result(None)
        return outcome

    tasks = [asyncio.ensure_future(call(t)) for t in targets]
    every = asyncio.gather(*tasks)
    try:
        await asyncio.wait((every, ended), return_when=asyncio.FIRST_COMPLETED)
        if not every.done():
            raise_for_failures(settled, targets)  # a fail-policy call failed: this raises
        return every.result()  # a check that raised fails the fan-out with it
    finally:
        for task in tasks:
            task.cancel()
        if not every.done():
            every.cancel()
            # Its calls are still being cancelled: it settles later, with their CancelledError as
            # its exception. Retrieve it then, so that asyncio does not log it as never retrieved.
            every.add_done_callback(_retrieve)
        elif not every.cancelled():
            every.exception()  # retrieved: raised above, or dropped with the fan-out


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


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
    client: ContributorClient,
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
    contributor that deduplicates on the id must not drop a later check). An MCP target
    re-reads its resources' revisions instead (``McpEndpoint.revision``).
    """
    if target.mcp is not None:
        try:
            return await target.mcp.revision(client, deadline_monotonic, max_response_bytes, clock)
        except Exception as exc:  # as below: a surprise is an error, not a crash of validate
            _report_bug("revision", target.source, exc)
            return "error", None
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
    except Exception as exc:  # as in contribute_all: a surprise is an error, not a crash
        _report_bug("revision", target.source, exc)
        return "error", None
    return "ok", answer.revision
