"""The stored preparation record: one typed, versioned model, and the one way to read it.

A record (docs/contract.md, "Storage") holds the manifest, budget and hashes of the response, the
scope, the model, hashes of the instructions, of each original history message and of the
request's host-side parts (``preparations/shape.py``), the revisions of called contributors and
how to reach each (source and endpoint name or inline URL, with an inline MCP server's kind,
resources and tool; never its instructions), the expiry of entered blocks, the contributor time
used, the names of the plugins whose legacy view was placed, the turn's cache plan (``cache``,
``preparations/turns.py``) and the accounting. Never block bodies, instructions, history or
input.

The store keeps a record as a JSON object it does not interpret; ``StoredPreparation`` is what
that object means. Every reader goes through ``StoredPreparation.read`` (the timeline and the
previous turn's lookup through ``TurnRecord.read``, which reads the turn part only), which also
reads every older shape a store may hold (a store keeps a record for up to ``store.ttl_seconds``, and in a
rolling deploy a replica reads what the previous version wrote):

- ``record_version`` 2 (``RECORD_VERSION``): the current shape.
- no ``record_version`` (version 1), in these shapes, each oldest first: without the routing
  fields (``requested_models``, ``native_history``, ``provider_counted_tokens``); with the
  manifest's block reports packed (``selection.block_rows_z``); with a ``cache`` turn that does
  not yet name its parts (``turn``, ``names``…); with block reports as JSON objects again.
  The scope's latest pointer carries the record's ``cache`` turn; one written with the first
  cache turns carries nothing (``{}``), and the turn is then read from the record.

``tests/storage/fixtures`` holds a record of each shape, written by the version that wrote it,
and one of a later version (``newer-record-v3.json``); a test puts each into SQLite and Redis and
sends it through every lifecycle call.

The record's parts are the answer's own models (``BudgetReport``, ``SelectionReport``, ``Scope``,
``CacheOptions``, ``ContributorRef``, ``NamedChange``...), read with ``extra="allow"`` at every
depth: a field this version does not know is kept, and written back as it was by a repair, the
one call that writes a record it read (``Part.dump``).

What a version means: ``record_version`` is raised only by a change an older reader would
misread: a field removed, renamed or read another way, or a value a closed set of its models
does not have (a new status or reason). A field added, with a default that reads as "not kept",
keeps the version: an older replica reads such a record as its own (that is how
``previous_cacheable_tokens`` and ``compaction`` came in). So a record of a version above
``RECORD_VERSION`` is one this version cannot read: it is refused, never read as if it were
ours. ``StoredPreparation.read`` and ``TurnRecord.read`` raise ``RecordTooNewError``
(``503 RECORD_TOO_NEW``: during a rolling deploy a replica of the newer version can answer, and
the clients retry a 503), and a prepare whose previous turn is such a record compares with
nothing (``turns.load``). The scope's latest pointer carries the writer's ``record_version``
beside the turn (``pointer_data``) for the same check.
"""

from __future__ import annotations

import base64
import functools
import secrets
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Self, get_args

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    field_serializer,
    model_validator,
)
from pydantic_core import to_jsonable_python

from context_assembly.core import compaction
from context_assembly.core.assemble import Assembly
from context_assembly.core.cache import PrefixDigests
from context_assembly.core.fingerprint import digest
from context_assembly.core.request import (
    CacheOptions,
    ContributorRef,
    NativeHistory,
    PrepareRequest,
    Render,
    Revision,
    Scope,
)
from context_assembly.core.result import (
    BudgetReport,
    CacheBreakpoint,
    DecisionTally,
    FirstChange,
    PrepareResponse,
    SelectionReport,
    decision_tally,
)
from context_assembly.core.transcript import Insertion, Prior
from context_assembly.engine import ModelContext
from context_assembly.errors import NotFoundError, RecordTooNewError
from context_assembly.lifecycle_models import ExpectedReason, NamedChange
from context_assembly.preparations.shape import shape_hash
from context_assembly.storage import PreparationRecord

RECORD_VERSION: Final = 2
"""The version of the records this service writes (the module doc lists the older ones)."""

MAX_SHOWN_ID: Final = 128  # our ids have 29 characters; a caller's path may hold anything

# The packed form of the block reports in version 1 records of one shape: base64 of zlib of one
# JSON array per report, with these fields in this order.
PACKED_ROWS: Final = "block_rows_z"
PACKED_ROW_FIELDS: Final = (
    "source",
    "id",
    "status",
    "reason",
    "tokens",
    "full_tokens",
    "projection_tokens",
    "priority",
    "protected",
    "dependencies",
)
# The record's contributor list, dumped in one call: how to reach each one again for its
# revision (an inline MCP server's kind and what it reads; not its tool's arguments, which
# validate does not send, nor instructions).
CONTRIBUTOR_REFS: Final = TypeAdapter(list[ContributorRef])
_REF_FIELDS: Final = {"__all__": {"source", "endpoint", "url", "kind", "resources", "tool"}}


class Part(BaseModel):
    """A part of a record: immutable, and keeping the fields it does not know, at any depth."""

    model_config = ConfigDict(frozen=True, extra="allow")

    @classmethod
    def load(cls, data: object) -> Self:
        """``data`` as this part, keeping every field it does not know: the answer's models
        inside refuse them on the wire, and take them here (``extra="allow"`` at every depth)."""
        return cls.model_validate(data, extra="allow")

    def dump(self) -> dict[str, Any]:
        """The JSON object the store keeps, with the fields it was read with and does not know
        (a part made here has none: only its models are looked through, not its values)."""
        data = self.model_dump(mode="json")
        kept: dict[str, Any] = _with_unknown(self, data) if _holds_unknown(self) else data
        return kept


def _holds_unknown(value: object) -> bool:
    """Whether a model in ``value`` whose fields are closed holds a field it does not know (a
    part's own are in its JSON already)."""
    if isinstance(value, BaseModel):
        if value.__pydantic_extra__ and value.model_config.get("extra") != "allow":
            return True
        nested = _nested(type(value))
        return bool(nested) and any(_holds_unknown(getattr(value, name)) for name in nested)
    if isinstance(value, list | tuple):
        return any(_holds_unknown(item) for item in value)
    if isinstance(value, Mapping):
        return any(_holds_unknown(item) for item in value.values())
    return False


def _with_unknown(value: object, dumped: Any) -> Any:
    """``dumped`` (``value`` as JSON) with the fields ``value`` was read with and does not know,
    at every depth: a model whose fields are closed (the answer's) leaves them out of its own
    JSON."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        out = dict(dumped)
        for name in _nested(type(value)):
            if name in out:
                out[name] = _with_unknown(getattr(value, name), out[name])
        for key, extra in (value.__pydantic_extra__ or {}).items():
            out.setdefault(key, to_jsonable_python(extra))
        return out
    if isinstance(value, list | tuple) and isinstance(dumped, list) and len(value) == len(dumped):
        return [_with_unknown(item, done) for item, done in zip(value, dumped, strict=True)]
    if isinstance(value, Mapping) and isinstance(dumped, dict):
        return {key: _with_unknown(value.get(key), item) for key, item in dumped.items()}
    return dumped


@functools.cache
def _nested(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` whose type holds a model (the others hold plain values only),
    so that a record of many block reports is looked through quickly."""
    return tuple(
        name for name, field in model.model_fields.items() if _holds_model(field.annotation)
    )


def _holds_model(annotation: object) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in get_args(annotation))


def _readable(record: PreparationRecord) -> None:
    """Refuse a record of a newer version (see the module doc)."""
    version = record.data.get("record_version")
    if isinstance(version, int) and version > RECORD_VERSION:
        raise RecordTooNewError(
            f"preparation {record.id} was written by a newer version of the service (record "
            f"version {version}; this version reads up to {RECORD_VERSION}): a replica of "
            "that version can answer",
            preparation_id=record.id,
            record_version=version,
        )


class StoredResponse(Part):
    """The prepare answer without its frame, as the answer had it (``GET`` shows it): each of
    the answer's fields but ``frame``, as the answer's models."""

    preparation_id: str
    model: str
    layout: Literal["legacy", "stable-prefix", "transcript"]
    render: Render
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int

    @classmethod
    def of(cls, response: PrepareResponse) -> StoredResponse:
        """What the record keeps of ``response`` (its models as they are, not copied)."""
        return cls.model_validate({name: getattr(response, name) for name in cls.model_fields})

    def known(self) -> dict[str, Any]:
        """Its fields as this version models them: without those it does not know, which the
        answer's models leave out of their JSON too."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    @model_validator(mode="before")
    @classmethod
    def _unpack(cls, value: Any) -> Any:
        """Block reports packed in ``PACKED_ROWS`` (a version 1 shape) become report objects."""
        selection = value.get("selection") if isinstance(value, Mapping) else None
        if not isinstance(selection, Mapping) or PACKED_ROWS not in selection:
            return value
        packed = base64.b64decode(selection[PACKED_ROWS], validate=True)
        rows = orjson.loads(zlib.decompress(packed))
        blocks = [dict(zip(PACKED_ROW_FIELDS, row, strict=True)) for row in rows]
        rest = {k: v for k, v in selection.items() if k != PACKED_ROWS}
        return {**value, "selection": {"blocks": blocks, **rest}}


class TurnNames(Part):
    """The names of a turn's prefix: model, render target, layout and tool names in frame order
    (names, never texts)."""

    model: str
    render: str
    layout: str
    tools: list[str]


class StoredCacheReport(Part):
    """``selection.cache`` as the turn had it (kept even when the answer left it out)."""

    previous_preparation_id: str | None = None
    prefix_kept: bool | None = None
    first_change: FirstChange | None = None
    cacheable_tokens: int = 0
    breakpoints: list[CacheBreakpoint] = []


class StoredCompaction(Part):
    """What a turn keeps of its compaction decision (``core/compaction.py``): the decision, and
    the tool calls whose results its frame sent cleared (ids only)."""

    decision: str
    reason: str | None = None
    cleared: list[str] = []

    def previous(self) -> compaction.Previous:
        """The turn as the next turn's previous one."""
        return compaction.Previous(acted=self.decision != "none", cleared=tuple(self.cleared))


class StoredTurn(Part):
    """The record's ``cache`` field: what it keeps of the turn (``preparations/turns.py``). The
    scope's latest pointer carries the same object. Fields from ``turn`` on are absent (``None``)
    in records of a version 1 shape."""

    options: CacheOptions | None = None  # the request's ``cache``, as given (``_given``)
    previous_preparation_id: str | None = None
    digests: PrefixDigests
    report: StoredCacheReport
    created_at: float
    expected_cached_tokens: int | None = None
    turn: int | None = None
    names: TurnNames | None = None
    named_change: NamedChange | None = None
    expected_reason: ExpectedReason | None = None
    since_previous_seconds: float | None = None
    lifetime_seconds: float | None = None
    min_cacheable_tokens: int | None = None
    # The previous turn's cacheable tokens, what a miss of this turn is measured against
    # (``turns.rebilled``); ``None`` without a previous turn, and in records written before it
    # was kept (version 2 ones included).
    previous_cacheable_tokens: int | None = None
    # What an anchored count of the next turn matches on (``core/anchor.py``): the frame's head
    # and the hashes of the input messages it sent (the history's are ``digests.history``).
    head_digest: str | None = None
    input_digests: list[str] | None = None
    # The ``transcript`` layout's insertions (``core/transcript.py``: positions and digests,
    # never text); ``None`` for another layout.
    transcript: list[dict[str, Any]] | None = None
    compaction: StoredCompaction | None = None

    @field_serializer("options")
    def _given(self, options: CacheOptions | None) -> dict[str, Any] | None:
        """The fields the request gave, and only them: ``previous_given`` reads which are."""
        return None if options is None else options.model_dump(mode="json", exclude_unset=True)

    def prior(self) -> Prior | None:
        """The turn as the previous turn of a ``transcript`` (``None``: not one)."""
        conversation = self.conversation()
        if self.transcript is None or conversation is None:
            return None
        return Prior(conversation, tuple(Insertion.load(raw) for raw in self.transcript))

    def conversation(self) -> tuple[str, ...] | None:
        """The message hashes of the conversation the turn sent (``None``: not kept)."""
        if self.head_digest is None or self.input_digests is None:
            return None
        return (*self.digests.history, *self.input_digests)


class StoredPreparation(Part):
    """One preparation record as the store keeps it (see the module doc)."""

    record_version: int
    response: StoredResponse
    model: str  # the model assembled for (the routed one under routing)
    requested_models: list[str]  # the candidates as requested (a refresh must give the same)
    native_history: NativeHistory | None = None  # the native descriptor a refresh must repeat
    scope_hash: str
    scope: Scope
    render: Render
    input_len: int
    shape_hash: str
    history_hashes: list[str]  # of the original history (a refresh keeps them)
    contributors: list[ContributorRef]  # how to reach each again (``_REF_FIELDS`` only)
    timeout_ms: float
    provider_counted_tokens: int = 0  # a native history's, which repair adds to its count
    tokenizer: str
    prefix_len: int
    instructions_hash: str
    selected_expiry: list[tuple[str, str]]  # (qualified id, expires_at) of entered blocks
    revisions: dict[str, Revision | None]  # of the sources that answered
    legacy_views: list[str] | None = None  # ``None``: a version 1 record made before they were kept
    used_ms: float  # contributor time used, of ``timeout_ms``
    capacity: int
    reserve: int  # response and reasoning reserve
    estimated_input_tokens: int
    repair_estimated_input_tokens: int | None = None  # the last repair frame's estimate
    cache: StoredTurn | None = None  # ``None``: a version 1 record made before cache plans

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, value: Any) -> Any:
        """A version 1 record (no ``record_version``) in the current shape: a record made before
        routing asked for its one model."""
        if not isinstance(value, Mapping) or "record_version" in value:
            return value
        return {
            "requested_models": [value.get("model")],
            **value,
            "record_version": RECORD_VERSION,
        }

    @field_serializer("contributors")
    def _refs(self, refs: list[ContributorRef]) -> list[dict[str, Any]]:
        dumped: list[dict[str, Any]] = CONTRIBUTOR_REFS.dump_python(
            refs, mode="json", exclude_none=True
        )
        return dumped

    @classmethod
    def read(cls, record: PreparationRecord) -> StoredPreparation:
        """What ``record``'s data means, in whatever shape of this version or an older one it
        was stored (``RecordTooNewError`` for a newer version's)."""
        _readable(record)
        return cls.load(record.data)

    def contributor_refs(self) -> list[ContributorRef]:
        """How to reach each contributor of the preparation again."""
        return self.contributors


class _TurnResponse(BaseModel):
    """The one field of a record's ``response`` a turn of the timeline shows."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    layout: str


class TurnRecord(BaseModel):
    """What the timeline reads of a record: its turn (``cache``, ``StoredTurn``) and the few
    fields a turn shows beside it (``timeline_turn``), the same in every shape a store may hold.
    The rest of the record (its manifest, hashes, contributors) is neither read nor validated:
    a page of fifty heavy turns reads fifty small parts, not fifty whole records."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    response: _TurnResponse
    model: str
    render: str
    scope_hash: str
    estimated_input_tokens: int
    cache: StoredTurn | None = None

    @classmethod
    def read(cls, record: PreparationRecord) -> TurnRecord:
        """The turn part of ``record``'s data, its turn read as the whole record reads it
        (``RecordTooNewError`` for a newer version's)."""
        _readable(record)
        return cls.model_validate(record.data, extra="allow")


def pointer_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """What the scope's latest pointer carries of a record's ``data`` (``turns.previous``): its
    turn, and the version that wrote it, so that a reader can tell a newer version's turn."""
    return {**data["cache"], "record_version": data["record_version"]}


def new_preparation_id() -> str:
    """An unguessable id (144 random bits)."""
    return "prep_" + secrets.token_urlsafe(18)


def not_found(prep_id: str) -> NotFoundError:
    """The 404 of an unknown id (or another tenant's: the same answer), naming the id as sent,
    cut at ``MAX_SHOWN_ID`` characters."""
    shown = prep_id if len(prep_id) <= MAX_SHOWN_ID else prep_id[:MAX_SHOWN_ID] + "…"
    return NotFoundError(f"no preparation {shown!r}", preparation_id=shown)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepare or refresh answer: the response, its JSON, and what the record keeps of it.

    ``stored`` is the response without its frame (no text); ``body`` is the HTTP answer.
    """

    response: PrepareResponse
    stored: StoredResponse
    body: bytes
    decisions: DecisionTally  # the manifest's decisions by status and reason (metrics, trace)

    @classmethod
    def of(cls, response: PrepareResponse) -> Prepared:
        body = response.model_dump_json().encode()
        stored = StoredResponse.of(response)
        return cls(response, stored, body, decision_tally(response.selection.blocks))


def native(described: NativeHistory | None) -> dict[str, Any] | None:
    """A native history descriptor as compared: the fields this version knows."""
    return None if described is None else described.model_dump(mode="json")


def legacy_views(request: PrepareRequest, response: PrepareResponse) -> list[str]:
    """The plugins whose current content (a legacy view) went into the prompt: those with
    ``content`` that no source of the request replaces. Names only; the breakdown labels the
    part of the window that holds them."""
    replaced = {source.source for source in response.selection.sources}
    return [p.name for p in request.plugins if p.content and p.name not in replaced]


def record_of(
    request: PrepareRequest,
    assembly: Assembly,
    ctx: ModelContext,
    prepared: Prepared,
    *,
    turn: StoredTurn,
    answered: Mapping[str, bool],
    used_ms: float,
    history_hashes: list[str],
) -> StoredPreparation:
    """The record of one prepare or refresh. ``answered`` says, for each webhook source called,
    whether it answered; ``history_hashes`` are the original history's (a refresh keeps them);
    ``turn`` is what the record keeps of the turn's cache plan."""
    response = prepared.response
    budget = response.budget
    return StoredPreparation(
        record_version=RECORD_VERSION,
        response=prepared.stored,
        model=ctx.model,
        requested_models=request.candidates,
        native_history=request.native_history,
        scope_hash=digest(request.scope.model_dump(mode="json")),
        scope=request.scope,
        render=request.render,
        input_len=len(request.input),
        shape_hash=shape_hash(request),
        history_hashes=history_hashes,
        # Only what validate needs to ask each one for its revision again: never its
        # ``instructions`` (host text the record must not hold, docs/contract.md, "Privacy").
        contributors=CONTRIBUTOR_REFS.validate_python(
            CONTRIBUTOR_REFS.dump_python(
                request.contributors, mode="json", exclude_none=True, include=_REF_FIELDS
            )
        ),
        timeout_ms=request.options.timeout_ms,
        provider_counted_tokens=budget.provider_counted_tokens or 0,
        tokenizer=ctx.counter.name,
        prefix_len=assembly.placed.prefix_len,
        instructions_hash=assembly.instructions_hash,
        selected_expiry=list(assembly.selected_expiry),
        # Only sources that answered: a source omitted after a failure contributed nothing,
        # so there is nothing of it for a later revision to make stale.
        revisions={s: r for s, r in assembly.revisions if answered.get(s, False)},
        legacy_views=legacy_views(request, response),
        used_ms=used_ms,
        capacity=budget.capacity,
        reserve=budget.response_reserve + budget.reasoning_reserve_tokens,
        estimated_input_tokens=budget.total_input_tokens,
        cache=turn,
    )
