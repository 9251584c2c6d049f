"""Where the service's own messages stand (core/layout.py, the turn point) and the tool-pairing
rules (core/pairing.py), on whole assemblies through the engine and every render."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.core.pairing import Located, first_violation
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import run_assembly, to_response
from context_assembly.errors import InvalidError
from context_assembly.tokens.registry import ModelRegistry
from context_assembly.validation import parse_model
from hypothesis_budget import examples

NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
REGISTRY = ModelRegistry.load()
LAYOUTS = ("legacy", "stable-prefix")
RENDERS = ("neutral", "openai-chat", "openai-responses", "anthropic", "gemini")
DATA = "Receipt A42: paid 40 EUR."


def answer(fields: dict[str, Any]) -> dict[str, Any]:
    request = parse_model(PrepareRequest, orjson.dumps(fields))
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    assembly, ctx = run_assembly(request, setups, inputs, now=NOW, tenant="t", registry=REGISTRY)
    response = to_response(request, assembly, ctx, preparation_id="prep_t", expires_at=NOW)
    return orjson.loads(response.model_dump_json())  # type: ignore[no-any-return]


def body(
    history: list[dict[str, Any]], inputs: list[dict[str, Any]], **fields: Any
) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "plugins": [{"name": "memory", "instructions": "Saved entries."}],
        "contributions": [
            {"source": "memory", "revision": 1, "blocks": [{"id": "r", "text": DATA}]}
        ],
        "tools": [{"name": "lookup", "description": "Look a receipt up."}],
        "history": history,
        "input": inputs,
        **fields,
    }


def call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "name": "lookup"}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": f"result of {call_id}"}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


QUESTION = user("Where is A42?")
LOOP = [QUESTION, call("c1"), result("c1"), call("c2")]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_tool_result_follows_its_call_in_the_neutral_frame(layout: str) -> None:
    """History ending in the assistant's calls and input holding their results: the service's
    messages stand before the question, never between the calls and their results."""
    got = answer(body(LOOP, [result("c2")], assembly={"layout": layout}))
    roles = [m["role"] for m in got["frame"]["messages"]]
    expected_own = ["developer", "user"] if layout == "stable-prefix" else ["user"]
    assert roles == ["system", *expected_own, "user", "assistant", "tool", "assistant", "tool"]
    placement = got["selection"]["placement"]
    assert placement == {
        "index": 1,
        "count": len(expected_own),
        "latest_user_turn": 1 + len(expected_own),
    }
    data = got["frame"]["messages"][placement["index"] + len(expected_own) - 1]
    assert DATA in data["content"]


@pytest.mark.parametrize("render", RENDERS)
def test_every_render_keeps_calls_and_results_adjacent(render: str) -> None:
    got = answer(body(LOOP, [result("c2")], render=render, assembly={"layout": "stable-prefix"}))
    frame = got["frame"]
    if render == "openai-chat":
        roles = [m["role"] for m in frame["messages"]]
        assert roles[-4:] == ["assistant", "tool", "assistant", "tool"]
    elif render == "anthropic":
        last = frame["messages"][-1]
        assert last["role"] == "user"
        assert [b["type"] for b in last["content"]] == ["tool_result"]
        assert frame["messages"][-2]["content"][-1]["type"] == "tool_use"
    elif render == "openai-responses":
        kinds = [item.get("type", "message") for item in frame["input"]]
        assert kinds[-4:] == ["function_call", "function_call_output"] * 2
    elif render == "gemini":
        last = frame["contents"][-1]
        assert "functionResponse" in last["parts"][0]
        assert "functionCall" in frame["contents"][-2]["parts"][-1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_step_of_a_tool_loop_extends_the_previous_frame(layout: str) -> None:
    """While the data is unchanged, every step's frame begins with the previous step's frame,
    through the data message."""
    conversation = [QUESTION]
    steps = []
    for step in range(1, 5):
        conversation += [call(f"c{step}"), result(f"c{step}")]
        history, inputs = conversation[:-1], conversation[-1:]
        steps.append(answer(body(history, inputs, assembly={"layout": layout}))["frame"])
    for before, after in itertools.pairwise(steps):
        assert after["messages"][: len(before["messages"])] == before["messages"]


def test_the_new_question_moves_the_turn_point_after_the_answer() -> None:
    history = [*LOOP, result("c2"), {"role": "assistant", "content": "It shipped."}]
    got = answer(body(history, [user("And A43?")], assembly={"layout": "stable-prefix"}))
    messages = got["frame"]["messages"]
    assert [m["role"] for m in messages[-3:]] == ["developer", "user", "user"]
    assert messages[-1]["content"] == "And A43?"
    assert got["selection"]["placement"]["index"] == len(messages) - 3


def test_a_run_of_user_messages_is_one_turn() -> None:
    got = answer(body([], [user("First part."), user("Second part.")]))
    messages = got["frame"]["messages"]
    assert [m["content"] for m in messages[-2:]] == ["First part.", "Second part."]
    assert got["selection"]["placement"] == {"index": 1, "count": 1, "latest_user_turn": 2}


def test_without_a_user_message_the_service_messages_open_the_conversation() -> None:
    got = answer(body([], [], assembly={"layout": "stable-prefix"}))
    assert [m["role"] for m in got["frame"]["messages"]] == ["system", "developer", "user"]
    assert got["selection"]["placement"]["latest_user_turn"] is None


# ----------------------------------------------------------------------------- pairing rules


def refusal(history: list[dict[str, Any]], inputs: list[dict[str, Any]], **fields: Any) -> str:
    with pytest.raises(InvalidError) as caught:
        answer(body(history, inputs, **fields))
    return str(caught.value)


def test_a_result_without_its_call_is_refused_naming_the_message_and_call() -> None:
    text = refusal([QUESTION], [result("c9")])
    assert "input.0" in text and "'c9'" in text


def test_a_call_left_unanswered_before_a_later_message_is_refused() -> None:
    text = refusal([QUESTION, call("c1")], [user("Never mind.")])
    assert "history.1" in text and "'c1'" in text


def test_a_call_left_unanswered_at_the_end_is_refused() -> None:
    text = refusal([QUESTION], [call("c1")])
    assert "input.0" in text and "'c1'" in text


def test_a_result_given_twice_and_a_call_id_used_twice_are_refused() -> None:
    assert "again" in refusal(LOOP[:3], [result("c1")])
    twice = {
        "role": "assistant",
        "tool_calls": [{"id": "d", "name": "a"}, {"id": "d", "name": "b"}],
    }
    assert "twice" in refusal([QUESTION, twice], [result("d")])


def test_parallel_results_must_come_before_the_next_message() -> None:
    both = {
        "role": "assistant",
        "tool_calls": [{"id": "p1", "name": "lookup"}, {"id": "p2", "name": "lookup"}],
    }
    text = refusal([QUESTION, both, result("p1"), user("Hurry.")], [result("p2")])
    assert "history.1" in text and "'p2'" in text


def test_a_provider_shaped_violation_names_the_callers_message() -> None:
    """An Anthropic user turn is read into several neutral messages: the error still names the
    caller's message index."""
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Go."}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
    ]
    stray = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t7", "content": "?"}],
    }
    text = refusal(history, [stray], model="claude-sonnet-4-5")
    assert "input.0" in text and "'t7'" in text


def test_a_provider_held_history_may_open_the_input_with_results() -> None:
    native = {"native": True, "provider_counted_tokens": 500}
    got = answer(body(native, [result("held"), user("Thanks.")], render="openai-responses"))  # type: ignore[arg-type]
    kinds = [item.get("type", "message") for item in got["frame"]["input"]]
    assert "function_call_output" in kinds


# ----------------------------------------------------------------------------- drop_oldest


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """User turns, each followed by tool loops of one to three parallel calls and an answer."""
    messages: list[dict[str, Any]] = []
    ids = iter(range(10_000))
    for turn in range(draw(st.integers(1, 5))):
        messages.append(user(f"question {turn} " + "word " * draw(st.integers(1, 60))))
        for _ in range(draw(st.integers(0, 3))):
            calls = [f"k{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            messages.append(
                {"role": "assistant", "tool_calls": [{"id": c, "name": "lookup"} for c in calls]}
            )
            messages += [
                {"role": "tool", "tool_call_id": c, "content": "r " * draw(st.integers(1, 80))}
                for c in calls
            ]
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": "answer " * draw(st.integers(1, 40))})
    return messages


@settings(max_examples=examples(60), deadline=None)
@given(conversation=conversations(), window=st.integers(300, 3000), keep=st.integers(0, 4))
def test_drop_oldest_never_splits_a_call_from_its_results(
    conversation: list[dict[str, Any]], window: int, keep: int
) -> None:
    """Whatever is dropped, the frame keeps the pairing rules, the latest user turn and the loop
    after it; the service's messages stand before that turn."""
    cut = max(i for i, m in enumerate(conversation) if m["role"] == "user")
    while cut > 0 and conversation[cut - 1]["role"] == "user":
        cut -= 1  # a run of user messages is one turn
    fields = body(
        conversation[:cut],
        conversation[cut:],
        max_context_tokens=window,
        response_reserve=16,
        assembly={
            "layout": "stable-prefix",
            "history_policy": {"mode": "drop_oldest", "keep_last_messages": keep},
        },
    )
    fields["contributions"][0]["blocks"][0]["protected"] = True
    try:
        got = answer(fields)
    except Exception as err:
        assert type(err).__name__ == "ContextOverflowError"
        return
    messages = got["frame"]["messages"]
    assert first_violation([Located(m, "frame", i) for i, m in enumerate(messages)]) is None
    placement = got["selection"]["placement"]
    turn = placement["latest_user_turn"]
    assert list(map(_essence, messages[turn:])) == list(map(_essence, conversation[cut:]))
    assert [m["role"] for m in messages[placement["index"] : turn]] == ["developer", "user"]


def _essence(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple(c["id"] for c in message.get("tool_calls") or ())
    return message["role"], message.get("content") or "", calls, message.get("tool_call_id")
