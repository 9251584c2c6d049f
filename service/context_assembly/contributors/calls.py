"""Contributor webhook calls: fan-out under one deadline, size caps, validation, failure policy.

docs/contract.md, "Webhook protocol". Every call is a task under **one total deadline** (one ``asyncio.timeout`` for the
prepare's deadline) around the whole exchange: connect, request, response head and the streamed
body; a server that drips one byte at a time cannot stretch it. At the deadline the call is
cancelled, its connection closed, and its outcome settled as ``timeout``; an outcome once settled
is never replaced, so an answer that arrives later has nothing left to change. The calls go
through :class:`~.client.ContributorClient` (aiohttp; pinning, caps and pool rules are there).

The outcome of a call and its statuses are ``outcomes.py``'s. A failure is also classified once, where it is seen, as a
:class:`~context_assembly.core.sources.SourceFailure`: a cause's name (``connect_refused``,
``timeout``, ``http_status`` with the status, ``invalid_answer`` with the path of the field...)
and the same in words (the outcome's ``cause``), which never quote the body (``failures.py``
for transport exceptions and invalid answers). An exception of the
service's own code settles the call as ``error`` too (cause ``internal_error``, in words
``unexpected <type>``), and is logged and counted as the bug it is (:func:`_report_bug`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson
import structlog
from pydantic import ValidationError

from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.failures import classify, schema_failure
from context_assembly.contributors.mcp import McpEndpoint
from context_assembly.contributors.outcomes import (
    MIN_SEND_SECONDS,
    SKIPPED_FAILURE,
    ContributorOutcome,
    PacketFields,
    Status,
)
from context_assembly.contributors.packets import ContributorAnswer, RevisionAnswer
from context_assembly.contributors.signing import (
    CallType,
    sign_headers,
    validate_secret,
    webhook_id,
)
from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.core.request import Revision, Scope
from context_assembly.core.sources import SourceFailure
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError
from context_assembly.metrics import InternalErrorSite, count_internal_error

TIMEOUT_HEADER = "X-Contributor-Timeout-Ms"
"""Remaining budget in integer milliseconds at send time (like Envoy's
``x-envoy-expected-rq-timeout-ms`` and Connect's ``Connect-Timeout-Ms``): relative, so
contributors need no synchronised clock."""

FailurePolicy = Literal["fail", "omit"]
TargetKind = Literal["registered", "inline"]

_DEADLINE_STATUSES = frozenset({"timeout", "skipped_deadline"})

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


# --------------------------------------------------------------------------- one exchange


@dataclass(frozen=True, slots=True)
class Exchange:
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


async def exchange(
    client: ContributorClient,
    target: ContributorTarget,
    body: bytes,
    msg_id: str,
    deadline_monotonic: float,
    max_response_bytes: int,
    clock: Callable[[], float],
) -> Exchange:
    """POST ``body`` and read a capped 2xx JSON body, all within the one deadline.

    A connection goes back to the pool only after a complete, accepted answer; any failure (a
    status, a cap, the deadline, a cancel) closes it, so a half-read answer is never reused.
    """
    started = clock()
    remaining = deadline_monotonic - started
    if remaining < MIN_SEND_SECONDS:
        return Exchange("skipped_deadline", 0.0, failure=SKIPPED_FAILURE)

    def settled(
        status: Status, failure: SourceFailure | None = None, data: bytes | None = None
    ) -> Exchange:
        return Exchange(status, (clock() - started) * 1000.0, data, failure)

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
        return settled(*classify(exc))
    except (aiohttp.ClientError, OSError) as exc:
        return settled(*classify(exc))
    return settled("ok", data=data)


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
        result = await exchange(
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
        return ContributorOutcome.failed(source, "invalid", duration_ms, schema_failure(err))
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
        result = await exchange(
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
