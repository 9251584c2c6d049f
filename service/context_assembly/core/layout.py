"""Prompt layouts (docs/contract.md, "Layouts"): where instructions, legacy views, the date line and data go.

``legacy``: one leading *system* message with host instructions, plugin instructions, the legacy
plugin views and the current date/time; then history; then the data message; then the input.
Tools in the caller's order.

``stable-prefix``: the leading *system* message holds only host and plugin instructions (nothing
that changes per turn); tools sorted by name (a sorted copy, the caller's list is untouched);
history; then one *developer* message with the legacy plugin views and the date/time; then the
data message; then the input. Everything before that developer message is the stable prefix.

Contributed data always stays in the *user* data message, never in instructions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from context_assembly.core.request import Message, PrepareRequest, Tool
from context_assembly.core.sources import SourceSetup

Layout = Literal["legacy", "stable-prefix"]
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
    leading: str | None
    per_turn: str | None
    if layout == "legacy":
        leading = "\n\n".join(p for p in (texts.instructions, texts.legacy_data, texts.date) if p)
        per_turn = None
        ordered_tools = tuple(tools)
    else:
        leading = texts.instructions or None
        per_turn = "\n\n".join(p for p in (texts.legacy_data, texts.date) if p)
        ordered_tools = tuple(sorted(tools, key=lambda t: t.name))
    if leading:
        messages.append(Message(role=LEADING_ROLE, content=leading))
    messages.extend(history)
    prefix_len = len(messages)
    if per_turn:
        messages.append(Message(role=PER_TURN_ROLE, content=per_turn))
    data_index = None
    if data_content is not None:
        data_index = len(messages)
        messages.append(Message(role="user", content=data_content))
    messages.extend(inputs)
    return Placed(tuple(messages), ordered_tools, prefix_len, leading or None, per_turn, data_index)
