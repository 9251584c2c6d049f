"""The ``transcript`` layout: each turn's frame extends the previous turn's (docs/contract.md,
"Layouts").

In ``stable-prefix`` the per-turn message (date line, legacy views) and the data message move to
the newest user turn every turn, so the provider can cache only up to the previous turn's user
message. In ``transcript`` they stay where an earlier turn put them: the caller sends its own
conversation back (without them), and the service re-inserts each one at the position it stood
(``Insertion.at``: the index, in the caller's conversation of history then input, of the
message it stood before). A new user turn adds its per-turn message and a data message with
what is new since the data already in the transcript; a step of a tool loop adds nothing before
the step's results, and new data, if any, after them. So the frame of turn k+1 begins with the
frame of turn k whenever the caller's conversation begins with turn k's.

The record never holds text (docs/contract.md, "Privacy"): an insertion keeps what it was made
of (the date line's local minute and time zone, a digest of the legacy views; each block piece's
qualified id, projection flag and digest) and a digest of the message. A re-inserted message is
rebuilt from this turn's own request: the date line from its minute, the views from the current
views when their digest matches, a data message from the current blocks when every piece is
offered again unchanged and unexpired. What cannot be rebuilt exactly is *cleared*: a short
fixed placeholder stands in its place from then on (the data it held is sent again in the new
data message if it is still selected). A block whose text changed, that expired or that is no
longer offered is therefore never sent from an earlier turn.

Pure: figures, hashes and blocks in, messages out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from context_assembly.core.blocks import Node
from context_assembly.core.counting import block_piece
from context_assembly.core.fingerprint import text_hash
from context_assembly.core.layout import PER_TURN_ROLE, date_line
from context_assembly.core.request import Block, Message
from context_assembly.core.select import DATA_ROLE, data_message

Kind = Literal["turn", "data", "cleared_turn", "cleared_data"]

CLEARED_TURN: Final = "[The notes of an earlier turn were cleared here.]"
CLEARED_DATA: Final = "[Context data of an earlier turn was cleared here; current data follows.]"
CLEARED_DATA_MESSAGE: Final = Message(role=DATA_ROLE, content=CLEARED_DATA)


@dataclass(frozen=True, slots=True)
class Insertion:
    """One message the service put into a transcript, without its text (module doc).

    ``at``: the index in the caller's conversation that it stands before. ``turn``: the local
    minute (ISO 8601 with offset), the time zone name and the digest of the legacy views.
    ``data``: the pieces as ``(source, block id, projected, piece digest)``, in order."""

    at: int
    kind: Kind
    digest: str
    minute: str | None = None
    timezone: str | None = None
    views: str | None = None
    pieces: tuple[tuple[str, str, bool, str], ...] = ()

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": self.at, "kind": self.kind, "digest": self.digest}
        if self.kind == "turn":
            out.update(minute=self.minute, timezone=self.timezone, views=self.views)
        if self.kind == "data":
            out["pieces"] = [list(piece) for piece in self.pieces]
        return out

    @classmethod
    def load(cls, raw: Mapping[str, Any]) -> Insertion:
        return cls(
            at=int(raw["at"]),
            kind=raw["kind"],
            digest=raw["digest"],
            minute=raw.get("minute"),
            timezone=raw.get("timezone"),
            views=raw.get("views"),
            pieces=tuple((str(s), str(i), bool(p), str(d)) for s, i, p, d in raw.get("pieces", ())),
        )


@dataclass(frozen=True, slots=True)
class Prior:
    """The previous turn of a ``transcript``: the message hashes of the conversation it sent
    and the insertions its frame held."""

    conversation: tuple[str, ...]
    insertions: tuple[Insertion, ...]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """An earlier insertion as this turn sends it."""

    insertion: Insertion  # as the record keeps it (a cleared one when it could not be rebuilt)
    message: Message
    cleared_now: bool


def turn_text(legacy_views: str, local_minute: datetime, timezone: str) -> str:
    """The per-turn message: the legacy views, then the date line."""
    return "\n\n".join(p for p in (legacy_views, date_line(local_minute, timezone)) if p)


def turn_insertion(at: int, legacy_views: str, local_now: datetime, timezone: str) -> Rebuilt:
    """This turn's per-turn message at ``at``."""
    minute = local_now.replace(second=0, microsecond=0)
    text = turn_text(legacy_views, minute, timezone)
    insertion = Insertion(
        at, "turn", text_hash(text), minute.isoformat(), timezone, text_hash(legacy_views)
    )
    return Rebuilt(insertion, Message(role=PER_TURN_ROLE, content=text), False)


def data_insertion(
    at: int, segments: Sequence[tuple[str, Sequence[tuple[Block, bool]]]]
) -> Rebuilt:
    """A data message of ``segments`` (each source's ``(block, projected)`` pieces) at ``at``."""
    text = data_message(segments)
    pieces = tuple(
        (source, block.id, projected, _piece_digest(block, projected))
        for source, items in segments
        for block, projected in items
    )
    insertion = Insertion(at, "data", text_hash(text), pieces=pieces)
    return Rebuilt(insertion, Message(role=DATA_ROLE, content=text), False)


def _piece_digest(block: Block, projected: bool) -> str:
    text = block.projection if projected and block.projection is not None else block.text
    return text_hash(block_piece(block.id, text, projected))


def rebuild(
    insertions: Iterable[Insertion],
    *,
    legacy_views: str,
    graph: Mapping[str, Node],
    now: datetime,
) -> list[Rebuilt]:
    """The earlier insertions as this turn sends them: rebuilt exactly, or cleared."""
    rebuilt: list[Rebuilt] = []
    for insertion in insertions:
        message = _rebuilt_message(insertion, legacy_views, graph, now)
        if message is not None and text_hash(_text(message)) == insertion.digest:
            rebuilt.append(Rebuilt(insertion, message, False))
            continue
        kind: Kind = (
            "cleared_turn" if insertion.kind in ("turn", "cleared_turn") else "cleared_data"
        )
        text = CLEARED_TURN if kind == "cleared_turn" else CLEARED_DATA
        role = PER_TURN_ROLE if kind == "cleared_turn" else DATA_ROLE
        cleared = Insertion(insertion.at, kind, text_hash(text))
        rebuilt.append(Rebuilt(cleared, Message(role=role, content=text), True))
    return rebuilt


def clear_data_messages(rebuilt: Iterable[Rebuilt]) -> list[Rebuilt]:
    """``rebuilt`` with every data message cleared (compaction clearing, docs/compaction.md): all
    of them at once, so the prefix changes once, and cleared from then on."""
    out = []
    for item in rebuilt:
        if item.insertion.kind != "data":
            out.append(item)
            continue
        cleared = Insertion(item.insertion.at, "cleared_data", text_hash(CLEARED_DATA))
        out.append(Rebuilt(cleared, CLEARED_DATA_MESSAGE, True))
    return out


def _text(message: Message) -> str:
    return message.content if isinstance(message.content, str) else ""


def _rebuilt_message(
    insertion: Insertion, legacy_views: str, graph: Mapping[str, Node], now: datetime
) -> Message | None:
    if insertion.kind == "cleared_turn":
        return Message(role=PER_TURN_ROLE, content=CLEARED_TURN)
    if insertion.kind == "cleared_data":
        return Message(role=DATA_ROLE, content=CLEARED_DATA)
    if insertion.kind == "turn":
        if insertion.minute is None or insertion.timezone is None:
            return None
        if insertion.views != text_hash(legacy_views):
            return None
        minute = datetime.fromisoformat(insertion.minute)
        return Message(
            role=PER_TURN_ROLE, content=turn_text(legacy_views, minute, insertion.timezone)
        )
    segments: list[tuple[str, list[tuple[Block, bool]]]] = []
    for source, block_id, projected, piece in insertion.pieces:
        node = graph.get(f"{source}/{block_id}")
        if node is None or (node.expires_at is not None and node.expires_at <= now):
            return None
        if _piece_digest(node.block, projected) != piece:
            return None
        if not segments or segments[-1][0] != source:
            segments.append((source, []))
        segments[-1][1].append((node.block, projected))
    return Message(role=DATA_ROLE, content=data_message(segments))


def present_pieces(rebuilt: Iterable[Rebuilt]) -> frozenset[tuple[str, str, bool, str]]:
    """The block pieces the re-inserted data messages already hold."""
    return frozenset(
        piece for item in rebuilt if not item.cleared_now for piece in item.insertion.pieces
    )


def new_data(
    order: Sequence[str],
    graph: Mapping[str, Node],
    projected: Mapping[str, bool],
    source_order: Sequence[str],
    present: frozenset[tuple[str, str, bool, str]],
) -> list[tuple[str, list[tuple[Block, bool]]]]:
    """The selected pieces that the transcript does not hold yet, grouped by source in
    ``source_order`` (the data message's own order)."""
    by_source: dict[str, list[tuple[Block, bool]]] = {}
    for qid in order:
        node = graph[qid]
        is_projected = projected[qid]
        key = (node.source, node.block.id, is_projected, _piece_digest(node.block, is_projected))
        if key not in present:
            by_source.setdefault(node.source, []).append((node.block, is_projected))
    return [(source, by_source[source]) for source in source_order if source in by_source]
