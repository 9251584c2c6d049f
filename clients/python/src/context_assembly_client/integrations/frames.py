"""The runtime's call in the service's neutral shape, and the service's frame mapped back onto
the runtime's own objects.

- **The call.** An adapter gives its runtime's call as a :class:`RuntimeCall`: the system
  prompt, and the messages and tools in neutral form, each :class:`Carried` with the runtime
  object(s) it stands for. :func:`split_turn` splits the messages into ``history`` and
  ``input``: ``input`` is the latest user turn (the run of consecutive user messages that holds
  the last one) and every message after it, tool calls and their results included; ``history``
  is everything before it. A call without any user message is all ``input``.
- **The frame, aligned** (:func:`align`): each frame message is matched, in order, with the
  neutral message the adapter sent, so that the runtime gets its own objects back (images,
  files, reasoning blocks, ids and metadata included); the messages the service added (leading
  system message, per-turn developer messages, data messages, earlier turns' ones included in a
  ``transcript``) are marked as such (:class:`FrameMessage`) for the adapter to build in its
  runtime's types. What the frame leaves out of the history is what :func:`history_skipped`
  says: the history the service dropped under ``history_policy: drop_oldest``
  (``budget.history_dropped_messages``), the messages before a provider's compaction item
  (:func:`is_compaction_item`) and those folded into a summary; a tool result the service
  cleared comes back rewritten.
- **The prepared call** (:class:`Prepared`): the service's answer, the aligned frame, the tools
  as the runtime's objects and what the call sets besides them (:mod:`.call_settings`).

A message the adapter has no neutral form for, or a frame that does not match what was sent, is
an :class:`IntegrationError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from context_assembly_client import ContextAssemblyError
from context_assembly_client.integrations.call_settings import Breakpoint, NativeApi
from context_assembly_client.types import CompactionReport, NativeDirective, PrepareResponse

__all__ = [
    "ADDED_ROLES",
    "Carried",
    "FrameMessage",
    "IntegrationError",
    "Prepared",
    "RuntimeCall",
    "align",
    "history_skipped",
    "is_compaction_item",
    "split_turn",
    "text_of",
]

ADDED_ROLES: Final = frozenset({"system", "developer", "user"})
"""Roles of the messages the service adds to a frame (leading system, per-turn developer, data)."""


class IntegrationError(ContextAssemblyError):
    """The adapter could not map a call or a frame: a message it has no neutral form for, or a
    frame that does not match what was sent. The call fails open like a service failure."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Carried:
    """One neutral message or tool and the runtime object(s) it stands for (``origin``)."""

    neutral: dict[str, Any]
    origin: Any


@dataclass(frozen=True, slots=True)
class RuntimeCall:
    """A runtime's model call in the service's neutral shape.

    ``model`` is the runtime's name of the model it is about to call (the request's ``model``
    unless the template names one); ``conversation`` the runtime's id of the conversation, thread
    or run, when it offers one (the default ``scope``)."""

    instructions: str
    messages: Sequence[Carried]
    tools: Sequence[Carried] = ()
    model: str | None = None
    conversation: str | None = None
    native_compaction: NativeApi | None = None
    """The provider compaction the model's class can carry in its call (``None``: none)."""


@dataclass(frozen=True, slots=True)
class FrameMessage:
    """One frame message: its ``index`` in the frame, and the runtime object it came from
    (``origin``), or ``None`` for a message the service added (``neutral`` then says what).
    ``rewritten``: the service replaced the content of ``origin`` (a cleared tool result): the
    runtime sends ``neutral["content"]`` in its place."""

    index: int
    neutral: dict[str, Any]
    origin: Any | None
    rewritten: bool = False


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepared call: the service's answer and the frame in terms of the runtime's objects."""

    response: PrepareResponse
    messages: Sequence[FrameMessage]
    tools: Sequence[Any]
    breakpoints: Sequence[Breakpoint] = ()
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    output_limit: int | None = None
    """The call's output limit: the budget's ``response_reserve`` plus its
    ``reasoning_reserve_tokens``, at most the model's maximum output (``None``: no reserve)."""
    compaction: CompactionReport | None = None
    """The compaction decision as the adapter presents it: ``selection.compaction``, with
    ``mode: "native"`` and the directive written (``native``) when the template asked for it."""
    native: NativeDirective | None = None
    """The provider's compaction to write into the call (``mode: "native"``, a class that has it)."""

    @property
    def preparation_id(self) -> str:
        return self.response.preparation_id

    def limit_within(self, *current: Any) -> int | None:
        """The output limit to set: :attr:`output_limit`, unless one of the ``current`` limits
        (the application's own settings, ``None`` when unset) is smaller; ``None`` when there is
        nothing to change."""
        if self.output_limit is None:
            return None
        set_already = [value for value in current if isinstance(value, int) and value > 0]
        if set_already and min(set_already) <= self.output_limit:
            return None
        return self.output_limit


# --------------------------------------------------------------------------- pure steps


def split_turn(messages: Sequence[Carried]) -> tuple[list[Carried], list[Carried]]:
    """``(history, input)``: ``input`` starts the latest user turn (see the module doc)."""
    roles = [message.neutral.get("role") for message in messages]
    if "user" not in roles:
        return [], list(messages)
    start = len(roles) - 1 - roles[::-1].index("user")
    while start > 0 and roles[start - 1] == "user":
        start -= 1
    return list(messages[:start]), list(messages[start:])


def _comparable(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message without its unset fields, as the service echoes it."""
    return {key: value for key, value in message.items() if value is not None}


def is_compaction_item(part: Any) -> bool:
    """Whether a neutral part is a provider's compaction item (``native``, item type
    ``compaction``)."""
    return (
        isinstance(part, Mapping)
        and part.get("type") == "native"
        and isinstance(part.get("item"), Mapping)
        and part["item"].get("type") == "compaction"
    )


def _from_item(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """``message`` from its latest compaction item on, as the service sends a history message
    that holds one (the provider ignores what precedes it); ``None`` when nothing is left out."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    found = [index for index, part in enumerate(content) if is_compaction_item(part)]
    if not found or found[-1] == 0:
        return None
    return _comparable({**message, "content": content[found[-1] :]})


def _rewritten(frame: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether ``frame`` is the tool message ``sent`` with its content replaced (cleared)."""
    return (
        frame.get("role") == "tool"
        and sent.get("role") == "tool"
        and isinstance(frame.get("content"), str)
        and _comparable({**frame, "content": None}) == _comparable({**sent, "content": None})
    )


def history_skipped(response: PrepareResponse) -> range:
    """The history messages the frame does not hold: those before a provider's compaction item
    and those ``history_policy`` dropped (the oldest), or those a summary folded (from
    ``folded_from``: the summary itself is a message the service added, and the first one
    ``history_policy`` drops after it).

    Raises:
        IntegrationError: for a summary after leading system messages together with dropped
            history, which the adapters do not map back.
    """
    report = response.selection.compaction
    removed = response.budget.history_dropped_messages
    if report is None:
        return range(removed)
    removed += report.provider_item_dropped_messages
    folded = report.folded_messages
    if not folded:
        return range(removed)
    start = report.folded_from
    if start and removed:
        raise IntegrationError(
            "a summary after leading system messages with history dropped is not mapped back"
        )
    return range(start, start + folded + max(removed - 1, 0))


def align(
    frame_messages: Sequence[Mapping[str, Any]],
    history: Sequence[Carried],
    inputs: Sequence[Carried],
    dropped: int | range,
) -> list[FrameMessage]:
    """The frame's messages, each with the runtime object it came from (``None``: added).

    The service keeps history (less the ``dropped`` messages: a count of the oldest, or the range
    :func:`history_skipped` gives)
    and input in order and only adds system, developer and user messages around them, so one
    pass in order matches them. A history message that holds a provider's compaction item comes
    back from that item on (the origin is still the whole runtime object: the provider ignores
    the rest); a tool result the service cleared comes back ``rewritten``.

    Raises:
        IntegrationError: when the frame holds another message, or lacks one that was sent.
    """
    skipped = range(dropped) if isinstance(dropped, int) else dropped
    expected = [*history[: skipped.start], *history[skipped.stop :], *inputs]
    aligned: list[FrameMessage] = []
    cursor = 0
    for index, raw in enumerate(frame_messages):
        message = dict(raw)
        sent = expected[cursor].neutral if cursor < len(expected) else None
        if sent is not None and _comparable(message) in (_comparable(sent), _from_item(sent)):
            aligned.append(FrameMessage(index, message, expected[cursor].origin))
            cursor += 1
        elif sent is not None and _rewritten(message, sent):
            aligned.append(FrameMessage(index, message, expected[cursor].origin, rewritten=True))
            cursor += 1
        elif message.get("role") in ADDED_ROLES and isinstance(message.get("content"), str):
            aligned.append(FrameMessage(index, message, None))
        else:
            raise IntegrationError(
                f"frame message {index} ({message.get('role')}) matches no message that was sent"
            )
    if cursor != len(expected):
        raise IntegrationError(
            f"the frame lacks {len(expected) - cursor} message(s) that were sent"
        )
    return aligned


def text_of(content: Any) -> str:
    """The text of a neutral content (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "")
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    )
