"""A loopback stand-in of the providers' HTTP APIs that runs a tool loop, as a real server.

``ProviderServer`` serves OpenAI Chat Completions (``POST /v1/chat/completions``), OpenAI
Responses (``POST /v1/responses``) and Anthropic Messages (``POST /v1/messages``) on 127.0.0.1
from a thread of its own, so the provider classes people use (LangChain's ``ChatOpenAI`` and
``ChatAnthropic``, Pydantic AI's ``OpenAIChatModel`` and ``AnthropicModel``, the Agents SDK's
``OpenAIChatCompletionsModel`` and ``OpenAIResponsesModel``) send to it through their own SDK
clients and HTTP stacks. Every request is recorded (``calls``: the path and the decoded body).

It answers as the provider does, with bodies validated by the provider SDK's own response
models: when the conversation's last assistant turn called tools (the results are in), or the
request offers no tool ``TOOL``, a text answer (``ANSWER``); otherwise a call of ``TOOL`` with
``{"id": "A42"}``, so an agent with that tool runs one tool step per user turn. ``stream: true`` gets the API's server-sent events. Each answer
has an id of its own (``chatcmpl-N``, ``resp_N``, ``msg_N``) and the usage figures below.

A request that asks for the provider's compaction (``context_management``) while its
conversation holds no compaction item yet is answered as one that crossed the threshold: the
answer opens with a compaction item (Anthropic's ``compaction`` block with the summary
``COMPACTED``, a Responses ``compaction`` item), as each API returns it. Recorded requests keep
their headers (``anthropic-beta``).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from anthropic.types import Message
from anthropic.types.beta import BetaMessage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

TOOL = "lookup"
ARGUMENTS = {"id": "A42"}
ANSWER = "Order A42 has shipped."
INPUT, CACHED, WRITTEN, OUTPUT = 2000, 1280, 300, 12
COMPACTED = "The user asked about order A42; it has shipped."
ENCRYPTED = "gAAAA-compacted-by-the-stand-in"


@dataclass(frozen=True)
class Recorded:
    path: str
    body: dict[str, Any]
    response_id: str
    headers: dict[str, str]


def _compacts(body: dict[str, Any]) -> bool:
    """The request asks for compaction and holds no compaction item yet."""
    if not body.get("context_management"):
        return False
    return b'"type":"compaction"' not in orjson.dumps(body.get("messages") or body.get("input"))


# --------------------------------------------------------------------------- what to answer


def _chat_done(messages: list[dict[str, Any]]) -> bool:
    """OpenAI Chat: the last assistant message called tools (their results follow)."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    return bool(last and last.get("tool_calls"))


def _responses_done(items: list[dict[str, Any]]) -> bool:
    """Responses: the last assistant item is a function call."""
    for item in reversed(items):
        if item.get("type") == "function_call":
            return True
        if item.get("role") == "assistant":
            return False
    return False


def _anthropic_done(messages: list[dict[str, Any]]) -> bool:
    """Anthropic: the last assistant turn has a ``tool_use`` block."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    content = last.get("content") if last else None
    return isinstance(content, list) and any(b.get("type") == "tool_use" for b in content)


# --------------------------------------------------------------------------- answers


def _chat(n: int, done: bool, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ANSWER if done else None}
    if not done:
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": TOOL, "arguments": orjson.dumps(ARGUMENTS).decode()},
            }
        ]
    completion = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "finish_reason": "stop" if done else "tool_calls", "message": message}
        ],
        "usage": {
            "prompt_tokens": INPUT,
            "completion_tokens": OUTPUT,
            "total_tokens": INPUT + OUTPUT,
            "prompt_tokens_details": {"cached_tokens": CACHED},
        },
    }
    ChatCompletion.model_validate(completion)
    return completion


def _chat_events(completion: dict[str, Any]) -> list[tuple[str | None, Any]]:
    base = {key: completion[key] for key in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": 0, **call} for call in message["tool_calls"]]
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**base, "choices": [], "usage": completion["usage"]},
    ]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    return [*((None, chunk) for chunk in chunks), (None, "[DONE]")]


def _response(
    n: int, done: bool, model: str, status: str = "completed", compact: bool = False
) -> dict[str, Any]:
    if done:
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": TOOL,
                "arguments": orjson.dumps(ARGUMENTS).decode(),
                "status": "completed",
            }
        ]
    if compact:
        output.insert(0, {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": ENCRYPTED})
    response: dict[str, Any] = {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1.0,
        "model": model,
        "status": status,
        "output": output if status == "completed" else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if status == "completed":
        response["usage"] = {
            "input_tokens": INPUT,
            "input_tokens_details": {"cached_tokens": CACHED, "cache_write_tokens": 0},
            "output_tokens": OUTPUT,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": INPUT + OUTPUT,
        }
    Response.model_validate(response)
    return response


def _response_events(n: int, done: bool, model: str) -> list[tuple[str | None, Any]]:
    final = _response(n, done, model)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response(n, done, model, "in_progress")}
    ]
    for index, item in enumerate(final["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": final})
    return [
        (event["type"], {**event, "sequence_number": number}) for number, event in enumerate(events)
    ]


def _anthropic_usage() -> dict[str, Any]:
    return {
        "input_tokens": INPUT - CACHED - WRITTEN,
        "cache_read_input_tokens": CACHED,
        "cache_creation_input_tokens": WRITTEN,
        "output_tokens": OUTPUT,
    }


def _message(n: int, done: bool, model: str, compact: bool = False) -> dict[str, Any]:
    content: list[dict[str, Any]] = (
        [{"type": "text", "text": ANSWER}]
        if done
        else [{"type": "tool_use", "id": f"toolu_{n}", "name": TOOL, "input": ARGUMENTS}]
    )
    if compact:
        content.insert(0, {"type": "compaction", "content": COMPACTED})
    message = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "end_turn" if done else "tool_use",
        "stop_sequence": None,
        "usage": _anthropic_usage(),
    }
    (BetaMessage if compact else Message).model_validate(message)
    return message


def _message_events(message: dict[str, Any]) -> list[tuple[str | None, Any]]:
    block = message["content"][0]
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    opened: dict[str, Any]
    delta: dict[str, Any]
    if block["type"] == "text":
        opened = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        opened = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": opened},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": message["usage"],
        },
        {"type": "message_stop"},
    ]
    return [(event["type"], event) for event in events]


# --------------------------------------------------------------------------- the server


def _sse(events: list[tuple[str | None, Any]]) -> bytes:
    lines: list[bytes] = []
    for name, data in events:
        if name is not None:
            lines.append(b"event: " + name.encode() + b"\n")
        payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
        lines.append(b"data: " + payload + b"\n\n")
    return b"".join(lines)


class ProviderServer:
    """The stand-in, serving on ``url`` until :meth:`close`."""

    def __init__(self) -> None:
        self.calls: list[Recorded] = []
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = orjson.loads(self.rfile.read(length)) if length else {}
                headers = {key.lower(): value for key, value in self.headers.items()}
                status, media, payload = server.answer(self.path.split("?")[0], body, headers)
                self.send_response(status)
                self.send_header("content-type", media)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def answer(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        n = next(self._numbers)
        headers = headers or {}
        compact = _compacts(body)
        model = str(body.get("model") or "model")
        stream = body.get("stream") is True
        offered = TOOL in orjson.dumps(body.get("tools") or []).decode()
        if path.endswith("/chat/completions"):
            done = not offered or _chat_done(body.get("messages") or [])
            completion = _chat(n, done, model)
            self._record(path, body, completion["id"], headers)
            if stream:
                return 200, "text/event-stream", _sse(_chat_events(completion))
            return 200, "application/json", orjson.dumps(completion)
        if path.endswith("/responses"):
            items = body.get("input")
            done = not offered or _responses_done(items if isinstance(items, list) else [])
            self._record(path, body, f"resp_{n}", headers)
            if stream:
                return 200, "text/event-stream", _sse(_response_events(n, done, model))
            return 200, "application/json", orjson.dumps(_response(n, done, model, compact=compact))
        if path.endswith("/messages"):
            done = not offered or _anthropic_done(body.get("messages") or [])
            message = _message(n, done, model, compact=compact)
            self._record(path, body, message["id"], headers)
            if stream:
                return 200, "text/event-stream", _sse(_message_events(message))
            return 200, "application/json", orjson.dumps(message)
        return 404, "application/json", orjson.dumps({"error": {"message": f"no route {path}"}})

    def _record(
        self, path: str, body: dict[str, Any], response_id: str, headers: dict[str, str]
    ) -> None:
        with self._lock:
            self.calls.append(Recorded(path, body, response_id, headers))

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=10)
