"""The assembly memo (core/memo.py) changes nothing but speed.

Property: over a sequence of turns in which blocks, limits, the window, failed sources and the
clock change (or not), an assembly with a memo answers exactly what one without a memo answers:
the same Assembly (frame, budget, manifest, hashes, expiries), or the same error. Examples check
that a repeated turn is served from the memo, that the clock crossing an expiry decides again,
and that the memo holds no block text.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_assembly.core.assemble import Assembly, assemble
from context_assembly.core.blocks import SourceBlocks
from context_assembly.core.budget import Capacity
from context_assembly.core.memo import AssemblyMemo, Entry
from context_assembly.core.request import Block, PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.errors import ServiceError
from fakes import PROFILE, SurchargeCounter, WordCounter
from hypothesis_budget import examples
from strategies import NOW, WORDS, Scenario, scenarios

PROPERTY = settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
COUNTERS = [WordCounter(), SurchargeCounter()]


def _request(
    groups: tuple[SourceBlocks, ...],
    *,
    max_data_tokens: int,
    limits: dict[str, int],
    layout: str,
    input_words: int,
    history: int,
    drop_oldest: bool,
) -> PrepareRequest:
    sources = [group.source for group in groups]
    return PrepareRequest.model_validate(
        {
            "model": "test-model",
            "response_reserve": 16,
            "instructions": "Be exact.",
            "plugins": [{"name": name, "instructions": f"{name} notes"} for name in sources],
            "contributions": [
                {"source": g.source, "revision": 1, "blocks": [b.model_dump() for b in g.blocks]}
                for g in groups
            ],
            "history": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 5}
                for i in range(history)
            ],
            "input": [{"role": "user", "content": " ".join(["word"] * input_words)}],
            "assembly": {
                "max_data_tokens": max_data_tokens,
                "source_token_limits": limits,
                "layout": layout,
                "max_blocks": 2048,
                "history_policy": {"mode": "drop_oldest" if drop_oldest else "none"},
            },
        }
    )


def _run(
    request: PrepareRequest,
    failed: frozenset[str],
    now: datetime,
    capacity: int,
    counter: Any,
    memo: AssemblyMemo | None,
) -> Assembly | tuple[type[ServiceError], str, dict[str, Any]]:
    setups = plan_sources(request)
    inputs = [
        replace(item, status="error", blocks=()) if item.setup.source in failed else item
        for item in materialised_inputs(request, setups)
    ]
    try:
        return assemble(
            request,
            setups,
            inputs,
            now=now,
            local_now=now,
            counter=counter,
            profile=PROFILE,
            capacity=Capacity(capacity, "host"),
            exact=False,
            tenant="t",
            memo=memo,
        )
    except ServiceError as err:
        return type(err), str(err), dict(err.extensions)


def _edit(groups: tuple[SourceBlocks, ...], draw: st.DrawFn) -> tuple[SourceBlocks, ...]:
    """One block changed: its text, priority, expiry or projection, or the block removed."""
    flat = [(g, i) for g in range(len(groups)) for i in range(len(groups[g].blocks))]
    if not flat:
        return groups
    g, i = draw(st.sampled_from(flat))
    block = groups[g].blocks[i]
    what = draw(
        st.sampled_from(["text", "same_length", "priority", "expiry", "projection", "remove"])
    )
    changed: Block | None
    if what == "text":
        changed = block.model_copy(update={"text": block.text + " " + draw(st.sampled_from(WORDS))})
    elif what == "same_length":
        # Same length, other words (so other counts): only the text's hash tells them apart.
        text = block.text.replace(" ", "x", 1) if " " in block.text else block.text + " "
        changed = block.model_copy(update={"text": text})
    elif what == "priority":
        changed = block.model_copy(update={"priority": block.priority + 100})
    elif what == "expiry":
        changed = block.model_copy(update={"expires_at": _at(draw(st.integers(-2, 4)))})
    elif what == "projection":
        changed = block.model_copy(update={"projection": None if block.projection else "short"})
    else:
        changed = None
    blocks = list(groups[g].blocks)
    if changed is None:
        del blocks[i]
    else:
        blocks[i] = changed
    return (*groups[:g], SourceBlocks(groups[g].source, tuple(blocks)), *groups[g + 1 :])


def _at(hours: int) -> str:
    return (NOW + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


@st.composite
def _near_expiries(draw: st.DrawFn, scenario: Scenario) -> tuple[SourceBlocks, ...]:
    """The scenario's blocks, some of them expiring within hours of NOW (the turns move the clock
    across them)."""
    groups = []
    for group in scenario.groups:
        blocks = tuple(
            block.model_copy(update={"expires_at": _at(draw(st.integers(-1, 4)))})
            if draw(st.integers(0, 3)) == 0
            else block
            for block in group.blocks
        )
        groups.append(SourceBlocks(group.source, blocks))
    return tuple(groups)


TURN_CHANGES = ["same", "edit", "input", "capacity", "clock", "edit", "limits", "fail", "layout"]


@PROPERTY
@given(scenarios(protected=True), st.sampled_from(COUNTERS), st.data())
def test_a_memo_answers_what_no_memo_answers(
    scenario: Scenario, counter: Any, data: st.DataObject
) -> None:
    """Turn after turn, with or without a memo: the same assembly or the same error."""
    draw = data.draw
    memo = AssemblyMemo()
    groups = draw(_near_expiries(scenario))
    state: dict[str, Any] = {
        "max_data_tokens": scenario.max_data_tokens,
        "limits": dict(scenario.source_limits),
        "layout": draw(st.sampled_from(["legacy", "stable-prefix"])),
        "input_words": draw(st.integers(1, 30)),
        "history": draw(st.integers(0, 6)),
        "drop_oldest": draw(st.booleans()),
    }
    capacity = draw(st.integers(100, 900))
    failed: frozenset[str] = frozenset()
    now = NOW
    for _ in range(draw(st.integers(2, 8))):
        request = _request(groups, **state)
        expected = _run(request, failed, now, capacity, counter, None)
        got = _run(request, failed, now, capacity, counter, memo)
        assert got == expected
        change = draw(st.sampled_from(TURN_CHANGES))
        if change == "input":
            state["input_words"] = draw(st.integers(1, 60))
        elif change == "capacity":
            capacity = draw(st.integers(100, 900))
        elif change == "clock":
            now += timedelta(minutes=draw(st.integers(0, 240)))
        elif change == "edit":
            groups = _edit(groups, draw)
        elif change == "limits":
            state["max_data_tokens"] = draw(st.integers(0, 400))
            state["limits"] = {
                s: draw(st.integers(0, 300)) for s in scenario.sources if draw(st.booleans())
            }
        elif change == "fail":
            failed = frozenset(draw(st.lists(st.sampled_from(scenario.sources), max_size=1)))
        elif change == "layout":
            state["layout"] = draw(st.sampled_from(["legacy", "stable-prefix"]))


def _blocks(texts: list[str], expires: str | None = None) -> tuple[SourceBlocks, ...]:
    return (
        SourceBlocks(
            "notes",
            tuple(
                Block(
                    id=f"n{i}", text=text, priority=10 - i, expires_at=expires if i == 0 else None
                )
                for i, text in enumerate(texts)
            ),
        ),
    )


def _turn(
    groups: tuple[SourceBlocks, ...], memo: AssemblyMemo, now: datetime = NOW, words: int = 3
) -> Assembly:
    request = _request(
        groups,
        max_data_tokens=400,
        limits={},
        layout="stable-prefix",
        input_words=words,
        history=2,
        drop_oldest=False,
    )
    result = _run(request, frozenset(), now, 5000, COUNTERS[0], memo)
    assert isinstance(result, Assembly)
    return result


TEXTS = ["the export job for account seven finished", "invoice 42 is paid", "ticket 9 is open"]


def test_a_repeated_turn_is_served_from_the_memo() -> None:
    """Same blocks and limits, new input: a hit, and the data message rendered again equal."""
    memo = AssemblyMemo()
    first = _turn(_blocks(TEXTS), memo)
    assert memo.info()[:2] == (0, 1)
    second = _turn(_blocks(TEXTS), memo, words=9)
    assert memo.info()[:2] == (1, 1)
    assert second.frame.messages[-2] == first.frame.messages[-2]  # the data message
    assert second.selection == first.selection


def test_a_changed_text_is_decided_again() -> None:
    memo = AssemblyMemo()
    _turn(_blocks(TEXTS), memo)
    changed = _turn(_blocks([TEXTS[0], TEXTS[1] + " and filed", TEXTS[2]]), memo)
    assert memo.info()[:2] == (0, 2)
    assert "and filed" in str(changed.frame.messages[-2].content)


def test_the_clock_crossing_an_expiry_decides_again() -> None:
    """A block valid at the first turn and expired at the second is omitted as ``expired``."""
    memo = AssemblyMemo()
    groups = _blocks(TEXTS, expires=_at(1))
    before = _turn(groups, memo)
    assert before.selection.blocks[0].status == "selected"
    still = _turn(groups, memo, now=NOW + timedelta(minutes=59))
    assert memo.info()[:2] == (1, 1)
    assert still.selection == before.selection
    after = _turn(groups, memo, now=NOW + timedelta(hours=1))
    assert memo.info()[:2] == (1, 2)
    reports = {b.id: b for b in after.selection.blocks}
    assert (reports["n0"].status, reports["n0"].reason) == ("omitted", "expired")


def _strings(value: object, seen: set[int]) -> Iterator[str]:
    """Every string reachable from ``value`` through containers and objects' attributes."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, str):
        yield value
        return
    if isinstance(value, dict):
        items: list[object] = [*value.keys(), *value.values()]
    elif isinstance(value, tuple | list | set | frozenset):
        items = list(value)
    elif isinstance(value, int | float | bool | datetime) or value is None:
        return
    else:
        items = list(gc.get_referents(value))
    for item in items:
        yield from _strings(item, seen)


def test_the_memo_holds_no_block_text() -> None:
    """Keys and entries keep ids, counts and hashes: no text or projection of any block."""
    memo = AssemblyMemo()
    texts = [f"confidential text number {i}, long enough to be unmistakable" for i in range(5)]
    groups = (
        SourceBlocks(
            "notes",
            tuple(
                Block(id=f"n{i}", text=t, projection=f"secret projection {i}")
                for i, t in enumerate(texts)
            ),
        ),
    )
    _turn(groups, memo)
    held = list(_strings(memo._entries, set()))
    assert held, "the walk reached the memo's contents"
    for text in [*texts, *(f"secret projection {i}" for i in range(5))]:
        assert not any(text in s for s in held)


def test_entries_are_bounded_by_block_reports() -> None:
    """A memo of 64 block reports never holds more than that, whatever it is fed."""
    memo = AssemblyMemo(max_blocks=64)
    for turn in range(40):
        _turn(_blocks([f"{word} {turn}" for word in TEXTS]), memo)
        assert sum(entry.weight for entry in memo._entries.values()) <= 64
    assert memo.info()[2] < 40


def test_the_least_recently_used_entry_goes_first() -> None:
    """Four turns of three blocks fill a memo of 16 block reports; a fifth drops the least
    recently used, which is the second turn once the first has been used again."""
    memo = AssemblyMemo(max_blocks=16)
    turns = [_blocks([f"{word} {turn}" for word in TEXTS]) for turn in range(5)]
    for groups in turns[:4]:
        _turn(groups, memo)
    _turn(turns[0], memo)
    assert memo.info() == (1, 4, 4)
    _turn(turns[4], memo)
    assert memo.info() == (1, 5, 4)
    _turn(turns[0], memo)
    assert memo.info()[:2] == (2, 5), "the first turn, used again, was kept"
    _turn(turns[1], memo)
    assert memo.info()[:2] == (2, 6), "the second turn, least recently used, was dropped"


@pytest.mark.parametrize("max_blocks", [-1, 0])
def test_a_memo_needs_room(max_blocks: int) -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        AssemblyMemo(max_blocks=max_blocks)


def test_entry_validity_is_the_window_between_expiries() -> None:
    entry = Entry(0, NOW - timedelta(hours=1), NOW + timedelta(hours=1))
    assert entry.valid_at(NOW)
    assert entry.valid_at(NOW - timedelta(hours=1))
    assert not entry.valid_at(NOW - timedelta(hours=2))
    assert not entry.valid_at(NOW + timedelta(hours=1))
    assert Entry(0, None, None).valid_at(datetime(2100, 1, 1, tzinfo=UTC))
