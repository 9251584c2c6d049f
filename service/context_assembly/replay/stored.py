"""A scope's own stored preparations, replayed (docs/replay.md, "Stored preparations").

Records keep no text (docs/contract.md, "Privacy"), so other policies cannot be tried on them:
what a record holds is the service's own plan and what came of it. ``replay --preparation ID``
reads the preparation's conversation from the configured store (the chain the timeline walks:
every page of it, oldest first) and puts, per turn and in total, the input, the cached tokens
the service's plan predicted by the provider's rules (``expected_cached_tokens``) against the
cached tokens and cache writes the usage reports gave, and the cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from context_assembly.config import Settings
from context_assembly.lifecycle_models import TimelineTurn
from context_assembly.preparations import turns
from context_assembly.storage import Store, open_store


class StoredError(RuntimeError):
    """The preparation cannot be read (unknown, expired or another tenant's)."""


async def stored_turns(store: Store, tenant: str, prep_id: str, now: float) -> list[TimelineTurn]:
    """Every live turn of ``prep_id``'s conversation, oldest first."""
    record = await store.get(tenant, prep_id, now)
    if record is None:
        raise StoredError(f"no live preparation {prep_id!r} of tenant {tenant!r} in the store")
    shown: list[TimelineTurn] = []
    before: int | None = None
    while True:
        page = await turns.page(store, record, now, before)
        shown = [*page.turns, *shown]
        if page.older_before is None or page.older_before == before:
            return shown
        before = page.older_before


async def read_stored(
    settings: Settings, tenant: str, prep_id: str, now: float
) -> list[TimelineTurn]:
    """``stored_turns`` from the store ``settings`` configure."""
    store = await open_store(
        settings.store.backend,
        path=settings.store.path,
        redis_url=settings.store.redis_url,
        key_prefix=settings.store.key_prefix,
        sqlite_synchronous=settings.store.sqlite_synchronous,
    )
    try:
        return await stored_turns(store, tenant, prep_id, now)
    finally:
        await store.aclose()


@dataclass(frozen=True, slots=True)
class StoredTotals:
    """The turns added up (a figure is summed over the turns that have it)."""

    turns: int
    reported: int  # turns with a usage report
    input_tokens: int
    predicted_cached: int
    reported_cached: int
    reported_writes: int
    cost: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "reported": self.reported,
            "input_tokens": self.input_tokens,
            "predicted_cached": self.predicted_cached,
            "reported_cached": self.reported_cached,
            "reported_cache_writes": self.reported_writes,
            "cost": None if self.cost is None else round(self.cost, 9),
        }


def totals(shown: Sequence[TimelineTurn]) -> StoredTotals:
    costs = [t.cost for t in shown if t.cost is not None]
    return StoredTotals(
        turns=len(shown),
        reported=sum(t.cached_input_tokens is not None for t in shown),
        input_tokens=sum(t.total_input_tokens for t in shown),
        predicted_cached=sum(t.expected_cached_tokens or 0 for t in shown),
        reported_cached=sum(t.cached_input_tokens or 0 for t in shown),
        reported_writes=sum(t.cache_write_tokens or 0 for t in shown),
        cost=sum(costs) if costs else None,
    )


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def as_text(prep_id: str, shown: Sequence[TimelineTurn]) -> str:
    """A table of the turns, then the totals."""
    lines = [
        f"{prep_id} (stored preparations): {len(shown)} turns, oldest first",
        f"{'turn':>4}  {'preparation':<30} {'input':>9} {'predicted':>9} {'reported':>9} "
        f"{'writes':>9} {'cost USD':>10}",
    ]
    for turn in shown:
        cost = "-" if turn.cost is None else f"{turn.cost:.4f}"
        lines.append(
            f"{'-' if turn.turn is None else turn.turn:>4}  {turn.preparation_id:<30} "
            f"{turn.total_input_tokens:>9,} {_count(turn.expected_cached_tokens):>9} "
            f"{_count(turn.cached_input_tokens):>9} {_count(turn.cache_write_tokens):>9} "
            f"{cost:>10}"
        )
    total = totals(shown)
    share = total.predicted_cached / total.input_tokens if total.input_tokens else 0.0
    said = total.reported_cached / total.input_tokens if total.input_tokens else 0.0
    cost = "-" if total.cost is None else f"{total.cost:.4f} USD"
    lines.append(
        f"total: input {total.input_tokens:,}; cached predicted {total.predicted_cached:,} "
        f"({share * 100:.1f}%), reported {total.reported_cached:,} ({said * 100:.1f}%, "
        f"{total.reported} of {total.turns} turns reported); cache writes reported "
        f"{total.reported_writes:,}; cost {cost}"
    )
    lines.append(
        "input: the service's count of each frame; predicted: the cached tokens its plan "
        "expected by the provider's rules; reported and writes: the usage reports'."
    )
    return "\n".join(lines) + "\n"


def as_json(prep_id: str, shown: Sequence[TimelineTurn]) -> dict[str, Any]:
    return {
        "preparation_id": prep_id,
        "turns": [t.model_dump(mode="json") for t in shown],
        "total": totals(shown).as_json(),
    }
