"""The compaction decision and the history rewrites (core/compaction.py), as properties: nothing
fires under the trigger, with the floor at or over it, or right after a compaction; near the
window it fires whatever the price; clearing changes only the contents of the results it names;
a provider's compaction item replaces what precedes it; a fold never parts a call from its
results."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from context_assembly.core import compaction
from context_assembly.core.pricing import PriceRates, Rates
from context_assembly.core.request import CompactionOptions, Message, Render

SONNET = PriceRates(
    Rates(
        input=Decimal(3),
        output=Decimal(15),
        cache_read=Decimal("0.3"),
        cache_write_5m=Decimal("3.75"),
        cache_write_1h=Decimal(6),
    )
)

options_strategy = st.builds(
    CompactionOptions,
    mode=st.sampled_from(["report", "native", "clear_tool_results"]),
    trigger_fraction=st.floats(min_value=0.05, max_value=1.0),
    trigger_tokens=st.none() | st.integers(min_value=1, max_value=300_000),
    clear_at_least=st.integers(min_value=0, max_value=50_000),
    horizon_turns=st.integers(min_value=1, max_value=200),
)


@st.composite
def pressures(draw: Any) -> compaction.Pressure:
    window = draw(st.integers(min_value=1_000, max_value=1_000_000))
    total = draw(st.integers(min_value=0, max_value=window))
    floor = draw(st.integers(min_value=0, max_value=total))
    reserve = draw(st.integers(min_value=0, max_value=window // 4))
    return compaction.Pressure(window=window, reserve=reserve, total=total, floor=floor)


@given(
    options=options_strategy,
    pressure=pressures(),
    acted=st.none() | st.booleans(),
    clearable=st.integers(min_value=0, max_value=500_000),
    priced=st.booleans(),
)
def test_the_decision_fires_only_when_it_can_help(
    options: CompactionOptions,
    pressure: compaction.Pressure,
    acted: bool | None,
    clearable: int,
    priced: bool,
) -> None:
    """It fires only at or over the trigger, with the floor under it, not right after a
    compaction; clearing only with at least `clear_at_least` to clear; over that and near the
    window it always fires; its action matches the mode."""
    previous = None if acted is None else compaction.Previous(acted=acted, cleared=())
    render: Render = "anthropic"
    report = compaction.decide(
        options,
        pressure,
        previous=previous,
        clearable_tokens=clearable,
        price=SONNET if priced else None,
        render=render,
    )
    trigger = compaction.trigger_tokens(options, pressure.window)
    assert report.trigger_tokens == trigger
    clearing = options.mode == "clear_tool_results"
    enough = not clearing or (clearable > 0 and clearable >= options.clear_at_least)
    may_fire = pressure.total >= trigger and pressure.floor < trigger and not acted and enough
    if not may_fire:
        assert report.decision == "none"
    if pressure.total >= trigger and pressure.floor >= trigger:
        assert report.reason == "floor_over_trigger"
    near = pressure.total >= compaction.NEAR_WINDOW * (pressure.window - pressure.reserve)
    if may_fire and near:
        assert report.reason == "near_window"
    if may_fire and not priced:
        assert report.decision != "none"
    if report.decision != "none":
        assert report.decision == ("clear_tool_results" if clearing else "compact")
    if report.economics is not None and report.decision == "none" and may_fire:
        assert not report.economics.pays and report.reason == "does_not_pay"


def tool_conversation(results: int) -> list[Message]:
    messages = [Message(role="user", content="go")]
    for number in range(results):
        messages.append(
            Message.model_validate(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"c{number}", "name": f"t{number % 3}"}],
                }
            )
        )
        messages.append(Message(role="tool", tool_call_id=f"c{number}", content=f"r{number}"))
    return messages


@given(results=st.integers(min_value=0, max_value=12), data=st.data())
def test_clearing_changes_only_the_named_results(results: int, data: Any) -> None:
    """Every message keeps its place, role, call id and calls; only the named results' contents
    become the placeholder naming the call."""
    history = tool_conversation(results)
    calls = data.draw(st.sets(st.sampled_from([f"c{n}" for n in range(results)] or ["none"])))
    cleared = compaction.clear_results(history, calls)
    assert len(cleared) == len(history)
    for before, after in zip(history, cleared, strict=True):
        assert (before.role, before.tool_call_id, before.tool_calls) == (
            after.role,
            after.tool_call_id,
            after.tool_calls,
        )
        if before.tool_call_id is not None and before.tool_call_id in calls:
            number = int(before.tool_call_id[1:])
            assert after.content == compaction.CLEARED_RESULT.format(
                name=f"t{number % 3}", id=before.tool_call_id
            )
        else:
            assert after == before


@given(
    results=st.integers(min_value=0, max_value=12),
    keep=st.integers(min_value=0, max_value=5),
    excluded=st.sets(st.sampled_from(["t0", "t1", "t2"])),
)
def test_clearable_spares_the_newest_and_the_excluded(
    results: int, keep: int, excluded: set[str]
) -> None:
    """The clearable results are the oldest ones beyond the newest `keep_tool_results`, never of
    an excluded tool, oldest first."""
    history = tool_conversation(results)
    options = CompactionOptions(keep_tool_results=keep, exclude_tools=sorted(excluded))
    found = compaction.clearable(history, [7] * len(history), 0, options, ())
    older = [f"c{n}" for n in range(max(results - keep, 0))]
    assert [call for call, _ in found] == [
        call for call in older if f"t{int(call[1:]) % 3}" not in excluded
    ]
    assert all(tokens == 7 for _, tokens in found)


def test_a_provider_item_replaces_what_precedes_it() -> None:
    """The latest compaction item wins; parts before it in its own message go too."""
    item = {"type": "compaction", "content": "summary"}
    history = [
        Message(role="user", content="a"),
        Message.model_validate(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "before"},
                    {"type": "native", "format": "anthropic", "item": item},
                    {"type": "text", "text": "after"},
                ],
            }
        ),
        Message(role="user", content="b"),
    ]
    sent, left_out = compaction.after_provider_compaction(history)
    assert left_out == 1
    assert sent[0].content[0].item == item  # type: ignore[union-attr]
    assert len(sent[0].content) == 2
    assert sent[1:] == history[2:]
    assert compaction.starts_with_compaction(sent)
    assert compaction.after_provider_compaction(history[:1]) == (history[:1], 0)


@given(
    results=st.integers(min_value=0, max_value=8),
    tail=st.booleans(),
    leading=st.lists(st.sampled_from(["system", "developer"]), max_size=2),
)
def test_a_fold_never_parts_a_call_from_its_results(
    results: int, tail: bool, leading: list[str]
) -> None:
    """The fold stops before an assistant message: every result folded has its call folded too,
    and the kept part goes on with a reply; the leading system and developer messages are never
    folded."""
    history = [Message(role=role, content="rules") for role in leading]
    history += tool_conversation(results)
    if tail:
        history.append(Message(role="assistant", content="done"))
    span = compaction.fold_span(history, len(history))
    assert span.start == len(leading)
    if not span:
        return
    assert history[span.stop].role == "assistant"
    folded = history[span.start : span.stop]
    folded_calls = {c.id for m in folded if m.tool_calls for c in m.tool_calls}
    for message in folded:
        assert message.role not in ("system", "developer")
        if message.role == "tool":
            assert message.tool_call_id in folded_calls
