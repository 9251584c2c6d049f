"""A recording mock transport that answers each provider SDK the way its provider does, the
SDK clients that send through it, and ``send``: one SDK call with a frame as its arguments.

Nothing reaches a network: every SDK client gets an ``httpx``/``httpx2`` client whose transport
is ``ProviderDouble``, which records each request body and answers with a canned response built
from (and validated by) the SDK's own response models, as JSON or as a server-sent event stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from google import genai
from google.genai import types as gtypes
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseTextDeltaEvent,
)

BASE_URL = "http://provider.test"

# ----------------------------------------------------------------------------- canned answers

# The canned answers' usage: distinct numbers, so that a field read in the wrong place shows.
INPUT, CACHED, WRITTEN, OUTPUT, THOUGHTS = 2000, 1280, 300, 42, 8


def _openai_chat() -> dict[str, Any]:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"},
            }
        ],
        "usage": _chat_usage(),
    }
    ChatCompletion.model_validate(completion)
    return completion


def _chat_usage() -> dict[str, Any]:
    return {
        "prompt_tokens": INPUT,
        "completion_tokens": OUTPUT,
        "total_tokens": INPUT + OUTPUT,
        "prompt_tokens_details": {"cached_tokens": CACHED, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": THOUGHTS},
    }


def _openai_chat_events(include_usage: bool) -> list[tuple[str | None, dict[str, Any]]]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if include_usage:  # stream_options.include_usage: one last chunk, no choices, the usage
        chunks.append({**base, "choices": [], "usage": _chat_usage()})
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    return [(None, chunk) for chunk in chunks]


def _response(status: str) -> dict[str, Any]:
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1.0,
        "model": "gpt-4o-mini",
        "status": status,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if status == "completed":
        response["output"] = [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ]
        response["usage"] = {
            "input_tokens": INPUT,
            "input_tokens_details": {"cached_tokens": CACHED, "cache_write_tokens": WRITTEN},
            "output_tokens": OUTPUT,
            "output_tokens_details": {"reasoning_tokens": THOUGHTS},
            "total_tokens": INPUT + OUTPUT,
        }
    Response.model_validate(response)
    return response


def _response_events() -> list[tuple[str | None, dict[str, Any]]]:
    events: list[tuple[type[Any], dict[str, Any]]] = [
        (
            ResponseCreatedEvent,
            {"type": "response.created", "response": _response("in_progress")},
        ),
        (
            ResponseTextDeltaEvent,
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "ok",
                "logprobs": [],
            },
        ),
        (
            ResponseCompletedEvent,
            {"type": "response.completed", "response": _response("completed")},
        ),
    ]
    out: list[tuple[str | None, dict[str, Any]]] = []
    for number, (model, event) in enumerate(events):
        event = {**event, "sequence_number": number}
        model.model_validate(event)
        out.append((event["type"], event))
    return out


def _anthropic_usage() -> dict[str, Any]:
    return {
        "input_tokens": INPUT - CACHED - WRITTEN,  # the part after the last cache breakpoint
        "cache_read_input_tokens": CACHED,
        "cache_creation_input_tokens": WRITTEN,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": WRITTEN},
        "output_tokens": OUTPUT,
    }


def _anthropic_message() -> dict[str, Any]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(),
    }
    Message.model_validate(message)
    return message


def _anthropic_events() -> list[tuple[str | None, dict[str, Any]]]:
    start = {**_anthropic_message(), "content": [], "stop_reason": None}
    start["usage"] = {**_anthropic_usage(), "output_tokens": 1}
    # The delta carries the final output count and, cumulatively, the input and cache counts.
    delta_usage = {
        key: value for key, value in _anthropic_usage().items() if key != "cache_creation"
    }
    events: list[tuple[type[Any], dict[str, Any]]] = [
        (RawMessageStartEvent, {"type": "message_start", "message": start}),
        (
            RawContentBlockStartEvent,
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            RawContentBlockDeltaEvent,
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ok"},
            },
        ),
        (RawContentBlockStopEvent, {"type": "content_block_stop", "index": 0}),
        (
            RawMessageDeltaEvent,
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": delta_usage,
            },
        ),
        (RawMessageStopEvent, {"type": "message_stop"}),
    ]
    for model, event in events:
        model.model_validate(event)
    return [(event["type"], event) for _, event in events]


def _gemini_chunk(text: str, *, usage: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
        "modelVersion": "gemini-2.5-flash",
    }
    if usage:  # the REST API's spelling: camelCase, zero counts left out
        chunk["candidates"][0]["finishReason"] = "STOP"
        chunk["usageMetadata"] = {
            "promptTokenCount": INPUT,
            "cachedContentTokenCount": CACHED,
            "candidatesTokenCount": OUTPUT,
            "thoughtsTokenCount": THOUGHTS,
            "totalTokenCount": INPUT + OUTPUT + THOUGHTS,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": INPUT}],
        }
    gtypes.GenerateContentResponse.model_validate(chunk)
    return chunk


class ProviderDouble:
    """A mock-transport handler standing in for the four provider APIs.

    It records each request (``bodies`` holds the decoded JSON body, ``urls`` the URL) and answers
    the route's canned response: JSON, or a server-sent event stream when the body asks for one
    (``stream: true``) or the URL is Gemini's ``streamGenerateContent``. The OpenAI and Anthropic
    SDKs send through ``httpx2``, google-genai through ``httpx``: ``transport`` makes one for
    either package, answering with that package's ``Response``.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.urls: list[str] = []

    def transport(self, http: Any) -> Any:
        return http.MockTransport(lambda request: self.handle(http, request))

    def handle(self, http: Any, request: Any) -> Any:
        body: dict[str, Any] = orjson.loads(request.content)
        self.bodies.append(body)
        self.urls.append(str(request.url))
        path: str = request.url.path
        if path.endswith(":streamGenerateContent"):
            chunks = [_gemini_chunk("o", usage=False), _gemini_chunk("k", usage=True)]
            return _sse(http, [(None, chunk) for chunk in chunks])
        if path.endswith(":generateContent"):
            return http.Response(200, json=_gemini_chunk("ok", usage=True))
        stream = body.get("stream") is True
        if path.endswith("/chat/completions"):
            if not stream:
                return http.Response(200, json=_openai_chat())
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return _sse(http, [*_openai_chat_events(include), (None, "[DONE]")])
        if path.endswith("/responses"):
            if not stream:
                return http.Response(200, json=_response("completed"))
            return _sse(http, _response_events())
        if path.endswith("/messages"):
            if not stream:
                return http.Response(200, json=_anthropic_message())
            return _sse(http, _anthropic_events())
        return http.Response(404, json={"error": {"message": f"no route {path}"}})

    def last(self) -> dict[str, Any]:
        assert len(self.bodies) == 1, f"expected one request, got {len(self.bodies)}"
        return self.bodies[0]

    def reset(self) -> None:
        self.bodies.clear()
        self.urls.clear()


def _sse(http: Any, events: list[tuple[str | None, Any]]) -> Any:
    lines: list[bytes] = []
    for name, data in events:
        if name is not None:
            lines.append(b"event: " + name.encode() + b"\n")
        payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
        lines.append(b"data: " + payload + b"\n\n")
    headers = {"content-type": "text/event-stream"}
    return http.Response(200, headers=headers, content=b"".join(lines))


class Sdks:
    """One client of each SDK, all sending to the same ``ProviderDouble``."""

    def __init__(self, double: ProviderDouble) -> None:
        self.double = double
        self.http2 = httpx2.Client(transport=double.transport(httpx2))
        self.http = httpx.Client(transport=double.transport(httpx))
        self.openai = openai.OpenAI(
            api_key="test-key", base_url=f"{BASE_URL}/v1", http_client=self.http2, max_retries=0
        )
        self.anthropic = anthropic.Anthropic(
            api_key="test-key", base_url=BASE_URL, http_client=self.http2, max_retries=0
        )
        self.gemini = genai.Client(
            vertexai=False,  # the Gemini API, whatever the environment says
            api_key="test-key",
            http_options=gtypes.HttpOptions(base_url=f"{BASE_URL}/", httpx_client=self.http),
        )

    def close(self) -> None:
        self.http2.close()
        self.http.close()


@pytest.fixture(scope="module")
def sdks() -> Iterator[Sdks]:
    clients = Sdks(ProviderDouble())
    yield clients
    clients.close()


def gemini_config(frame: dict[str, Any]) -> gtypes.GenerateContentConfig:
    """google-genai's config for a generateContent REST body: every key but ``contents``, with
    ``generationConfig``'s fields at the top level (the SDK flattens them into its config)."""
    rest = {
        key: value for key, value in frame.items() if key not in ("contents", "generationConfig")
    }
    return gtypes.GenerateContentConfig.model_validate(
        {**rest, **frame.get("generationConfig", {})}
    )


def send(
    sdks: Sdks, render: str, model: str, frame: dict[str, Any], *, stream: bool, **options: Any
) -> Any:
    """Call the render's SDK with the frame as its arguments (``options`` added, for usage
    tests); a stream is read to its end and its events returned as a list."""
    sdks.double.reset()
    arguments = {**frame, **options}
    if stream and render != "gemini":
        arguments["stream"] = True
    if render == "openai-chat":
        answer: Any = sdks.openai.chat.completions.create(**arguments)
    elif render == "openai-responses":
        answer = sdks.openai.responses.create(**arguments)
    elif render == "anthropic":
        answer = sdks.anthropic.messages.create(**arguments)
    else:
        assert not options, "google-genai takes its options in the config"
        models = sdks.gemini.models
        call = models.generate_content_stream if stream else models.generate_content
        answer = call(model=model, contents=frame["contents"], config=gemini_config(frame))
    return list(answer) if stream else answer
