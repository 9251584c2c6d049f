"""The output limit a provider frame carries is what the budget reserved (docs/api.md, "Output
limit"): input plus that limit never exceed the window, whatever the request."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.cli import assemble_bytes
from context_assembly.core.render import OUTPUT_LIMIT_KEYS
from context_assembly.errors import InvalidError, ServiceError
from context_assembly.tokens.registry import ModelRegistry
from hypothesis_budget import examples

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RENDERS = ("openai-chat", "openai-responses", "anthropic", "gemini")
MODELS = ("gpt-4o", "gpt-4", "o3-mini", "claude-sonnet-4-5", "claude-3-haiku", "gemini-2.5-flash")
REGISTRY = ModelRegistry.load()


def frame_limit(render: str, frame: dict[str, Any]) -> int:
    """The output limit in a rendered body, read through its (dotted) key."""
    value: Any = frame
    for key in OUTPUT_LIMIT_KEYS[render].split("."):
        value = value[key]
    assert isinstance(value, int)
    return value


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    words = st.text(alphabet="abcdefgh ijk", min_size=1, max_size=400)
    blocks = [
        {"id": f"b{i}", "text": draw(words), "priority": draw(st.integers(-5, 5))}
        for i in range(draw(st.integers(0, 6)))
    ]
    history = [
        {"role": role, "content": draw(words)}
        for role in draw(st.lists(st.sampled_from(["user", "assistant"]), max_size=4))
    ]
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(MODELS)),
        "render": draw(st.sampled_from(RENDERS)),
        "response_reserve": draw(st.integers(1, 150_000)),
        "assembly": {
            "max_data_tokens": draw(st.integers(0, 3_000)),
            "reasoning_reserve_tokens": draw(st.integers(0, 60_000)),
            "layout": draw(st.sampled_from(["legacy", "stable-prefix"])),
        },
        "instructions": draw(words),
        "plugins": [{"name": "memory"}],
        "contributions": [{"source": "memory", "revision": 1, "blocks": blocks}],
        "history": history,
        "input": [{"role": "user", "content": draw(words)}],
    }
    capacity = draw(st.none() | st.integers(50, 200_000))
    if capacity is not None:
        body["max_context_tokens"] = capacity
    return body


@settings(max_examples=examples(150), deadline=None)
@given(requests())
def test_input_plus_output_limit_never_exceeds_the_window(body: dict[str, Any]) -> None:
    """Whenever a prepare succeeds, total input + the frame's output limit <= capacity (for a
    count over the window only by its estimate, with the estimated part at half its size), and
    the limit is the reserve, capped at the model's maximum output."""
    try:
        answer = orjson.loads(assemble_bytes(orjson.dumps(body), NOW))
    except ServiceError:
        return  # an overflow: nothing was promised
    budget = answer["budget"]
    limit = frame_limit(body["render"], answer["frame"])
    reserve = budget["response_reserve"] + budget["reasoning_reserve_tokens"]
    profile = REGISTRY.lookup(body["model"])
    assert profile is not None and profile.max_output_tokens is not None
    assert limit == min(reserve, profile.max_output_tokens)
    warnings = {w["code"] for w in answer["selection"].get("warnings", ())}
    if "estimate_over_window" in warnings:
        # Over only by the estimate: the estimated part at half its size must fit.
        assert budget["count_source"] in ("estimate", "calibrated")
        lowest = budget["total_input_tokens"] - budget["estimated_tokens"] // 2
        assert lowest + limit <= budget["capacity"]
        assert budget["data_tokens"] <= budget["data_limit_tokens"]
    else:
        assert budget["total_input_tokens"] + limit <= budget["capacity"]
    report = answer["selection"]["output_limit"]
    assert report == {
        "parameter": OUTPUT_LIMIT_KEYS[body["render"]],
        "tokens": limit,
        "source": "reserve" if limit == reserve else "model_maximum",
    }


def test_the_default_reserve_is_the_limit_of_every_render() -> None:
    """Without response_reserve the frame carries 4096, not the model's maximum output."""
    for render in RENDERS:
        body = {
            "model": "claude-sonnet-4-5",
            "render": render,
            "input": [{"role": "user", "content": "hi"}],
        }
        answer = orjson.loads(assemble_bytes(orjson.dumps(body), NOW))
        assert frame_limit(render, answer["frame"]) == 4096


def test_a_neutral_frame_carries_no_limit() -> None:
    """The neutral frame has no output parameter and the manifest names none."""
    body = {"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}]}
    answer = orjson.loads(assemble_bytes(orjson.dumps(body), NOW))
    assert set(answer["frame"]) == {"messages", "tools"}
    assert "output_limit" not in answer["selection"]


@pytest.mark.parametrize("render", RENDERS)
def test_a_zero_reserve_is_refused_for_a_provider_frame(render: str) -> None:
    """A provider frame needs an output limit of at least 1: a zero reserve is a named 422."""
    body = {
        "model": "gpt-4o",
        "render": render,
        "response_reserve": 0,
        "input": [{"role": "user", "content": "hi"}],
    }
    with pytest.raises(InvalidError) as caught:
        assemble_bytes(orjson.dumps(body), NOW)
    assert "response_reserve" in str(caught.value.to_problem())
