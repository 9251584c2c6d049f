"""Wire models of the prepare response (SPEC §3.2): budget, manifest and hashes.

The manifest is detached metadata: ids, statuses, reasons and token counts; never block bodies
and never raw revision values.

Fields added for managed routing, native history and cache plans
(``budget.provider_counted_tokens``, ``selection.native_history``, ``selection.routing``,
``selection.cache``) are left out of the JSON when unused, so a single-model request with a
message-list history and no ``cache`` answers byte for byte as before.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Literal

import orjson
from pydantic import Field, TypeAdapter

from context_assembly.core.request import Frozen, Render
from context_assembly.core.select import Reason, Status
from context_assembly.core.sources import SourceKind, SourceStatus


def _unset(value: object) -> bool:
    return value is None or value is False


CapacitySource = Literal["host", "provider", "registry", "fallback"]
Tokenizer = Literal["o200k_base", "cl100k_base", "estimate"]


class RoutingCandidate(Frozen):
    """One candidate model that routing tried, and why it was or was not chosen.

    ``needed_tokens`` is what the request needs before any selection: fixed content + reserves +
    the protected closure, counted with this candidate's tokenizer and framing;
    ``shortfall_tokens`` is how much of it the window lacks (0 when it fits). ``reason``:
    ``fits`` (chosen), ``window`` (does not fit), ``fits_after_compaction`` (chosen only after
    the request's ``history_policy`` dropped history, no candidate fitting without).
    """

    model: str
    capacity: int
    capacity_source: CapacitySource
    tokenizer: Tokenizer
    fits: bool
    needed_tokens: int
    shortfall_tokens: int
    reason: Literal["fits", "window", "fits_after_compaction"]


class RoutingReport(Frozen):
    """How managed routing chose the model (only for requests that give ``models``).

    ``candidates`` lists every candidate tried, in preference order (``first_fit`` stops at the
    first that fits). ``pinned`` is true on a refresh: it stays on the routed model.
    """

    policy: Literal["first_fit"]
    chosen: str
    pinned: bool = False
    candidates: list[RoutingCandidate]


class BudgetReport(Frozen):
    capacity: int
    capacity_source: CapacitySource
    response_reserve: int
    reasoning_reserve_tokens: int
    instructions_tokens: int
    legacy_data_tokens: int
    tools_tokens: int
    history_tokens: int
    input_tokens: int
    remaining_tokens: int
    data_limit_tokens: int
    data_tokens: int
    total_input_tokens: int
    history_dropped_messages: int
    provider_counted_tokens: int | None = Field(default=None, exclude_if=_unset)


class BlockReport(Frozen):
    source: str
    id: str
    status: Status
    reason: Reason
    tokens: int
    full_tokens: int
    projection_tokens: int | None
    priority: int
    protected: bool
    dependencies: list[str]


# The manifest's block reports validated or serialised as one list, in one pydantic-core pass.
BLOCK_REPORTS = TypeAdapter(list[BlockReport])

# The compact form of the manifest's block reports that a stored record keeps: one JSON array per
# block with these fields in this order, the whole list zlib-compressed and base64-encoded. The
# reports repeat their sources, statuses and reasons: 128 reports take ~1.6 KB instead of ~21 KB
# as objects, so a typical record fits one SQLite page (no overflow pages to write).
BLOCK_ROW_FIELDS = tuple(BlockReport.model_fields)
_row_values = attrgetter(*BLOCK_ROW_FIELDS)


def pack_block_rows(reports: Sequence[BlockReport]) -> str:
    """``reports`` in the compact stored form (see ``BLOCK_ROW_FIELDS``)."""
    rows = orjson.dumps([_row_values(report) for report in reports])
    return base64.b64encode(zlib.compress(rows, 1)).decode("ascii")


# A manifest's decisions counted by (status, reason), in first-seen order: what the metrics add
# up per answer (``Metrics.observe_preparation``); a memoised turn counted them once.
DecisionTally = tuple[tuple[tuple[str, str], int], ...]
_status_reason = attrgetter("status", "reason")


def decision_tally(reports: Sequence[BlockReport]) -> DecisionTally:
    """``reports`` counted by ``(status, reason)``."""
    counts: dict[tuple[str, str], int] = {}
    for key in map(_status_reason, reports):
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def unpack_block_rows(packed: str) -> list[dict[str, Any]]:
    """The block report objects of a packed form (``pack_block_rows``)."""
    rows = orjson.loads(zlib.decompress(base64.b64decode(packed, validate=True)))
    return [dict(zip(BLOCK_ROW_FIELDS, row, strict=True)) for row in rows]


class SourceReport(Frozen):
    source: str
    kind: SourceKind
    status: SourceStatus
    duration_ms: float
    block_count: int


CachePart = Literal["model", "tools", "instructions", "layout", "history"]
BreakpointAfter = Literal["tools", "instructions", "history"]
CacheTtl = Literal["5m", "1h"]
SkipReason = Literal["below_minimum", "unstable_in_layout", "limit"]


class FirstChange(Frozen):
    """The first part of the prefix that differs from the previous turn's.

    ``index``: the first differing history message, or tool definition (in frame order); a
    count past the end when one list only grew or shrank there; ``None`` for the other parts.
    """

    part: CachePart
    index: int | None


class CacheBreakpoint(Frozen):
    """A placed cache marker: ``tokens`` is the count of the prefix up to and including ``after``;
    ``message`` the frame index of the message the marker ends (absent for ``tools``: the last
    tool definition)."""

    after: BreakpointAfter
    tokens: int
    ttl: CacheTtl
    message: int | None = Field(default=None, exclude_if=_unset)


class SkippedBreakpoint(Frozen):
    after: BreakpointAfter
    reason: SkipReason


class CacheReport(Frozen):
    """``selection.cache``: the cache plan of this turn and how its prefix compares with the
    previous turn's (only for a request with ``cache``; ``core/cache.py`` builds it)."""

    previous_preparation_id: str | None
    prefix_kept: bool | None
    first_change: FirstChange | None
    cacheable_tokens: int
    breakpoints: list[CacheBreakpoint]
    skipped: list[SkippedBreakpoint]
    # The OpenAI options the body carries (``openai-*``) or that an adapter passes on
    # (``neutral``); absent when the request sets none.
    prompt_cache_key: str | None = Field(default=None, exclude_if=_unset)
    prompt_cache_retention: str | None = Field(default=None, exclude_if=_unset)


class OutputLimit(Frozen):
    """``selection.output_limit``: the output limit a provider-shaped frame carries.

    ``parameter`` is the body's key (dotted when nested); ``tokens`` its value: the budget's
    ``response_reserve + reasoning_reserve_tokens``, or the model's maximum output when that is
    smaller (``source``).
    """

    parameter: str
    tokens: int
    source: Literal["reserve", "model_maximum"]


class SelectionReport(Frozen):
    blocks: list[BlockReport]
    sources: list[SourceReport]
    max_data_tokens: int
    selected_data_tokens: int
    layout: Literal["legacy", "stable-prefix"]
    reasoning_reserve_tokens: int
    tokenizer: Tokenizer
    exact: bool
    opaque_or_multimodal: bool
    native_history: bool = Field(default=False, exclude_if=_unset)
    routing: RoutingReport | None = Field(default=None, exclude_if=_unset)
    cache: CacheReport | None = Field(default=None, exclude_if=_unset)
    output_limit: OutputLimit | None = Field(default=None, exclude_if=_unset)


class PrepareResponse(Frozen):
    preparation_id: str
    model: str
    layout: Literal["legacy", "stable-prefix"]
    render: Render
    frame: dict[str, Any]
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int = Field(default=1, ge=1, le=2)
