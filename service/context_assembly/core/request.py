"""Wire models of a prepare request (SPEC §3.1); the field names are the public contract.

Models are frozen and reject unknown fields. Shape and option ranges are checked here; the block
rules of SPEC §5.1 that need the whole request (limits, duplicates, cycles) live in ``blocks.py``
so that their errors can name the offending ``source/id``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from context_assembly.core.provider_messages import (
    InputFormat,
    ProviderFormat,
    ShapeError,
    to_neutral,
)
from context_assembly.core.strict_schema import strict_problems

MAX_OPTION = 1_000_000


def _encodable(value: Any) -> Any:
    """Free-form JSON must encode again: the service serialises it to count, hash, render and
    store, and an integer beyond 64 bits cannot be (it would fail there, as a 500); nor can
    ``NaN``, ``Infinity`` or a number too large for a float (``1e400``), which the JSON parser
    reads and orjson would write as ``null``: the prompt would silently say something else."""
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError as err:
        raise PydanticCustomError(
            "json_encodable", "JSON the service cannot encode again: {reason}", {"reason": str(err)}
        ) from None
    if b"null" in encoded and not _finite(value):  # a non-finite float encodes as null
        raise PydanticCustomError(
            "json_encodable",
            "JSON the service cannot encode again: {reason}",
            {"reason": "NaN, Infinity or a number beyond the float range"},
        )
    return value


def _finite(value: Any) -> bool:
    """Whether ``value`` holds no non-finite float at any depth."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(item) for item in value)
    return True


# A free-form JSON object (or value) that the service can encode again (see ``_encodable``).
JsonObject = Annotated[dict[str, Any], AfterValidator(_encodable)]
JsonValue = Annotated[Any, AfterValidator(_encodable)]


class Frozen(BaseModel):
    """Base of every wire value: immutable, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- messages


class TextPart(Frozen):
    type: Literal["text"]
    text: StrictStr


class OpaquePart(BaseModel):
    """An image, file or provider-opaque item: carried through as given, counted conservatively."""

    model_config = ConfigDict(frozen=True, extra="allow")
    type: Literal["image", "file", "opaque"]

    @model_validator(mode="after")
    def _extra_encodable(self) -> OpaquePart:
        _encodable(self.model_extra)
        return self


class NativePart(Frozen):
    """A provider's own content item, carried as given (``core/provider_messages.py``): the
    renderer of ``format`` sends ``item`` back unchanged; another renderer refuses it by name.

    ``text`` is what the service counts for it (exact); without it the part counts as an image
    or a file (``media``) or as its compact JSON, and makes the counts uncertain.
    """

    type: Literal["native"]
    format: ProviderFormat
    item: JsonObject
    text: StrictStr | None = Field(default=None, exclude_if=lambda value: value is None)
    media: Literal["image", "file"] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


Part = Annotated[TextPart | OpaquePart | NativePart, Field(discriminator="type")]

# Fields of a provider's message or call that the neutral shape has no place for, kept under the
# format's name and sent back by that format's renderer only.
ProviderFields = dict[ProviderFormat, JsonObject]


def _no_fields(value: object) -> bool:
    return value is None


class ToolCall(Frozen):
    id: StrictStr
    name: StrictStr
    arguments: StrictStr | JsonObject = ""
    provider_fields: ProviderFields | None = Field(default=None, exclude_if=_no_fields)


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(Frozen):
    role: Role
    content: StrictStr | list[Part] = ""
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    provider_fields: ProviderFields | None = Field(default=None, exclude_if=_no_fields)


class Tool(Frozen):
    """A tool definition. ``strict: true`` asks the provider to hold the model's arguments to the
    schema (OpenAI and Anthropic); the schema must then be strict-compatible
    (``core/strict_schema.py``). Left out of dumps when false, so that the counts and hashes of a
    tool without it stay as they were."""

    name: StrictStr = Field(min_length=1, max_length=256)
    description: StrictStr = ""
    parameters: JsonObject = Field(default_factory=dict)
    strict: StrictBool = Field(default=False, exclude_if=lambda value: value is False)

    @model_validator(mode="after")
    def _strict_compatible(self) -> Tool:
        if self.strict:
            problems = list(strict_problems(self.parameters))
            if problems:
                raise ValueError(
                    f"tool {self.name!r} is strict but its schema is not strict-compatible: "
                    + "; ".join(problems)
                )
        return self


class Plugin(Frozen):
    name: StrictStr = Field(min_length=1, max_length=256)
    instructions: StrictStr | None = None
    content: StrictStr | None = None


# --------------------------------------------------------------------------- blocks and sources

Revision = StrictStr | StrictInt | StrictFloat

# The integers the service keeps and serialises (orjson: records, hashes, answers) must fit in
# 64 bits; a larger one would fail there, as a 500. Signed, as most JSON parsers keep them exactly.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


def finite_revision(value: Revision) -> Revision:
    """A revision is a string, a finite number, or an integer within 64 bits (signed)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("revision must be a finite number or a string")
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"an integer revision must be within {INT64_MIN}..{INT64_MAX}")
    return value


class Block(Frozen):
    """One piece of source data. Field rules needing the request's limits are in ``blocks.py``."""

    id: StrictStr
    text: StrictStr
    # Within 64 bits here, so that any block can be hashed; the range SPEC §5.1 allows
    # (-1000..1000) is a block rule (``blocks.py``), reported with the block's id. The schema
    # stays a plain integer (OpenAPI's bounds are floats, which cannot say 2**63 - 1).
    priority: Annotated[
        StrictInt, Field(ge=INT64_MIN, le=INT64_MAX), WithJsonSchema({"type": "integer"})
    ] = 0
    protected: StrictBool = False
    dependencies: list[StrictStr] = Field(default_factory=list)
    expires_at: StrictStr | None = None
    projection: StrictStr | None = None


class ContributorRef(Frozen):
    """A remote webhook contributor: a registered ``endpoint`` name or an inline ``url``."""

    source: StrictStr = Field(min_length=1)
    endpoint: StrictStr | None = None
    url: StrictStr | None = None
    instructions: StrictStr | None = None
    failure_policy: Literal["fail", "omit"] | None = None
    recovery_tool: StrictStr | None = None

    @model_validator(mode="after")
    def _one_target(self) -> ContributorRef:
        if (self.endpoint is None) == (self.url is None):
            raise ValueError("give exactly one of 'endpoint' or 'url'")
        return self


class Contribution(Frozen):
    """Blocks the host already has, carried in the request (an inline contributor)."""

    source: StrictStr = Field(min_length=1)
    revision: Revision
    blocks: list[Block] = Field(default_factory=list)
    instructions: StrictStr | None = None
    recovery_tool: StrictStr | None = None

    _revision_finite = field_validator("revision")(finite_revision)


class WhiteboardEntry(Frozen):
    key: StrictStr
    description: StrictStr = ""
    value: JsonValue = None
    priority: Literal["low", "normal", "high", "critical"] = "normal"


class Whiteboard(Frozen):
    source: StrictStr = Field(min_length=1)
    entries: list[WhiteboardEntry] = Field(default_factory=list)
    recovery_tool: StrictStr | None = None


class Scope(Frozen):
    account_id: StrictStr | None = None
    connector_accounts: dict[str, StrictStr] = Field(default_factory=dict)
    task_id: StrictStr | None = None
    principal: StrictStr | None = None
    identities: list[StrictStr] = Field(default_factory=list)
    roles: list[StrictStr] = Field(default_factory=list)


# --------------------------------------------------------------------------- history and routing


class NativeHistory(Frozen):
    """The conversation is held by the provider (a previous response id, a server-side compacted
    item): the service never sees it and cannot hash, count or compact it.

    ``provider_counted_tokens`` is the provider's count of that held state: the tokens the
    provider adds to what this request sends (instructions, tools, data and input are sent fresh
    and counted by the service). It replaces the counted history in the budget.
    ``opaque`` (default true) says the held state may contain items whose content the service
    cannot know (compacted or encrypted items); it sets ``selection.opaque_or_multimodal``.
    """

    native: Literal[True]
    provider_counted_tokens: StrictInt = Field(ge=0, le=100_000_000)
    opaque: StrictBool = True


class Routing(Frozen):
    """Managed routing over ``models``: ``first_fit`` takes the first candidate, in the request's
    preference order, whose window fits the fixed content, the protected closure and the reserves.
    """

    policy: Literal["first_fit"] = "first_fit"


ModelName = Annotated[StrictStr, Field(min_length=1, max_length=256)]
MAX_MODELS = 8
_MESSAGES = TypeAdapter(list[Message])


# --------------------------------------------------------------------------- options


class HistoryPolicy(Frozen):
    mode: Literal["none", "drop_oldest"] = "none"
    keep_last_messages: StrictInt = Field(default=2, ge=0, le=MAX_OPTION)


TokenLimit = Annotated[StrictInt, Field(ge=0, le=MAX_OPTION)]


class AssemblyOptions(Frozen):
    max_data_tokens: TokenLimit = 2048
    source_token_limits: dict[str, TokenLimit] = Field(default_factory=dict)
    layout: Literal["legacy", "stable-prefix"] = "legacy"
    reasoning_reserve_tokens: TokenLimit = 0
    timeout_ms: StrictInt = Field(default=1000, ge=1, le=30_000)
    max_blocks: StrictInt = Field(default=128, ge=0, le=2048)
    max_block_characters: StrictInt = Field(default=65_536, ge=1, le=MAX_OPTION)
    tokenizer: Literal["auto", "o200k_base", "cl100k_base", "estimate"] = "auto"
    history_policy: HistoryPolicy = Field(default_factory=HistoryPolicy)


DEFAULT_ASSEMBLY = AssemblyOptions()

Render = Literal["neutral", "openai-chat", "openai-responses", "anthropic", "gemini"]


PREPARATION_ID_PATTERN: Final = r"^prep_[A-Za-z0-9_-]+$"


class CacheOptions(Frozen):
    """Provider cache directives the caller opts in to, and the turn to explain this one against.

    ``breakpoints``: for ``render: "anthropic"`` the body carries ``cache_control`` markers where
    ``core/cache.py`` plans them (``neutral`` shows the plan in the manifest only; the other
    renderers ignore it). ``ttl``: the markers' lifetime. ``key``: the OpenAI
    ``prompt_cache_key`` (``openai-chat``, ``openai-responses``): this string, or for ``"auto"``
    a short hash of tenant and scope. ``retention``: OpenAI's ``prompt_cache_retention``.

    ``previous_preparation_id``: absent means the previous turn is the latest preparation of the
    same tenant and scope; ``null`` means this is a first turn (``previous_given`` tells the two
    apart); else the id of the previous turn's preparation.
    """

    breakpoints: StrictBool = False
    ttl: Literal["5m", "1h"] = "5m"
    key: StrictStr | None = Field(default=None, min_length=1, max_length=64)
    retention: Literal["in_memory", "24h"] | None = None
    previous_preparation_id: StrictStr | None = Field(
        default=None, max_length=128, pattern=PREPARATION_ID_PATTERN
    )

    @property
    def previous_given(self) -> bool:
        """Whether the request names its previous turn (an id, or ``null`` for a first turn)."""
        return "previous_preparation_id" in self.model_fields_set


def read_conversation(data: Any, fields: tuple[str, ...]) -> Any:
    """``data`` (a request body) with the provider-shaped messages of ``fields`` read into
    neutral ones, by the body's ``input_format``; an unreadable message is an error at its
    place (``history.3.content.1``). A bad ``input_format`` is left for the model to report."""
    if not isinstance(data, dict):
        return data
    declared = data.get("input_format", "auto")
    if declared not in ("auto", "neutral", "openai-chat", "anthropic", "openai-responses"):
        return data
    read = dict(data)
    for field in fields:
        if isinstance(read.get(field), list):
            try:
                read[field] = to_neutral(read[field], declared)
            except ShapeError as err:
                raise _located_error((field, *err.loc), err.message) from None
    return read


def _located_error(loc: tuple[str | int, ...], message: str) -> ValidationError:
    return ValidationError.from_exception_data(
        "PrepareRequest",
        [InitErrorDetails(type=PydanticCustomError("message_shape", message), loc=loc, input=None)],
    )


def _field_error(field: str, message: str) -> ValidationError:
    """A request-level rule reported at the field it concerns (``loc`` names the field)."""
    return ValidationError.from_exception_data(
        "PrepareRequest",
        [
            InitErrorDetails(
                type=PydanticCustomError("request_rule", message), loc=(field,), input=None
            )
        ],
    )


class PrepareRequest(Frozen):
    """The body of ``POST /v1/prepare`` and ``POST /v1/budget``, and the CLI's input.

    Give exactly one of ``model`` (one model, as always) or ``models`` (1..8 distinct candidates
    in preference order, managed routing; ``routing`` defaults to ``{"policy": "first_fit"}`` and
    is refused without ``models``). With ``models`` each candidate's capacity comes from the model
    registry (else the fallback window), so ``max_context_tokens`` is refused as ambiguous: one
    host figure cannot be every candidate's window (``max_context_source`` is then unused, as it
    is whenever ``max_context_tokens`` is absent). The response's ``model`` is the chosen
    candidate and the preparation is bound to it.

    ``history`` is either the message list (as always) or a ``NativeHistory`` object when
    the provider holds the conversation: the budget then takes ``provider_counted_tokens`` as the
    history term, and the frame carries no history messages (the provider-held state sits right
    after the leading instructions message; everything else is assembled fresh after it).

    ``cache`` (``CacheOptions``) opts in to provider cache directives and to ``selection.cache``
    (``core/cache.py``); without it the answer is what it is without the field.
    """

    model: StrictStr | None = Field(default=None, min_length=1, max_length=256)
    models: list[ModelName] | None = Field(default=None, min_length=1, max_length=MAX_MODELS)
    routing: Routing | None = None
    max_context_tokens: StrictInt | None = Field(default=None, ge=1, le=100_000_000)
    max_context_source: Literal["host", "provider"] = "host"
    response_reserve: StrictInt = Field(default=4096, ge=0, le=100_000_000)
    assembly: AssemblyOptions | None = None
    instructions: StrictStr = ""
    plugins: list[Plugin] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    history: list[Message] | NativeHistory = Field(default_factory=list)
    input: list[Message] = Field(default_factory=list)
    contributors: list[ContributorRef] = Field(default_factory=list)
    contributions: list[Contribution] = Field(default_factory=list)
    whiteboard: Whiteboard | None = None
    scope: Scope = Field(default_factory=Scope)
    timezone: StrictStr = "UTC"
    render: Render = "neutral"
    # How ``history`` and ``input`` are read (``core/provider_messages.py``); left out of dumps
    # when "auto", so that the hashes of a request without it stay as they were.
    input_format: InputFormat = Field(default="auto", exclude_if=lambda value: value == "auto")
    # Left out of dumps when absent, so that the hashes of a request without it stay as they were.
    cache: CacheOptions | None = Field(default=None, exclude_if=lambda value: value is None)

    @model_validator(mode="before")
    @classmethod
    def _provider_shapes(cls, data: Any) -> Any:
        return read_conversation(data, ("history", "input"))

    @field_validator("history", mode="wrap")
    @classmethod
    def _history(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Dispatch by JSON type so that errors name ``history.<i>.<field>`` (or
        # ``history.<field>``), not the members of a union.
        if isinstance(value, dict):
            return NativeHistory.model_validate(value)
        if isinstance(value, NativeHistory):
            return value
        return _MESSAGES.validate_python(value)

    @model_validator(mode="after")
    def _model_or_models(self) -> PrepareRequest:
        if (self.model is None) == (self.models is None):
            raise _field_error("model", "give exactly one of 'model' or 'models'")
        if self.models is None:
            if self.routing is not None:
                raise _field_error("routing", "'routing' is only allowed with 'models'")
            return self
        if len(set(self.models)) != len(self.models):
            raise _field_error("models", "'models' must not name a model twice")
        if self.max_context_tokens is not None:
            raise _field_error(
                "max_context_tokens",
                "'max_context_tokens' is ambiguous with 'models': each candidate's window comes "
                "from the model registry",
            )
        return self

    @model_validator(mode="after")
    def _output_room(self) -> PrepareRequest:
        # A provider frame's output limit is the reserve (``render.output_limit``); providers
        # refuse a limit of 0 (Anthropic requires ``max_tokens`` >= 1).
        reserve = self.response_reserve + self.options.reasoning_reserve_tokens
        if self.render != "neutral" and reserve == 0:
            raise _field_error(
                "response_reserve",
                f"render {self.render!r} carries the reserve as the frame's output limit: "
                "'response_reserve' plus 'assembly.reasoning_reserve_tokens' must be at least 1",
            )
        return self

    @property
    def model_name(self) -> str:
        """The model of this request: ``model``, or before routing the first (preferred) candidate.

        The engine assembles a routed request as a copy whose ``model`` is the chosen candidate.
        """
        if self.model is not None:
            return self.model
        assert self.models
        return self.models[0]

    @property
    def candidates(self) -> list[str]:
        """The models this request may be assembled for, in preference order."""
        return list(self.models) if self.models is not None else [self.model_name]

    @property
    def native_history(self) -> NativeHistory | None:
        """The provider-held history descriptor, or ``None`` when the history is a message list."""
        return self.history if isinstance(self.history, NativeHistory) else None

    @property
    def history_messages(self) -> list[Message]:
        """The history messages this request sends (none when the history is native)."""
        return [] if isinstance(self.history, NativeHistory) else list(self.history)

    @property
    def options(self) -> AssemblyOptions:
        """The assembly options in force (the defaults when the request gives none)."""
        return self.assembly if self.assembly is not None else DEFAULT_ASSEMBLY
