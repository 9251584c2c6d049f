"""What the provider SDK tests share: the prepare requests of every case, the service they are
prepared by (the real app in-process on a real SQLite file), and the check of a frame against
the request types each SDK declares (``check_frame``). The SDKs' mock transport is in
``provider_double``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Required

import pytest
from anthropic.types import MessageParam, TextBlockParam, ToolParam
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from fastapi.testclient import TestClient
from google.genai import types as gtypes
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import FunctionToolParam, ResponseInputItemParam
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import ConfigDict, TypeAdapter, with_config
from typing_extensions import TypedDict  # pydantic needs it for TypedDicts before Python 3.12

from context_assembly.api.app import create_app
from context_assembly.config import load_settings

RENDERS = ("openai-chat", "openai-responses", "anthropic", "gemini")
MODELS = {
    "openai-chat": "gpt-4o-mini",
    "openai-responses": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",  # minimum cacheable prefix 1,024 in the model registry
    "gemini": "gemini-2.5-flash",
}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
BLOCK_TEXT = "Receipt A42: paid 40 EUR."

# ----------------------------------------------------------------------------- prepare requests

TOOLS: list[dict[str, Any]] = [
    {
        "name": "lookup",
        "description": "Look a receipt up by id.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
        },
    },
    {"name": "clock", "description": "The current time."},  # no parameters
]

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "name": "alice", "content": "Find receipt A42 and the time."},
    {"role": "developer", "content": "Answer in one sentence."},  # host instructions mid-history
    {
        "role": "assistant",
        "content": "Looking both up.",
        "tool_calls": [  # parallel calls: string and object arguments
            {"id": "call_1", "name": "lookup", "arguments": '{"id": "A42"}'},
            {"id": "call_2", "name": "clock", "arguments": {}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "A42: paid 40 EUR."},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "assistant", "content": "A42 was paid; it is noon."},
    {"role": "user", "content": "And A43?"},
    {
        "role": "assistant",
        "content": "",  # calls only: OpenAI Chat sends content null
        "tool_calls": [{"id": "call_3", "name": "lookup", "arguments": {"id": "A43"}}],
    },
    {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "A43: open."}]},
]

# A user message with an image. Anthropic and Gemini take it as a neutral message whose
# ``image`` part carries the provider's own fields (core/render.py); OpenAI's part types are not
# ``image``, so for OpenAI the whole message is in the provider's own shape (read as such by
# ``core/provider_messages.py``, sent back unchanged by that provider's render).
_QUESTION = "What does this receipt say?"
IMAGE_MESSAGES: dict[str, dict[str, Any]] = {
    "openai-chat": {
        "role": "user",
        "content": [
            {"type": "text", "text": _QUESTION},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    },
    "openai-responses": {
        "role": "user",
        "content": [
            {"type": "input_text", "text": _QUESTION},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        ],
    },
    "anthropic": {
        "role": "user",
        "content": [
            {"type": "text", "text": _QUESTION},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": PNG},
            },
        ],
    },
    "gemini": {
        "role": "user",
        "content": [
            {"type": "text", "text": _QUESTION},
            {"type": "image", "inlineData": {"mimeType": "image/png", "data": PNG}},
        ],
    },
}

CACHE: dict[str, dict[str, Any]] = {
    "openai-chat": {"key": "auto", "retention": "24h"},
    "openai-responses": {"key": "ledger", "retention": "in_memory"},
    "anthropic": {"breakpoints": True, "ttl": "1h"},
    "gemini": {"breakpoints": True},  # no directive for Gemini: the frame must stay plain
}

CASES = ("conversation-legacy", "conversation-stable", "image", "cache", "strict-tool", "minimal")


def prepare_body(render: str, case: str) -> dict[str, Any]:
    """The prepare request of one case for one render target."""
    if case == "minimal":  # no instructions, tools, history or sources
        return {"model": MODELS[render], "render": render, "input": [_user("Hi.")]}
    body: dict[str, Any] = {
        "model": MODELS[render],
        "render": render,
        "instructions": "You are a careful bookkeeper.",
        "plugins": [{"name": "memory", "instructions": "Saved entries."}],
        "contributions": [
            {
                "source": "memory",
                "revision": 1,
                "blocks": [{"id": "receipt", "text": BLOCK_TEXT, "protected": True}],
            }
        ],
        "tools": TOOLS,
        "history": HISTORY,
        "input": [_user("Summarise both receipts.")],
        "assembly": {"layout": "stable-prefix"},
    }
    if case == "conversation-legacy":
        body["assembly"] = {"layout": "legacy"}
    elif case == "conversation-stable":
        body["response_reserve"] = 1000
        body["assembly"] = {"layout": "stable-prefix", "reasoning_reserve_tokens": 3000}
    elif case == "image":
        body["history"] = []
        body["input"] = [IMAGE_MESSAGES[render]]
    elif case == "cache":
        # Long enough instructions and tools for Anthropic's minimum cacheable prefix.
        body["instructions"] = "You are a careful bookkeeper. " * 300
        body["cache"] = CACHE[render]
    elif case == "strict-tool":
        # A strict tool's schema must be strict-compatible (closed objects, every key required).
        parameters = {**TOOLS[0]["parameters"], "additionalProperties": False}
        body["tools"] = [{**TOOLS[0], "parameters": parameters, "strict": True}, TOOLS[1]]
    return body


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def expected_output_limit(body: dict[str, Any], model_maximum: int) -> int:
    """The output limit a frame carries: the budget's reserve, at most the model's maximum."""
    reserve = int(body.get("response_reserve", 4096))
    reserve += int(body.get("assembly", {}).get("reasoning_reserve_tokens", 0))
    return min(reserve, model_maximum)


def output_limit_of(render: str, frame: dict[str, Any]) -> Any:
    """The frame's output-limit value, under the key its provider reads."""
    if render == "gemini":
        return frame.get("generationConfig", {}).get("maxOutputTokens")
    key = {
        "openai-chat": "max_completion_tokens",
        "openai-responses": "max_output_tokens",
        "anthropic": "max_tokens",
    }[render]
    return frame.get(key)


# ----------------------------------------------------------------------------- the service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The real app in-process on a real SQLite file, shared by one module's tests."""
    path: Path = tmp_path_factory.mktemp("sdk") / "service.db"
    with TestClient(create_app(load_settings(store={"path": str(path)}))) as client:
        yield client


def prepare(service: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = service.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


Prepared = Callable[[str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def prepared(service: TestClient) -> Prepared:
    """The prepare answer of ``(render, case)``, prepared once per module."""
    answers: dict[tuple[str, str], dict[str, Any]] = {}

    def get(render: str, case: str) -> dict[str, Any]:
        if (render, case) not in answers:
            answers[render, case] = prepare(service, prepare_body(render, case))
        return answers[render, case]

    return get


# ----------------------------------------------------------------------------- SDK request types

# ``extra="forbid"``: a key the SDK does not declare is refused, as is a missing ``Required`` key
# or a wrong ``Literal``; ``strict``: no coercion (a dict is never taken for a string).
_STRICT = ConfigDict(extra="forbid", strict=True)


def conforms(declared: Any, values: list[Any]) -> list[Any]:
    """Validate each value against the SDK's declared type and return the validated data.

    The SDKs declare nested sequences as ``Iterable[...]``, which pydantic validates lazily:
    every such iterator is drained here, so that nested items are checked too.
    """
    adapter = _adapter(declared)
    # Drained while the adapter lives: the lazy iterators refer to its validator definitions.
    drained = _drain(adapter.validate_python(values))
    assert drained == values  # strict: nothing was coerced or added
    return list(drained)


@functools.cache
def _adapter(declared: Any) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[declared], config=_STRICT)


def _drain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _drain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [_drain(item) for item in value]
    return value


@with_config(ConfigDict(extra="forbid"))
class GeminiContent(TypedDict):
    """A turn of ``contents``: one of the REST API's two roles, and google-genai's ``Part``s."""

    role: Literal["user", "model"]
    parts: list[gtypes.Part]


@with_config(ConfigDict(extra="forbid"))
class GenerateContentBody(TypedDict, total=False):
    """The generateContent REST body of the gemini render (the model is in the URL).

    google-genai declares no type for the REST body itself; its parts are the SDK's pydantic
    models (camelCase aliases, unknown keys forbidden).
    """

    contents: Required[list[GeminiContent]]
    systemInstruction: gtypes.Content
    tools: list[gtypes.Tool]
    generationConfig: gtypes.GenerationConfig


GEMINI_BODY = TypeAdapter(GenerateContentBody)


def check_frame(render: str, frame: dict[str, Any]) -> None:
    """Validate each part of the frame, then the whole body, against the SDK's request types
    (raises ``pydantic.ValidationError``)."""
    if render == "openai-chat":
        conforms(ChatCompletionMessageParam, frame["messages"])
        conforms(ChatCompletionFunctionToolParam, frame.get("tools", []))
        conforms(CompletionCreateParamsNonStreaming, [frame])
    elif render == "openai-responses":
        conforms(ResponseInputItemParam, frame["input"])
        conforms(FunctionToolParam, frame.get("tools", []))
        conforms(ResponseCreateParamsNonStreaming, [frame])
    elif render == "anthropic":
        conforms(MessageParam, frame["messages"])
        conforms(ToolParam, frame.get("tools", []))
        system = frame.get("system")
        if not isinstance(system, str | None):
            conforms(TextBlockParam, system)
        conforms(MessageCreateParamsNonStreaming, [frame])
    else:
        GEMINI_BODY.validate_python(frame)
