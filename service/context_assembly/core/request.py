"""Wire models of a prepare request (docs/api.md, "POST /v1/prepare"); the field names are the public contract.

Models are frozen and reject unknown fields. Shape and option ranges are checked here; the block
rules (docs/contract.md, "Block rules") that need the whole request (limits, duplicates, cycles) live in ``blocks.py``
so that their errors can name the offending ``source/id``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from context_assembly.core.pairing import Located, PairingViolation, first_violation
from context_assembly.core.provider_messages import (
    InputFormat,
    Origin,
    ProviderFormat,
    ShapeError,
    read_located,
    read_messages,
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


def wire_schema(schema: JsonDict, cls: type[Any] | None = None) -> None:
    """How a wire model's JSON schema reads in the OpenAPI document: its properties carry a
    description and no title. ReDoc labels each member of a union with the property's title when
    the member has none, so an optional field read ``Model (string) or Model (null) (Model)``;
    untitled, it reads ``string or null``. A field whose default is an empty list or object
    made anew for each instance (``default_factory``), which pydantic leaves out of the schema,
    states it (``"default": []``), as generated clients read defaults from the document. (A
    ``json_schema_extra`` hook of every wire model.)"""
    properties = schema.get("properties")
    if isinstance(properties, dict):
        fields = {} if cls is None else cls.model_fields
        for name, prop in properties.items():
            if isinstance(prop, dict):
                prop.pop("title", None)
                field = fields.get(name)
                if field is not None and field.default_factory in (list, dict):
                    prop.setdefault("default", field.default_factory())


def refusing(*cases: tuple[str, JsonDict]) -> Callable[[JsonDict, type[Any]], None]:
    """A ``json_schema_extra`` hook that also says, in the schema, which combinations of fields
    the model refuses (``not`` any of ``cases``, each described). A field that is absent or
    ``null`` counts as not given, as the model reads it."""

    def extra(schema: JsonDict, cls: type[Any]) -> None:
        wire_schema(schema, cls)
        schema["not"] = {"anyOf": [{"description": why, **case} for why, case in cases]}

    return extra


def given(**types: str) -> JsonDict:
    """The schema of an object in which each named field is given (present, not ``null``) with
    its JSON type."""
    return {
        "required": list(types),
        "properties": {name: {"type": json_type} for name, json_type in types.items()},
    }


def not_given(*fields: str) -> JsonDict:
    """The schema of an object in which none of ``fields`` is given (each absent or ``null``)."""
    return {"properties": {name: {"type": "null"} for name in fields}}


# A ``history`` or ``input`` item in a provider's own shape, as the document states it: the
# schema of a neutral ``Message`` cannot describe three providers' shapes, so the document says
# what the service accepts (an object) and the service checks it (a 422 naming the message and
# part it cannot read).
PROVIDER_MESSAGE: Final[JsonDict] = {
    "type": "object",
    "title": "ProviderMessage",
    "description": "A message of the OpenAI Chat or Anthropic Messages shape, or an OpenAI "
    "Responses item, as the provider's SDK writes it; read into the neutral shape with nothing "
    "lost (`input_format`).",
    "additionalProperties": True,
}


def messages_schema(schema: JsonDict) -> None:
    """A ``json_schema_extra`` hook of ``history`` and ``input``: each item is a neutral
    ``Message`` or a provider's message (``PROVIDER_MESSAGE``)."""
    options = schema.get("anyOf", [schema])
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and option.get("type") == "array":
            option["items"] = {"anyOf": [option["items"], PROVIDER_MESSAGE]}


class Frozen(BaseModel):
    """Base of every wire value: immutable, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=wire_schema)


# --------------------------------------------------------------------------- messages


class TextPart(Frozen):
    """A text part of a message's content."""

    type: Literal["text"] = Field(description="Always `text`.")
    text: StrictStr = Field(description="The text.")


class OpaquePart(BaseModel):
    """An image, a file or another item the service cannot read: carried through as given, with
    any other fields it has, and counted with a conservative figure (it sets
    `selection.opaque_or_multimodal`)."""

    model_config = ConfigDict(frozen=True, extra="allow", json_schema_extra=wire_schema)
    type: Literal["image", "file", "opaque"] = Field(
        description="`image`, `file` or `opaque`; the part's other fields are kept as given."
    )

    @model_validator(mode="after")
    def _extra_encodable(self) -> OpaquePart:
        _encodable(self.model_extra)
        return self


class NativePart(Frozen):
    """A provider's own content item that the neutral shape has no words for (a thinking block,
    a server-tool result, ...), carried as given: the render of its `format` sends `item` back
    unchanged; another render refuses it, naming the frame message and part."""

    # Read from provider-shaped messages by ``core/provider_messages.py``. ``text`` is what the
    # service counts for it (exact); without it the part counts as an image or a file
    # (``media``) or as its compact JSON, and makes the counts uncertain.
    type: Literal["native"] = Field(description="Always `native`.")
    format: ProviderFormat = Field(
        description="The provider format the item comes from: the only render that sends it."
    )
    item: JsonObject = Field(description="The provider's content item, sent back unchanged.")
    text: StrictStr | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="The item's text, counted exactly; absent when it has none.",
    )
    media: Literal["image", "file"] | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="`image` or `file` when the item is one: counted with a conservative figure. "
        "An item with neither `text` nor `media` counts as its compact JSON.",
    )


Part = Annotated[TextPart | OpaquePart | NativePart, Field(discriminator="type")]

# Fields of a provider's message or call that the neutral shape has no place for, kept under the
# format's name and sent back by that format's renderer only.
ProviderFields = dict[ProviderFormat, JsonObject]


def _no_fields(value: object) -> bool:
    return value is None


_PROVIDER_FIELDS = (
    "fields of the provider's shape that the neutral one has no place for, under the format's "
    "name; sent back by that format's render only"
)


class ToolCall(Frozen):
    """A tool call of an assistant message."""

    id: StrictStr = Field(description="The call's id; the `tool` message that answers it names it.")
    name: StrictStr = Field(description="The name of the tool called.")
    arguments: StrictStr | JsonObject = Field(
        default="", description="The arguments: the JSON text the model wrote, or an object."
    )
    provider_fields: ProviderFields | None = Field(
        default=None,
        exclude_if=_no_fields,
        description=f"The call's {_PROVIDER_FIELDS}.",
    )


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(Frozen):
    """A message of the neutral shape. `history` and `input` also take OpenAI Chat, Anthropic
    Messages and OpenAI Responses messages, read into this shape with nothing lost."""

    role: Role = Field(description="`system`, `developer`, `user`, `assistant` or `tool`.")
    content: StrictStr | list[Part] = Field(
        default="",
        description="Text, or a list of parts: `text`, `image`, `file`, `opaque` or `native`.",
    )
    name: StrictStr | None = Field(default=None, description="The author's name, if any.")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="An assistant message's tool calls."
    )
    tool_call_id: StrictStr | None = Field(
        default=None, description="A `tool` message's answer to this call id."
    )
    provider_fields: ProviderFields | None = Field(
        default=None,
        exclude_if=_no_fields,
        description=f"The message's {_PROVIDER_FIELDS} (a Responses item's `id` and `status`).",
    )


class Tool(Frozen):
    """A tool definition, sent with the frame in the provider's own form."""

    # ``strict`` is checked by ``core/strict_schema.py``, and left out of dumps when false, so
    # that the counts and hashes of a tool without it match those of a tool that never had it.
    name: StrictStr = Field(min_length=1, max_length=256, description="The tool's name.")
    description: StrictStr = Field(default="", description="What the tool does, for the model.")
    parameters: JsonObject = Field(
        default_factory=dict, description="The JSON schema of the tool's arguments."
    )
    strict: StrictBool = Field(
        default=False,
        exclude_if=lambda value: value is False,
        description="Ask the provider to hold the model's arguments to `parameters` (OpenAI "
        "Chat `function.strict`, Anthropic `strict`; the Responses render always sends `strict`; "
        "Gemini has no such flag). The schema must then be strict-compatible: the root is an "
        "object schema, and every object sets `additionalProperties: false` and lists all its "
        "`properties` in `required`.",
    )

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
    """A plugin of the host: its instructions, and its legacy content view unless a source of
    this request (a contributor, an inline contribution or the whiteboard) replaces it."""

    name: StrictStr = Field(
        min_length=1,
        max_length=256,
        description="The plugin's name; each source of the request names the plugin it replaces.",
    )
    instructions: StrictStr | None = Field(
        default=None,
        description="The plugin's instructions, in the leading system message under its name.",
    )
    content: StrictStr | None = Field(
        default=None,
        description="The plugin's legacy content view, placed as it is (`legacy_data_tokens`) "
        "unless a source replaces it.",
    )


# --------------------------------------------------------------------------- blocks and sources

Revision = StrictStr | StrictInt | StrictFloat

# The integers the service keeps and serialises (orjson: records, hashes, answers) must fit in
# 64 bits; a larger one would fail there, as a 500. Signed, as most JSON parsers keep them exactly.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
# The priorities a block may have (docs/contract.md, "Block rules"): enforced by the block rules
# (``blocks.py``) and stated in the schema.
MIN_PRIORITY: Final = -1000
MAX_PRIORITY: Final = 1000


# The schema of a revision: the integer member says the 64-bit range (as floats, the form
# OpenAPI bounds take: -2**63 and 2**63 are exact, hence the exclusive maximum). A JSON number
# cannot be told from an integer by its schema, so a large integer still matches ``number``;
# the description says the rule.
REVISION_SCHEMA: Final[JsonDict] = {
    "anyOf": [
        {"type": "string"},
        {"type": "integer", "minimum": INT64_MIN, "exclusiveMaximum": INT64_MAX + 1},
        {"type": "number"},
    ]
}


def finite_revision(value: Revision) -> Revision:
    """A revision is a string, a finite number, or an integer within 64 bits (signed)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("revision must be a finite number or a string")
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"an integer revision must be within {INT64_MIN}..{INT64_MAX}")
    return value


class Block(Frozen):
    """One piece of source data: selected in full, projected (its shorter `projection` sent
    instead) or omitted, each with a reason."""

    # Field rules needing the request's limits are in ``blocks.py``.
    id: StrictStr = Field(
        description="The block's id, unique in its source; other blocks name it `source/id`."
    )
    text: StrictStr = Field(
        description="The text the model reads in the data message (at most "
        "`assembly.max_block_characters` characters)."
    )
    # Within 64 bits here, so that any block can be hashed; the range the block rules allow
    # (-1000..1000, docs/contract.md) is checked in ``blocks.py`` and reported with the block's
    # id. The schema says that range, which the service enforces for every block of a request.
    priority: Annotated[
        StrictInt,
        Field(ge=INT64_MIN, le=INT64_MAX),
        WithJsonSchema({"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY}),
    ] = Field(
        default=0,
        description="Optional blocks are chosen by priority, highest first (ties by `source/id`).",
    )
    protected: StrictBool = Field(
        default=False,
        description="Always selected, with its dependencies; a request whose protected blocks do "
        "not fit the data limit is refused (`CONTEXT_ASSEMBLY_OVERFLOW`).",
    )
    dependencies: list[StrictStr] = Field(
        default_factory=list,
        description="Blocks this one needs, as `source/id`: it is chosen only with all of them.",
    )
    expires_at: StrictStr | None = Field(
        default=None,
        description="An RFC 3339 time after which the block is omitted as `expired` (an expired "
        "protected block, or protected block's dependency, is a `422`).",
    )
    projection: StrictStr | None = Field(
        default=None,
        description="A shorter text sent instead when the full text does not fit (`projected`).",
    )


_INSTRUCTIONS = (
    "Instructions that replace the plugin's for this request (`null` drops them); absent, the "
    "plugin's own stay."
)
_RECOVERY_TOOL = (
    "A tool the model can call to read an entry that is not shown; the plugin's note names it."
)


MAX_INLINE_RESOURCES: Final = 64
"""Resource URIs an inline MCP contributor may pin (as many as ``"listed"`` reads at most)."""

_MCP_OPTION = 'Only with `kind: "mcp"`.'
_MCP_RESOURCES: JsonDict = {
    "required": ["resources"],
    "properties": {"resources": {"type": ["array", "string"]}},
}


class ContributorRef(Frozen):
    """A contributor the service calls during the prepare, within `assembly.timeout_ms`: a
    registered `endpoint` or an allowlisted `url` (exactly one). A `url` is a webhook, or with
    `kind: "mcp"` an MCP server's Streamable HTTP endpoint, read with `resources` and `tool`."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra=refusing(
            ("both `endpoint` and `url`", given(endpoint="string", url="string")),
            ("neither `endpoint` nor `url`", not_given("endpoint", "url")),
            (
                "`kind` with `endpoint` (a registered contributor's kind is its registration's)",
                given(endpoint="string", kind="string"),
            ),
            (
                '`resources`, `tool` or `tool_arguments` without `kind: "mcp"`',
                {
                    "anyOf": [_MCP_RESOURCES, given(tool="string"), given(tool_arguments="object")],
                    "not": {"required": ["kind"], "properties": {"kind": {"const": "mcp"}}},
                },
            ),
            (
                '`kind: "mcp"` without `resources` or `tool`',
                {
                    "required": ["kind"],
                    "properties": {
                        "kind": {"const": "mcp"},
                        "resources": {"type": "null"},
                        "tool": {"type": "null"},
                    },
                },
            ),
            (
                "`tool_arguments` without `tool`",
                {
                    "required": ["tool_arguments"],
                    "properties": {"tool_arguments": {"type": "object"}, "tool": {"type": "null"}},
                },
            ),
        ),
    )

    source: StrictStr = Field(
        min_length=1, description="The plugin whose content view the answered blocks replace."
    )
    endpoint: StrictStr | None = Field(
        default=None,
        description="The name of a contributor registered in the configuration "
        "(`[contributors.<name>]`), of the kind registered there.",
    )
    url: StrictStr | None = Field(
        default=None,
        description="An inline contributor URL; only one the `[inline_urls]` allowlist admits, "
        "resolving to an allowed address (else `CONTRIBUTOR_URL_REJECTED`).",
    )
    instructions: StrictStr | None = Field(default=None, description=_INSTRUCTIONS)
    failure_policy: Literal["fail", "omit"] | None = Field(
        default=None,
        description="When the call fails: `fail` fails the prepare (`502`, or `504` past the "
        "deadline); `omit` leaves the source out and goes on. Absent: the registration's "
        "policy, `fail` for a `url`.",
    )
    recovery_tool: StrictStr | None = Field(default=None, description=_RECOVERY_TOOL)
    kind: Literal["webhook", "mcp"] = Field(
        default="webhook",
        exclude_if=lambda value: value == "webhook",
        description="What the `url` speaks: `webhook` (the contributor protocol) or `mcp` (an "
        "MCP server over Streamable HTTP). Only with `url`: a registered `endpoint` has the "
        "kind of its registration.",
    )
    resources: (
        Annotated[
            list[Annotated[StrictStr, Field(min_length=1)]],
            Field(
                min_length=1,
                max_length=MAX_INLINE_RESOURCES,
                json_schema_extra={"uniqueItems": True},
            ),
        ]
        | Literal["listed"]
        | None
    ) = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="The MCP server's resources read every prepare: their URIs (1 to "
        f"{MAX_INLINE_RESOURCES}, none twice), or `listed`: those the server lists for the "
        f"assistant (`annotations.audience`), the {MAX_INLINE_RESOURCES} of highest priority. "
        + _MCP_OPTION,
    )
    tool: StrictStr | None = Field(
        default=None,
        min_length=1,
        exclude_if=lambda value: value is None,
        description="One read-only tool of the MCP server called every prepare. " + _MCP_OPTION,
    )
    tool_arguments: JsonObject | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="The tool's arguments; in every string, `{input}` is replaced by the text of "
        "the last `user` input message. Only with `tool`.",
    )

    @field_validator("kind")
    @classmethod
    def _kind_of_url(cls, value: str, info: ValidationInfo) -> str:
        # Only a kind given in the body reaches here (defaults are not validated).
        if info.data.get("endpoint") is not None:
            raise ValueError(
                "kind is for a url only: a registered endpoint has the kind of its registration"
            )
        return value

    @field_validator("resources", "tool", "tool_arguments")
    @classmethod
    def _mcp_option(cls, value: Any, info: ValidationInfo) -> Any:
        # A kind that failed its own check is not in ``info.data``: its error is enough.
        if value is not None and info.data.get("kind", "mcp") != "mcp":
            raise ValueError(f'{info.field_name} is for kind "mcp" only')
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError("a resource URI is listed twice")
        if info.field_name == "tool_arguments" and value is not None and "tool" in info.data:
            if info.data["tool"] is None:
                raise ValueError("tool_arguments needs a tool")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> ContributorRef:
        if (self.endpoint is None) == (self.url is None):
            raise ValueError("give exactly one of 'endpoint' or 'url'")
        if self.kind == "mcp" and self.resources is None and self.tool is None:
            raise ValueError('kind "mcp" needs resources, a tool, or both')
        return self


class Contribution(Frozen):
    """Blocks the host already has, sent in the request (an inline source)."""

    source: StrictStr = Field(
        min_length=1, description="The plugin whose content view these blocks replace."
    )
    revision: Annotated[Revision, WithJsonSchema(REVISION_SCHEMA)] = Field(
        description="The version of these blocks: a string, a finite number or an integer "
        "within signed 64 bits."
    )
    blocks: list[Block] = Field(default_factory=list, description="The blocks.")
    instructions: StrictStr | None = Field(default=None, description=_INSTRUCTIONS)
    recovery_tool: StrictStr | None = Field(default=None, description=_RECOVERY_TOOL)

    _revision_finite = field_validator("revision")(finite_revision)


class WhiteboardEntry(Frozen):
    """One saved entry: a block whose text is the description, a newline and the value, and whose
    projection is the description."""

    key: StrictStr = Field(description="The entry's key: its block id.")
    description: StrictStr = Field(
        default="",
        description="What the entry holds: the first line of its text, and its projection.",
    )
    value: JsonValue = Field(
        default=None, description="Any JSON: a string as it is, anything else as compact JSON."
    )
    priority: Literal["low", "normal", "high", "critical"] = Field(
        default="normal",
        description="`low`, `normal` or `high` rank the entry among optional blocks; a "
        "`critical` entry is protected.",
    )


class Whiteboard(Frozen):
    """Entries the host keeps (a memory, a scratchpad), turned into the blocks of one source."""

    source: StrictStr = Field(
        min_length=1, description="The plugin whose content view the entries replace."
    )
    entries: list[WhiteboardEntry] = Field(default_factory=list, description="The entries.")
    recovery_tool: StrictStr | None = Field(default=None, description=_RECOVERY_TOOL)


class Scope(Frozen):
    """Whom and what the call is for. Contributors receive it; validate, refresh and repair refuse
    a changed one (`scope_changed`); the turns of one tenant and scope form a conversation (cache
    plans, the timeline)."""

    account_id: StrictStr | None = Field(default=None, description="The account the call is for.")
    connector_accounts: dict[str, StrictStr] = Field(
        default_factory=dict, description="Per connector, the account the call uses there."
    )
    task_id: StrictStr | None = Field(default=None, description="The task the call belongs to.")
    principal: StrictStr | None = Field(
        default=None, description="Who the agent acts for (a user or a service)."
    )
    identities: list[StrictStr] = Field(
        default_factory=list, description="The principal's identities."
    )
    roles: list[StrictStr] = Field(default_factory=list, description="The principal's roles.")


# --------------------------------------------------------------------------- history and routing


class NativeHistory(Frozen):
    """A conversation the provider holds (a previous response id, a server-side compacted item):
    the service never sees it, so it cannot hash, count or compact it. The frame carries no
    history messages; the provider-held state goes right after the leading instructions."""

    native: Literal[True] = Field(description="Always `true`: the provider holds the history.")
    provider_counted_tokens: StrictInt = Field(
        ge=0,
        le=100_000_000,
        description="The provider's count of the state it holds: the tokens it adds to what this "
        "request sends. The budget's history term.",
    )
    opaque: StrictBool = Field(
        default=True,
        description="The held state may contain items whose content the service cannot know "
        "(compacted or encrypted); sets `selection.opaque_or_multimodal`.",
    )


class Routing(Frozen):
    """Managed routing over `models`."""

    policy: Literal["first_fit"] = Field(
        default="first_fit",
        description="`first_fit`: the first candidate, in the order of `models`, whose window "
        "holds the fixed content, the reserves and the protected blocks.",
    )


ModelName = Annotated[StrictStr, Field(min_length=1, max_length=256)]
MAX_MODELS = 8
_MESSAGES = TypeAdapter(list[Message])
# The lists of a message validated apart when it is a large one (``_messages``).
_LISTS: Final[dict[str, TypeAdapter[Any]]] = {
    "content": TypeAdapter(list[Part]),
    "tool_calls": TypeAdapter(list[ToolCall]),
}


# --------------------------------------------------------------------------- options


class HistoryPolicy(Frozen):
    """What happens when the frame does not fit the window."""

    mode: Literal["none", "drop_oldest"] = Field(
        default="none",
        description="`none`: the history stays whole, and a frame that cannot fit is "
        "`CONTEXT_OVERFLOW`. `drop_oldest`: the oldest history messages are dropped (a tool call "
        "with its results) until it fits; never the latest user turn or what follows it.",
    )
    keep_last_messages: StrictInt = Field(
        default=2,
        ge=0,
        le=MAX_OPTION,
        description="With `drop_oldest`: how many of the newest messages are never dropped.",
    )


TokenLimit = Annotated[StrictInt, Field(ge=0, le=MAX_OPTION)]


class CompactionOptions(Frozen):
    """When the service says the conversation should be compacted, and whether it acts
    (docs/compaction.md). The decision is in every answer (`selection.compaction`)."""

    mode: Literal["report", "native", "summarize", "clear_tool_results"] = Field(
        default="report",
        description="`report`: decide and say, the caller compacts. `native`: the frame asks "
        "the provider to compact at the trigger (Anthropic and OpenAI Responses renders). "
        "`summarize`: the service's summarizer contributor folds the history before the latest "
        "user turn into one summary message. `clear_tool_results`: old tool results are "
        "replaced with a placeholder naming the call.",
    )
    trigger_fraction: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="The trigger as a share of the model's window (unless `trigger_tokens`).",
    )
    trigger_tokens: StrictInt | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="The trigger in input tokens; takes the place of `trigger_fraction`.",
    )
    keep_tool_results: StrictInt = Field(
        default=3,
        ge=0,
        le=MAX_OPTION,
        description="`clear_tool_results`: the newest tool results never cleared.",
    )
    clear_at_least: TokenLimit = Field(
        default=5_000,
        description="`clear_tool_results`: clearing fires only when it removes at least this "
        "many tokens (so the cache prefix is broken for a worthwhile gain, not for each result).",
    )
    exclude_tools: list[StrictStr] = Field(
        default_factory=list,
        max_length=256,
        description="`clear_tool_results`: tools whose results are never cleared.",
    )
    horizon_turns: StrictInt = Field(
        default=10,
        ge=1,
        le=1000,
        description="The turns ahead over which carrying the history is priced against "
        "compacting it (`selection.compaction.economics`).",
    )
    summary_tokens: TokenLimit = Field(
        default=2_000,
        description="The expected size of a summary, for the price comparison; `summarize` asks "
        "the summarizer for at most this many tokens.",
    )
    summarizer: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="`summarize`: the registered contributor endpoint (`[contributors.NAME]`, a "
        "webhook) that writes the summary.",
    )

    @model_validator(mode="after")
    def _summarizer_for_summarize(self) -> CompactionOptions:
        if (self.mode == "summarize") != (self.summarizer is not None):
            raise ValueError("'summarizer' is given with mode 'summarize', and only with it")
        return self


DEFAULT_COMPACTION: Final = CompactionOptions()


class AssemblyOptions(Frozen):
    """How the frame is assembled: the data limits, the layout, the contributors' deadline."""

    max_data_tokens: TokenLimit = Field(
        default=2048,
        description="The most tokens the data message may take; the data limit is the smaller of "
        "this and the window left after the fixed parts and the reserves.",
    )
    source_token_limits: dict[str, TokenLimit] = Field(
        default_factory=dict,
        description="Per source (a plugin's name), the most tokens its blocks may take.",
    )
    layout: Literal["legacy", "stable-prefix", "transcript"] = Field(
        default="legacy",
        description="`legacy`: one leading system message with the instructions, the legacy "
        "views and the date line. `stable-prefix`: the system message holds only the "
        "instructions and tools are sorted by name, so the prefix stays the same from turn to "
        "turn; the legacy views and the date line go in a developer message. `transcript`: as "
        "`stable-prefix`, but the developer and data messages of earlier turns of the scope stay "
        "where they stood, so each turn's frame begins with the previous turn's; new data is "
        "sent as what the transcript does not hold yet. The service's per-turn messages stand "
        "right before the latest user turn (`selection.placement`), never between a tool call "
        "and its results.",
    )
    reasoning_reserve_tokens: TokenLimit = Field(
        default=0,
        description="Tokens kept free for reasoning or thinking, beside `response_reserve`.",
    )
    timeout_ms: StrictInt = Field(
        default=1000,
        ge=1,
        le=30_000,
        description="The one deadline of all contributor calls of the prepare, in milliseconds.",
    )
    max_blocks: StrictInt = Field(
        default=128,
        ge=0,
        le=2048,
        description="The most blocks the preparation may have (all sources together).",
    )
    max_block_characters: StrictInt = Field(
        default=65_536,
        ge=1,
        le=MAX_OPTION,
        description="The longest text or projection a block may have, in characters.",
    )
    tokenizer: Literal["auto", "o200k_base", "cl100k_base", "estimate"] = Field(
        default="auto",
        description="`auto`: the model's own tokenizer, or the conservative `estimate` for a "
        "model without a public one; or one named here.",
    )
    history_policy: HistoryPolicy = Field(
        default_factory=HistoryPolicy,
        description="Whether the oldest history may be dropped when the frame does not fit.",
    )
    # Left out of dumps when the defaults, so that the shape hash of a request without it
    # matches that of records stored without the field.
    compaction: CompactionOptions = Field(
        default_factory=CompactionOptions,
        exclude_if=lambda value: value == DEFAULT_COMPACTION,
        description="When the conversation should be compacted and how (`selection.compaction`).",
    )


DEFAULT_ASSEMBLY = AssemblyOptions()

Render = Literal["neutral", "openai-chat", "openai-responses", "anthropic", "gemini"]


NATIVE_COMPACTION: Final = frozenset({"anthropic", "openai-responses"})
"""The renders whose provider compacts on its own (``assembly.compaction.mode: "native"``)."""

PREPARATION_ID_PATTERN: Final = r"^prep_[A-Za-z0-9_-]+$"


class CacheOptions(Frozen):
    """Provider cache directives, and the turn to explain this one against (`selection.cache`).
    The service creates no cache, calls no provider and promises no hit."""

    # ``core/cache.py`` plans the markers. ``previous_given`` tells an absent
    # ``previous_preparation_id`` from a ``null`` one.
    breakpoints: StrictBool = Field(
        default=False,
        description='With `render: "anthropic"`, `cache_control` markers (at most 4) after the '
        "last tool, after the leading system content and on the last history message, each only "
        "where the tokens up to it reach the model's minimum cacheable length. With an OpenAI "
        "render and a model with `explicit_cache_breakpoints` (GPT-5.6 and later), "
        "`prompt_cache_breakpoint` markers at the same places (never on an assistant message, "
        "never with `retention`). `neutral` reports the plan without markers; the other renders "
        "and models ignore it.",
    )
    ttl: Literal["5m", "1h"] = Field(
        default="5m",
        description='The Anthropic markers\' lifetime; `1h` adds `"ttl": "1h"` to each.',
    )
    instructions_ttl: Literal["5m", "1h"] | None = Field(
        default=None,
        description="Anthropic: the lifetime of the markers after the tools and after the leading "
        "instructions, which change less often than the conversation (absent: `ttl`). A 1-hour "
        "marker must come before a 5-minute one, so `5m` here with `ttl: 1h` is refused.",
    )
    automatic: StrictBool = Field(
        default=False,
        description='With `render: "anthropic"`, a top-level `cache_control` (automatic '
        "caching: the provider marks the request's last block). It takes one of the 4 marker "
        "slots, and in `transcript` it stands in for the marker on the frame's end.",
    )
    mode: Literal["implicit", "explicit"] = Field(
        default="implicit",
        description="OpenAI models with `explicit_cache_breakpoints`: `implicit` keeps OpenAI's "
        "own breakpoint on the newest message beside at most 3 of the plan's; `explicit` sends "
        '`prompt_cache_options: {"mode": "explicit"}` and the plan places up to 4 (needs '
        "`breakpoints: true`; refused with `retention`).",
    )
    diagnostics: StrictBool = Field(
        default=False,
        description="Ask the provider why its cache missed, against the previous turn's "
        "response: Anthropic's `diagnostics.previous_message_id` (`null` on a first turn, or "
        "when the previous turn's usage report named no `response_id`), OpenAI Responses' "
        "`prompt_cache_options.comparison_response_id` on models with "
        "`explicit_cache_breakpoints` (when there is an id to name).",
    )
    key: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="OpenAI renders: the body's `prompt_cache_key`, this string or, for `auto`, "
        "one derived from tenant and scope (the same for every turn of the scope, never the "
        "scope's values).",
    )
    retention: Literal["in_memory", "24h"] | None = Field(
        default=None, description="OpenAI renders: the body's `prompt_cache_retention`."
    )
    previous_preparation_id: StrictStr | None = Field(
        default=None,
        max_length=128,
        pattern=PREPARATION_ID_PATTERN,
        description="The turn to compare with. Absent: the latest preparation of the same tenant "
        "and scope (a first turn without an explicit `scope`). `null`: a first turn. An id no live preparation of the tenant has is "
        "compared with nothing (`prefix_kept: null`).",
    )

    @property
    def previous_given(self) -> bool:
        """Whether the request names its previous turn (an id, or ``null`` for a first turn)."""
        return "previous_preparation_id" in self.model_fields_set

    def conflict(self) -> tuple[str, str] | None:
        """The field and words of a combination the providers refuse or that caches nothing
        (``PrepareRequest`` reports it at ``cache.<field>``); ``None`` when there is none."""
        if self.mode == "explicit" and not self.breakpoints:
            return "mode", (
                "mode 'explicit' turns OpenAI's own breakpoint off, so without breakpoints: true "
                "nothing would be cached"
            )
        if self.mode == "explicit" and self.retention is not None:
            return "mode", (
                "mode 'explicit' needs the plan's breakpoints, which are never sent with "
                "retention (OpenAI refuses prompt_cache_options.ttl beside "
                "prompt_cache_retention): leave one of them out"
            )
        if self.instructions_ttl == "5m" and self.ttl == "1h":
            return "instructions_ttl", (
                "Anthropic takes 1-hour markers before 5-minute ones: the instructions' marker "
                "comes first, so it cannot be 5m when ttl is 1h"
            )
        return None


MAX_MESSAGES: Final = 10_000
"""The most messages ``history`` and ``input`` may hold together, counted as the caller sends
them (docs/operations.md, "Large requests"): more is a 422 naming the field, before any message
is read or validated."""

# Items (messages, content parts, tool calls) validated per call of pydantic-core: between two
# calls the interpreter may hand its lock to the event loop, when a large body is parsed in a
# worker thread (``offload.py``); within one, it cannot.
_CHUNK: Final = 2048

CONVERSATION: Final = ("history", "input")


def too_many_messages(counts: dict[str, int]) -> ValidationError | None:
    """The error of a conversation over ``MAX_MESSAGES`` (``counts``: the messages of each field
    sent as a list, in order), at the field that goes over; ``None`` within it."""
    total = 0
    for field, count in counts.items():
        total += count
        if total > MAX_MESSAGES:
            held = sum(counts.values())
            return ValidationError.from_exception_data(
                "PrepareRequest",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "too_many_messages",
                            f"history and input hold {held} messages together, over the limit "
                            f"of {MAX_MESSAGES} a request may send",
                        ),
                        loc=(field,),
                        input=None,
                    )
                ],
            )
    return None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A request body with its conversation read (``read_conversation``): the messages of each
    field as the caller sent them and the format they were read in (to name an error at the
    caller's place: ``origins``), and the first tool-pairing rule the conversation breaks."""

    data: Any
    sent: dict[str, list[Any]]
    declared: InputFormat
    violation: PairingViolation | None

    def origins(self, field: str) -> list[Origin] | None:
        """The ``Origin`` of each neutral message of ``field`` (``None``: not read)."""
        if field not in self.sent:
            return None
        return read_located(self.sent[field], self.declared)[1]


def read_conversation(data: Any, fields: tuple[str, ...] = CONVERSATION) -> Conversation:
    """``data`` (a request body) with the provider-shaped messages of ``fields`` read into
    neutral ones, by the body's ``input_format``; an unreadable message is an error at its
    place (``history.3.content.1``), and so is a conversation over ``MAX_MESSAGES``. A bad
    ``input_format`` is left for the model to report.

    The conversation (the fields in order) must then keep the providers' tool-pairing rules
    (``core/pairing.py``): the first violation is returned, for an error at the caller's
    message (``history.4``) that names the call id."""
    if not isinstance(data, dict):
        return Conversation(data, {}, "neutral", None)
    lists = {field: data[field] for field in fields if isinstance(data.get(field), list)}
    over = too_many_messages({field: len(value) for field, value in lists.items()})
    if over is not None:
        raise over
    declared = data.get("input_format", "auto")
    if declared not in ("auto", "neutral", "openai-chat", "anthropic", "openai-responses"):
        return Conversation(data, {}, "neutral", None)
    read = dict(data)
    conversation: list[Located] = []
    provider_held = any(
        isinstance(data.get(field), dict) and data[field].get("native") is True for field in fields
    )
    for field, value in lists.items():
        try:
            read[field], indexes = read_messages(value, declared)
        except ShapeError as err:
            raise _located_error((field, *err.loc), err.message) from None
        conversation.extend(
            Located(message, field, index)
            for message, index in zip(read[field], indexes, strict=True)
        )
    violation = first_violation(conversation, provider_held=provider_held)
    return Conversation(read, lists, declared, violation)


def _pairing_detail(violation: PairingViolation) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("tool_pairing", violation.message),
        loc=(violation.field, violation.index),
        input=violation.call_id,
    )


def _again(error: ErrorDetails, loc: tuple[str | int, ...]) -> InitErrorDetails:
    """A validation error as it was, at ``loc``."""
    return InitErrorDetails(
        type=PydanticCustomError(error["type"], error["msg"]), loc=loc, input=error["input"]
    )


def _relocated(err: ValidationError, read: Conversation) -> ValidationError:
    """``err`` (the model's validation of ``read.data``) with every place below a message of
    the conversation named as the caller sent it (``Origin.locate``: the caller's message, and
    its field), and the pairing violation, if any, after the other errors."""
    errors = err.errors(include_url=False)
    moved: list[InitErrorDetails] = []
    changed = read.violation is not None
    found: dict[str, list[Origin] | None] = {}
    for error in errors:
        loc = error["loc"]
        field = str(loc[0]) if loc else ""
        if field in read.sent and field not in found:
            found[field] = read.origins(field)  # read again, with the routes, on an error only
        origins = found.get(field)
        if origins is not None and len(loc) > 1 and isinstance(loc[1], int):
            index, place = origins[loc[1]].locate(loc[2:])
            moved_loc: tuple[str | int, ...] = (loc[0], index, *place)
            changed = changed or moved_loc != loc
            loc = moved_loc
        moved.append(_again(error, loc))
    if not changed:
        return err
    if read.violation is not None:
        moved.append(_pairing_detail(read.violation))
    return ValidationError.from_exception_data(err.title, moved)


def _weight(message: Any) -> int:
    """The items validating ``message`` takes: itself, its content parts and its tool calls."""
    if not isinstance(message, dict):
        return 1
    return 1 + sum(len(items) for key in _LISTS if isinstance(items := message.get(key), list))


def _messages(value: Any) -> list[Message]:
    """``value`` validated as a list of messages, about ``_CHUNK`` items a call (errors at the
    index of the whole list); a message of more items has its content parts and tool calls
    validated ``_CHUNK`` at a time first."""
    if not isinstance(value, list):
        return _MESSAGES.validate_python(value)
    weights = [_weight(message) for message in value]
    if sum(weights) <= _CHUNK:
        return _MESSAGES.validate_python(value)
    validated: list[Message] = []
    errors: list[InitErrorDetails] = []
    start = 0
    while start < len(value):
        end, load = start + 1, weights[start]
        while end < len(value) and load + weights[end] <= _CHUNK:
            load += weights[end]
            end += 1
        chunk = value[start:end]
        if load > _CHUNK:  # one message alone
            chunk = [_with_lists(value[start], start, errors)]
        if chunk[0] is not None:
            try:
                validated += _MESSAGES.validate_python(chunk)
            except ValidationError as err:
                errors += _shifted(err, start)
        start = end
    if errors:
        raise ValidationError.from_exception_data("list[Message]", errors)
    return validated


def _with_lists(message: dict[str, Any], index: int, errors: list[InitErrorDetails]) -> Any:
    """``message`` with its content parts and tool calls validated, ``_CHUNK`` at a time; their
    errors go to ``errors`` (at ``index``), and the message is then ``None``."""
    read = dict(message)
    failed = False
    for key, adapter in _LISTS.items():
        items = message.get(key)
        if not isinstance(items, list):
            continue
        done: list[Any] = []
        for start in range(0, len(items), _CHUNK):
            try:
                done += adapter.validate_python(items[start : start + _CHUNK])
            except ValidationError as err:
                errors += _shifted(err, start, (index, key))
                failed = True
        read[key] = done
    return None if failed else read


def _shifted(
    err: ValidationError, offset: int, above: tuple[str | int, ...] = ()
) -> list[InitErrorDetails]:
    """The errors of a list's slice from ``offset``, at the index in the whole list (below
    ``above``)."""
    shifted = []
    for error in err.errors(include_url=False):
        first, *rest = error["loc"]
        index = first + offset if isinstance(first, int) else first
        shifted.append(_again(error, (*above, index, *rest)))
    return shifted


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
    """The body of `POST /v1/prepare`, `POST /v1/budget` and `POST /v1/preparations/{id}/refresh`:
    the model (or the candidates of routing), the budget, the host's own parts (`instructions`,
    `plugins`, `tools`, `history`, `input`) and the sources (`contributors`, `contributions`,
    `whiteboard`). Give exactly one of `model` and `models`."""

    # Also the CLI's input. With ``models`` the response's ``model`` is the chosen candidate and
    # the preparation is bound to it; ``max_context_source`` is unused whenever
    # ``max_context_tokens`` is absent. Without ``cache`` the answer is what it is without the
    # field (``core/cache.py``).
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra=refusing(
            ("both `model` and `models`", given(model="string", models="array")),
            ("neither `model` nor `models`", not_given("model", "models")),
            (
                "`max_context_tokens` with `models`",
                given(models="array", max_context_tokens="integer"),
            ),
            (
                "`routing` without `models`",
                {
                    "required": ["routing"],
                    "properties": {"routing": {"type": "object"}, "models": {"type": "null"}},
                },
            ),
        ),
    )

    model: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The model the frame is for: its tokenizer, window and framing come from the "
        "model registry (`GET /v1/models`). Exactly one of `model` and `models`.",
    )
    models: list[ModelName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MODELS,
        description="Managed routing: distinct candidate models in order of preference; the "
        "answer's `model` is the first whose window fits (`selection.routing` says why). "
        "Exactly one of `model` and `models`.",
    )
    routing: Routing | None = Field(
        default=None,
        description="The routing policy over `models` (only with `models`; default "
        '`{"policy": "first_fit"}`).',
    )
    max_context_tokens: StrictInt | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="The model's context window as the host knows it. Absent: the model "
        "registry's, else 128,000. Not with `models`: each candidate's window is the registry's.",
    )
    max_context_source: Literal["host", "provider"] = Field(
        default="host",
        description="Who gave `max_context_tokens`, reported as `budget.capacity_source`.",
    )
    response_reserve: StrictInt = Field(
        default=4096,
        ge=0,
        le=100_000_000,
        description="Tokens kept free for the answer. A provider render carries it, plus "
        "`assembly.reasoning_reserve_tokens`, as the frame's output limit (at least 1).",
    )
    assembly: AssemblyOptions | None = Field(
        default=None, description="The data limits, the layout and the contributors' deadline."
    )
    instructions: StrictStr = Field(
        default="", description="The host's instructions: the start of the leading system message."
    )
    plugins: list[Plugin] = Field(
        default_factory=list,
        description="The host's plugins; each source of the request replaces one's content view.",
    )
    tools: list[Tool] = Field(default_factory=list, description="The tools sent with the frame.")
    history: list[Message] | NativeHistory = Field(
        default_factory=list,
        description="The conversation so far: messages in the neutral, OpenAI Chat, Anthropic or "
        'OpenAI Responses shape, or `{"native": true, ...}` when the provider holds it.',
        json_schema_extra=messages_schema,
    )
    input: list[Message] = Field(
        default_factory=list,
        description="This turn's messages (the shapes `history` takes), after `history`. Tool "
        "calls and results must pair up across both (a `422` names the message and call id).",
        json_schema_extra=messages_schema,
    )
    contributors: list[ContributorRef] = Field(
        default_factory=list,
        description="Sources the service calls (webhooks and MCP servers), in parallel under "
        "one deadline.",
    )
    contributions: list[Contribution] = Field(
        default_factory=list, description="Inline sources: blocks the host sends itself."
    )
    whiteboard: Whiteboard | None = Field(
        default=None, description="Saved entries turned into the blocks of one source."
    )
    scope: Scope = Field(
        default_factory=Scope,
        description="Whom and what the call is for: sent to contributors, and the conversation "
        "that cache plans and the timeline follow.",
    )
    timezone: StrictStr = Field(
        default="UTC", description="The IANA time zone of the date and time line."
    )
    render: Render = Field(
        default="neutral",
        description="The frame's shape: `neutral` (messages and tools) or a provider's request "
        "body (`openai-chat`, `openai-responses`, `anthropic`, `gemini`), sent as it is.",
    )
    # How ``history`` and ``input`` are read (``core/provider_messages.py``); left out of dumps
    # when "auto", so that the hashes of a request without it match those of records stored
    # without the field.
    input_format: InputFormat = Field(
        default="auto",
        exclude_if=lambda value: value == "auto",
        description="How `history` and `input` are read: `auto`, each message in the format its "
        "shape shows; or one format for every message.",
    )
    # Left out of dumps when absent, so that the hashes of a request without it match those of
    # records stored without the field.
    cache: CacheOptions | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Provider cache directives, and `selection.cache`: this turn explained "
        "against the previous one of the same scope.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _provider_shapes(cls, data: Any, handler: ModelWrapValidatorHandler[PrepareRequest]) -> Any:
        # The conversation is read first (``read_conversation``); the model's errors then name
        # the caller's messages, and a broken tool pairing is named after them (or alone).
        read = read_conversation(data)
        try:
            validated = handler(read.data)
        except ValidationError as err:
            raise _relocated(err, read) from None
        if read.violation is not None:
            raise ValidationError.from_exception_data(
                "PrepareRequest", [_pairing_detail(read.violation)]
            )
        return validated

    @field_validator("history", mode="wrap")
    @classmethod
    def _history(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Dispatch by JSON type so that errors name ``history.<i>.<field>`` (or
        # ``history.<field>``), not the members of a union.
        if isinstance(value, dict):
            return NativeHistory.model_validate(value)
        if isinstance(value, NativeHistory):
            return value
        return _messages(value)

    @field_validator("input", mode="wrap")
    @classmethod
    def _input(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, list) and sum(map(_weight, value)) > _CHUNK:
            return _messages(value)  # in chunks (``_CHUNK``)
        return handler(value)

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

    @model_validator(mode="after")
    def _cache_combination(self) -> PrepareRequest:
        conflict = None if self.cache is None else self.cache.conflict()
        if conflict is not None:
            raise _field_error(f"cache.{conflict[0]}", conflict[1])
        return self

    @model_validator(mode="after")
    def _native_compaction_render(self) -> PrepareRequest:
        if self.options.compaction.mode == "native" and self.render not in NATIVE_COMPACTION:
            raise _field_error(
                "assembly.compaction.mode",
                f"render {self.render!r} has no provider compaction: mode 'native' needs render "
                "'anthropic' or 'openai-responses'",
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
