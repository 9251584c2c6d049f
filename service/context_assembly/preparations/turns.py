"""Turns of one conversation: which preparation came before this one, what the record keeps of a
turn's cache plan, and the chain the timeline shows.

The plan and the comparison themselves are pure (``core/cache.py``); this module joins them to
the store.

Previous turn (``previous``)
    A request without ``cache``, or whose ``cache`` leaves out ``previous_preparation_id``, is
    compared with the latest preparation of the same tenant and scope: every ``put`` moves the
    store's pointer for ``scope_key(tenant, scope)`` (a digest: the store never sees the scope's
    values), and the pointer expires with the record it names. Only an explicit scope (one that
    names at least one value) forms a conversation: a request without one has no scope key, is
    a first turn unless it names its previous turn, and is nobody's previous turn. ``previous_preparation_id:
    null`` is a first turn. An id is looked up for the same tenant; when no live record of the
    tenant has it (unknown, expired or another tenant's, which look the same), the turn is
    compared with nothing: ``selection.cache`` names the id with ``prefix_kept: null``. The
    pointer carries the latest turn's ``"cache"`` field (below), so that a prepare finds its
    previous turn in one small read.

Record (``record_part``)
    Every preparation's record keeps, under ``cache`` (``record.StoredTurn``): the request's ``cache`` object (``None``
    when absent; a refresh takes it from here), the previous preparation id, the prefix digests
    (``PrefixDigests``: hashes, never text), ``selection.cache`` (kept even when the answer
    leaves it out, for the timeline), the wall time it was made and ``expected_cached_tokens``,
    which a usage report of the main call shows beside the provider's ``cached_input_tokens``.
    To explain the turn without the previous record it also keeps: the turn's number, the names
    of its prefix (model, render target, layout, tool names in frame order: names, never
    texts), the first change by name (``named_change``), why the expected figure is what it is
    (``expected_reason``), the seconds since the previous turn, the provider's cache lifetime
    and the model's minimum cacheable length.

Timeline (``page``)
    A page holds at most ``TIMELINE_TURNS`` turns of the chain, oldest first: the newest, or
    those numbered below ``before``. Each record is read for its turn part only
    (``record.TurnRecord``: the ``cache`` field and the few fields a turn shows). A record made
    before turn numbers were kept takes its number from the newer turn it precedes, or has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, get_args

from context_assembly.core import compaction
from context_assembly.core.anchor import Anchor
from context_assembly.core.assemble import Assembly
from context_assembly.core.cache import (
    DEFAULT_CACHE,
    CacheTurn,
    PrefixDigests,
    cache_lifetime,
    expected_cached_tokens,
    long_lifetime,
    long_lived_tokens,
)
from context_assembly.core.fingerprint import digest
from context_assembly.core.request import CacheOptions, Message, PrepareRequest, Scope
from context_assembly.core.result import CachePart, CacheReport, FirstChange
from context_assembly.engine import rfc3339
from context_assembly.errors import RecordTooNewError
from context_assembly.lifecycle_models import (
    CacheMiss,
    ExpectedReason,
    MissCause,
    NamedChange,
    Timeline,
    TimelineTurn,
)
from context_assembly.preparations.record import (
    RECORD_VERSION,
    StoredCacheReport,
    StoredCompaction,
    StoredPreparation,
    StoredTurn,
    TurnNames,
    TurnRecord,
)
from context_assembly.storage import PreparationRecord, Store

TIMELINE_TURNS: Final = 50
"""The most turns a page of the timeline shows."""


UNSCOPED: Final = Scope()


def scope_key(tenant: str, scope: Scope) -> str | None:
    """The store's name for the latest preparation of ``tenant`` in ``scope``: a digest only;
    ``None`` for a request without an explicit scope, which forms no conversation."""
    if scope == UNSCOPED:
        return None
    return digest([tenant, scope.model_dump(mode="json")]).removeprefix("sha256:")


@dataclass(frozen=True, slots=True)
class Previous:
    """The turn a preparation is compared with: ``id`` as ``selection.cache`` names it, and the
    ``cache`` field of its record (``None``: compared with nothing)."""

    id: str | None
    part: StoredTurn | None

    @property
    def digests(self) -> PrefixDigests | None:
        return None if self.part is None else self.part.digests

    @property
    def compacted(self) -> compaction.Previous | None:
        """What the turn recorded of its compaction (``None``: nothing)."""
        if self.part is None or self.part.compaction is None:
            return None
        return self.part.compaction.previous()


FIRST_TURN: Final = Previous(None, None)


async def load(store: Store, tenant: str, prep_id: str | None, now: float) -> Previous:
    """The turn ``prep_id`` names (``FIRST_TURN`` for ``None``)."""
    if prep_id is None:
        return FIRST_TURN
    record = await store.get(tenant, prep_id, now)
    if record is None:
        return Previous(prep_id, None)
    try:
        return Previous(prep_id, TurnRecord.read(record).cache)
    except RecordTooNewError:  # a newer version's turn: compared with nothing, never misread
        return Previous(prep_id, None)


async def previous(store: Store, tenant: str, request: PrepareRequest, now: float) -> Previous:
    """The previous turn of a new preparation (rules in the module doc). The scope's pointer
    carries the latest turn's ``cache`` field, so finding it reads no record."""
    options = request.cache
    if options is not None and options.previous_given:
        return await load(store, tenant, options.previous_preparation_id, now)
    key = scope_key(tenant, request.scope)
    latest = None if key is None else await store.latest(tenant, key, now)
    if latest is None:
        return FIRST_TURN
    if not latest.data:  # a pointer of a version 1 shape, written without the turn
        return await load(store, tenant, latest.id, now)
    version = latest.data.get("record_version")  # absent: written before pointers carried it
    if isinstance(version, int) and version > RECORD_VERSION:
        return Previous(latest.id, None)  # as ``load``: a newer version's turn is not read
    return Previous(latest.id, StoredTurn.load(latest.data))


def record_part(
    request: PrepareRequest,
    turn: CacheTurn,
    before: Previous,
    now: float,
    *,
    assembly: Assembly,
    model: str,
    minimum: int | None,
    explicit: bool = False,
) -> StoredTurn:
    """What the record keeps of a turn (see the module doc); ``now`` is the wall time,
    ``model`` the model assembled for and ``minimum`` its minimum cacheable length
    (``engine.cache_minimum``); ``explicit``: OpenAI's explicit-breakpoint rules apply
    (``core.cache.openai_explicit``)."""
    options = request.cache if request.cache is not None else DEFAULT_CACHE
    report = turn.report
    lifetime = cache_lifetime(request.render, options, explicit=explicit)
    longest = None if explicit else long_lifetime(request.render, options)
    part = before.part
    since = None if part is None else round(max(0.0, now - part.created_at), 3)
    previous_cacheable = None if part is None else part.report.cacheable_tokens
    expected = 0
    if since is not None and previous_cacheable is not None and part is not None:
        expected = expected_cached_tokens(
            prefix_kept=report.prefix_kept,
            cacheable_tokens=report.cacheable_tokens,
            previous_cacheable_tokens=previous_cacheable,
            since_previous=timedelta(seconds=since),
            lifetime=lifetime,
            long_lived=(
                long_lived_tokens([b.model_dump() for b in report.breakpoints]),
                long_lived_tokens([b.model_dump() for b in part.report.breakpoints]),
            ),
            long_lifetime=longest,
        )
    # A turn past the lifetime that still reads the long-lived markers is not ``expired``.
    read_lifetime = lifetime
    if expected and lifetime is not None and since is not None and since > lifetime.total_seconds():
        read_lifetime = longest
    names = TurnNames(
        model=model,
        render=request.render,
        layout=request.options.layout,
        tools=[tool.name for tool in assembly.placed.tools],
    )
    previous_names = None if part is None else part.names
    decided = assembly.selection.compaction
    return StoredTurn(
        options=request.cache,
        previous_preparation_id=before.id,
        digests=turn.digests,
        report=StoredCacheReport.model_validate(report.model_dump(mode="json")),
        created_at=now,
        expected_cached_tokens=expected,
        turn=_next_number(part),
        names=names,
        named_change=named_change(report.first_change, names, assembly.history, previous_names),
        expected_reason=expected_reason(
            report,
            has_previous=part is not None,
            previous_cacheable_tokens=previous_cacheable,
            since_previous=since,
            lifetime=read_lifetime,
        ),
        since_previous_seconds=since,
        lifetime_seconds=None if lifetime is None else lifetime.total_seconds(),
        min_cacheable_tokens=minimum,
        previous_cacheable_tokens=previous_cacheable,
        head_digest=assembly.head_digest,
        input_digests=list(assembly.conversation_hashes[len(assembly.history) :]),
        transcript=None
        if assembly.transcript is None
        else [insertion.dump() for insertion in assembly.transcript],
        compaction=None
        if decided is None
        else StoredCompaction(
            decision=decided.decision, reason=decided.reason, cleared=decided.cleared_calls
        ),
    )


async def previous_response_id(
    store: Store, tenant: str, before: Previous, request: PrepareRequest, now: float
) -> str | None:
    """The provider's response id the previous turn's latest main or wrap-up usage report named,
    for a request with ``cache.diagnostics`` (``None`` without it, without a previous turn or a
    report naming one, and when the previous turn had another render target: its ids are
    another API's)."""
    if request.cache is None or not request.cache.diagnostics:
        return None
    part = before.part
    if before.id is None or part is None or part.names is None:
        return None
    if part.names.render != request.render:
        return None
    record = await store.get(tenant, before.id, now)
    last = None if record is None else record.accounting.last
    found = None if last is None else last.get("response_id")
    return found if isinstance(found, str) else None


async def anchor(store: Store, tenant: str, before: Previous, now: float) -> Anchor | None:
    """The previous turn as an anchor for this turn's count (``core/anchor.py``): its frame's
    head and conversation, and the provider's input count of its main call, once a usage report
    gave it; ``None`` otherwise."""
    conversation = None if before.part is None else before.part.conversation()
    if before.id is None or before.part is None or conversation is None:
        return None
    record = await store.get(tenant, before.id, now)
    last = None if record is None else record.accounting.last
    if last is None or last.get("call") != "main" or last.get("provider_input_tokens") is None:
        return None
    head = before.part.head_digest
    assert head is not None  # conversation() is None without it
    return Anchor(before.id, head, conversation, int(last["provider_input_tokens"]))


def _next_number(previous: StoredTurn | None) -> int | None:
    """A turn's number: 1 without a previous turn, the previous one's plus one (``None`` when
    the previous record has no number: made before numbers were kept)."""
    if previous is None:
        return 1
    return None if previous.turn is None else previous.turn + 1


def _model_name(names: TurnNames) -> str:
    return f"{names.model} ({names.render})"


def named_change(
    change: FirstChange | None,
    names: TurnNames,
    history: Sequence[Message],
    previous: TurnNames | None,
) -> NamedChange | None:
    """``change`` with names (``lifecycle.NamedChange``): this turn's ``names`` and ``history``
    sent, and the previous turn's ``names`` (``None`` for a record made before they were kept).
    Only names and roles: never a text."""
    if change is None:
        return None
    named: dict[str, Any] = {"part": change.part, "index": change.index, "change": "changed"}
    index = change.index
    if change.part == "model":
        named["name"] = _model_name(names)
        if previous is not None:
            named["previous_name"] = _model_name(previous)
    elif change.part == "layout":
        named["name"] = names.layout
        if previous is not None:
            named["previous_name"] = previous.layout
    elif change.part == "tools" and index is not None:
        tools = names.tools
        before = None if previous is None else previous.tools
        if index >= len(tools):
            named["change"] = "removed"
            if before is not None and index < len(before):
                named["name"] = before[index]
        else:
            named["name"] = tools[index]
            if before is not None and index >= len(before):
                named["change"] = "added"
            elif before is not None and before[index] != tools[index]:
                # Tools are laid out by name: a new tool shifts the others, a removed one too.
                if tools[index] not in before and before[index] in tools:
                    named["change"] = "added"
                elif before[index] not in tools and tools[index] in before:
                    named["change"] = "removed"
                    named["name"] = before[index]
                else:
                    named["previous_name"] = before[index]
    elif change.part == "history" and index is not None:
        if index < len(history):
            named["role"] = history[index].role
        else:
            named["change"] = "removed"
    return NamedChange.model_validate(named)


def expected_reason(
    report: CacheReport,
    *,
    has_previous: bool,
    previous_cacheable_tokens: int | None,
    since_previous: float | None,
    lifetime: timedelta | None,
) -> ExpectedReason:
    """Why ``expected_cached_tokens`` is what it is: the conditions of
    ``core.cache.expected_cached_tokens`` in its order, ``"cached"`` when none holds (the
    figure is then above 0; a test holds the two together)."""
    if not has_previous:
        return "first_turn" if report.previous_preparation_id is None else "previous_unknown"
    if report.prefix_kept is not True:
        return "prefix_changed" if report.prefix_kept is False else "previous_unknown"
    if lifetime is None:
        return "no_provider_cache"
    if since_previous is not None and timedelta(seconds=since_previous) > lifetime:
        return "expired"
    if report.cacheable_tokens == 0:
        return "nothing_cacheable"
    if not previous_cacheable_tokens:
        return "previous_nothing_cacheable"
    return "cached"


def stored_options(stored: StoredPreparation) -> CacheOptions | None:
    """The ``cache`` object a record's request had (a refresh keeps it)."""
    return None if stored.cache is None else stored.cache.options


def stored_previous(stored: StoredPreparation | TurnRecord) -> str | None:
    """The previous preparation id a record was compared with."""
    return None if stored.cache is None else stored.cache.previous_preparation_id


def expected_of(stored: StoredPreparation) -> int | None:
    """A record's ``expected_cached_tokens`` (``None`` for a record made before it existed)."""
    return None if stored.cache is None else stored.cache.expected_cached_tokens


def miss(
    prefix_kept: bool | None,
    reason: str | None,
    expected: int | None,
    reported: int | None,
) -> CacheMiss | None:
    """How a turn missed the cache, if it did: its prefix changed, the previous turn's cache had
    expired, or the provider reported fewer cached tokens than expected."""
    if prefix_kept is False:
        return "prefix_changed"
    if reason == "expired":
        return "expired"
    if reported is not None and expected is not None and reported < expected:
        return "provider"
    return None


@dataclass(frozen=True, slots=True)
class Rebilled:
    """A main call's cache miss as its usage report counts it: ``cause``, the first part of
    the prefix that changed, ``expired`` or ``provider`` (``None``: no miss), and ``tokens``,
    the input tokens the miss billed again (``None``: not known, for a record made before the
    previous turn's cacheable tokens were kept)."""

    cause: MissCause | None
    tokens: int | None


NO_TURN: Final = Rebilled(None, None)


def rebilled(part: StoredTurn | None, reported: int | None, unread: int | None) -> Rebilled:
    """The miss of a turn's main call that read ``reported`` tokens from the cache (``None``:
    the report did not say, counted as 0) and what it billed again: what the call would have
    read without the miss, less what it read, at least 0 and at most the ``unread`` input
    tokens the call paid for otherwise (``None``: the report did not give its input).

    Without the miss means: for ``provider``, the expected cached tokens; for ``expired``,
    what the previous turn cached and this turn's prefix holds (the smaller of the two turns'
    cacheable tokens), as if the previous turn had been within the cache lifetime; for a
    changed prefix, the same figure as if the prefix had been kept, 0 when the previous turn
    was past the lifetime anyway or the render target has no cache the service models."""
    if part is None:
        return NO_TURN
    report = part.report
    kind = miss(report.prefix_kept, part.expected_reason, part.expected_cached_tokens, reported)
    if kind is None:
        return Rebilled(None, 0)
    cause: MissCause | None
    if kind == "prefix_changed":
        cause = _changed_part(report)
    else:
        cause = kind
    if cause is None:
        return NO_TURN
    previous = part.previous_cacheable_tokens
    could: int | None
    if kind == "provider":
        could = part.expected_cached_tokens
    elif previous is None or part.since_previous_seconds is None:
        could = None
    else:
        lifetime = part.lifetime_seconds
        since = 0.0 if kind == "expired" else part.since_previous_seconds
        could = expected_cached_tokens(
            prefix_kept=True,
            cacheable_tokens=report.cacheable_tokens,
            previous_cacheable_tokens=previous,
            since_previous=timedelta(seconds=since),
            lifetime=None if lifetime is None else timedelta(seconds=lifetime),
        )
    if could is None:
        return Rebilled(cause, None)
    tokens = max(0, could - (reported or 0))
    return Rebilled(cause, tokens if unread is None else min(tokens, max(0, unread)))


def _changed_part(report: StoredCacheReport) -> MissCause | None:
    """The first part of the prefix that changed, as the record names it (``compare`` always
    names one when the prefix was not kept; ``None`` for a record that does not)."""
    return None if report.first_change is None else _CHANGED_PARTS.get(report.first_change.part)


_CHANGED_PARTS: Final[dict[str, MissCause]] = {part: part for part in get_args(CachePart)}


def timeline_turn(
    record: PreparationRecord, stored: StoredPreparation | TurnRecord, number: int | None
) -> TimelineTurn:
    """A record (``stored``: what its data means, or its turn part) as a turn of the timeline;
    ``number`` is its turn's (``page`` derives it for a record that has none)."""
    part = stored.cache
    last = record.accounting.last
    reported = None if last is None else last.get("cached_input_tokens")
    priced = None if last is None else last.get("cost") or {}
    main = last is not None and last.get("call") == "main"
    report = StoredCacheReport() if part is None else part.report
    expected = None if part is None else part.expected_cached_tokens
    reason = None if part is None else part.expected_reason
    turn = {
        "turn": number,
        "preparation_id": record.id,
        "created_at": None
        if part is None
        else rfc3339(datetime.fromtimestamp(part.created_at, UTC)),
        "model": stored.model,
        "render": stored.render,
        "layout": stored.response.layout,
        "total_input_tokens": stored.estimated_input_tokens,
        "previous_preparation_id": None if part is None else part.previous_preparation_id,
        "prefix_kept": report.prefix_kept,
        "first_change": None if part is None else _named(part),
        "cacheable_tokens": None if part is None else report.cacheable_tokens,
        "expected_cached_tokens": expected,
        "expected_reason": reason,
        "seconds_since_previous": None if part is None else part.since_previous_seconds,
        "cache_lifetime_seconds": None if part is None else part.lifetime_seconds,
        "cached_input_tokens": reported,
        "cache_write_tokens": None if last is None else last.get("cache_creation_input_tokens"),
        "cost": None if priced is None else priced.get("total"),
        "rebilled_tokens": last.get("rebilled_tokens") if main and last is not None else None,
        "miss_cost": priced.get("miss") if main and priced is not None else None,
        "miss": miss(report.prefix_kept, reason, expected, reported),
        "compaction": None
        if part is None or part.compaction is None
        else {"decision": part.compaction.decision, "reason": part.compaction.reason},
    }
    return TimelineTurn.model_validate(turn)


def _named(part: StoredTurn) -> NamedChange | None:
    """The turn's first change with its names, or as ``selection.cache`` named it in a record
    made before the names were kept."""
    if part.named_change is not None:
        return part.named_change
    change = part.report.first_change
    return None if change is None else NamedChange(part=change.part, index=change.index)


async def page(
    store: Store, record: PreparationRecord, now: float, before: int | None = None
) -> Timeline:
    """A page of ``record``'s conversation, oldest first: ``record`` and the preparations before
    it (each record's previous preparation, while it is live, the tenant's and of the same
    scope), at most ``TIMELINE_TURNS``, the newest or those numbered below ``before``.

    The chain is walked from ``record`` (one read per turn, newer turns included when
    ``before`` skips them), each record read for its turn part only (``TurnRecord``);
    ``older_before`` is set when a live turn older than the page follows it."""
    shown: list[tuple[PreparationRecord, TurnRecord, int | None]] = []  # newest first
    seen = {record.id}
    current, stored = record, TurnRecord.read(record)
    number = _number(stored)
    scope_hash = stored.scope_hash
    older = False
    while True:
        if before is None or (number is not None and number < before):
            if len(shown) == TIMELINE_TURNS:
                older = True
                break
            shown.append((current, stored, number))
        prep_id = stored_previous(stored)
        if prep_id is None or prep_id in seen:
            break
        found = await store.get(record.tenant, prep_id, now)
        if found is None:
            break
        current, stored = found, TurnRecord.read(found)
        if stored.scope_hash != scope_hash:
            break
        seen.add(prep_id)
        own = _number(stored)
        number = own if own is not None else _less(number)
    shown.reverse()
    oldest = shown[0][2] if shown else None
    turns = [timeline_turn(r, s, n) for r, s, n in shown]
    costs = [turn.cost for turn in turns if turn.cost is not None]
    misses = [turn.miss_cost for turn in turns if turn.miss_cost is not None]
    return Timeline(
        preparation_id=record.id,
        turns=turns,
        older_before=oldest if older and oldest is not None else None,
        cost=round(sum(costs), 9) if costs else None,
        miss_cost=round(sum(misses), 9) if misses else None,
    )


def _number(stored: StoredPreparation | TurnRecord) -> int | None:
    return None if stored.cache is None else stored.cache.turn


def _less(number: int | None) -> int | None:
    return None if number is None or number <= 1 else number - 1
