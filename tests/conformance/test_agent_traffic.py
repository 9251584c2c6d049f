"""A conformance corpus of agent traffic (``agent_traffic/``): conversations as the providers'
SDKs hold them (OpenAI Chat, Anthropic, Responses) and in the neutral shape, with single and
parallel tool calls, multi-step loops, an interrupted loop, images and thinking or reasoning.

Each is replayed call by call as an agent loop makes them (the history so far, and as input the
messages that came since the model last answered) through ``POST /v1/prepare``, for every layout
and for its own render, ``neutral`` and (a neutral conversation) every provider render. Each
frame must conform to the provider SDK's request types, keep that provider's pairing of tool
calls and results, carry the contributed data, and (fixed clock, unchanged data) begin with the
previous call's frame while the loop goes on, and with the ``transcript`` layout on every call."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from provider_sdk_support import check_frame

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.core.pairing import Located, first_violation
from context_assembly.preparations.clock import Clock

CORPUS = Path(__file__).parent / "agent_traffic"
FORMATS = ("openai-chat", "anthropic", "openai-responses", "neutral")
PROVIDER_RENDERS = ("openai-chat", "openai-responses", "anthropic", "gemini")
LAYOUTS = ("legacy", "stable-prefix", "transcript")
DATA = "Account note 7: the customer prefers short answers."
MODELS = {
    "openai-chat": "gpt-4o-mini",
    "openai-responses": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini-2.5-flash",
    "neutral": None,
}


def recorded(fmt: str) -> dict[str, Any]:
    return orjson.loads((CORPUS / f"{fmt}.json").read_bytes())  # type: ignore[no-any-return]


def _is_output(fmt: str, item: dict[str, Any]) -> bool:
    """Whether ``item`` is something the model produced (a call boundary comes before a run)."""
    if fmt == "openai-responses" and item.get("type") in {"reasoning", "function_call"}:
        return True
    return item.get("role") == "assistant"


def calls(fmt: str, conversation: list[dict[str, Any]]) -> Iterator[tuple[list[Any], list[Any]]]:
    """``(history, input)`` of each model call of the conversation: one before every run of the
    model's output, the input being what came since the model last answered."""
    answered = 0
    for index, item in enumerate(conversation):
        starts_run = _is_output(fmt, item) and (
            index == 0 or not _is_output(fmt, conversation[index - 1])
        )
        if starts_run:
            yield conversation[:answered], conversation[answered:index]
        if _is_output(fmt, item):
            answered = index + 1


GRID = [
    (fmt, render, layout)
    for fmt in FORMATS
    for render in ((*PROVIDER_RENDERS, "neutral") if fmt == "neutral" else (fmt, "neutral"))
    for layout in LAYOUTS
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    path = tmp_path_factory.mktemp("traffic") / "service.db"
    clock = Clock(wall=lambda: 1_796_212_800.0)  # fixed: the date line stays the same
    with TestClient(create_app(load_settings(store={"path": str(path)}), clock=clock)) as client:
        yield client


@pytest.mark.parametrize(("fmt", "render", "layout"), GRID)
def test_every_call_of_a_recorded_loop_gets_a_frame_the_provider_accepts(
    service: TestClient, fmt: str, render: str, layout: str
) -> None:
    case = recorded(fmt)
    previous: dict[str, Any] | None = None
    replayed = 0
    scope = {"task_id": f"{fmt}-{render}-{layout}-{secrets.token_hex(4)}"}
    for history, inputs in calls(fmt, case["conversation"]):
        body = {
            "model": case["model"] if render in (fmt, "neutral") else MODELS[render],
            "render": render,
            "instructions": "You are a careful agent.",
            "plugins": [{"name": "notes", "instructions": "Account notes."}],
            "contributions": [
                {"source": "notes", "revision": 1, "blocks": [{"id": "n7", "text": DATA}]}
            ],
            "tools": case["tools"],
            "history": history,
            "input": inputs,
            "assembly": {"layout": layout},
            "scope": scope,
        }
        response = service.post("/v1/prepare", json=body)
        assert response.status_code == 200, response.text
        frame = response.json()["frame"]
        if render == "neutral":
            messages = frame["messages"]
            assert first_violation([Located(m, "frame", i) for i, m in enumerate(messages)]) is None
        else:
            check_frame(render, frame)
            assert_pairs(render, frame)
        assert DATA in orjson.dumps(frame).decode()
        loop_goes_on = bool(inputs) and all(_is_result(fmt, item) for item in inputs)
        extends = loop_goes_on or layout == "transcript"  # a transcript extends every turn
        if render == "neutral" and previous is not None and extends:
            assert frame["messages"][: len(previous["messages"])] == previous["messages"]
        previous = frame
        replayed += 1
    assert replayed >= 5


def _is_result(fmt: str, item: dict[str, Any]) -> bool:
    if fmt == "openai-responses":
        return item.get("type") == "function_call_output"
    if fmt == "anthropic":
        content = item.get("content")
        return isinstance(content, list) and all(b.get("type") == "tool_result" for b in content)
    return item.get("role") == "tool"


def assert_pairs(render: str, frame: dict[str, Any]) -> None:
    """The render's own pairing rule on the body as the provider receives it."""
    if render == "openai-chat":
        messages = frame["messages"]
        for index, message in enumerate(messages):
            ids = [c["id"] for c in message.get("tool_calls") or ()]
            following = messages[index + 1 : index + 1 + len(ids)]
            assert sorted(m.get("tool_call_id") for m in following) == sorted(ids), index
            assert all(m["role"] == "tool" for m in following), index
    elif render == "anthropic":
        messages = frame["messages"]
        for index, message in enumerate(messages):
            content = message["content"] if isinstance(message["content"], list) else []
            ids = [b["id"] for b in content if b.get("type") == "tool_use"]
            if not ids:
                continue
            answer = messages[index + 1]["content"]
            assert messages[index + 1]["role"] == "user"
            opening = [b.get("tool_use_id") for b in answer[: len(ids)]]
            assert sorted(opening) == sorted(ids), index
    elif render == "openai-responses":
        items = frame["input"]
        open_calls: set[str] = set()
        for item in items:
            kind = item.get("type", "message")
            if kind == "function_call":
                open_calls.add(item["call_id"])
            elif kind == "function_call_output":
                open_calls.remove(item["call_id"])
            elif kind == "message" and item.get("role") != "assistant":
                assert not open_calls, item
        assert not open_calls
    else:  # gemini
        contents = frame["contents"]
        for index, content in enumerate(contents):
            called = [p for p in content["parts"] if "functionCall" in p]
            if not called:
                continue
            answer = contents[index + 1]["parts"][: len(called)]
            assert all("functionResponse" in p for p in answer), index
