"""Provider-shaped frames are what the providers' official SDKs declare, and the SDKs send them
as they are (openai, anthropic, google-genai; no network: a mock transport answers).

For every render target and a varied set of prepare requests (``provider_sdk_support.CASES``:
both layouts, tools with and without parameters, a developer message mid-history, parallel tool
calls with string and object arguments and their results, an image part, cache directives, a
strict tool, a request with nothing but input), the real app in-process prepares the frame, and:

- each part validates against the SDK's declared request types, and so does the whole body
  (``extra="forbid"``, strict, nested iterables drained: see ``conforms``); for every SDK a
  deliberately broken part fails, so these checks can fail;
- the SDK's ``create`` called with the frame as its only arguments, non-streaming and with
  ``stream=True``, raises nothing and sends exactly the frame (plus ``"stream": true``).

Gemini: google-genai has no call that takes a REST body as it is (``HttpOptions.extra_body``
could overwrite the keys it sends, but that would step around the SDK's own request path, which
is what a host uses). The tests call ``generate_content`` and ``generate_content_stream`` with
``model``, ``contents=frame["contents"]`` and a ``GenerateContentConfig`` built from the frame's
other keys (``provider_double.gemini_config``). The SDK re-spells parts of what it sends
(JSON-schema types in upper case, blob fields in snake_case; the REST API reads both), so its body
is compared with the frame through the SDK's models (``GEMINI_BODY``): the same keys, and every
part parses to the same value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from provider_double import Sdks, sdks, send
from provider_sdk_support import (
    BLOCK_TEXT,
    CASES,
    GEMINI_BODY,
    MODELS,
    RENDERS,
    Prepared,
    check_frame,
    expected_output_limit,
    output_limit_of,
    prepare,
    prepare_body,
    prepared,
    service,
)
from pydantic import ValidationError

__all__ = ["prepared", "sdks", "service"]  # module-scoped fixtures

GRID = [pytest.param(render, case, id=f"{render}-{case}") for render in RENDERS for case in CASES]


# ----------------------------------------------------------------------------- the request types


@pytest.mark.parametrize(("render", "case"), GRID)
def test_frame_parts_conform_to_the_sdk_request_types(
    prepared: Prepared, render: str, case: str
) -> None:
    """Every message/input item, tool, system block and the whole body of the frame is a valid
    value of the type the provider's SDK declares for it."""
    check_frame(render, prepared(render, case)["frame"])


def _maximum_output(service: TestClient, model: str) -> int:
    models = service.get("/v1/models").json()["models"]
    (entry,) = [entry for entry in models if entry["name"] == model]
    maximum: int = entry["max_output_tokens"]
    return maximum


@pytest.mark.parametrize(("render", "case"), GRID)
def test_frame_output_limit_is_the_budget_reserve(
    service: TestClient, prepared: Prepared, render: str, case: str
) -> None:
    """The output-limit key carries response_reserve + reasoning_reserve_tokens (default 4096)
    and selection.output_limit says so."""
    answer = prepared(render, case)
    expected = expected_output_limit(
        prepare_body(render, case), _maximum_output(service, MODELS[render])
    )
    assert output_limit_of(render, answer["frame"]) == expected
    assert answer["selection"]["output_limit"]["tokens"] == expected
    assert answer["selection"]["output_limit"]["source"] == "reserve"


@pytest.mark.parametrize("render", RENDERS)
def test_frame_output_limit_stops_at_the_model_maximum(service: TestClient, render: str) -> None:
    """A reserve beyond the model's maximum output is sent as that maximum, which the provider
    accepts, and selection.output_limit names the model maximum as its source."""
    maximum = _maximum_output(service, MODELS[render])
    body = {**prepare_body(render, "minimal"), "response_reserve": maximum + 1000}
    answer = prepare(service, body)
    assert output_limit_of(render, answer["frame"]) == maximum
    assert answer["selection"]["output_limit"]["source"] == "model_maximum"
    check_frame(render, answer["frame"])


@pytest.mark.parametrize("render", RENDERS)
def test_each_case_reaches_the_frame(prepared: Prepared, render: str) -> None:
    """The cases are not vacuous: the data message, the image, the cache directives and the
    strict flag each appear in the frame where the provider reads them."""
    for case in CASES:
        text = str(prepared(render, case)["frame"])
        assert (BLOCK_TEXT in text) is (case != "minimal"), case
    image = str(prepared(render, "image")["frame"])
    assert "iVBORw0KGgo" in image
    cache = prepared(render, "cache")["frame"]
    plain = prepared(render, "conversation-stable")["frame"]
    if render.startswith("openai"):
        assert cache["prompt_cache_key"]
        assert cache["prompt_cache_retention"] in ("24h", "in_memory")
    elif render == "anthropic":  # on the system prompt and on the history's last message
        assert cache["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        assert b'"cache_control"' in orjson.dumps(cache["messages"])
        assert b'"cache_control"' not in orjson.dumps(plain)
    else:
        assert set(cache) == set(plain)
    tools = prepared(render, "strict-tool")["frame"]["tools"]
    if render == "openai-chat":  # function.strict only when asked
        assert {t["function"]["name"]: t["function"].get("strict") for t in tools} == {
            "lookup": True,
            "clock": None,
        }
    elif render == "openai-responses":  # always strict, false unless asked
        assert {t["name"]: t["strict"] for t in tools} == {"lookup": True, "clock": False}
        assert {t["name"]: t["strict"] for t in plain["tools"]} == {"lookup": False, "clock": False}


Breaker = Callable[[dict[str, Any]], None]


def _pop(path: list[Any], key: str) -> Breaker:
    def brk(frame: dict[str, Any]) -> None:
        _at(frame, path).pop(key)

    return brk


def _set(path: list[Any], key: str, value: Any) -> Breaker:
    def brk(frame: dict[str, Any]) -> None:
        _at(frame, path)[key] = value

    return brk


def _at(frame: dict[str, Any], path: list[Any]) -> Any:
    node: Any = frame
    for step in path:
        node = node[step] if not callable(step) else step(node)
    return node


def _first(predicate: Callable[[Any], bool]) -> Callable[[list[Any]], Any]:
    return lambda items: next(item for item in items if predicate(item))


def _role(role: str) -> Callable[[list[Any]], Any]:
    return _first(lambda item: item.get("role") == role)


def _typed(kind: str) -> Callable[[list[Any]], Any]:
    return _first(lambda item: item.get("type") == kind)


def _has(kind: str) -> Callable[[list[Any]], Any]:
    return _first(lambda item: any(block.get("type") == kind for block in item["content"]))


def _part(key: str) -> Callable[[list[Any]], Any]:
    return _first(lambda item: any(key in part for part in item["parts"]))


# One missing required key, one wrong literal or type, and one undeclared key per SDK.
BROKEN: dict[str, list[tuple[str, Breaker]]] = {
    "openai-chat": [
        ("tool message without tool_call_id", _pop(["messages", _role("tool")], "tool_call_id")),
        (
            "tool call of type 'func'",
            _set(["messages", _role("assistant"), "tool_calls", 0], "type", "func"),
        ),
        ("undeclared key on a tool", _set(["tools", 0, "function"], "input_schema", {})),
    ],
    "openai-responses": [
        ("function tool without strict", _pop(["tools", 0], "strict")),
        ("message of role 'tool'", _set(["input", _role("developer")], "role", "tool")),
        ("call output without output", _pop(["input", _typed("function_call_output")], "output")),
    ],
    "anthropic": [
        (
            "tool_result without tool_use_id",
            _pop(["messages", _has("tool_result"), "content", 0], "tool_use_id"),
        ),
        ("message of role 'tool'", _set(["messages", 0], "role", "tool")),
        ("tool without input_schema", _pop(["tools", 0], "input_schema")),
    ],
    "gemini": [
        ("turn of role 'assistant'", _set(["contents", _role("model")], "role", "assistant")),
        (
            "functionCall args as a string",
            _set(["contents", _part("functionCall"), "parts", -1, "functionCall"], "args", "{}"),
        ),
        ("a part keeping the neutral type", _set(["contents", 0, "parts", 0], "type", "text")),
    ],
}


@pytest.mark.parametrize("render", RENDERS)
def test_a_broken_frame_part_fails_the_sdk_types(prepared: Prepared, render: str) -> None:
    """The validation can fail: each deliberately broken copy of a valid frame is refused."""
    frame = prepared(render, "conversation-stable")["frame"]
    check_frame(render, frame)
    for name, brk in BROKEN[render]:
        broken = copy.deepcopy(frame)
        brk(broken)
        assert broken != frame, name
        with pytest.raises(ValidationError):
            check_frame(render, broken)


# ----------------------------------------------------------------------------- the SDK calls


def _as_sent(render: str, body: dict[str, Any]) -> Any:
    """A body for comparison: as is, or for Gemini parsed by the SDK's models."""
    return GEMINI_BODY.validate_python(body) if render == "gemini" else body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("render", "case"), GRID)
def test_the_sdk_sends_the_frame_as_it_is(
    prepared: Prepared, sdks: Sdks, render: str, case: str, stream: bool
) -> None:
    """create(**frame) (Gemini: see the module doc) needs no other argument, raises nothing,
    parses the canned answer, and the body it sent is the frame (plus stream: true)."""
    frame = prepared(render, case)["frame"]
    answer = send(sdks, render, MODELS[render], frame, stream=stream)
    sent = sdks.double.last()
    expected = {**frame, "stream": True} if stream and render != "gemini" else frame
    assert _as_sent(render, sent) == _as_sent(render, expected)
    assert sdks.double.urls[0].endswith(
        {
            "openai-chat": "/v1/chat/completions",
            "openai-responses": "/v1/responses",
            "anthropic": "/v1/messages",
            "gemini": f"/models/{MODELS[render]}:"
            + ("streamGenerateContent?alt=sse" if stream else "generateContent"),
        }[render]
    )
    assert answer  # the SDK parsed the answer (a stream: its events)


def test_anthropic_sdk_takes_the_default_reserve_without_streaming_but_not_a_large_one(
    service: TestClient, sdks: Sdks
) -> None:
    """The Anthropic SDK refuses a non-streaming call whose max_tokens may take over ten
    minutes: the default reserve passes, a 60,000-token reserve needs streaming."""
    body = prepare_body("anthropic", "conversation-stable")
    large = prepare(service, {**body, "response_reserve": 60_000, "assembly": {}})["frame"]
    assert large["max_tokens"] == 60_000
    with pytest.raises(ValueError, match="Streaming is required"):
        send(sdks, "anthropic", MODELS["anthropic"], large, stream=False)
    assert send(sdks, "anthropic", MODELS["anthropic"], large, stream=True)
    default = prepare(service, {**body, "response_reserve": 4096, "assembly": {}})["frame"]
    assert default["max_tokens"] == 4096
    assert send(sdks, "anthropic", MODELS["anthropic"], default, stream=False)


# ----------------------------------------------------------------------------- provider-shaped input

RECORDED = Path(__file__).parents[1] / "core" / "conversations"


@pytest.mark.parametrize("render", ["openai-chat", "anthropic", "openai-responses"])
def test_a_provider_shaped_conversation_renders_to_what_its_sdk_declares(
    service: TestClient, sdks: Sdks, render: str
) -> None:
    """A conversation recorded in a provider's shape (tool calls, results, images, thinking or
    reasoning items), posted as it is and rendered for that provider, conforms to the SDK's
    request types and is sent by the SDK unchanged."""
    body = orjson.loads((RECORDED / f"{render}.json").read_bytes())
    frame = prepare(service, {**body, "render": render})["frame"]
    check_frame(render, frame)
    send(sdks, render, body["model"], frame, stream=False)
    assert _as_sent(render, sdks.double.last()) == _as_sent(render, frame)


# ----------------------------------------------------------------------------- newer cache rules

NEWER_CACHE = [
    pytest.param(
        "openai-chat",
        "gpt-5.6-sol",
        {"breakpoints": True, "mode": "explicit", "key": "auto"},
        id="openai-chat-explicit",
    ),
    pytest.param(
        "openai-responses",
        "gpt-5.6-sol",
        {"breakpoints": True, "diagnostics": True},
        id="openai-responses-implicit-diagnostics",
    ),
    pytest.param(
        "openai-responses",
        "gpt-5.6-luna",
        {"breakpoints": True, "mode": "explicit", "diagnostics": True},
        id="openai-responses-explicit-diagnostics",
    ),
    pytest.param(
        "anthropic",
        "claude-sonnet-4-5",
        {"breakpoints": True, "automatic": True, "instructions_ttl": "1h", "diagnostics": True},
        id="anthropic-automatic-mixed-ttl-diagnostics",
    ),
]


def _second_turn(service: TestClient, render: str, model: str, cache: dict[str, Any]) -> Any:
    """The second turn of a conversation whose first turn's usage report named a response id,
    in the transcript layout (where every directive of the plan can appear)."""
    body = prepare_body(render, "cache")
    body.update(
        model=model,
        cache=cache,
        scope={"task_id": f"sdk-{render}-{model}-{len(cache)}"},
        assembly={"layout": "transcript"},
    )
    first = prepare(service, body)
    response_id = {"anthropic": "msg_01sdk", "openai-responses": "resp_sdk"}.get(render, "c-1")
    report = {
        "report_id": "r1",
        "provider": "anthropic" if render == "anthropic" else "openai",
        "usage": {"input_tokens": 10, "output_tokens": 1}
        if render != "openai-chat"
        else {"prompt_tokens": 10, "completion_tokens": 1},
        "response_id": response_id,
    }
    usage = service.post(f"/v1/preparations/{first['preparation_id']}/usage", json=report)
    assert usage.status_code == 200, usage.text
    body["history"] = [*body["history"], *body["input"], {"role": "assistant", "content": "Done."}]
    body["input"] = [{"role": "user", "content": "And now?"}]
    return prepare(service, body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("render", "model", "cache"), NEWER_CACHE)
def test_newer_cache_directives_are_what_the_sdks_declare(
    service: TestClient,
    sdks: Sdks,
    render: str,
    model: str,
    cache: dict[str, Any],
    stream: bool,
) -> None:
    """OpenAI's ``prompt_cache_breakpoint`` and ``prompt_cache_options`` (mode, comparison
    response), Anthropic's top-level ``cache_control``, mixed marker lifetimes and
    ``diagnostics`` conform to the SDKs' request types and are sent unchanged."""
    answer = _second_turn(service, render, model, cache)
    frame = answer["frame"]
    text = orjson.dumps(frame).decode()
    if render == "anthropic":
        assert frame["cache_control"] == {"type": "ephemeral"}
        assert frame["diagnostics"] == {"previous_message_id": "msg_01sdk"}
        assert '"ttl":"1h"' in text
    else:
        assert "prompt_cache_breakpoint" in text
        if render == "openai-responses":
            assert frame["prompt_cache_options"]["comparison_response_id"] == "resp_sdk"
    check_frame(render, frame)
    send(sdks, render, model, frame, stream=stream)
    expected = {**frame, "stream": True} if stream else frame
    assert sdks.double.last() == expected


@pytest.mark.parametrize(
    ("render", "key", "value"),
    [
        ("openai-chat", "prompt_cache_options", {"mode": "auto"}),
        ("openai-chat", "prompt_cache_options", {"comparison_response_id": "r"}),  # Responses only
        ("openai-responses", "prompt_cache_options", {"ttl": "5m"}),
        ("anthropic", "diagnostics", {"previous_message": None}),
        ("anthropic", "cache_control", {"type": "ephemeral", "ttl": "30m"}),
    ],
)
def test_a_broken_cache_directive_fails_the_sdk_types(render: str, key: str, value: Any) -> None:
    """The SDK types refuse a directive the provider does not take, so the checks above can
    fail."""
    frames: dict[str, dict[str, Any]] = {
        "openai-chat": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        "openai-responses": {"model": "m", "input": [{"role": "user", "content": "x"}]},
        "anthropic": {
            "model": "m",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}],
        },
    }
    frame = frames[render]
    check_frame(render, frame)
    with pytest.raises(ValidationError):
        check_frame(render, {**frame, key: value})
