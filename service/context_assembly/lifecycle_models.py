"""The request bodies and answers of the lifecycle calls (docs/contract.md, "Lifecycle"):
validate, repair, usage, budget and the reads (a preparation, its timeline). Models only: the
calls themselves are ``preparations/operations.py``; prepare's and refresh's own body and
answer are ``core/request.py`` and ``core/result.py``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr

from context_assembly.core.frame import Frame
from context_assembly.core.request import Frozen, JsonObject, Scope
from context_assembly.core.result import BudgetReport, CachePart, SelectionReport
from context_assembly.core.usage import CallKind, Provider

_MODEL = "The model the frame is for: the preparation's (with `models`, the chosen one)."
_SCOPE = "The request's `scope` (a changed one is `scope_changed`)."


class ValidateRequest(Frozen):
    """The final check right before dispatch, with what is about to be sent."""

    model: StrictStr = Field(min_length=1, description=_MODEL)
    scope: Scope = Field(default_factory=Scope, description=_SCOPE)
    frame: Frame = Field(
        description="The neutral frame about to be sent; its prefix and input must be the "
        "preparation's (`prefix_changed`, `input_changed`)."
    )


class ValidateResponse(Frozen):
    """The preparation still holds: send the frame."""

    valid: Literal[True] = Field(default=True, description="Always `true` (a stale one is `409`).")
    preparation_id: str = Field(description="The preparation checked.")
    checked_at: str = Field(description="When it was checked (RFC 3339).")


class RepairRequest(Frozen):
    """A structured-output repair call after the model answered; no contributor is called."""

    model: StrictStr = Field(min_length=1, description=_MODEL)
    scope: Scope = Field(default_factory=Scope, description=_SCOPE)
    instructions: StrictStr = Field(
        default="",
        description="The request's `instructions` (a changed one is `instructions_changed`).",
    )
    frame: Frame = Field(description="The neutral frame that was dispatched.")
    answer: StrictStr = Field(description="The model's answer, to be given again as JSON.")
    schema_: JsonObject | None = Field(
        default=None,
        alias="schema",
        description="A JSON schema the answer must match; the repair request names it.",
    )


class RepairResponse(Frozen):
    """The repair call's frame: the dispatched frame, the answer and a user message asking for
    the answer as JSON."""

    preparation_id: str = Field(description="The preparation repaired.")
    frame: dict[str, Any] = Field(description="What to send, in the preparation's render.")
    estimated_input_tokens: int = Field(description="The frame's input tokens, as counted.")


class UsageRequest(Frozen):
    """The provider's usage object for a call made with this preparation."""

    report_id: StrictStr = Field(
        min_length=1,
        max_length=256,
        description="Your id of the report (the provider's response id serves); the same id "
        "twice changes nothing.",
    )
    provider: Provider = Field(
        description="The shape of `usage`: `openai` (Chat or Responses), `anthropic`, `google`, "
        "or `normalized` (the four fields of an observation, by name)."
    )
    call: CallKind = Field(
        default="main",
        description="`main`: the call with the frame; `wrap_up`: a follow-up call with it; "
        "`repair`: the repair frame's call.",
    )
    usage: JsonObject = Field(description="The provider's usage object, exactly as received.")
    response_id: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The provider's id of the response the usage came with (an OpenAI "
        "`chatcmpl-…` or `resp_…`, an Anthropic `msg_…`), kept with the observation; absent when "
        "the provider gave none.",
    )
    diagnostics: JsonObject | None = Field(
        default=None,
        description="The provider's cache diagnostics object of that response, exactly as "
        "received (Anthropic's `diagnostics`, OpenAI's `prompt_cache_diagnostics`), kept with the "
        "observation; absent when the provider returned none.",
    )


MissCause = Literal["model", "layout", "tools", "instructions", "history", "expired", "provider"]
"""Why a main call missed the cache: the first part of the prefix that changed, or the kind of
the other misses (``CacheMiss``)."""


class CostReport(Frozen):
    """What one usage report cost at the model's price, per bucket and in total (USD, rounded
    to 1e-9)."""

    currency: Literal["USD"] = Field(description="Always `USD`.")
    uncached_input: float = Field(
        description="Input tokens neither read from nor written to the cache."
    )
    cache_read: float = Field(description="Input tokens read from the cache.")
    cache_write_5m: float = Field(
        description="Input tokens written to the cache for 5 minutes (Anthropic)."
    )
    cache_write_1h: float = Field(
        description="Input tokens written to the cache for 1 hour (Anthropic)."
    )
    cache_write: float = Field(
        description="Input tokens written to the cache at the model's one write rate (OpenAI "
        "GPT-5.6 and later)."
    )
    output: float = Field(description="Generated tokens, reasoning included.")
    total: float = Field(description="The whole report.")
    # ``None``: a report stored before the figure was kept.
    miss: float | None = Field(
        default=None,
        description="What the call's cache miss cost: `total` less what the call would have "
        "cost had its `rebilled_tokens` been read from the cache (taken from its cache writes "
        "first, then from its uncached input). 0 without a miss; `null` for a wrap-up or repair "
        "call, when `rebilled_tokens` is `null`, or when the price has no cache read rate.",
    )
    long_context: bool = Field(description="Whether the long-context rates applied.")
    price: str = Field(description="The registry entry whose price applied.")
    price_source: Literal["shipped", "configured"] = Field(
        description="Where that price comes from (`GET /v1/models` shows it)."
    )


class Observation(Frozen):
    """One usage report, normalised to the same meaning across providers (`null`: the provider
    did not say)."""

    provider: Provider = Field(description="The shape the report came in.")
    call: CallKind = Field(description="The call it was for.")
    report_id: str = Field(description="The report's id.")
    observed_at: str = Field(description="When it was recorded (RFC 3339).")
    provider_input_tokens: int | None = Field(
        description="Every input token the provider processed, cached or not."
    )
    input_token_delta: int | None = Field(
        description="`provider_input_tokens` minus the service's estimate."
    )
    cached_input_tokens: int | None = Field(
        description="The part of the input read from the provider's cache."
    )
    # ``None``: a repair call, or a report stored before the figure existed.
    expected_cached_tokens: int | None = Field(
        default=None,
        description="The cached input tokens the preparation's cache plan expects for this call "
        "(`null` for a repair call).",
    )
    cache_creation_input_tokens: int | None = Field(
        description="The part of the input written to the provider's cache."
    )
    output_tokens: int | None = Field(description="Generated tokens, reasoning included.")
    # ``None``: the report named none, or it was stored before the field existed.
    response_id: str | None = Field(
        default=None, description="The provider's response id the report named (`null`: none)."
    )
    diagnostics: JsonObject | None = Field(
        default=None,
        description="The provider's cache diagnostics object the report carried (`null`: none).",
    )
    # ``None``: a wrap-up or repair call, or a report stored before the figures were kept.
    miss_cause: MissCause | None = Field(
        default=None,
        description="Why this main call read less from the cache than it could have: the "
        "first part of the prefix that changed from the previous turn's (`model`, `layout`, "
        "`tools`, `instructions`, `history`), `expired` (the previous turn was older than the "
        "provider keeps a cached prefix) or `provider` (the provider reported fewer cached "
        "tokens than expected). `null` without a miss, and for a wrap-up or repair call.",
    )
    rebilled_tokens: int | None = Field(
        default=None,
        description="Input tokens of this main call that its cache miss billed again: what it "
        "would have read from the cache without the miss, less what it read (0 without a "
        "miss). Without the miss means: the expected cached tokens for `provider`; the "
        "smaller of this turn's and the previous turn's cacheable tokens for `expired`, and "
        "for a changed prefix when the previous turn was within the cache lifetime. `null` "
        "for a wrap-up or repair call, and for a preparation stored before the figures were "
        "kept.",
    )
    # ``None``: no price for the model, or a report stored before costs were kept.
    cost: CostReport | None = Field(
        default=None,
        description="What the call cost at the model's price (`null`: the model has no price, "
        "or the report's buckets cannot be priced; never a guess).",
    )


class AccountingReport(Frozen):
    """The service's estimate beside the provider's reports."""

    estimated_input_tokens: int = Field(description="The frame's input tokens, as counted.")
    last: Observation | None = Field(description="The latest `main` or `wrap_up` report.")
    auxiliary: Observation | None = Field(description="The latest `repair` report.")


class UsageResponse(Frozen):
    """The preparation's accounting after the report."""

    preparation_id: str = Field(description="The preparation reported on.")
    accounting: AccountingReport = Field(description="Its accounting.")


class PreparationView(Frozen):
    """Everything stored about one preparation: never block texts, instructions, history or
    input (the record does not hold them)."""

    preparation_id: str = Field(description="The preparation's id.")
    model: str = Field(description="The model the frame is for.")
    layout: Literal["legacy", "stable-prefix", "transcript"] = Field(
        description="The frame's layout."
    )
    render: str = Field(description="The frame's shape.")
    budget: BudgetReport = Field(description="The token budget, as prepare answered it.")
    selection: SelectionReport = Field(description="The manifest, as prepare answered it.")
    fingerprint: str = Field(description="The fingerprint, as prepare answered it.")
    prefix_hash: str = Field(description="The hash of the stable prefix.")
    prefix_tokens: int = Field(description="The tokens of the stable prefix.")
    input_hash: str = Field(description="The hash of the input messages.")
    expires_at: str = Field(description="When the preparation expires (RFC 3339).")
    attempt: int = Field(description="1, or 2 after the refresh.")
    refresh_used: bool = Field(description="Whether the one refresh is used up.")
    accounting: AccountingReport = Field(description="The estimate and the usage reports.")


class BudgetResponse(Frozen):
    """What is already materialisable (inline contributions, the whiteboard, legacy views),
    counted and selected; no contributor is called and nothing is stored."""

    model: str = Field(description="The model counted for (with `models`, the chosen one).")
    budget: BudgetReport = Field(description="The token budget.")
    selection: SelectionReport = Field(description="The manifest of what is materialisable.")
    pending_sources: list[str] = Field(
        description="The webhook sources, not called here (prepare calls them)."
    )


ChangeKind = Literal["changed", "added", "removed"]
ExpectedReason = Literal[
    "first_turn",
    "previous_unknown",
    "prefix_changed",
    "no_provider_cache",
    "expired",
    "nothing_cacheable",
    "previous_nothing_cacheable",
    "cached",
]
CacheMiss = Literal["prefix_changed", "expired", "provider"]


class NamedChange(Frozen):
    """``first_change`` of ``selection.cache`` with the names the record keeps (never a text):
    which tool, which history message and its role, which model or layout."""

    part: CachePart = Field(
        description="The first part of the prefix that differs from the previous turn's, in "
        "prefix order: model (with the render target), layout, tools, instructions, history."
    )
    index: int | None = Field(
        description="tools and history: the first tool definition (frame order) or history "
        "message that differs, or where one list ended; null for the other parts."
    )
    change: ChangeKind | None = Field(
        default=None,
        description="changed: the item at index differs; added: a tool the previous turn did "
        "not have (tools are laid out by name, so it may shift others); removed: a tool the "
        "previous turn had, or a history cut short there. Null for a record made before it was "
        "kept.",
    )
    name: str | None = Field(
        default=None,
        description="tools: the tool's name (the previous turn's when removed); model: the model "
        "and render target; layout: the layout. Null for instructions and history.",
    )
    previous_name: str | None = Field(
        default=None,
        description="The previous turn's name at the same place when it is another: the tool "
        "replaced there, the model or layout before.",
    )
    role: str | None = Field(
        default=None,
        description="history: the role of this turn's message at index (null when removed).",
    )


class TurnCompaction(Frozen):
    """A timeline turn's compaction decision (`selection.compaction` of its preparation)."""

    decision: str = Field(description="`none`, `compact` or `clear_tool_results`.")
    reason: str | None = Field(description="Why (`selection.compaction.reason`).")


class TimelineTurn(Frozen):
    """One preparation of a timeline: its figures, how its prefix compared with the one before
    (``prefix_kept``/``first_change`` as in ``selection.cache``) and why the cached tokens are
    what they are."""

    turn: int | None = Field(
        description="The turn's number in its conversation: 1 when compared with nothing, the "
        "previous turn's plus one otherwise (a refresh keeps its turn's). Null for a record "
        "made before numbers were kept."
    )
    preparation_id: str = Field(description="The preparation of this turn.")
    created_at: str | None = Field(description="When the turn was prepared (RFC 3339, UTC).")
    model: str = Field(description="The model assembled for (the routed one).")
    render: str = Field(description="The render target of the frame.")
    layout: str = Field(description="The layout of the frame.")
    total_input_tokens: int = Field(description="The frame's estimated input tokens.")
    previous_preparation_id: str | None = Field(
        description="The preparation this turn was compared with (null: a first turn)."
    )
    prefix_kept: bool | None = Field(
        description="Whether the previous turn's prefix starts this one (null: nothing to "
        "compare with)."
    )
    first_change: NamedChange | None = Field(
        description="The first part of the prefix that changed, by name (null when kept)."
    )
    cacheable_tokens: int | None = Field(
        description="Tokens of this turn's prefix a provider can cache (selection.cache)."
    )
    expected_cached_tokens: int | None = Field(
        description="The cached input tokens this turn's call can be expected to report."
    )
    expected_reason: ExpectedReason | None = Field(
        description="Why expected_cached_tokens is what it is: first_turn, previous_unknown "
        "(the previous preparation is unknown or expired), prefix_changed, no_provider_cache "
        "(the render target has none the service models), expired (the previous turn is older "
        "than the provider keeps a prefix), nothing_cacheable (this turn's prefix is below the "
        "model's minimum, or no marker was asked for), previous_nothing_cacheable (the previous "
        "turn cached nothing), or cached. Null for a record made before it was kept."
    )
    seconds_since_previous: float | None = Field(
        description="Seconds between the previous turn and this one (null: no previous turn)."
    )
    cache_lifetime_seconds: float | None = Field(
        description="How long the provider keeps a cached prefix after its last use, for this "
        "turn's render target and cache options (null: no cache the service models)."
    )
    cached_input_tokens: int | None = Field(
        description="The cached input tokens the provider reported for the main call (null: "
        "no usage report)."
    )
    cache_write_tokens: int | None = Field(
        default=None,
        description="The cache writes the provider reported for the turn's latest main or "
        "wrap-up call (null: no usage report, or none reported).",
    )
    cost: float | None = Field(
        default=None,
        description="What the turn's latest main or wrap-up call cost in USD at the model's "
        "price, from its usage report (null: no report, or no price).",
    )
    rebilled_tokens: int | None = Field(
        default=None,
        description="The input tokens the turn's main call paid again because of its miss "
        "(the usage report's `rebilled_tokens`; 0 without a miss). Null: no usage report, the "
        "latest one is not of the main call, or the preparation was stored before the figure "
        "was kept.",
    )
    miss_cost: float | None = Field(
        default=None,
        description="What the miss cost in USD: what the main call paid less what it would "
        "have paid had its rebilled_tokens been read from the cache (the usage report's "
        "`cost.miss`; 0 without a miss). Null: no usage report, the latest one is not of the "
        "main call, no price (or no cache read rate), or no rebilled_tokens.",
    )
    miss: CacheMiss | None = Field(
        description="A turn that read less from the cache than it could have: prefix_changed "
        "(the prefix differs from the previous turn's), expired (the previous turn is older "
        "than the provider's cache lifetime) or provider (the provider reported fewer cached "
        "tokens than expected). Null otherwise."
    )
    compaction: TurnCompaction | None = Field(
        default=None,
        description="The turn's compaction decision (docs/compaction.md); null for a turn "
        "stored before decisions were recorded.",
    )


class Timeline(Frozen):
    """``GET /v1/preparations/{id}/timeline``: a page of the preparation's conversation, the
    preparation and the turns before it in its scope, oldest first (50 at most: the newest,
    or those before the turn ``before`` names)."""

    preparation_id: str = Field(description="The preparation whose conversation is shown.")
    turns: list[TimelineTurn] = Field(description="The turns of this page, oldest first.")
    older_before: int | None = Field(
        description="The before value of the page of older turns (the oldest turn shown here); "
        "null when no older turn is live."
    )
    cost: float | None = Field(
        default=None,
        description="The cost in USD of the page's turns that have one (null: none has).",
    )
    miss_cost: float | None = Field(
        default=None,
        description="The miss_cost in USD of the page's turns that have one (null: none has).",
    )
