"""The providers' tool-pairing rules, checked on the conversation a request sends (docs/api.md,
"Tool calls and their results").

Every provider refuses a conversation whose tool calls and results do not pair up: OpenAI Chat
wants the ``tool`` messages of every call of an assistant message right after it; Anthropic wants
the ``tool_result`` blocks of all parallel calls to open the next user message; Gemini wants the
``functionResponse`` turn right after the ``functionCall`` turn; OpenAI Responses wants an output
for every ``function_call``. In the neutral shape these are one rule, checked for every render
(a ``neutral`` frame is sent to one of them by an adapter):

- every call of an assistant message is answered by a ``tool`` message before the next message
  that is not a ``tool`` message, and before the conversation ends;
- a ``tool`` message answers a call of the assistant message before it that is still open: no
  result without its call, none twice;
- one assistant message does not use a call id twice.

With a provider-held history (``{"native": true}``) the input may open with results of calls the
provider holds.

Pure: it reads the messages after the provider shapes were read into the neutral one (plain
objects, possibly not yet validated: a malformed message is left to the model's validation) and
names the caller's own message (``history.4``, ``input.0``) through ``origins``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Located:
    """A message of the conversation and the caller's place for it (``("history", 4)``)."""

    message: Any
    field: str
    index: int


@dataclass(frozen=True, slots=True)
class PairingViolation:
    """The first place the conversation breaks a pairing rule."""

    field: str
    index: int
    call_id: str
    message: str


def _get(message: Any, key: str) -> Any:
    if isinstance(message, dict):
        return message.get(key)
    return getattr(message, key, None)


def _call_ids(message: Any) -> list[str] | None:
    """The call ids of an assistant message (``None`` when it is not one with calls, or when its
    calls are malformed: validation names those)."""
    if _get(message, "role") != "assistant":
        return None
    calls = _get(message, "tool_calls")
    if not isinstance(calls, list) or not calls:
        return None
    ids = [_get(call, "id") for call in calls]
    return ids if all(isinstance(i, str) for i in ids) else None


def first_violation(
    conversation: Sequence[Located], *, provider_held: bool = False
) -> PairingViolation | None:
    """The first pairing rule ``conversation`` (history, then input) breaks, or ``None``."""
    open_calls: dict[str, Located] = {}
    answered: set[str] = set()
    started = False  # a message other than a tool result has been seen
    for item in conversation:
        role = _get(item.message, "role")
        if role == "tool":
            call_id = _get(item.message, "tool_call_id")
            if not isinstance(call_id, str):
                continue  # validation names the missing id
            if call_id in open_calls:
                del open_calls[call_id]
                answered.add(call_id)
                continue
            if provider_held and not started:
                continue
            why = "answers it again" if call_id in answered else "has no call before it"
            return PairingViolation(
                item.field,
                item.index,
                call_id,
                f"the tool result for call {call_id!r} {why}: a result must answer a call of "
                "the assistant message before it that is not yet answered",
            )
        started = True
        if open_calls:
            return _unanswered(open_calls, f"before {item.field}.{item.index}")
        ids = _call_ids(item.message)
        if ids is None:
            continue
        answered = set()
        for call_id in ids:
            if call_id in open_calls:
                return PairingViolation(
                    item.field,
                    item.index,
                    call_id,
                    f"the assistant message names call id {call_id!r} twice",
                )
            open_calls[call_id] = item
    if open_calls:
        return _unanswered(open_calls, "before the conversation ends")
    return None


def _unanswered(open_calls: dict[str, Located], where: str) -> PairingViolation:
    call_id, owner = next(iter(open_calls.items()))
    return PairingViolation(
        owner.field,
        owner.index,
        call_id,
        f"tool call {call_id!r} of this assistant message has no result {where}: every call "
        "must be answered by a tool message right after the message that makes it",
    )
