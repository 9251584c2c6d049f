"""The contributor protocol (docs/contract.md, "Webhook protocol"): the packets the service
``POST``s to a contributor (``contribute``, ``revision``) and to a summarizer (``summarize``,
docs/compaction.md), and the answers it takes back.

The calls write a packet's bytes themselves (``calls.py``, ``summarizer.py``: the parts a
prepare shares are dumped once for all its contributors); the packet models say what the bytes
hold, and a test reads each packet the service sends with its model. The answers are read with
theirs. The OpenAPI document's ``webhooks`` describe the protocol with these models
(``api/webhooks.py``), and the clients' packet and answer types are generated from it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from context_assembly.core.request import (
    REVISION_SCHEMA,
    Block,
    Frozen,
    Message,
    Revision,
    Scope,
    finite_revision,
    wire_schema,
)

_SCOPE = (
    "The request's `scope`: whom and what the call is for. The packet carries no credentials and "
    "grants no authority: authorise what is read against it."
)
_DEADLINE = (
    "The prepare's deadline, in Unix milliseconds (`X-Contributor-Timeout-Ms` gives the time "
    "left, needing no synchronised clock)."
)


class ContributePacket(Frozen):
    """What the service asks a contributor for during a prepare (and its refresh): all its
    contributors at once, under one deadline. The answer is `{revision, blocks}`."""

    type: Literal["contribute"] = Field(description="Always `contribute`.")
    preparation_id: str = Field(description="The preparation (the same for its refresh).")
    source: str = Field(description="The source asked for: the plugin its blocks replace.")
    model: str = Field(
        description="The model the request names (with `models`, the preferred candidate; in a "
        "refresh, the prepare's)."
    )
    input: list[Message] = Field(description="A copy of the request's input messages.")
    data_budget_tokens: int = Field(
        description="The request's `assembly.max_data_tokens`: the tokens every source's blocks "
        "share in the data message."
    )
    source_token_limit: int | None = Field(
        description="The source's limit (`assembly.source_token_limits`), or `null`."
    )
    scope: Scope = Field(description=_SCOPE)
    deadline_unix_ms: int = Field(description=_DEADLINE)


class RevisionPacket(Frozen):
    """The check of a source's current revision that validate and repair make (`stale` when it
    differs from the prepare's). The answer is `{revision}`."""

    type: Literal["revision"] = Field(description="Always `revision`.")
    source: str = Field(description="The source whose revision is asked for.")
    scope: Scope = Field(description=_SCOPE)


class SummarizePacket(Frozen):
    """What the service asks a summarizer for under `assembly.compaction.mode: "summarize"`: the
    summary of the oldest history messages, which replaces them in the frame. The answer is
    `{summary}`."""

    type: Literal["summarize"] = Field(description="Always `summarize`.")
    preparation_id: str = Field(description="The preparation (the same for its refresh).")
    source: str = Field(description="The summarizer's registered endpoint name.")
    model: str = Field(description="The model the frame is for.")
    messages: list[Message] = Field(
        description="The history messages to fold into one summary, oldest first."
    )
    max_summary_tokens: int = Field(
        description="The longest summary wanted, in tokens (`assembly.compaction.summary_tokens`)."
    )
    scope: Scope = Field(description=_SCOPE)
    deadline_unix_ms: int = Field(description=_DEADLINE)


_REVISION = (
    "The version of what the source holds for this scope: a string, a finite number or an "
    "integer within signed 64 bits. Validate compares it with the prepare's."
)


class ContributorAnswer(Frozen):
    """A contributor's ``200`` body: exactly ``{revision, blocks}``, blocks as the core models
    them (the request-wide block rules of docs/contract.md, "Block rules", run later, over every
    source, in the core)."""

    revision: Annotated[Revision, WithJsonSchema(REVISION_SCHEMA)] = Field(description=_REVISION)
    blocks: list[Block] = Field(description="The source's blocks (none is `[]`).")

    _revision_finite = field_validator("revision")(finite_revision)


class RevisionAnswer(BaseModel):
    """The answer to a ``revision`` packet: ``{revision}`` (other members are ignored, so a
    contributor may answer both packet types with the same body)."""

    model_config = ConfigDict(frozen=True, extra="ignore", json_schema_extra=wire_schema)
    revision: Annotated[Revision, WithJsonSchema(REVISION_SCHEMA)] = Field(description=_REVISION)

    _revision_finite = field_validator("revision")(finite_revision)


class SummaryAnswer(BaseModel):
    """The summarizer's ``200`` body: ``{summary}`` (other members are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore", json_schema_extra=wire_schema)
    summary: str = Field(
        min_length=1,
        description="The summary, which replaces the folded messages as one message; what it "
        "says is the summarizer's.",
    )
