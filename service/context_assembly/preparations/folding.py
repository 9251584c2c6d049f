"""The fold of ``assembly.compaction.mode: "summarize"`` (docs/compaction.md): when the decision
is ``compact``, the history before the latest reply is sent to the summarizer
(``contributors/summarizer.py``) and the frame is assembled again with its summary in place of
what it folded. A prepare and a refresh fold the same way (``operations.Preparations``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from context_assembly.contributors.calls import ContributorTarget
from context_assembly.core import compaction
from context_assembly.core.assemble import Assembly
from context_assembly.core.layout import turn_point
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import ManifestWarning
from context_assembly.engine import ModelContext
from context_assembly.preparations.targets import Contributors

log = structlog.get_logger("context_assembly.preparations")


async def fold(
    contributors: Contributors,
    request: PrepareRequest,
    assembly: Assembly,
    ctx: ModelContext,
    summarizer: ContributorTarget,
    *,
    prep_id: str,
    attempt: int,
    budget_ms: float,
    assemble: Callable[[PrepareRequest], Awaitable[tuple[Assembly, ModelContext]]],
) -> tuple[Assembly, ModelContext]:
    """``summarize``: the history before the latest reply (``compaction.fold_span``: never the
    leading system and developer messages) folded into the summarizer's summary, and the frame
    assembled again with it; the unfolded frame, with the warning ``compaction_failed``, when
    the summarizer fails or there is nothing to fold. ``budget_ms``:
    the time the contributors left the summarizer."""
    decided = assembly.selection.compaction
    assert decided is not None
    history = request.history_messages
    span = compaction.fold_span(history, turn_point([*history, *request.input]))
    result = None
    if span:
        result = await contributors.summarize(
            summarizer,
            request,
            history[span.start : span.stop],
            prep_id,
            budget_ms=budget_ms,
            attempt=attempt,
            model=ctx.model,
        )
    if result is None or result.summary is None:
        detail = "nothing before the latest user turn to fold"
        if result is not None and result.failure is not None:
            detail = (
                f"the summarizer {summarizer.source!r} failed ({result.status}: "
                f"{result.failure.cause}): the frame is not compacted"
            )
            log.warning(
                "summarizer_failed",
                preparation_id=prep_id,
                summarizer=summarizer.source,
                status=result.status,
                cause=result.failure.cause,
            )
        warning = ManifestWarning(code="compaction_failed", detail=detail)
        selection = assembly.selection.model_copy(
            update={"warnings": [*assembly.selection.warnings, warning]}
        )
        return replace(assembly, selection=selection), ctx
    summary = compaction.summary_message(result.summary)
    kept = [*history[: span.start], summary, *history[span.stop :]]
    sent = request.model_copy(update={"history": kept})
    caller = assembly.caller_history_hashes  # the record keeps the caller's own history's
    assembly, ctx = await assemble(sent)
    report = decided.model_copy(
        update={
            "folded_from": span.start,
            "folded_messages": len(span),
            "summary": summary.model_dump(mode="json", exclude_none=True),
        }
    )
    selection = assembly.selection.model_copy(update={"compaction": report})
    return replace(assembly, selection=selection, caller_history_hashes=caller), ctx
