"""Wire models of a prepare request (SPEC §3.1); the field names are the public contract.

Models are frozen and reject unknown fields. Shape and option ranges are checked here; the block
rules of SPEC §5.1 that need the whole request (limits, duplicates, cycles) live in ``blocks.py``
so that their errors can name the offending ``source/id``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

MAX_OPTION = 1_000_000


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


Part = Annotated[TextPart | OpaquePart, Field(discriminator="type")]


class ToolCall(Frozen):
    id: StrictStr
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = ""


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(Frozen):
    role: Role
    content: StrictStr | list[Part] = ""
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None


class Tool(Frozen):
    name: StrictStr = Field(min_length=1, max_length=256)
    description: StrictStr = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class Plugin(Frozen):
    name: StrictStr = Field(min_length=1, max_length=256)
    instructions: StrictStr | None = None
    content: StrictStr | None = None


# --------------------------------------------------------------------------- blocks and sources

Revision = StrictStr | StrictInt | StrictFloat


def _finite_revision(value: Revision) -> Revision:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("revision must be a finite number or a string")
    return value


class Block(Frozen):
    """One piece of source data. Field rules needing the request's limits are in ``blocks.py``."""

    id: StrictStr
    text: StrictStr
    priority: StrictInt = 0
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

    _revision_finite = field_validator("revision")(_finite_revision)


class WhiteboardEntry(Frozen):
    key: StrictStr
    description: StrictStr = ""
    value: Any = None
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


class PrepareRequest(Frozen):
    """The body of ``POST /v1/prepare`` and ``POST /v1/budget``, and the CLI's input."""

    model: StrictStr = Field(min_length=1, max_length=256)
    max_context_tokens: StrictInt | None = Field(default=None, ge=1, le=100_000_000)
    max_context_source: Literal["host", "provider"] = "host"
    response_reserve: StrictInt = Field(default=4096, ge=0, le=100_000_000)
    assembly: AssemblyOptions | None = None
    instructions: StrictStr = ""
    plugins: list[Plugin] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    history: list[Message] = Field(default_factory=list)
    input: list[Message] = Field(default_factory=list)
    contributors: list[ContributorRef] = Field(default_factory=list)
    contributions: list[Contribution] = Field(default_factory=list)
    whiteboard: Whiteboard | None = None
    scope: Scope = Field(default_factory=Scope)
    timezone: StrictStr = "UTC"
    render: Render = "neutral"

    @property
    def options(self) -> AssemblyOptions:
        """The assembly options in force (the defaults when the request gives none)."""
        return self.assembly if self.assembly is not None else DEFAULT_ASSEMBLY

    @property
    def has_sources(self) -> bool:
        """Whether any source is replaced by contributed blocks in this request."""
        return bool(self.contributors or self.contributions or self.whiteboard is not None)
