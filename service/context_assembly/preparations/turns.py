"""Turns of one conversation: which preparation came before this one, what the record keeps of a
turn's cache plan, and the chain the timeline shows.

The plan and the comparison themselves are pure (``core/cache.py``); this module joins them to
the store.

Previous turn (``previous``)
    A request without ``cache``, or whose ``cache`` leaves out ``previous_preparation_id``, is
    compared with the latest preparation of the same tenant and scope: every ``put`` moves the
    store's pointer for ``scope_key(tenant, scope)`` (a digest: the store never sees the scope's
    values), and the pointer expires with the record it names. ``previous_preparation_id:
    null`` is a first turn. An id is looked up for the same tenant; when no live record of the
    tenant has it (unknown, expired or another tenant's, which look the same), the turn is
    compared with nothing: ``selection.cache`` names the id with ``prefix_kept: null``. The
    pointer carries the latest turn's ``"cache"`` field (below), so that a prepare finds its
    previous turn in one small read.

Record (``record_part``)
    Every preparation's record keeps, under ``"cache"``: the request's ``cache`` object (``None``
    when absent; a refresh takes it from here), the previous preparation id, the prefix digests
    (``PrefixDigests``: hashes, never text), ``selection.cache`` (kept even when the answer
    leaves it out, for the timeline), the wall time it was made and ``expected_cached_tokens``,
    which a usage report of the main call shows beside the provider's ``cached_input_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from context_assembly.core.cache import (
    DEFAULT_CACHE,
    CacheTurn,
    PrefixDigests,
    cache_lifetime,
    expected_cached_tokens,
)
from context_assembly.core.fingerprint import digest
from context_assembly.core.request import CacheOptions, PrepareRequest, Scope
from context_assembly.storage import PreparationRecord, Store

CACHE: Final = "cache"
"""The record's field holding the turn (see the module doc)."""

TIMELINE_TURNS: Final = 50
"""The most turns the timeline shows (the newest ones)."""


def scope_key(tenant: str, scope: Scope) -> str:
    """The store's name for the latest preparation of ``tenant`` in ``scope``: a digest only."""
    return digest([tenant, scope.model_dump(mode="json")]).removeprefix("sha256:")


def part_of(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A record's ``"cache"`` field, ``None`` for a record made before it existed."""
    part = data.get(CACHE)
    return part if isinstance(part, Mapping) else None


@dataclass(frozen=True, slots=True)
class Previous:
    """The turn a preparation is compared with: ``id`` as ``selection.cache`` names it, and the
    ``"cache"`` field of its record (``None``: compared with nothing)."""

    id: str | None
    part: Mapping[str, Any] | None

    @property
    def digests(self) -> PrefixDigests | None:
        return None if self.part is None else PrefixDigests.from_record(self.part["digests"])


FIRST_TURN: Final = Previous(None, None)


async def load(store: Store, tenant: str, prep_id: str | None, now: float) -> Previous:
    """The turn ``prep_id`` names (``FIRST_TURN`` for ``None``)."""
    if prep_id is None:
        return FIRST_TURN
    record = await store.get(tenant, prep_id, now)
    return Previous(prep_id, None if record is None else part_of(record.data))


async def previous(store: Store, tenant: str, request: PrepareRequest, now: float) -> Previous:
    """The previous turn of a new preparation (rules in the module doc). The scope's pointer
    carries the latest turn's ``"cache"`` field, so finding it reads no record."""
    options = request.cache
    if options is not None and options.previous_given:
        return await load(store, tenant, options.previous_preparation_id, now)
    latest = await store.latest(tenant, scope_key(tenant, request.scope), now)
    return FIRST_TURN if latest is None else Previous(latest.id, latest.data)


def record_part(
    request: PrepareRequest, turn: CacheTurn, before: Previous, now: float
) -> dict[str, Any]:
    """What the record keeps of a turn (see the module doc); ``now`` is the wall time."""
    options = request.cache if request.cache is not None else DEFAULT_CACHE
    report = turn.report
    expected = 0
    part = before.part
    if part is not None:
        expected = expected_cached_tokens(
            prefix_kept=report.prefix_kept,
            cacheable_tokens=report.cacheable_tokens,
            previous_cacheable_tokens=int(part["report"]["cacheable_tokens"]),
            since_previous=timedelta(seconds=now - float(part["created_at"])),
            lifetime=cache_lifetime(request.render, options),
        )
    return {
        "options": None
        if request.cache is None
        else request.cache.model_dump(mode="json", exclude_unset=True),
        "previous_preparation_id": before.id,
        "digests": turn.digests.to_record(),
        "report": report.model_dump(mode="json"),
        "created_at": now,
        "expected_cached_tokens": expected,
    }


def stored_options(data: Mapping[str, Any]) -> CacheOptions | None:
    """The ``cache`` object a record's request had (a refresh keeps it)."""
    part = part_of(data)
    if part is None or part.get("options") is None:
        return None
    return CacheOptions.model_validate(part["options"])


def stored_previous(data: Mapping[str, Any]) -> str | None:
    """The previous preparation id a record was compared with."""
    part = part_of(data)
    return None if part is None else part.get("previous_preparation_id")


def expected_of(data: Mapping[str, Any]) -> int | None:
    """A record's ``expected_cached_tokens`` (``None`` for a record made before it existed)."""
    part = part_of(data)
    return None if part is None else part.get("expected_cached_tokens")


async def chain(store: Store, record: PreparationRecord, now: float) -> list[PreparationRecord]:
    """``record`` and the preparations before it in the same scope, oldest first, at most
    ``TIMELINE_TURNS``: each record's previous preparation, while it is live, the tenant's and
    of the same scope."""
    turns = [record]
    current = record
    while len(turns) < TIMELINE_TURNS:
        prep_id = stored_previous(current.data)
        if prep_id is None or any(t.id == prep_id for t in turns):
            break
        found = await store.get(record.tenant, prep_id, now)
        if found is None or found.data.get("scope_hash") != record.data.get("scope_hash"):
            break
        turns.append(found)
        current = found
    turns.reverse()
    return turns
