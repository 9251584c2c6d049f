"""Wire models of the prepare response (docs/api.md, "POST /v1/prepare"): budget, manifest and hashes.

The manifest is detached metadata: ids, statuses, reasons and token counts; never block bodies
and never raw revision values.

Fields added for managed routing, native history and cache plans
(``budget.provider_counted_tokens``, ``selection.native_history``, ``selection.routing``,
``selection.cache``) are left out of the JSON when unused, so a single-model request with a
message-list history and no ``cache`` answers byte for byte as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Literal

from pydantic import Field, TypeAdapter

from context_assembly.core.compaction import CompactionReport
from context_assembly.core.request import Frozen, Render
from context_assembly.core.select import Reason, Status
from context_assembly.core.sources import FailureCause, SourceKind, SourceStatus


def _unset(value: object) -> bool:
    return value is None or value is False


CapacitySource = Literal["host", "provider", "registry", "fallback"]
Tokenizer = Literal["o200k_base", "cl100k_base", "estimate"]


_CAPACITY_SOURCE = (
    "Where the window comes from: `host` or `provider` (the request's `max_context_tokens`), "
    "`registry` (the model registry) or `fallback` (128,000)."
)


class RoutingCandidate(Frozen):
    """One candidate model that routing tried, and why it was or was not chosen."""

    model: str = Field(description="The candidate model.")
    capacity: int = Field(description="Its context window, in tokens.")
    capacity_source: CapacitySource = Field(description=_CAPACITY_SOURCE)
    tokenizer: Tokenizer = Field(description="The tokenizer its counts use.")
    fits: bool = Field(description="Whether its window holds `needed_tokens`.")
    needed_tokens: int = Field(
        description="What the request needs before any selection: the fixed content, the "
        "reserves and the protected blocks with their dependencies, counted for this candidate."
    )
    shortfall_tokens: int = Field(description="How much of it the window lacks (0 when it fits).")
    reason: Literal["fits", "window", "fits_after_compaction"] = Field(
        description="`fits`: chosen. `window`: does not fit. `fits_after_compaction`: chosen "
        "after `history_policy` dropped history, when no candidate fitted without."
    )


class RoutingReport(Frozen):
    """How managed routing chose the model (only for a request with `models`)."""

    policy: Literal["first_fit"] = Field(description="The routing policy.")
    chosen: str = Field(description="The model chosen: the answer's `model`.")
    pinned: bool = Field(
        default=False, description="True on a refresh, which stays on the routed model."
    )
    candidates: list[RoutingCandidate] = Field(
        description="Every candidate tried, in order of preference (`first_fit` stops at the "
        "first that fits)."
    )


CountSource = Literal["exact", "anchored", "calibrated", "estimate"]


class AnchorReport(Frozen):
    """`budget.anchored`: the part of the frame that repeats the previous turn's, counted with
    the provider's own figure for that turn (its usage report)."""

    preparation_id: str = Field(description="The previous turn whose usage report anchors.")
    shared_messages: int = Field(
        description="How many messages of this turn's conversation (history, then input) "
        "repeat the previous turn's."
    )
    whole: bool = Field(
        description="Whether this turn's conversation repeats all of the previous turn's: the "
        "shared part then counts as the provider counted the whole previous frame."
    )
    provider_tokens: int = Field(
        description="The provider's input count of the previous turn's frame (its `main` call)."
    )
    estimated_tokens: int = Field(
        description="The service's own count of the shared part (tools, leading message and "
        "the shared conversation)."
    )
    counted_tokens: int = Field(
        description="What the shared part counts as: `provider_tokens` when `whole`, else the "
        "smaller of the two figures (a part of a frame is never more than the frame)."
    )
    correction_tokens: int = Field(
        description="`estimated_tokens` minus `counted_tokens`: what anchoring took off the "
        "terms (negative when the provider counted more)."
    )


class BudgetReport(Frozen):
    """The token budget: the window, each term of the frame, the reserves and the data limit.
    The terms add up to `total_input_tokens` (less `anchored.correction_tokens` when the count
    is anchored); every count includes its message framing."""

    capacity: int = Field(description="The model's context window, in tokens.")
    capacity_source: CapacitySource = Field(description=_CAPACITY_SOURCE)
    response_reserve: int = Field(description="Tokens kept free for the answer.")
    reasoning_reserve_tokens: int = Field(description="Tokens kept free for reasoning.")
    instructions_tokens: int = Field(
        description="The leading instructions (host and plugins), with the reply priming."
    )
    legacy_data_tokens: int = Field(
        description="The legacy plugin views and the date and time line."
    )
    tools_tokens: int = Field(description="The tool definitions.")
    history_tokens: int = Field(
        description="The history as sent (the provider's count for a native history)."
    )
    input_tokens: int = Field(description="This turn's input messages.")
    remaining_tokens: int = Field(
        description="The window left for data: capacity minus the reserves and every fixed term."
    )
    data_limit_tokens: int = Field(
        description="The data message's limit: the smaller of `max_data_tokens` and "
        "`remaining_tokens`."
    )
    data_tokens: int = Field(description="The data message as sent (0 without one).")
    total_input_tokens: int = Field(description="Every input token of the frame: the terms added.")
    history_dropped_messages: int = Field(
        description="History messages `history_policy` dropped to fit."
    )
    provider_counted_tokens: int | None = Field(
        default=None,
        exclude_if=_unset,
        description="A native history's `provider_counted_tokens` (absent otherwise).",
    )
    count_source: CountSource | None = Field(
        default=None,
        exclude_if=_unset,
        description="Where `total_input_tokens` comes from: `exact` (the model's own "
        "tokenizer), `anchored` (the part repeating the previous turn counted with the "
        "provider's figure, the rest estimated), `calibrated` (the estimate times "
        "`calibration_factor`, learnt from this tenant's usage reports on the model) or "
        "`estimate` (the conservative estimator: at least the real count in practice). Absent in "
        "records stored before it was reported.",
    )
    estimated_tokens: int | None = Field(
        default=None,
        exclude_if=_unset,
        description="How many of `total_input_tokens` are estimated (the error bound: the "
        "estimate is meant to be over, never under, the provider's count); 0 when `exact`.",
    )
    calibration_factor: float | None = Field(
        default=None,
        exclude_if=_unset,
        description="The factor the estimated counts were multiplied by (at most 1, at least "
        "0.5), learnt from the provider's counts in this tenant's usage reports on the model; "
        "absent while there are too few reports, and for exact counts.",
    )
    anchored: AnchorReport | None = Field(
        default=None,
        exclude_if=_unset,
        description="The anchoring on the previous turn's usage report (only when "
        "`count_source` is `anchored`).",
    )


class BlockReport(Frozen):
    """The decision on one block, with its reason and counts (never its text)."""

    source: str = Field(description="The block's source.")
    id: str = Field(description="The block's id in its source.")
    status: Status = Field(description="`selected` (in full), `projected` or `omitted`.")
    reason: Reason = Field(
        description="Why: `protected`, `dependency` (another chosen block needs it), `fits`, "
        "`projection_fits`; or, omitted, `expired`, `missing_dependency`, `budget` (the data "
        "limit), `source_budget` (its source's limit), `source_failed`, `binary_content` (an "
        "MCP server's binary content: never sent as text, reported with 0 tokens after the "
        "blocks)."
    )
    tokens: int = Field(description="Tokens as sent: full, projected, or 0 when omitted.")
    full_tokens: int = Field(description="Tokens of the full text in the data message.")
    projection_tokens: int | None = Field(
        description="Tokens of the projection (`null` without one)."
    )
    priority: int = Field(description="The block's priority.")
    protected: bool = Field(description="Whether the block is protected.")
    dependencies: list[str] = Field(description="The blocks it needs, as `source/id`.")


# The manifest's block reports validated or serialised as one list, in one pydantic-core pass.
BLOCK_REPORTS = TypeAdapter(list[BlockReport])

# A manifest's decisions counted by (status, reason), in first-seen order: what the metrics and
# the trace add up per answer (``Metrics.observe_preparation``, ``tracing``).
DecisionTally = tuple[tuple[tuple[str, str], int], ...]
_status_reason = attrgetter("status", "reason")


def decision_tally(reports: Sequence[BlockReport]) -> DecisionTally:
    """``reports`` counted by ``(status, reason)``."""
    counts: dict[tuple[str, str], int] = {}
    for key in map(_status_reason, reports):
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


class SourceFailureReport(Frozen):
    """Why a source failed: the cause's name, the same in words, and the HTTP status or the
    field path when there is one. Never a part of the contributor's answer."""

    cause: FailureCause = Field(
        description="What happened. The connection: `connect_refused`, `connect_failed`, "
        "`name_resolution`, `tls`, `tls_certificate`, `connection_reset`, `connection_closed`, "
        "`protocol_error`, `transport_refused`, `transport_error`. Time: `timeout` (the "
        "deadline passed first), `no_time_left` (the call was not sent). The answer: "
        "`http_status` (not 2xx, a redirect included; see `status`), `content_type`, "
        "`content_encoding`, `too_large`, `invalid_json`, `invalid_answer` (not the "
        "protocol's shape; see `field`), `block_rules` (its blocks break the block rules; see "
        "`field`). MCP servers: `jsonrpc_error`, `tool_error`, `protocol_version`, "
        "`session_lost`, `no_answer`. Inline URLs: `url_rejected`. `internal_error`: a bug of "
        "the service, logged as `internal_error`."
    )
    detail: str = Field(
        description="The same in words (`HTTP 503`, `deadline reached while reading the body`, "
        "`schema: blocks.0.id: Input should be a valid string`); it never quotes the answer."
    )
    status: int | None = Field(
        default=None,
        exclude_if=_unset,
        description="The HTTP status the contributor answered (`http_status`, and a "
        "`jsonrpc_error` that came with a status other than 2xx); absent otherwise.",
    )
    field: str | None = Field(
        default=None,
        exclude_if=_unset,
        description="The path of the offending field in the answer, dotted (`blocks.0.id`), "
        "for `invalid_answer` and `block_rules` when one field is at fault; absent otherwise.",
    )


class SourceReport(Frozen):
    """One source of the request and how it answered."""

    source: str = Field(description="The source: the plugin it replaces.")
    kind: SourceKind = Field(
        description="`webhook` (a contributor of the webhook protocol), `mcp` (an MCP server), "
        "`inline` (a contribution) or `whiteboard`."
    )
    status: SourceStatus = Field(
        description="`ok` (a contributor answered), `inline`; or a failure left out under "
        "`omit`: `timeout`, `error`, `invalid`, `too_large`, `skipped_deadline`, `rejected`."
    )
    duration_ms: float = Field(description="How long the source took, in milliseconds.")
    block_count: int = Field(
        description="How many blocks it gave (not counting items reported as `binary_content`)."
    )
    failure: SourceFailureReport | None = Field(
        default=None,
        exclude_if=_unset,
        description="Why the source failed, for a failed contributor left out under `omit` "
        "(absent otherwise).",
    )


CachePart = Literal["model", "tools", "instructions", "layout", "history"]
BreakpointAfter = Literal["tools", "instructions", "history", "end"]
CacheTtl = Literal["5m", "1h"]
BreakpointTtl = Literal["5m", "1h", "30m"]
SkipReason = Literal[
    "below_minimum", "unstable_in_layout", "limit", "not_markable", "automatic", "retention"
]


class FirstChange(Frozen):
    """The first part of the prefix that differs from the previous turn's."""

    part: CachePart = Field(
        description="`model`, `layout`, `tools`, `instructions` or `history`, in prefix order."
    )
    index: int | None = Field(
        description="For `tools` and `history`: the first differing tool (in frame order) or "
        "history message, or the length of the shorter list when one only grew or shrank; "
        "`null` for the other parts."
    )


class CacheBreakpoint(Frozen):
    """A cache marker placed in the frame (or, for `neutral`, where one goes)."""

    after: BreakpointAfter = Field(
        description="What the marker ends: `tools` (the last tool definition), `instructions` "
        "(the leading system content), `history` (the last message of the stable prefix: in "
        "`transcript`, the previous turn's frame) or `end` (the frame's last message, "
        "`transcript` only)."
    )
    tokens: int = Field(description="The tokens of the prefix up to and including it.")
    ttl: BreakpointTtl = Field(
        description="The marker's lifetime: `5m` or `1h` (Anthropic), `30m` (OpenAI's default, "
        "the shortest it keeps an entry)."
    )
    message: int | None = Field(
        default=None,
        exclude_if=_unset,
        description="The frame index of the message the marker ends (absent for `tools`).",
    )


class SkippedBreakpoint(Frozen):
    """A cache marker the plan left out, and why."""

    after: BreakpointAfter = Field(description="Where the marker would have gone.")
    reason: SkipReason = Field(
        description="`below_minimum`: the tokens up to it are under the model's minimum "
        "cacheable length. `unstable_in_layout`: that part changes each turn in `legacy`. "
        "`limit`: more markers than the provider takes. `not_markable`: OpenAI takes no "
        "breakpoint there (on tool definitions, on an assistant message, on a part of another "
        "kind). `automatic`: the provider's own marker ends the frame there (Anthropic's "
        "automatic caching, OpenAI's implicit mode), counted in `cacheable_tokens`. "
        "`retention`: OpenAI breakpoints are not sent with `prompt_cache_retention`."
    )


class CacheControlDirective(Frozen):
    """Anthropic's top-level `cache_control`: automatic caching of the request's last block."""

    type: Literal["ephemeral"] = Field(description="Always `ephemeral`.")
    ttl: CacheTtl | None = Field(
        default=None, exclude_if=_unset, description="`1h`; absent for the 5-minute default."
    )


class DiagnosticsDirective(Frozen):
    """Anthropic's request `diagnostics`: the provider compares this request with the one that
    answered `previous_message_id` and says why its cache missed."""

    previous_message_id: str | None = Field(
        description="The previous turn's response id (`msg_…`) from its usage report; `null` on "
        "a first turn or when no report named one (the provider then only keeps this request's "
        "fingerprint for the next turn)."
    )


class PromptCacheOptionsDirective(Frozen):
    """OpenAI's `prompt_cache_options` (models with `explicit_cache_breakpoints` only)."""

    mode: Literal["explicit"] | None = Field(
        default=None,
        exclude_if=_unset,
        description="`explicit`: no breakpoint of OpenAI's own (absent: its implicit default).",
    )
    comparison_response_id: str | None = Field(
        default=None,
        exclude_if=_unset,
        description="The previous turn's response id (`resp_…`) the provider compares this "
        "request with (Responses only, with `cache.diagnostics`).",
    )


class CacheReport(Frozen):
    """`selection.cache`: this turn's cache plan and how its prefix compares with the previous
    turn's (only for a request with `cache`)."""

    # ``core/cache.py`` builds it.
    previous_preparation_id: str | None = Field(
        description="The turn compared with (`null`: a first turn)."
    )
    prefix_kept: bool | None = Field(
        description="Whether the previous turn's prefix starts this one (`null`: nothing to "
        "compare with)."
    )
    first_change: FirstChange | None = Field(
        description="The first part that changed (`null` when the prefix was kept or there is "
        "nothing to compare with)."
    )
    cacheable_tokens: int = Field(
        description="Tokens a provider can cache: up to the last marker (Anthropic); by "
        "OpenAI's rule (at least 1,024, in steps of 128) for OpenAI renders."
    )
    breakpoints: list[CacheBreakpoint] = Field(description="The markers placed.")
    skipped: list[SkippedBreakpoint] = Field(description="The markers left out, with the reason.")
    # The OpenAI options the body carries (``openai-*``) or that an adapter passes on
    # (``neutral``); absent when the request sets none.
    prompt_cache_key: str | None = Field(
        default=None,
        exclude_if=_unset,
        description="The `prompt_cache_key` (OpenAI and neutral renders, when `cache.key` is set).",
    )
    prompt_cache_retention: str | None = Field(
        default=None,
        exclude_if=_unset,
        description="The `prompt_cache_retention` (OpenAI and neutral renders, when "
        "`cache.retention` is set).",
    )
    prompt_cache_options: PromptCacheOptionsDirective | None = Field(
        default=None,
        exclude_if=_unset,
        description="The `prompt_cache_options` (OpenAI and neutral renders, models with "
        "`explicit_cache_breakpoints`, when there is one to send).",
    )
    cache_control: CacheControlDirective | None = Field(
        default=None,
        exclude_if=_unset,
        description="The top-level `cache_control` (Anthropic and neutral renders, with "
        "`cache.automatic`).",
    )
    diagnostics: DiagnosticsDirective | None = Field(
        default=None,
        exclude_if=_unset,
        description="The request's `diagnostics` (Anthropic and neutral renders, with "
        "`cache.diagnostics`).",
    )


class ManifestWarning(Frozen):
    """A fact about how the frame was made that the caller may not expect."""

    code: Literal["unknown_model", "estimate_over_window", "compaction_failed"] = Field(
        description="`unknown_model`: the model is not in the registry; its tokens are counted "
        "with the conservative estimate and its window is the request's or the fallback. "
        "`estimate_over_window`: the estimated count is over the window but the provider's may "
        "not be (it would fit were the estimated part half its size): the frame is not refused; "
        "it carries the protected data only, and the provider's count decides. "
        "`compaction_failed`: `summarize` decided to compact but the summarizer failed (or "
        "there was nothing to fold): the frame is sent uncompacted."
    )
    detail: str = Field(
        description="The same in words, naming the model and the known names nearest to it."
    )


class OutputLimit(Frozen):
    """`selection.output_limit`: the output limit a provider-shaped frame carries."""

    parameter: str = Field(
        description="The body's parameter (dotted when nested): `max_completion_tokens`, "
        "`max_output_tokens`, `max_tokens` or `generationConfig.maxOutputTokens`."
    )
    tokens: int = Field(description="Its value.")
    source: Literal["reserve", "model_maximum"] = Field(
        description="`reserve`: `response_reserve` plus `reasoning_reserve_tokens`. "
        "`model_maximum`: the model's maximum output, when the reserve is above it."
    )


class Placement(Frozen):
    """`selection.placement`: where the service's own per-turn messages stand in the frame."""

    index: int = Field(
        description="The index, in the neutral frame's messages, where the service's per-turn "
        "messages stand (the developer message of `stable-prefix`, then the data message): "
        "immediately before the latest user turn. Everything before it is the stable prefix."
    )
    count: int = Field(
        description="How many messages the service put there (0 to 2): the developer message "
        "and the data message, each only when it has content."
    )
    latest_user_turn: int | None = Field(
        description="The index in the neutral frame's messages of the latest user turn's first "
        "message, which follows them; `null` when the conversation has no user message (the "
        "service's messages then open the conversation)."
    )


class SelectionReport(Frozen):
    """The manifest: one report per block and per source, and how the counts were made."""

    blocks: list[BlockReport] = Field(description="Every block's decision, in rank order.")
    sources: list[SourceReport] = Field(description="Every source of the request.")
    max_data_tokens: int = Field(description="The request's `assembly.max_data_tokens`.")
    selected_data_tokens: int = Field(
        description="The data message as sent, in tokens (its envelope included)."
    )
    layout: Literal["legacy", "stable-prefix", "transcript"] = Field(
        description="The frame's layout."
    )
    reasoning_reserve_tokens: int = Field(description="The reasoning reserve.")
    tokenizer: Tokenizer = Field(description="The tokenizer the counts use.")
    model_entry: str | None = Field(
        default=None,
        description="The name of the registry entry (`GET /v1/models`) the model resolved to, "
        "by its name, an alias or a dated snapshot of one: the window, output limit, tokenizer "
        "and framing the counts used. `null` when the model is not in the registry "
        "(`unknown_model`).",
    )
    exact: bool = Field(
        description="Whether the counts are exact: the tokenizer is the model's own (and the "
        "history is not held by the provider)."
    )
    opaque_or_multimodal: bool = Field(
        description="Whether the frame holds parts counted conservatively (images, files, "
        "opaque or provider-held items)."
    )
    native_history: bool = Field(
        default=False,
        exclude_if=_unset,
        description="True when the provider holds the history (absent otherwise).",
    )
    placement: Placement | None = Field(
        default=None,
        exclude_if=_unset,
        description="Where the service's own per-turn messages stand in the frame (absent in "
        "records stored before it was reported).",
    )
    routing: RoutingReport | None = Field(
        default=None,
        exclude_if=_unset,
        description="How routing chose the model (only with `models`).",
    )
    cache: CacheReport | None = Field(
        default=None,
        exclude_if=_unset,
        description="The cache plan and the comparison with the previous turn (only with `cache`).",
    )
    output_limit: OutputLimit | None = Field(
        default=None,
        exclude_if=_unset,
        description="The output limit a provider-shaped frame carries (absent for `neutral`).",
    )
    compaction: CompactionReport | None = Field(
        default=None,
        exclude_if=_unset,
        description="The context pressure of the call and the compaction decision "
        "(docs/compaction.md); absent in records stored before it was reported.",
    )
    warnings: list[ManifestWarning] = Field(
        default_factory=list,
        exclude_if=lambda value: not value,
        description="What the caller should know about how this frame was made (absent when "
        "there is nothing): `unknown_model` when the model is not in the registry, "
        "`estimate_over_window` when an estimated count is over the window but the provider's "
        "may not be.",
    )


class PrepareResponse(Frozen):
    """The prepared model call: the frame to send, the budget, the manifest and the hashes."""

    preparation_id: str = Field(
        description="The preparation's id, for validate, refresh, repair, usage and the views."
    )
    model: str = Field(description="The model the frame is for (with `models`: the chosen one).")
    layout: Literal["legacy", "stable-prefix", "transcript"] = Field(
        description="The frame's layout."
    )
    render: Render = Field(description="The frame's shape.")
    frame: dict[str, Any] = Field(
        description="What to send: `{messages, tools}` for `neutral`, else the provider's "
        "request body, output limit included."
    )
    budget: BudgetReport = Field(description="The token budget.")
    selection: SelectionReport = Field(description="The manifest: every decision, explained.")
    fingerprint: str = Field(
        description="`sha256:` of the model, tenant, scope, render and rendered request: a "
        "diagnostic, not a provider cache key."
    )
    prefix_hash: str = Field(
        description="`sha256:` of the stable prefix: the model, the tools in frame order and the "
        "leading messages; validate recomputes it from the frame."
    )
    prefix_tokens: int = Field(description="The tokens of the stable prefix.")
    input_hash: str = Field(description="`sha256:` of the input messages.")
    expires_at: str = Field(
        description="When the preparation expires (RFC 3339); later calls with its id are `404`."
    )
    attempt: int = Field(
        default=1, ge=1, le=2, description="1 for a prepare, 2 for the one refresh."
    )
