"""The summarizer call of ``assembly.compaction.mode: "summarize"`` (docs/compaction.md).

A summarizer is a registered webhook endpoint. The service POSTs it one ``summarize`` packet,
signed and under the prepare's deadline like a contribution (``calls.exchange``)::

    {"type": "summarize", "preparation_id": "prep_...", "source": "<endpoint name>",
     "model": "...", "messages": [<the neutral messages to fold>],
     "max_summary_tokens": 2000, "scope": {...}, "deadline_unix_ms": ...}

and takes ``{"summary": "<text>"}`` back (other members are ignored). The text replaces the
folded messages as one summary message; what it says is the summarizer's, not the service's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from context_assembly.contributors.calls import ContributorTarget, exchange
from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.packets import SummaryAnswer
from context_assembly.contributors.signing import webhook_id
from context_assembly.core.request import Message, Scope
from context_assembly.core.sources import SourceFailure, SourceStatus


@dataclass(frozen=True, slots=True)
class Summarized:
    """A settled summarizer call: ``summary`` when ``ok``, else the failure."""

    status: SourceStatus
    duration_ms: float
    summary: str | None = None
    failure: SourceFailure | None = None


async def summarize(
    client: ContributorClient,
    target: ContributorTarget,
    *,
    preparation_id: str,
    model: str,
    messages: Sequence[Message],
    max_summary_tokens: int,
    scope: Scope,
    deadline_monotonic: float,
    deadline_unix_ms: int,
    attempt: int,
    max_response_bytes: int,
    clock: Callable[[], float] = time.monotonic,
) -> Summarized:
    """Ask ``target`` for the summary of ``messages``; never raises for what it did."""
    body = orjson.dumps(
        {
            "type": "summarize",
            "preparation_id": preparation_id,
            "source": target.source,
            "model": model,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in messages],
            "max_summary_tokens": max_summary_tokens,
            "scope": scope.model_dump(mode="json"),
            "deadline_unix_ms": deadline_unix_ms,
        }
    )
    msg_id = webhook_id(preparation_id, target.source, "summarize", attempt)
    result = await exchange(
        client, target, body, msg_id, deadline_monotonic, max_response_bytes, clock
    )
    if result.status != "ok" or result.body is None:
        failure = result.failure or SourceFailure("internal_error", "no answer body")
        return Summarized(result.status, result.duration_ms, failure=failure)
    try:
        answer = SummaryAnswer.model_validate(orjson.loads(result.body))
    except orjson.JSONDecodeError as err:
        failure = SourceFailure("invalid_json", f"invalid JSON at char {err.pos}")
        return Summarized("invalid", result.duration_ms, failure=failure)
    except ValidationError:
        failure = SourceFailure(
            "invalid_answer", "the answer has no non-empty 'summary' string", field="summary"
        )
        return Summarized("invalid", result.duration_ms, failure=failure)
    return Summarized("ok", result.duration_ms, summary=answer.summary)
