"""The usage route takes each provider SDK's parsed usage object as it is.

A host calls the provider with the frame through its SDK and posts the usage the SDK parsed:
``model_dump()`` of the response's usage (Gemini's also by its REST camelCase aliases), and the
usage of a stream: OpenAI Chat's last chunk (``stream_options.include_usage``), the Responses
``response.completed`` event, Anthropic's ``message_start`` and ``message_delta`` events, Gemini's
last chunk. Each is produced here by the real SDK from a canned provider answer (a mock transport,
``provider_double.ProviderDouble``), posted to ``POST /v1/preparations/{id}/usage`` of the
real app, and read back from ``GET /v1/preparations/{id}``: the cached and cache-write tokens land
in ``accounting.last`` with one meaning across providers (core/usage.py).

Every canned answer reports the same call (``INPUT`` input tokens of which ``CACHED`` were read
from and ``WRITTEN`` written to the cache, ``OUTPUT`` output tokens), each in its provider's terms
(Anthropic's ``input_tokens`` excludes both cache parts; Gemini counts thinking apart), so most
shapes must land as the same four numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from anthropic.types import MessageDeltaUsage
from fastapi.testclient import TestClient
from provider_double import CACHED, INPUT, OUTPUT, THOUGHTS, WRITTEN, Sdks, sdks, send
from provider_sdk_support import MODELS, prepare, prepare_body, service

__all__ = ["sdks", "service"]  # module-scoped fixtures

Numbers = tuple[int | None, int | None, int | None, int | None]
# What the call reports, as (provider_input, cached_input, cache_creation_input, output).
SAME_CALL: Numbers = (INPUT, CACHED, WRITTEN, OUTPUT)


def _call(render: str, stream: bool, **options: Any) -> Callable[[Sdks, dict[str, Any]], Any]:
    def run(sdks: Sdks, frame: dict[str, Any]) -> Any:
        return send(sdks, render, MODELS[render], frame, stream=stream, **options)

    return run


def _chat_stream(sdks: Sdks, frame: dict[str, Any]) -> Any:
    chunks = _call("openai-chat", True, stream_options={"include_usage": True})(sdks, frame)
    assert [chunk.usage is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]
    return chunks[-1].usage


def _responses_stream(sdks: Sdks, frame: dict[str, Any]) -> Any:
    events = _call("openai-responses", True)(sdks, frame)
    assert events[-1].type == "response.completed"
    return events[-1].response.usage


def _anthropic_event(kind: str) -> Callable[[Sdks, dict[str, Any]], Any]:
    def run(sdks: Sdks, frame: dict[str, Any]) -> Any:
        (event,) = [e for e in _call("anthropic", True)(sdks, frame) if e.type == kind]
        return event.message.usage if kind == "message_start" else event.usage

    return run


def _gemini_stream(sdks: Sdks, frame: dict[str, Any]) -> Any:
    return _call("gemini", True)(sdks, frame)[-1].usage_metadata


def _dump(usage: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = usage.model_dump()
    return dumped


def _camel(usage: Any) -> dict[str, Any]:  # as the REST API spells it
    dumped: dict[str, Any] = usage.model_dump(mode="json", by_alias=True)
    assert dumped["promptTokenCount"] == INPUT
    return dumped


def _snake(usage: Any) -> dict[str, Any]:  # as google-genai's models name it
    dumped: dict[str, Any] = usage.model_dump(mode="json")
    assert dumped["prompt_token_count"] == INPUT
    return dumped


# (id, render, provider, SDK usage object of a call, how it is dumped, the accounting expected)
SHAPES: list[tuple[str, str, str, Callable[[Sdks, dict[str, Any]], Any], Any, Numbers]] = [
    (
        "openai-chat",
        "openai-chat",
        "openai",
        lambda sdks, frame: _call("openai-chat", False)(sdks, frame).usage,
        _dump,
        (INPUT, CACHED, None, OUTPUT),  # Chat's canned usage has no cache_write_tokens
    ),
    (
        "openai-chat-stream",
        "openai-chat",
        "openai",
        _chat_stream,
        _dump,
        (INPUT, CACHED, None, OUTPUT),
    ),
    (
        "openai-responses",
        "openai-responses",
        "openai",
        lambda sdks, frame: _call("openai-responses", False)(sdks, frame).usage,
        _dump,
        SAME_CALL,
    ),
    ("openai-responses-stream", "openai-responses", "openai", _responses_stream, _dump, SAME_CALL),
    (
        "anthropic",
        "anthropic",
        "anthropic",
        lambda sdks, frame: _call("anthropic", False)(sdks, frame).usage,
        _dump,
        SAME_CALL,
    ),
    (
        "anthropic-message-start",  # the output count so far: 1
        "anthropic",
        "anthropic",
        _anthropic_event("message_start"),
        _dump,
        (INPUT, CACHED, WRITTEN, 1),
    ),
    (
        "anthropic-message-delta",  # cumulative counts, as current APIs send them
        "anthropic",
        "anthropic",
        _anthropic_event("message_delta"),
        _dump,
        SAME_CALL,
    ),
    (
        "anthropic-message-delta-output-only",  # input and cache fields null
        "anthropic",
        "anthropic",
        lambda sdks, frame: MessageDeltaUsage.model_validate({"output_tokens": OUTPUT}),
        _dump,
        (None, None, None, OUTPUT),
    ),
    (
        "gemini-camel-case",
        "gemini",
        "google",
        lambda sdks, frame: _call("gemini", False)(sdks, frame).usage_metadata,
        _camel,
        (INPUT, CACHED, None, OUTPUT + THOUGHTS),  # no cache-write count; thinking is output
    ),
    (
        "gemini-snake-case",
        "gemini",
        "google",
        lambda sdks, frame: _call("gemini", False)(sdks, frame).usage_metadata,
        _snake,
        (INPUT, CACHED, None, OUTPUT + THOUGHTS),
    ),
    (
        "gemini-stream",
        "gemini",
        "google",
        _gemini_stream,
        _camel,
        (INPUT, CACHED, None, OUTPUT + THOUGHTS),
    ),
]


@pytest.mark.parametrize(
    ("render", "provider", "usage_of", "dump", "expected"),
    [pytest.param(*shape[1:], id=shape[0]) for shape in SHAPES],
)
def test_the_usage_route_takes_the_sdk_usage_as_it_is(
    service: TestClient,
    sdks: Sdks,
    render: str,
    provider: str,
    usage_of: Callable[[Sdks, dict[str, Any]], Any],
    dump: Callable[[Any], dict[str, Any]],
    expected: Numbers,
) -> None:
    """The SDK's usage object of a call made with the frame, dumped as it is, is accepted and
    lands in accounting.last as the call's input, cached, cache-write and output tokens."""
    answer = prepare(service, prepare_body(render, "cache"))
    preparation_id = answer["preparation_id"]
    usage = dump(usage_of(sdks, answer["frame"]))
    posted = service.post(
        f"/v1/preparations/{preparation_id}/usage",
        json={"report_id": "call-1", "provider": provider, "call": "main", "usage": usage},
    )
    assert posted.status_code == 200, posted.text
    record = service.get(f"/v1/preparations/{preparation_id}")
    assert record.status_code == 200, record.text
    accounting = record.json()["accounting"]
    last = accounting["last"]
    assert (last["provider"], last["report_id"]) == (provider, "call-1")
    assert (
        last["provider_input_tokens"],
        last["cached_input_tokens"],
        last["cache_creation_input_tokens"],
        last["output_tokens"],
    ) == expected
    provider_input = expected[0]
    assert last["input_token_delta"] == (
        None if provider_input is None else provider_input - accounting["estimated_input_tokens"]
    )
