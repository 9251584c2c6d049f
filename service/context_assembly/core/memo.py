"""The assembly memo: what one turn decided about its blocks, reused when the next turn sends them again.

An agent sends the same memory entries, documents and notes turn after turn; only the input and
the history change. Validating, costing, selecting and reporting 128 blocks is most of a
prepare's work, and it is a pure function of the blocks and a few numbers. The memo keeps its
*text-free* result under a key that names all of those inputs, so that a repeated turn only
renders the data message again (from the current request's own blocks) and reuses the rest.

What the key holds (``AssemblyMemo.key``): per source, the SHA-256 of all of its blocks' fields
(``blocks_digest``; never the text itself); then the source order, the failed sources, the token
counter (by identity), the model profile and the validation limits. ``Outcome`` is further keyed
by the data limit, the data budget and the source limits. The same digests serve the request
shape hash that refresh compares (``preparations/record.py``), so the blocks are hashed once a
request.

What is kept: the protected demand, and per selection key the rendered order (source, block
position, view), the exact token count of that data message, the manifest's block reports (ids,
statuses, reasons, counts, dependencies), also packed as a record keeps them and counted by
status and reason, and the selected expiries. No block text, projection, instruction or history
is held: the data message is rendered each time from the request.

Time: a result depends on the clock only through which blocks have expired. An entry records the
latest expiry at or before the instant it was computed and the earliest after it, and is used only
while the clock stays between them (so a block expiring between two turns is decided again).

Errors are never memoised: a request that fails runs the whole way each time and fails the same way.

Bounds: a least-recently-used map of entries, weighted by the block reports they hold
(``max_blocks`` in all), at most ``MAX_OUTCOMES`` outcomes an entry; the least recently used
entries are dropped while the weight is over the bound. One memo serves one event loop (the app
makes one and hands it to its preparations); it takes no lock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Final

import orjson

from context_assembly.core.counting import ModelProfile, TokenCounter
from context_assembly.core.request import AssemblyOptions, Block
from context_assembly.core.result import BlockReport, DecisionTally

# Every field of a block, in a fixed order (a test holds this to the model's fields, so a new
# field cannot be left out of the digest).
BLOCK_FIELDS: Final = (
    "id",
    "text",
    "priority",
    "protected",
    "dependencies",
    "expires_at",
    "projection",
)
_block_values = attrgetter(*BLOCK_FIELDS)


def blocks_digest(blocks: Sequence[Block]) -> bytes:
    """SHA-256 of the blocks' fields as JSON arrays in ``BLOCK_FIELDS`` order: the identity of
    one source's blocks (canonical: a block holds no JSON object whose key order could vary).
    A stored shape hash is made of these digests, so the order is ``BLOCK_FIELDS``'s, whatever
    the model's own."""
    return hashlib.sha256(orjson.dumps([_block_values(b) for b in blocks])).digest()


# Block reports held in all: ~1.4 KB each with their JSON, rows and render plan (measured with
# tracemalloc over 128-block turns), so ~23 MB at most.
DEFAULT_MAX_BLOCKS: Final = 16_384
MAX_OUTCOMES: Final = 4  # selections kept per set of blocks (different limits), oldest dropped

MemoKey = tuple[object, ...]
SelectionKey = tuple[int, int, tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class Segment:
    """One source's part of the data message: block positions (in the key's block order) and,
    beside them, views (``True`` for the projection), in rendered order. Two flat tuples, not a
    pair per block: a memoised turn renders them with C-level iteration and touches two objects
    instead of one per block."""

    source: str
    positions: tuple[int, ...]
    projected: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The text-free result of one selection over the memoised blocks."""

    segments: tuple[Segment, ...]
    data_tokens: int
    blocks: tuple[BlockReport, ...]  # the manifest's block reports, in rank order
    block_rows: str  # and in the packed form a stored record keeps (``result.pack_block_rows``)
    selected_expiry: tuple[tuple[str, str], ...]
    decisions: DecisionTally  # the reports counted by status and reason (``result.decision_tally``)


@dataclass(slots=True)
class Entry:
    """Everything memoised for one set of blocks: the protected demand, and the outcomes by data
    limit, data budget and source limits."""

    demand: int
    valid_from: datetime | None  # the latest expiry at or before the computing instant
    valid_until: datetime | None  # the earliest expiry after it
    outcomes: dict[SelectionKey, Outcome] = field(default_factory=dict)

    @property
    def weight(self) -> int:
        """What the entry counts against the memo's bound: 1 + block reports held."""
        return sum(1 + len(outcome.blocks) for outcome in self.outcomes.values())

    def valid_at(self, now: datetime) -> bool:
        """Whether ``now`` sees the same blocks expired as the computing instant did."""
        if self.valid_from is not None and now < self.valid_from:
            return False
        return self.valid_until is None or now < self.valid_until


def expiry_window(
    expiries: Sequence[datetime], now: datetime
) -> tuple[datetime | None, datetime | None]:
    """``(latest expiry <= now, earliest expiry > now)``: the instants between which the set of
    expired blocks stays what it is at ``now``."""
    past = [moment for moment in expiries if moment <= now]
    future = [moment for moment in expiries if moment > now]
    return (max(past) if past else None, min(future) if future else None)


def selection_key(
    data_limit: int, max_data_tokens: int, source_limits: Mapping[str, int]
) -> SelectionKey:
    return (data_limit, max_data_tokens, tuple(sorted(source_limits.items())))


class AssemblyMemo:
    """A bounded, text-free memo of block decisions across turns (see the module docstring)."""

    __slots__ = ("_entries", "_hits", "_max_blocks", "_misses", "_weight")

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self._max_blocks = max_blocks
        self._entries: OrderedDict[MemoKey, Entry] = OrderedDict()
        self._weight = 0  # the sum of the entries' weights
        self._hits = 0
        self._misses = 0

    @staticmethod
    def key(
        digests: Sequence[tuple[str, bytes]],
        source_order: Sequence[str],
        failed: frozenset[str],
        counter: TokenCounter,
        profile: ModelProfile,
        options: AssemblyOptions,
    ) -> MemoKey:
        """The key of everything a selection depends on but the limits and the time, from the
        ``(source, blocks_digest)`` of each live source in order."""
        return (
            tuple(digests),
            tuple(source_order),
            failed,
            counter,
            profile,
            options.max_blocks,
            options.max_block_characters,
        )

    def get(self, key: MemoKey, now: datetime) -> Entry | None:
        """The entry of ``key`` if it is valid at ``now`` (then the most recently used)."""
        entry = self._entries.get(key)
        if entry is None or not entry.valid_at(now):
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return entry

    def record(
        self,
        key: MemoKey,
        entry: Entry | None,
        sel_key: SelectionKey,
        outcome: Outcome,
        *,
        demand: int,
        expiries: Sequence[datetime],
        now: datetime,
    ) -> None:
        """Keep ``outcome`` under ``key`` and ``sel_key``: in ``entry`` when the turn found one,
        else in a new entry (replacing one whose validity window has passed)."""
        if (1 + len(outcome.blocks)) * MAX_OUTCOMES > self._max_blocks:
            return  # an entry could outweigh the whole memo: not worth evicting everything for
        entries = self._entries
        if entry is None or entries.get(key) is not entry:
            valid_from, valid_until = expiry_window(expiries, now)
            entry = Entry(demand, valid_from, valid_until)
            replaced = entries.pop(key, None)
            if replaced is not None:
                self._weight -= replaced.weight
            entries[key] = entry
        before = entry.weight
        outcomes = entry.outcomes
        if sel_key not in outcomes and len(outcomes) >= MAX_OUTCOMES:
            del outcomes[next(iter(outcomes))]  # the oldest: limits move as history grows
        outcomes[sel_key] = outcome
        self._weight += entry.weight - before
        entries.move_to_end(key)
        while self._weight > self._max_blocks:
            _, dropped = entries.popitem(last=False)
            self._weight -= dropped.weight

    def info(self) -> tuple[int, int, int]:
        """``(hits, misses, entries)``."""
        return self._hits, self._misses, len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._weight = 0
        self._hits = 0
        self._misses = 0
