"""Typed models of the service's requests and responses, named as in ``openapi/openapi.json``.

Every class here has a schema of the same name in the committed OpenAPI document, with the same
property names, the same required properties and the same closed value sets; a test in the
service repository fails when the two drift apart.

Two kinds of model:

- **Request models** (``PrepareRequest`` and what it contains, ``Frame``, ``ValidateRequest``,
  ``RepairRequest``, ``UsageRequest``) refuse unknown fields, so a misspelt option fails here
  instead of on the server. Range limits are left to the server, which reports them as
  ``InvalidRequestError`` naming the field. The client sends only the fields you set
  (``exclude_unset``), so the server's defaults apply to the rest.
- **Response models** are frozen and accept members they do not know, so a newer server that
  adds a field does not break an older client. A value outside a closed set (a new status or
  reason) is a contract change and fails validation
  (:class:`~context_assembly_client.APIResponseValidationError`).

Every method of the clients also accepts a plain ``dict`` wherever it takes a request model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AccountingReport",
    "AssemblyOptions",
    "Block",
    "BlockReport",
    "BudgetReport",
    "BudgetResponse",
    "CacheBreakpoint",
    "CacheOptions",
    "CacheReport",
    "CallKind",
    "Contribution",
    "ContributorRef",
    "FirstChange",
    "Frame",
    "Health",
    "HistoryPolicy",
    "ManifestWarning",
    "Message",
    "ModelInfo",
    "ModelList",
    "NamedChange",
    "NativeHistory",
    "NativePart",
    "Observation",
    "OpaquePart",
    "OutputLimit",
    "Plugin",
    "PreparationView",
    "PrepareRequest",
    "PrepareResponse",
    "Problem",
    "Provider",
    "RepairRequest",
    "RepairResponse",
    "Revision",
    "Routing",
    "RoutingCandidate",
    "RoutingReport",
    "Scope",
    "SelectionReport",
    "SkippedBreakpoint",
    "SourceReport",
    "TextPart",
    "Timeline",
    "TimelineTurn",
    "Tool",
    "ToolCall",
    "UsageRequest",
    "UsageResponse",
    "ValidateRequest",
    "ValidateResponse",
    "Whiteboard",
    "WhiteboardEntry",
]

Provider: TypeAlias = Literal["openai", "anthropic", "google", "normalized"]
CallKind: TypeAlias = Literal["main", "wrap_up", "repair"]
Layout: TypeAlias = Literal["legacy", "stable-prefix"]
Render: TypeAlias = Literal["neutral", "openai-chat", "openai-responses", "anthropic", "gemini"]
Revision: TypeAlias = str | int | float
"""A contributor's revision: a string or a finite number, compared for equality only."""


class RequestModel(BaseModel):
    """Base of request models: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    """Base of response models: frozen; unknown members are kept, not refused."""

    model_config = ConfigDict(extra="allow", frozen=True)


# --------------------------------------------------------------------------- messages and tools


class TextPart(RequestModel):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class OpaquePart(BaseModel):
    """An image, file or provider-opaque part, carried through as given (counts become uncertain)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image", "file", "opaque"]


ProviderFormat: TypeAlias = Literal["openai-chat", "anthropic", "openai-responses"]


class NativePart(RequestModel):
    """A provider's own content item carried as given; rendered back for ``format`` only."""

    type: Literal["native"]
    format: ProviderFormat
    item: dict[str, Any]
    text: str | None = None
    media: Literal["image", "file"] | None = None


Part: TypeAlias = Annotated[TextPart | OpaquePart | NativePart, Field(discriminator="type")]


class ToolCall(RequestModel):
    """A tool call made by an assistant message."""

    id: str
    name: str
    arguments: str | dict[str, Any] = ""
    provider_fields: dict[ProviderFormat, dict[str, Any]] | None = None


class Message(RequestModel):
    """One conversation message; ``content`` is a string or a list of parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] = ""
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    provider_fields: dict[ProviderFormat, dict[str, Any]] | None = None


class Tool(RequestModel):
    """A tool definition; ``parameters`` is a JSON Schema (strict-compatible when ``strict``)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool = False


class Plugin(RequestModel):
    """A legacy plugin source: its instructions and its content view."""

    name: str
    instructions: str | None = None
    content: str | None = None


class Frame(RequestModel):
    """The neutral frame: messages in dispatch order and the tool definitions."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)


# --------------------------------------------------------------------------- sources


class Block(RequestModel):
    """One piece of source data a contributor offers."""

    id: str
    text: str
    priority: int = 0
    protected: bool = False
    dependencies: list[str] = Field(default_factory=list)
    expires_at: str | None = None
    projection: str | None = None


class ContributorRef(RequestModel):
    """A contributor for a source: a registered ``endpoint`` name or an inline ``url``; with
    ``kind="mcp"``, an inline MCP server read with ``resources`` and ``tool``."""

    source: str
    endpoint: str | None = None
    url: str | None = None
    instructions: str | None = None
    failure_policy: Literal["fail", "omit"] | None = None
    recovery_tool: str | None = None
    kind: Literal["webhook", "mcp"] = "webhook"
    resources: list[str] | Literal["listed"] | None = None
    tool: str | None = None
    tool_arguments: dict[str, Any] | None = None


class Contribution(RequestModel):
    """Blocks the host already has, carried inline in the request."""

    source: str
    revision: Revision
    blocks: list[Block] = Field(default_factory=list)
    instructions: str | None = None
    recovery_tool: str | None = None


class WhiteboardEntry(RequestModel):
    """One whiteboard entry; the built-in adapter turns it into a block."""

    key: str
    description: str = ""
    value: Any = None
    priority: Literal["low", "normal", "high", "critical"] = "normal"


class Whiteboard(RequestModel):
    """The whiteboard source and its entries."""

    source: str
    entries: list[WhiteboardEntry] = Field(default_factory=list)
    recovery_tool: str | None = None


class Scope(RequestModel):
    """Who and what the call is for; contributors authorise their reads against it."""

    account_id: str | None = None
    connector_accounts: dict[str, str] = Field(default_factory=dict)
    task_id: str | None = None
    principal: str | None = None
    identities: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- requests


class HistoryPolicy(RequestModel):
    """How history may be compacted when the frame does not fit."""

    mode: Literal["none", "drop_oldest"] = "none"
    keep_last_messages: int = 2


class AssemblyOptions(RequestModel):
    """The ``assembly`` options of a prepare request (server defaults shown)."""

    max_data_tokens: int = 2048
    source_token_limits: dict[str, int] = Field(default_factory=dict)
    layout: Layout = "legacy"
    reasoning_reserve_tokens: int = 0
    timeout_ms: int = 1000
    max_blocks: int = 128
    max_block_characters: int = 65_536
    tokenizer: Literal["auto", "o200k_base", "cl100k_base", "estimate"] = "auto"
    history_policy: HistoryPolicy = Field(default_factory=HistoryPolicy)


class NativeHistory(RequestModel):
    """A conversation the provider holds (previous response id, compacted item), given as its
    provider-counted size instead of messages."""

    native: Literal[True]
    provider_counted_tokens: int
    opaque: bool = True


class Routing(RequestModel):
    """Managed routing over ``models``: the first candidate whose window fits."""

    policy: Literal["first_fit"] = "first_fit"


class CacheOptions(RequestModel):
    """Provider cache directives a request opts in to, and the turn to explain it against.

    ``previous_preparation_id``: leave it unset for the latest preparation of the same tenant
    and scope, set it to ``None`` for a first turn, or to the previous turn's id.
    """

    breakpoints: bool = False
    ttl: Literal["5m", "1h"] = "5m"
    key: str | None = None
    retention: Literal["in_memory", "24h"] | None = None
    previous_preparation_id: str | None = None


class PrepareRequest(RequestModel):
    """The body of ``prepare``, ``budget`` and ``refresh`` (docs/api.md, "POST /v1/prepare").

    Give exactly one of ``model`` or ``models`` (candidates in preference order, with
    ``routing``); ``history`` is a message list or a :class:`NativeHistory`.
    """

    model: str | None = None
    models: list[str] | None = None
    routing: Routing | None = None
    max_context_tokens: int | None = None
    max_context_source: Literal["host", "provider"] = "host"
    response_reserve: int = 4096
    assembly: AssemblyOptions | None = None
    instructions: str = ""
    plugins: list[Plugin] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    history: list[Message] | NativeHistory = Field(default_factory=list)
    input: list[Message] = Field(default_factory=list)
    contributors: list[ContributorRef] = Field(default_factory=list)
    contributions: list[Contribution] = Field(default_factory=list)
    whiteboard: Whiteboard | None = None
    scope: Scope = Field(default_factory=Scope)
    timezone: str = "UTC"
    render: Render = "neutral"
    input_format: Literal["auto", "neutral", "openai-chat", "anthropic", "openai-responses"] = (
        "auto"
    )
    cache: CacheOptions | None = None


class ValidateRequest(RequestModel):
    """The body of ``validate``: the neutral frame the host is about to send."""

    model: str
    scope: Scope = Field(default_factory=Scope)
    frame: Frame


class RepairRequest(RequestModel):
    """The body of ``repair``: the dispatched frame and the model's unformatted answer."""

    model: str
    scope: Scope = Field(default_factory=Scope)
    instructions: str = ""
    frame: Frame
    answer: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class UsageRequest(RequestModel):
    """The body of ``report_usage``: the provider's usage object as received."""

    report_id: str
    provider: Provider
    call: CallKind = "main"
    usage: dict[str, Any]


# --------------------------------------------------------------------------- responses


class BudgetReport(ResponseModel):
    """Where the window goes: capacity, reserves, each part's tokens, what remains for data."""

    capacity: int
    capacity_source: Literal["host", "provider", "registry", "fallback"]
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
    provider_counted_tokens: int | None = None


class BlockReport(ResponseModel):
    """The decision on one block: status, reason and what it costs in this request."""

    source: str
    id: str
    status: Literal["selected", "projected", "omitted"]
    reason: Literal[
        "protected",
        "dependency",
        "fits",
        "projection_fits",
        "expired",
        "missing_dependency",
        "budget",
        "source_budget",
        "source_failed",
        "binary_content",
    ]
    tokens: int
    full_tokens: int
    projection_tokens: int | None
    priority: int
    protected: bool
    dependencies: list[str]


class SourceReport(ResponseModel):
    """How one source fared: its kind, status, time taken and number of blocks."""

    source: str
    kind: Literal["webhook", "mcp", "inline", "whiteboard"]
    status: Literal[
        "ok", "inline", "timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"
    ]
    duration_ms: float
    block_count: int


class RoutingCandidate(ResponseModel):
    """One candidate routing tried: its window, what the request needs, and the outcome."""

    model: str
    capacity: int
    capacity_source: Literal["host", "provider", "registry", "fallback"]
    tokenizer: Literal["o200k_base", "cl100k_base", "estimate"]
    fits: bool
    needed_tokens: int
    shortfall_tokens: int
    reason: Literal["fits", "window", "fits_after_compaction"]


class RoutingReport(ResponseModel):
    """How managed routing chose the model (requests with ``models`` only)."""

    policy: Literal["first_fit"]
    chosen: str
    pinned: bool = False
    candidates: list[RoutingCandidate]


class FirstChange(ResponseModel):
    """The first part of the prefix that differs from the previous turn's."""

    part: Literal["model", "tools", "instructions", "layout", "history"]
    index: int | None


class CacheBreakpoint(ResponseModel):
    after: Literal["tools", "instructions", "history"]
    tokens: int
    ttl: Literal["5m", "1h"]
    message: int | None = None


class SkippedBreakpoint(ResponseModel):
    after: Literal["tools", "instructions", "history"]
    reason: Literal["below_minimum", "unstable_in_layout", "limit"]


class CacheReport(ResponseModel):
    """``selection.cache``: the turn's cache plan and its prefix against the previous turn's."""

    previous_preparation_id: str | None
    prefix_kept: bool | None
    first_change: FirstChange | None
    cacheable_tokens: int
    breakpoints: list[CacheBreakpoint]
    skipped: list[SkippedBreakpoint]
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None


class ManifestWarning(ResponseModel):
    """A fact about how the frame was made that the caller may not expect."""

    code: Literal["unknown_model"]
    detail: str


class OutputLimit(ResponseModel):
    """``selection.output_limit``: the output-limit parameter a provider frame carries."""

    parameter: str
    tokens: int
    source: Literal["reserve", "model_maximum"]


class SelectionReport(ResponseModel):
    """The manifest: every block's decision, every source's outcome, and the totals."""

    blocks: list[BlockReport]
    sources: list[SourceReport]
    max_data_tokens: int
    selected_data_tokens: int
    layout: Layout
    reasoning_reserve_tokens: int
    tokenizer: Literal["o200k_base", "cl100k_base", "estimate"]
    exact: bool
    opaque_or_multimodal: bool
    native_history: bool = False
    routing: RoutingReport | None = None
    cache: CacheReport | None = None
    output_limit: OutputLimit | None = None
    warnings: list[ManifestWarning] = Field(default_factory=list)


class PrepareResponse(ResponseModel):
    """The answer of ``prepare`` and ``refresh``: frame, manifest, budget and hashes."""

    preparation_id: str
    model: str
    layout: Layout
    render: Render
    frame: dict[str, Any]
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int = 1


class BudgetResponse(ResponseModel):
    """The answer of ``budget``: what is already materialisable; no contributor was called."""

    model: str
    budget: BudgetReport
    selection: SelectionReport
    pending_sources: list[str]


class ValidateResponse(ResponseModel):
    """The answer of a successful ``validate`` (a stale one raises ``StaleError``)."""

    valid: Literal[True] = True
    preparation_id: str
    checked_at: str


class RepairResponse(ResponseModel):
    """The answer of ``repair``: the repair frame and its estimated input tokens."""

    preparation_id: str
    frame: dict[str, Any]
    estimated_input_tokens: int


class Observation(ResponseModel):
    """One recorded provider usage report, normalised, with its delta to the estimate."""

    provider: Provider
    call: CallKind
    report_id: str
    observed_at: str
    provider_input_tokens: int | None
    input_token_delta: int | None
    cached_input_tokens: int | None
    # What the preparation's cache plan expects the provider to report as cached (``None``: a
    # repair call, or a server without the figure).
    expected_cached_tokens: int | None = None
    cache_creation_input_tokens: int | None
    output_tokens: int | None


class AccountingReport(ResponseModel):
    """The estimate and the last main/wrap-up and auxiliary (repair) observations."""

    estimated_input_tokens: int
    last: Observation | None
    auxiliary: Observation | None


class UsageResponse(ResponseModel):
    """The answer of ``report_usage``: the preparation's accounting after the report."""

    preparation_id: str
    accounting: AccountingReport


class NamedChange(ResponseModel):
    """``first_change`` with the names the record keeps: the tool's name (``name``, and
    ``previous_name`` when another was there), the history message's ``role``, or the model
    and layout before and after; ``change`` is ``changed``, ``added`` or ``removed``."""

    part: Literal["model", "tools", "instructions", "layout", "history"]
    index: int | None
    change: Literal["changed", "added", "removed"] | None = None
    name: str | None = None
    previous_name: str | None = None
    role: str | None = None


class TimelineTurn(ResponseModel):
    """One turn of a timeline page: its number, figures, how its prefix compared with the
    previous turn's, why the expected cached tokens are what they are, and its ``miss``:
    ``prefix_changed``, ``expired`` or ``provider`` (fewer cached tokens reported than
    expected)."""

    turn: int | None
    preparation_id: str
    created_at: str | None
    model: str
    render: str
    layout: str
    total_input_tokens: int
    previous_preparation_id: str | None
    prefix_kept: bool | None
    first_change: NamedChange | None
    cacheable_tokens: int | None
    expected_cached_tokens: int | None
    expected_reason: (
        Literal[
            "first_turn",
            "previous_unknown",
            "prefix_changed",
            "no_provider_cache",
            "expired",
            "nothing_cacheable",
            "previous_nothing_cacheable",
            "cached",
        ]
        | None
    )
    seconds_since_previous: float | None
    cache_lifetime_seconds: float | None
    cached_input_tokens: int | None
    miss: Literal["prefix_changed", "expired", "provider"] | None


class Timeline(ResponseModel):
    """``GET /v1/preparations/{id}/timeline``: a page of the conversation's turns, oldest first
    (at most 50); ``older_before`` is the ``before`` of the page of older turns."""

    preparation_id: str
    turns: list[TimelineTurn]
    older_before: int | None


class PreparationView(ResponseModel):
    """The answer of ``get_preparation``: everything stored, never block bodies."""

    preparation_id: str
    model: str
    layout: Layout
    render: str
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int
    refresh_used: bool
    accounting: AccountingReport


class ModelInfo(ResponseModel):
    """One model of the capacity registry."""

    name: str
    provider: str
    context_window: int | None
    max_output_tokens: int | None
    tokenizer: str
    tokens_per_message: int
    tokens_per_name: int
    reply_priming: int
    tokens_per_tool: int
    min_cacheable_prefix: int | None


class ModelList(ResponseModel):
    """The answer of ``models``: the registry and the fallback window."""

    models: list[ModelInfo]
    fallback_context_window: int


class Health(ResponseModel):
    """The answer of ``health``."""

    status: str


class Problem(ResponseModel):
    """An RFC 9457 problem body; ``code`` is one of the service's error codes.

    Errors carry the body as a plain dict (``APIStatusError.problem``); this model documents its
    standard members and can parse it: ``Problem.model_validate(err.problem)``.
    """

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
