"""Context pressure and the compaction decision (docs/compaction.md). Pure: no I/O, no clock.

Every assembly measures its pressure against the window of the model that takes the call and
decides, in ``decide``, one of:

``none``
    under the trigger; or the floor (what compaction cannot lower) is itself at or over the
    trigger, so compacting would not bring the frame under it and would fire again every turn;
    or the previous turn of the scope compacted (hysteresis); or too little to clear; or it does
    not pay (``Economics``).
``compact``
    fold the history before the latest user turn: the caller's own summarizer (``report``), the
    provider (``native``, whose directive this module writes) or the service's summarizer
    contributor (``summarize``).
``clear_tool_results``
    replace old tool results with a placeholder naming the call (``clear_results``).

The floor is the part of the frame no compaction removes: the instructions, the tools, the
service's per-turn message, the protected data, the latest user turn with the tool loop after
it, and a provider's compaction item or a summary at the head of the history. For clearing, the
loop's earlier results that clearing may replace (``clearable``) are not in it: a long tool
loop's results are its main weight.

Two rewrites of the history run before any count, so that every count, hash and cache plan is
of the history as the provider will read it:

- ``after_provider_compaction``: a provider's compaction item (Anthropic's ``compaction`` block,
  OpenAI Responses' ``compaction`` item) replaces what precedes it, as both providers specify;
  the service drops that part itself instead of counting what the provider ignores.
- ``clear_results``: results cleared on earlier turns of the scope are cleared again, the same
  way, so the prefix the provider cached stays the same and nothing fires again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal

from pydantic import Field

from context_assembly.core.pricing import PriceRates
from context_assembly.core.request import (
    CompactionOptions,
    Frozen,
    Message,
    NativePart,
    Render,
)

Decision = Literal["none", "compact", "clear_tool_results"]
Reason = Literal[
    "under_trigger",
    "floor_over_trigger",
    "just_compacted",
    "too_little_to_clear",
    "does_not_pay",
    "over_trigger",
    "near_window",
]

NEAR_WINDOW: Final = 0.95
"""Past this share of the window left for input, compaction fires whether or not it pays: the
next turns would not fit."""

ANTHROPIC_BETA: Final = "compact-2026-01-12"
ANTHROPIC_EDIT: Final = "compact_20260112"
ANTHROPIC_MIN_TRIGGER: Final = 50_000
"""Anthropic refuses a compaction trigger below this many input tokens."""

CLEARED_RESULT: Final = "[tool result cleared to save context: {name} call {id}]"
"""The text a cleared tool result is replaced with."""


class Economics(Frozen):
    """Whether compacting pays, in USD at the model's prices, over `horizon_turns` turns."""

    horizon_turns: int = Field(description="The turns the comparison looks ahead.")
    carry_usd: float = Field(
        description="Carrying what compaction would remove, read from the cache at the cache-read "
        "rate, on each of the next `horizon_turns` turns."
    )
    compact_usd: float = Field(
        description="Compacting: writing the rebuilt frame to the cache once, plus (for "
        "`compact`) the summary call reading the folded part and writing the summary."
    )
    pays: bool = Field(description="Whether `carry_usd` exceeds `compact_usd`.")


class NativeDirective(Frozen):
    """The provider's own compaction, as the frame asks for it (`mode: "native"`)."""

    parameter: Literal["context_management"] = Field(description="The body member that carries it.")
    threshold_tokens: int = Field(
        description="The input tokens at which the provider compacts (Anthropic: at least 50,000)."
    )
    beta: str | None = Field(
        description="The `anthropic-beta` header value the call must carry (`null`: none)."
    )


class CompactionReport(Frozen):
    """`selection.compaction`: the context pressure of the call and what it decided."""

    mode: Literal["report", "native", "summarize", "clear_tool_results"] = Field(
        description="The request's `assembly.compaction.mode`."
    )
    window_tokens: int = Field(description="The window of the model that takes the call.")
    input_tokens: int = Field(description="The frame's input tokens, as assembled.")
    floor_tokens: int = Field(
        description="What no compaction can remove: instructions, tools, the per-turn message, "
        "protected data, the latest user turn and its tool loop, a compaction item or summary "
        "at the head of the history."
    )
    trigger_tokens: int = Field(description="The input tokens at which compaction fires.")
    decision: Decision = Field(description="`none`, `compact` or `clear_tool_results`.")
    reason: Reason = Field(
        description="Why: `under_trigger`, `floor_over_trigger` (compacting could not bring the "
        "frame under the trigger), `just_compacted` (the previous turn of the scope compacted), "
        "`too_little_to_clear` (fewer clearable tool-result tokens than `clear_at_least`), "
        "`does_not_pay`, `over_trigger`, `near_window` (over the trigger and near the window: "
        "fires whether or not it pays)."
    )
    reclaimable_tokens: int = Field(
        description="Tokens the decision's action could remove: the input over the floor, or "
        "for clearing the clearable tool results."
    )
    economics: Economics | None = Field(
        default=None,
        description="Whether it pays, at the model's prices; `null` without a price or when "
        "under the trigger.",
    )
    provider_item_dropped_messages: int = Field(
        default=0,
        description="History messages before a provider's compaction item, left out as the "
        "provider ignores them.",
    )
    cleared_calls: list[str] = Field(
        default_factory=list,
        description="The tool calls whose results this frame sends cleared (earlier turns' and "
        "this turn's), oldest first.",
    )
    cleared_tokens: int = Field(
        default=0, description="Tokens the clearing of this turn removed from the frame."
    )
    native: NativeDirective | None = Field(
        default=None, description="The provider's compaction as the frame asks for it."
    )
    folded_from: int = Field(
        default=0,
        description="`summarize`: the index of the first history message the summary replaced "
        "(after the history's leading system and developer messages, which are never folded).",
    )
    folded_messages: int = Field(
        default=0,
        description="`summarize`: how many history messages, from `folded_from`, the summary "
        "replaced in this frame.",
    )
    summary: dict[str, Any] | None = Field(
        default=None,
        description="`summarize`: the summary message that replaced them, for the caller to put "
        "in place of those `folded_messages` history messages in later turns.",
    )


@dataclass(frozen=True, slots=True)
class Pressure:
    """The figures a decision is made from (counts of the frame as assembled)."""

    window: int
    reserve: int
    total: int
    floor: int


@dataclass(frozen=True, slots=True)
class Previous:
    """What the previous turn of the scope recorded of its compaction."""

    acted: bool  # it compacted or cleared
    cleared: tuple[str, ...]  # call ids whose results it sent cleared


def trigger_tokens(options: CompactionOptions, window: int) -> int:
    """The trigger: ``trigger_tokens``, else ``trigger_fraction`` of the window."""
    if options.trigger_tokens is not None:
        return options.trigger_tokens
    return math.floor(options.trigger_fraction * window)


# --------------------------------------------------------------------------- history rewrites


def _compaction_index(message: Message) -> int | None:
    if isinstance(message.content, str):
        return None
    found = None
    for index, part in enumerate(message.content):
        if isinstance(part, NativePart) and part.item.get("type") == "compaction":
            found = index
    return found


def after_provider_compaction(history: Sequence[Message]) -> tuple[list[Message], int]:
    """The history from the latest provider compaction item on (parts before it in its own
    message left out too), and how many messages were left out before it."""
    for at in range(len(history) - 1, -1, -1):
        index = _compaction_index(history[at])
        if index is None:
            continue
        message = history[at]
        assert not isinstance(message.content, str)
        if index:
            message = message.model_copy(update={"content": list(message.content[index:])})
        return [message, *history[at + 1 :]], at
    return list(history), 0


SUMMARY_HEADING: Final = "[Summary of the earlier conversation]\n\n"
"""The start of a summary message (``summarize``): how a later turn knows it."""


def summary_message(summary: str) -> Message:
    """The message a summary replaces the folded history with: a ``user`` message (every
    provider accepts one at the start of a conversation)."""
    return Message(role="user", content=SUMMARY_HEADING + summary)


def fold_span(history: Sequence[Message], point: int) -> range:
    """The history messages a summary folds: from the first one after the leading system and
    developer messages (instructions are never folded) to the last assistant message ahead of
    ``point`` (the latest user turn), that one excluded. The summary (a ``user`` message) is
    then followed by that reply, never by the latest user turn, so the service's per-turn
    messages still stand after it; and a cut before an assistant message never parts a tool call
    from its results. Empty: nothing to fold."""
    start = 0
    while start < len(history) and history[start].role in ("system", "developer"):
        start += 1
    for index in range(min(point, len(history)) - 1, start, -1):
        if history[index].role == "assistant":
            return range(start, index)
    return range(start, start)


def starts_with_compaction(history: Sequence[Message]) -> bool:
    """Whether the history opens with a provider's compaction item or a summary: a unit that
    no compaction removes."""
    if not history:
        return False
    first = next((m for m in history if m.role not in ("system", "developer")), history[0])
    if isinstance(first.content, str):
        return first.role == "user" and first.content.startswith(SUMMARY_HEADING)
    return _compaction_index(first) == 0


def _call_names(conversation: Iterable[Message]) -> dict[str, str]:
    return {
        call.id: call.name
        for message in conversation
        if message.tool_calls
        for call in message.tool_calls
    }


def clear_results(history: Sequence[Message], calls: Iterable[str]) -> list[Message]:
    """``history`` with the results of ``calls`` replaced by ``CLEARED_RESULT``; every other
    message, the calls themselves and the results' ids and fields unchanged."""
    wanted = set(calls)
    if not wanted:
        return list(history)
    names = _call_names(history)
    out = []
    for message in history:
        call = message.tool_call_id
        if message.role == "tool" and call in wanted:
            text = CLEARED_RESULT.format(name=names.get(call, "tool"), id=call)
            message = message.model_copy(update={"content": text})
        out.append(message)
    return out


def clearable(
    history: Sequence[Message],
    counts: Sequence[int],
    newer: int,
    options: CompactionOptions,
    already: Iterable[str],
) -> list[tuple[str, int]]:
    """The results that clearing may replace, oldest first, with their tokens: tool results of
    the history, a tool loop's earlier steps included, except the newest ``keep_tool_results``
    (``newer`` of which are in the input) and those of ``exclude_tools``, not cleared yet."""
    names = _call_names(history)
    done = set(already)
    results = [
        (index, message.tool_call_id)
        for index, message in enumerate(history)
        if message.role == "tool" and message.tool_call_id is not None
    ]
    keep = max(options.keep_tool_results - newer, 0)
    older = results[: max(len(results) - keep, 0)]
    return [
        (call, counts[index])
        for index, call in older
        if call not in done and names.get(call) not in options.exclude_tools
    ]


# --------------------------------------------------------------------------- the decision


def decide(
    options: CompactionOptions,
    pressure: Pressure,
    *,
    previous: Previous | None,
    clearable_tokens: int,
    price: PriceRates | None,
    render: Render,
) -> CompactionReport:
    """The decision of one turn (module doc). ``clearable_tokens``: what clearing would remove
    now; ``price``: the model's rates (``None``: the decision follows the trigger alone)."""
    trigger = trigger_tokens(options, pressure.window)
    clearing = options.mode == "clear_tool_results"
    reclaimable = clearable_tokens if clearing else max(pressure.total - pressure.floor, 0)
    base: dict[str, Any] = {
        "mode": options.mode,
        "window_tokens": pressure.window,
        "input_tokens": pressure.total,
        "floor_tokens": pressure.floor,
        "trigger_tokens": trigger,
        "reclaimable_tokens": reclaimable,
        "native": native_directive(options, render, trigger),
    }

    def answer(
        decision: Decision, reason: Reason, economics: Economics | None = None
    ) -> CompactionReport:
        return CompactionReport(decision=decision, reason=reason, economics=economics, **base)

    if pressure.total < trigger:
        return answer("none", "under_trigger")
    if pressure.floor >= trigger:
        return answer("none", "floor_over_trigger")
    if previous is not None and previous.acted:
        return answer("none", "just_compacted")
    if clearing and (clearable_tokens == 0 or clearable_tokens < options.clear_at_least):
        return answer("none", "too_little_to_clear")
    economics = None if price is None else _economics(options, pressure, reclaimable, price)
    decision: Decision = "clear_tool_results" if clearing else "compact"
    if pressure.total >= NEAR_WINDOW * (pressure.window - pressure.reserve):
        return answer(decision, "near_window", economics)
    if economics is not None and not economics.pays:
        return answer("none", "does_not_pay", economics)
    return answer(decision, "over_trigger", economics)


def _economics(
    options: CompactionOptions, pressure: Pressure, reclaimable: int, price: PriceRates
) -> Economics | None:
    """Carrying ``reclaimable`` at the cache-read rate for ``horizon_turns`` turns, against
    writing the rebuilt frame once and (for ``compact``) the summary call: the folded part read
    from the cache and the summary written as output. ``None`` when a rate is missing."""
    rates = price.base
    write = rates.cache_write_5m or rates.cache_write or rates.input
    read = rates.cache_read
    if read is None:
        return None
    summary = 0 if options.mode == "clear_tool_results" else options.summary_tokens
    rebuilt = pressure.total - reclaimable + summary
    per_million = Decimal(1_000_000)
    carry = Decimal(reclaimable) * read * options.horizon_turns / per_million
    compact = Decimal(rebuilt) * write / per_million
    if summary:
        compact += (Decimal(reclaimable) * read + Decimal(summary) * rates.output) / per_million
    return Economics(
        horizon_turns=options.horizon_turns,
        carry_usd=round(float(carry), 9),
        compact_usd=round(float(compact), 9),
        pays=carry > compact,
    )


# --------------------------------------------------------------------------- native


def native_directive(
    options: CompactionOptions, render: Render, trigger: int
) -> NativeDirective | None:
    """The provider's compaction for ``mode: "native"`` and a render that has it."""
    if options.mode != "native":
        return None
    if render == "anthropic":
        return NativeDirective(
            parameter="context_management",
            threshold_tokens=max(trigger, ANTHROPIC_MIN_TRIGGER),
            beta=ANTHROPIC_BETA,
        )
    if render == "openai-responses":
        return NativeDirective(parameter="context_management", threshold_tokens=trigger, beta=None)
    return None


def add_native(body: dict[str, Any], render: Render, directive: NativeDirective | None) -> None:
    """Write ``directive`` into a rendered provider body (in place)."""
    if directive is None:
        return
    if render == "anthropic":
        edit = {
            "type": ANTHROPIC_EDIT,
            "trigger": {"type": "input_tokens", "value": directive.threshold_tokens},
        }
        body["context_management"] = {"edits": [edit]}
    elif render == "openai-responses":
        body["context_management"] = [
            {"type": "compaction", "compact_threshold": directive.threshold_tokens}
        ]
