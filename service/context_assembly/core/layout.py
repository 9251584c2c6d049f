"""Prompt layouts (docs/contract.md, "Layouts"): where instructions, legacy views, the date line and data go.

``legacy``: one leading *system* message with host instructions, plugin instructions, the legacy
plugin views and the current date/time; then the conversation (history, then input) with the data
message inserted at the turn point (below). Tools in the caller's order.

``stable-prefix``: the leading *system* message holds only host and plugin instructions (nothing
that changes per turn); tools sorted by name (a sorted copy, the caller's list is untouched);
then the conversation with one *developer* message (the legacy plugin views and the date/time)
and the data message inserted at the turn point. Everything before the turn point is the stable
prefix.

The turn point (``turn_point``): the service's own per-turn messages stand immediately before the
latest user turn, the run of ``user`` messages that holds the last ``user`` message of history +
input. What follows it (the assistant's tool calls, their results, further steps of the loop)
comes after them, so they never stand between a tool call and its results, and every step of a
tool loop repeats the previous step's frame as its prefix while the data is unchanged. Without a
user message they open the conversation.

Contributed data always stays in the *user* data message, never in instructions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from context_assembly.core.request import Message, PrepareRequest, Tool
from context_assembly.core.sources import SourceSetup

Layout = Literal["legacy", "stable-prefix", "transcript"]
LEADING_ROLE = "system"
PER_TURN_ROLE = "developer"


def partial_view_note(source: str, recovery_tool: str | None) -> str:
    """The note a replaced source gets in its instructions: the model sees the entries selected
    for this request. It is true whether or not an entry was left out, so that it can stay in
    the cache-stable prefix while the selection changes from turn to turn."""
    note = (
        f"Note: this request shows the {source} entries selected for it, which may not be all "
        "of them; entries that are not shown still exist and were not deleted."
    )
    if recovery_tool:
        note += f" Use the {recovery_tool} tool to read an entry that is not shown."
    return note


_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def date_line(local_now: datetime, timezone: str) -> str:
    """The current date/time line, to the minute, in the request's time zone.

    Formatted field by field (English weekday names whatever the process locale; ``strftime``
    would follow ``LC_TIME`` and costs more).
    """
    n = local_now
    return (
        f"Current date and time: {n.year:04d}-{n.month:02d}-{n.day:02d} {n.hour:02d}:{n.minute:02d}"
        f" ({timezone}, {_WEEKDAYS[n.weekday()]})"
    )


@dataclass(frozen=True, slots=True)
class Texts:
    """The host-side text parts of a frame, before they are placed by a layout."""

    instructions: str  # host + plugin instructions (+ partial-view notes)
    legacy_data: str  # legacy plugin views of sources that are not replaced
    date: str


def build_texts(
    request: PrepareRequest, replaced: Mapping[str, SourceSetup], local_now: datetime
) -> Texts:
    """Host instructions, plugin instructions and legacy views, with replacements applied."""
    parts = [request.instructions] if request.instructions else []
    views: list[str] = []
    for plugin in request.plugins:
        setup = replaced.get(plugin.name)
        instructions = plugin.instructions
        if setup is not None:
            if setup.replaces_instructions:
                instructions = setup.instructions
            note = partial_view_note(plugin.name, setup.recovery_tool)
            instructions = f"{instructions}\n{note}" if instructions else note
        elif plugin.content:
            views.append(f"## {plugin.name} (current content)\n{plugin.content}")
        if instructions:
            parts.append(f"## {plugin.name}\n{instructions}")
    return Texts("\n\n".join(parts), "\n\n".join(views), date_line(local_now, request.timezone))


@dataclass(frozen=True, slots=True)
class Placed:
    """The frame's messages by role in the layout; ``prefix_len`` messages form the prefix."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...]
    prefix_len: int
    leading: str | None  # text of the leading system message
    per_turn: str | None  # text of the per-turn developer message (stable-prefix only)
    data_index: int | None  # position of the data message
    history_in_prefix: int  # how many history messages stand before the turn point
    turn_index: int | None  # frame position of the latest user turn (None without one)
    own_index: int  # frame position of this turn's own messages (where they would stand)
    own_count: int  # how many this turn added (0 to 2)


def turn_point(conversation: Sequence[Message]) -> int:
    """Where the service's per-turn messages go in ``conversation`` (history + input): the start
    of the run of ``user`` messages that holds the last one; 0 when there is no user message."""
    last = next(
        (i for i in range(len(conversation) - 1, -1, -1) if conversation[i].role == "user"), None
    )
    if last is None:
        return 0
    while last > 0 and conversation[last - 1].role == "user":
        last -= 1
    return last


def leading_text(layout: Layout, texts: Texts) -> str | None:
    """The leading system message's text in ``layout`` (``None`` when it has none)."""
    if layout == "legacy":
        parts = (texts.instructions, texts.legacy_data, texts.date)
        return "\n\n".join(p for p in parts if p) or None
    return texts.instructions or None


def frame_tools(layout: Layout, tools: Sequence[Tool]) -> tuple[Tool, ...]:
    """The tools in frame order: the caller's in ``legacy``, sorted by name otherwise."""
    if layout == "legacy":
        return tuple(tools)
    return tuple(sorted(tools, key=lambda t: t.name))


def place(
    layout: Layout,
    texts: Texts,
    tools: Sequence[Tool],
    history: Sequence[Message],
    data_content: str | None,
    inputs: Sequence[Message],
) -> Placed:
    """Lay the frame out; pure and deterministic."""
    messages: list[Message] = []
    leading = leading_text(layout, texts)
    per_turn: str | None = None
    if layout != "legacy":
        per_turn = "\n\n".join(p for p in (texts.legacy_data, texts.date) if p)
    ordered_tools = frame_tools(layout, tools)
    if leading:
        messages.append(Message(role=LEADING_ROLE, content=leading))
    conversation = (*history, *inputs)
    point = turn_point(conversation)
    messages.extend(conversation[:point])
    prefix_len = len(messages)
    if per_turn:
        messages.append(Message(role=PER_TURN_ROLE, content=per_turn))
    data_index = None
    if data_content is not None:
        data_index = len(messages)
        messages.append(Message(role="user", content=data_content))
    turn_index = len(messages) if any(m.role == "user" for m in conversation[point:]) else None
    messages.extend(conversation[point:])
    return Placed(
        tuple(messages),
        ordered_tools,
        prefix_len,
        leading or None,
        per_turn,
        data_index,
        history_in_prefix=min(point, len(history)),
        turn_index=turn_index,
        own_index=prefix_len,
        own_count=bool(per_turn) + (data_index is not None),
    )


def place_transcript(
    texts: Texts,
    tools: Sequence[Tool],
    conversation: Sequence[Message],
    insertions: Sequence[tuple[int, Message, bool]],
    *,
    history_len: int,
    shared: int,
) -> Placed:
    """Lay a ``transcript`` frame out (``core/transcript.py``): the leading instructions, then
    the conversation with each insertion ``(at, message, new)`` before ``conversation[at]`` (at
    the end for ``at == len(conversation)``), in the given order. The prefix is everything the
    previous turn's frame held: what comes before this turn's first new insertion and before the
    conversation's first message beyond ``shared``."""
    leading = leading_text("transcript", texts)
    messages: list[Message] = []
    if leading:
        messages.append(Message(role=LEADING_ROLE, content=leading))
    by_position: dict[int, list[tuple[Message, bool]]] = {}
    for at, message, new in insertions:
        by_position.setdefault(at, []).append((message, new))
    prefix_len: int | None = None
    own_index: int | None = None
    own_count = 0
    per_turn: str | None = None
    data_index: int | None = None
    history_in_prefix = 0
    frame_index: list[int] = []  # of each conversation message
    for index in range(len(conversation) + 1):
        for message, new in by_position.get(index, ()):
            if new and prefix_len is None:
                prefix_len = len(messages)
            if new:
                own_index = len(messages) if own_index is None else own_index
                own_count += 1
            if new and message.role == PER_TURN_ROLE:
                per_turn = message.content if isinstance(message.content, str) else None
            elif new:
                data_index = len(messages)
            messages.append(message)
        if index == len(conversation):
            break
        if index >= shared and prefix_len is None:
            prefix_len = len(messages)
        if prefix_len is None and index < history_len:
            history_in_prefix += 1
        frame_index.append(len(messages))
        messages.append(conversation[index])
    point = turn_point(conversation)
    turn_index = None
    if any(m.role == "user" for m in conversation[point:]):
        turn_index = frame_index[point]
    return Placed(
        tuple(messages),
        frame_tools("transcript", tools),
        len(messages) if prefix_len is None else prefix_len,
        leading,
        per_turn,
        data_index,
        history_in_prefix=history_in_prefix,
        turn_index=turn_index,
        own_index=len(messages) if own_index is None else own_index,
        own_count=own_count,
    )
