"""The token budget (docs/contract.md, "Budget") and opt-in history compaction.

::

    capacity   = max_context_tokens | registry(model) | fallback 128000
    fixed      = instructions + legacy data + date/time + tools + history + input (framing included)
    reserve    = response_reserve + reasoning_reserve_tokens
    remaining  = capacity - reserve - fixed
    data_limit = min(max_data_tokens, remaining)

``instructions_tokens`` carries the once-per-request reply priming of the chat counting rule, so
that the terms add up to ``total_input_tokens`` exactly.

With a native (provider-held) history the history term is the request's
``provider_counted_tokens``: one item the service cannot see, split or drop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from context_assembly.core.counting import (
    Counted,
    ModelProfile,
    TokenCounter,
    count_message,
    count_text_message,
    count_tools,
)
from context_assembly.core.layout import LEADING_ROLE, PER_TURN_ROLE, Layout, Texts
from context_assembly.core.request import Message, PrepareRequest, Tool

FALLBACK_CAPACITY = 128_000
CapacitySource = Literal["host", "provider", "registry", "fallback"]


@dataclass(frozen=True, slots=True)
class Capacity:
    tokens: int
    source: CapacitySource


def resolve_capacity(
    max_context_tokens: int | None,
    max_context_source: Literal["host", "provider"],
    profile: ModelProfile | None,
) -> Capacity:
    """The window: the request's figure, else the registry's, else the documented fallback."""
    if max_context_tokens is not None:
        return Capacity(max_context_tokens, max_context_source)
    if profile is not None and profile.context_window is not None:
        return Capacity(profile.context_window, "registry")
    return Capacity(FALLBACK_CAPACITY, "fallback")


def count_history(
    request: PrepareRequest, counter: TokenCounter, profile: ModelProfile
) -> list[Counted]:
    """The history term per message; a native history is one provider-counted item."""
    native = request.native_history
    if native is not None:
        return [Counted(native.provider_counted_tokens, native.opaque)]
    return [count_message(m, counter, profile) for m in request.history_messages]


@dataclass(frozen=True, slots=True)
class FixedCosts:
    """The fixed terms of one layout; every figure includes its message framing."""

    instructions: int
    legacy_data: int
    tools: int
    history: int
    input: int
    opaque: bool

    @property
    def total(self) -> int:
        return self.instructions + self.legacy_data + self.tools + self.history + self.input


def fixed_costs(
    layout: Layout,
    texts: Texts,
    tools: Sequence[Tool],
    history_counts: Sequence[Counted],
    inputs: Sequence[Message],
    counter: TokenCounter,
    profile: ModelProfile,
) -> FixedCosts:
    """Count every fixed term exactly (by the chat rule) for ``layout``."""
    instructions = (
        count_text_message(LEADING_ROLE, texts.instructions, counter, profile)
        if texts.instructions
        else 0
    )
    if layout == "legacy":
        leading = "\n\n".join(p for p in (texts.instructions, texts.legacy_data, texts.date) if p)
        legacy_data = count_text_message(LEADING_ROLE, leading, counter, profile) - instructions
    else:
        per_turn = "\n\n".join(p for p in (texts.legacy_data, texts.date) if p)
        legacy_data = (
            count_text_message(PER_TURN_ROLE, per_turn, counter, profile) if per_turn else 0
        )
    history = Counted(0)
    for item in history_counts:
        history = history + item
    input_total = Counted(0)
    for message in inputs:
        input_total = input_total + count_message(message, counter, profile)
    return FixedCosts(
        instructions + profile.reply_priming,
        legacy_data,
        count_tools(list(tools), counter, profile),
        history.tokens,
        input_total.tokens,
        history.opaque or input_total.opaque,
    )


def history_units(history: Sequence[Message]) -> list[range]:
    """History split into droppable turns: an assistant tool call stays with its tool results."""
    units: list[range] = []
    index = 0
    while index < len(history):
        end = index + 1
        if history[index].role == "assistant" and history[index].tool_calls:
            while end < len(history) and history[end].role == "tool":
                end += 1
        units.append(range(index, end))
        index = end
    return units


def plan_drop_oldest(
    history_counts: Sequence[Counted],
    units: Sequence[range],
    keep_last: int,
    tokens_needed: int,
    turn_point: int,
) -> int:
    """How many leading history messages to drop to free ``tokens_needed`` tokens.

    Whole units only, oldest first, never touching the last ``keep_last`` messages nor anything
    from ``turn_point`` on (the latest user turn and the tool loop after it). Returns the number
    of messages to drop, or -1 when even the most allowed dropping frees too little.
    """
    droppable_end = min(max(len(history_counts) - keep_last, 0), turn_point)
    freed = 0
    dropped = 0
    for unit in units:
        if tokens_needed <= freed:
            break
        if unit.stop > droppable_end:
            break
        freed += sum(history_counts[i].tokens for i in unit)
        dropped = unit.stop
    return dropped if freed >= tokens_needed else -1
