"""Provider renderers: golden bodies per target and structural properties (docs/contract.md, "Provider renders")."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from context_assembly.core.frame import Frame
from context_assembly.core.render import RAW_ARGUMENTS_KEY, render_frame
from context_assembly.core.request import Message, OpaquePart, Render, TextPart, Tool, ToolCall
from context_assembly.errors import InvalidError
from hypothesis_budget import examples

TARGETS: tuple[Render, ...] = ("neutral", "openai-chat", "openai-responses", "anthropic", "gemini")

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
DATA = '{"context_data":[{"source":"memory","blocks":[{"id":"m1","text":"Likes tea"}]}]}'

GOLDEN_FRAME = Frame(
    messages=[
        Message(role="system", content="You are helpful."),
        Message(role="developer", content="Cite sources."),
        Message(role="user", content="What is the weather in Paris?"),
        Message(
            role="assistant",
            content="",
            tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')],
        ),
        Message(role="tool", content="18C and sunny", tool_call_id="call_1"),
        Message(role="assistant", content="It is 18C and sunny in Paris."),
        Message(role="developer", content="Current date: 2025-01-01"),
        Message(role="user", content=DATA),
        Message(role="user", content=[TextPart(type="text", text="And tomorrow?")]),
    ],
    tools=[Tool(name="get_weather", description="Weather for a city.", parameters=WEATHER_SCHEMA)],
)

GOLDEN: dict[Render, dict[str, Any]] = {
    "neutral": {
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "developer", "content": "Cite sources."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
                ],
            },
            {"role": "tool", "content": "18C and sunny", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It is 18C and sunny in Paris."},
            {"role": "developer", "content": "Current date: 2025-01-01"},
            {"role": "user", "content": DATA},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": WEATHER_SCHEMA,
            }
        ],
    },
    "openai-chat": {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "developer", "content": "Cite sources."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": "18C and sunny", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It is 18C and sunny in Paris."},
            {"role": "developer", "content": "Current date: 2025-01-01"},
            {"role": "user", "content": DATA},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a city.",
                    "parameters": WEATHER_SCHEMA,
                },
            }
        ],
        "max_completion_tokens": 1024,
    },
    "openai-responses": {
        "model": "gpt-4o-mini",
        "input": [
            {"role": "system", "content": "You are helpful."},
            {"role": "developer", "content": "Cite sources."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
            {"role": "assistant", "content": "It is 18C and sunny in Paris."},
            {"role": "developer", "content": "Current date: 2025-01-01"},
            {"role": "user", "content": DATA},
            {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": WEATHER_SCHEMA,
                "strict": False,
            }
        ],
        "max_output_tokens": 1024,
    },
    "anthropic": {
        "model": "gpt-4o-mini",
        "max_tokens": 1024,
        "system": "You are helpful.\n\nCite sources.",
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C and sunny"}
                ],
            },
            {"role": "assistant", "content": "It is 18C and sunny in Paris."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "[developer instructions]\nCurrent date: 2025-01-01",
                    },
                    {"type": "text", "text": DATA},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city.",
                "input_schema": WEATHER_SCHEMA,
            }
        ],
    },
    "gemini": {
        "contents": [
            {"role": "user", "parts": [{"text": "What is the weather in Paris?"}]},
            {
                "role": "model",
                "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"content": "18C and sunny"},
                        }
                    }
                ],
            },
            {"role": "model", "parts": [{"text": "It is 18C and sunny in Paris."}]},
            {
                "role": "user",
                "parts": [
                    {"text": "[developer instructions]\nCurrent date: 2025-01-01"},
                    {"text": DATA},
                    {"text": "And tomorrow?"},
                ],
            },
        ],
        "systemInstruction": {"parts": [{"text": "You are helpful.\n\nCite sources."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "get_weather",
                        "description": "Weather for a city.",
                        "parameters": WEATHER_SCHEMA,
                    }
                ]
            }
        ],
        "generationConfig": {"maxOutputTokens": 1024},
    },
}


@pytest.mark.parametrize("target", TARGETS)
def test_golden_body_per_target(target: Render) -> None:
    """The reference frame renders to the exact documented body for every target."""
    body = render_frame(GOLDEN_FRAME, target, "gpt-4o-mini", 1024)
    assert body == GOLDEN[target]
    # Key order is part of the body's bytes (and so of any hash over it): pin it too.
    assert orjson.dumps(body) == orjson.dumps(GOLDEN[target])


@pytest.mark.parametrize("target", ["openai-chat", "openai-responses", "anthropic", "gemini"])
def test_no_max_output_tokens_leaves_the_limit_out(target: Render) -> None:
    """Without max_output_tokens the renderer sets no output limit rather than inventing one."""
    body = render_frame(GOLDEN_FRAME, target, "m", None)
    assert not {"max_completion_tokens", "max_output_tokens", "max_tokens", "generationConfig"} & (
        body.keys()
    )


def test_mid_system_message_gets_its_own_marker() -> None:
    """A later system message becomes a user turn marked as system instructions."""
    frame = Frame(
        messages=[
            Message(role="user", content="hi"),
            Message(role="system", content="Be brief."),
        ]
    )
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    assert "system" not in anthropic
    assert anthropic["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "text", "text": "[system instructions]\nBe brief."},
            ],
        }
    ]
    gemini = render_frame(frame, "gemini", "gemini-2.5-flash", None)
    assert "systemInstruction" not in gemini
    assert gemini["contents"][0]["parts"][1] == {"text": "[system instructions]\nBe brief."}


def test_first_turn_may_be_the_assistant() -> None:
    """An assistant message first after the system prompt is kept; no user turn is invented."""
    frame = Frame(
        messages=[
            Message(role="system", content="S"),
            Message(role="assistant", content="Hello! How can I help?"),
            Message(role="user", content="Tea facts."),
        ]
    )
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    assert [m["role"] for m in anthropic["messages"]] == ["assistant", "user"]
    gemini = render_frame(frame, "gemini", "g", None)
    assert [c["role"] for c in gemini["contents"]] == ["model", "user"]


def test_non_json_arguments_are_kept_raw_for_anthropic_and_gemini() -> None:
    """Arguments that are not a JSON object survive verbatim under the raw-arguments key."""
    frame = Frame(
        messages=[
            Message(role="user", content="go"),
            Message(
                role="assistant",
                content="Calling.",
                tool_calls=[
                    ToolCall(id="a", name="f", arguments="not json"),
                    ToolCall(id="b", name="g", arguments="[1, 2]"),
                    ToolCall(id="c", name="h", arguments=""),
                    ToolCall(id="d", name="k", arguments={"x": [1]}),
                ],
            ),
        ]
    )
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    blocks = anthropic["messages"][1]["content"]
    assert blocks[0] == {"type": "text", "text": "Calling."}
    assert [b["input"] for b in blocks[1:]] == [
        {RAW_ARGUMENTS_KEY: "not json"},
        {RAW_ARGUMENTS_KEY: "[1, 2]"},
        {},
        {"x": [1]},
    ]
    gemini = render_frame(frame, "gemini", "g", None)
    assert [p["functionCall"]["args"] for p in gemini["contents"][1]["parts"][1:]] == [
        {RAW_ARGUMENTS_KEY: "not json"},
        {RAW_ARGUMENTS_KEY: "[1, 2]"},
        {},
        {"x": [1]},
    ]
    chat = render_frame(frame, "openai-chat", "gpt", None)
    assert [c["function"]["arguments"] for c in chat["messages"][1]["tool_calls"]] == [
        "not json",
        "[1, 2]",
        "",
        '{"x":[1]}',
    ]


def test_parallel_tool_results_merge_into_one_user_turn() -> None:
    """Several tool results after one assistant turn form a single user turn, in order."""
    frame = Frame(
        messages=[
            Message(role="user", content="both"),
            Message(
                role="assistant",
                tool_calls=[ToolCall(id="1", name="a"), ToolCall(id="2", name="b")],
            ),
            Message(role="tool", content="A", tool_call_id="1"),
            Message(role="tool", content="B", tool_call_id="2"),
            Message(role="user", content="thanks"),
        ]
    )
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    assert anthropic["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "1", "content": "A"},
            {"type": "tool_result", "tool_use_id": "2", "content": "B"},
            {"type": "text", "text": "thanks"},
        ],
    }
    gemini = render_frame(frame, "gemini", "g", None)
    assert [list(p) for p in gemini["contents"][2]["parts"]] == [
        ["functionResponse"],
        ["functionResponse"],
        ["text"],
    ]
    assert [p["functionResponse"]["name"] for p in gemini["contents"][2]["parts"][:2]] == [
        "a",
        "b",
    ]


def test_opaque_parts_pass_through() -> None:
    """Image/file/opaque parts keep their fields; Gemini drops only the neutral type key."""
    image = OpaquePart.model_validate(
        {"type": "image", "inlineData": {"mimeType": "image/png", "data": "AAAA"}}
    )
    frame = Frame(
        messages=[Message(role="user", content=[TextPart(type="text", text="look"), image])]
    )
    expected = {"type": "image", "inlineData": {"mimeType": "image/png", "data": "AAAA"}}
    chat = render_frame(frame, "openai-chat", "gpt", None)
    assert chat["messages"][0]["content"][1] == expected
    responses = render_frame(frame, "openai-responses", "gpt", None)
    assert responses["input"][0]["content"] == [{"type": "input_text", "text": "look"}, expected]
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    assert anthropic["messages"][0]["content"][1] == expected
    gemini = render_frame(frame, "gemini", "g", None)
    assert gemini["contents"][0]["parts"] == [
        {"text": "look"},
        {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
    ]


def test_leading_system_with_non_text_part_is_not_a_system_prompt() -> None:
    """A leading system message with an image cannot be a text system prompt, so it is marked."""
    image = OpaquePart.model_validate({"type": "image", "source": {"type": "url", "url": "u"}})
    frame = Frame(
        messages=[
            Message(role="system", content="Plain."),
            Message(role="system", content=[image]),
            Message(role="user", content="q"),
        ]
    )
    body = render_frame(frame, "anthropic", "claude", 10)
    assert body["system"] == "Plain."
    assert body["messages"][0]["content"][:2] == [
        {"type": "text", "text": "[system instructions]"},
        {"type": "image", "source": {"type": "url", "url": "u"}},
    ]


def test_empty_parameters_schema_per_provider() -> None:
    """A tool without parameters gets an empty object schema for Anthropic and none for Gemini."""
    frame = Frame(tools=[Tool(name="now", description="Current time.")])
    anthropic = render_frame(frame, "anthropic", "claude", 10)
    assert anthropic["tools"] == [
        {
            "name": "now",
            "description": "Current time.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    gemini = render_frame(frame, "gemini", "g", None)
    assert gemini["tools"] == [
        {"functionDeclarations": [{"name": "now", "description": "Current time."}]}
    ]
    assert "system" not in anthropic
    assert anthropic["messages"] == []


@pytest.mark.parametrize("target", ["openai-responses", "anthropic"])
def test_tool_message_without_call_id_is_invalid(target: Render) -> None:
    """Targets that link results by call id refuse a tool message without one, naming it."""
    frame = Frame(messages=[Message(role="user", content="x"), Message(role="tool", content="r")])
    with pytest.raises(InvalidError) as caught:
        render_frame(frame, target, "m", 10)
    assert caught.value.extensions["field"] == "frame.messages[1].tool_call_id"


def test_gemini_tool_result_name_falls_back_to_message_name() -> None:
    """Gemini takes the function name from the matching call, else from the tool message's name."""
    named = Frame(messages=[Message(role="tool", content="r", name="lookup", tool_call_id="zz")])
    body = render_frame(named, "gemini", "g", None)
    assert body["contents"][0]["parts"][0]["functionResponse"]["name"] == "lookup"
    anonymous = Frame(messages=[Message(role="tool", content="r", tool_call_id="zz")])
    with pytest.raises(InvalidError) as caught:
        render_frame(anonymous, "gemini", "g", None)
    assert caught.value.extensions["field"] == "frame.messages[0]"


@pytest.mark.parametrize("target", ["openai-chat", "openai-responses"])
def test_unencodable_arguments_are_invalid_not_a_crash(target: Render) -> None:
    """Object arguments JSON cannot carry (integers beyond 64 bits) are refused by the model
    (``request.JsonObject``) and, should one be built without validation, by path in render."""
    with pytest.raises(ValidationError, match="json_encodable"):
        ToolCall(id="1", name="f", arguments={"n": 2**70})
    unchecked = ToolCall.model_construct(id="1", name="f", arguments={"n": 2**70})
    frame = Frame(
        messages=[
            Message(role="user", content="x"),
            Message.model_construct(role="assistant", content="", tool_calls=[unchecked]),
        ]
    )
    with pytest.raises(InvalidError) as caught:
        render_frame(frame, target, "m", None)
    assert caught.value.extensions["field"] == "frame.messages[1].tool_calls[0].arguments"


# --------------------------------------------------------------------------- properties


def _all_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_all_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_all_keys(v) for v in value))
    return set()


def _all_strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _all_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _all_strings(v)]
    return [value] if isinstance(value, str) else []


def _message_texts(frame: Frame) -> list[str]:
    texts: list[str] = []
    for message in frame.messages:
        if isinstance(message.content, str):
            texts.append(message.content)
        else:
            texts.extend(p.text for p in message.content if isinstance(p, TextPart))
    return [t for t in texts if t]


# Built from fragments rather than ``st.text()``: no charmap to build on a cold cache (which trips
# Hypothesis' too-slow health check on fresh CI), and the fragments aim at what could break
# rendering: JSON syntax, escapes, blank lines, non-ASCII, and the marker text itself.
FRAGMENTS = [
    "a",
    "Zz",
    " ",
    "\n",
    "\n\n",
    '"',
    "\\",
    "{",
    "}",
    "[",
    "é",
    "😀",
    "[developer instructions]",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
content = st.one_of(
    texts,
    st.lists(
        st.one_of(
            texts.map(lambda t: TextPart(type="text", text=t)),
            st.just(OpaquePart.model_validate({"type": "image", "url": "https://x/i.png"})),
        ),
        max_size=3,
    ),
)


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    """Conversations of any role order where each tool result answers an earlier call."""
    messages: list[Message] = []
    call_number = 0
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        kind = draw(st.sampled_from(["system", "developer", "user", "assistant", "calls"]))
        if kind != "calls":
            messages.append(Message(role=kind, content=draw(content)))
            continue
        calls = []
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            call_number += 1
            arguments = draw(
                st.one_of(
                    texts,
                    st.dictionaries(
                        texts, st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=2
                    ),
                )
            )
            calls.append(
                ToolCall(id=f"call_{call_number}", name=f"fn_{call_number}", arguments=arguments)
            )
        messages.append(Message(role="assistant", content=draw(content), tool_calls=calls))
        messages.extend(
            Message(role="tool", content=draw(content), tool_call_id=call.id) for call in calls
        )
    tools = [
        Tool(
            name=name,
            description=draw(texts),
            parameters=draw(st.sampled_from([{}, WEATHER_SCHEMA])),
        )
        for name in draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3))
    ]
    return Frame(messages=messages, tools=tools)


@settings(max_examples=examples(200))
@given(frame=frames(), target=st.sampled_from(TARGETS))
def test_rendering_is_deterministic_and_pure(frame: Frame, target: Render) -> None:
    """Same frame, same bytes; the frame is unchanged and shares nothing mutable with the body."""
    snapshot = frame.model_dump(mode="json")
    first = render_frame(frame, target, "model-x", 256)
    second = render_frame(frame, target, "model-x", 256)
    assert orjson.dumps(first) == orjson.dumps(second)
    # Scribble over every dict in the body: the frame must not notice.
    stack: list[Any] = [first]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            item["__mutated__"] = True
        elif isinstance(item, list):
            stack.extend(item)
    assert frame.model_dump(mode="json") == snapshot


@settings(max_examples=examples(200))
@given(frame=frames(), target=st.sampled_from(["anthropic", "gemini"]))
def test_anthropic_and_gemini_alternate_roles_and_lose_no_text(
    frame: Frame, target: Render
) -> None:
    """Turns strictly alternate, and every message text appears in the rendered body."""
    body = render_frame(frame, target, "model-x", 256)
    turns = body["messages"] if target == "anthropic" else body["contents"]
    roles = [turn["role"] for turn in turns]
    assert all(a != b for a, b in pairwise(roles))
    assert all(turn["content" if target == "anthropic" else "parts"] for turn in turns)
    strings = _all_strings(body)
    for text in _message_texts(frame):
        assert any(text in s for s in strings), text


@settings(max_examples=examples(100))
@given(frame=frames(), target=st.sampled_from(TARGETS))
def test_renderer_never_adds_cache_markers(frame: Frame, target: Render) -> None:
    """No cache_control, cache key or cached-content reference is ever invented (docs/contract.md, "Provider renders")."""
    body = render_frame(frame, target, "model-x", 256)
    assert not _all_keys(body) & {
        "cache_control",
        "prompt_cache_key",
        "prompt_cache_retention",
        "cachedContent",
        "cached_content",
    }


STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": ["integer", "null"]},
        "units": {
            "type": "object",
            "properties": {"metric": {"type": "boolean"}},
            "required": ["metric"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "days", "units"],
    "additionalProperties": False,
}


def test_strict_is_sent_where_each_provider_reads_it() -> None:
    """Responses always says strict; Chat and Anthropic only when asked; Gemini never."""
    loose = Tool(name="loose", parameters=WEATHER_SCHEMA)
    strict = Tool(name="tight", parameters=STRICT_SCHEMA, strict=True)
    frame = Frame(messages=[Message(role="user", content="hi")], tools=[loose, strict])
    chat = render_frame(frame, "openai-chat", "gpt-4o", 100)["tools"]
    assert "strict" not in chat[0]["function"] and chat[1]["function"]["strict"] is True
    responses = render_frame(frame, "openai-responses", "gpt-4o", 100)["tools"]
    assert [tool["strict"] for tool in responses] == [False, True]
    anthropic = render_frame(frame, "anthropic", "claude-sonnet-4-5", 100)["tools"]
    assert "strict" not in anthropic[0] and anthropic[1]["strict"] is True
    gemini = render_frame(frame, "gemini", "gemini-2.5-flash", 100)["tools"]
    assert all("strict" not in d for d in gemini[0]["functionDeclarations"])
    neutral = render_frame(frame, "neutral", "gpt-4o", 100)["tools"]
    assert "strict" not in neutral[0] and neutral[1]["strict"] is True


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        ({}, "the root must be an object schema"),
        ({**STRICT_SCHEMA, "additionalProperties": True}, "parameters: an object must set"),
        ({**STRICT_SCHEMA, "required": ["city"]}, "missing ['days', 'units']"),
        (
            {
                **STRICT_SCHEMA,
                "properties": {
                    **STRICT_SCHEMA["properties"],  # type: ignore[dict-item]
                    "units": {"type": "object", "properties": {"metric": {}}, "required": []},
                },
            },
            "parameters.properties.units: an object must set 'additionalProperties': false",
        ),
        (
            {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "object"}}},
                "required": ["tags"],
                "additionalProperties": False,
            },
            "parameters.properties.tags.items",
        ),
    ],
)
def test_a_strict_tool_with_a_loose_schema_is_refused_by_name(
    schema: dict[str, Any], rule: str
) -> None:
    """A strict tool whose schema breaks a strict rule is refused, naming the tool and the rule."""
    with pytest.raises(ValidationError) as caught:
        Tool(name="lookup", parameters=schema, strict=True)
    message = str(caught.value)
    assert "tool 'lookup' is strict" in message and rule in message


def test_a_tool_without_strict_dumps_as_before() -> None:
    """``strict`` false is left out of the tool's dump, so counts and hashes are unchanged."""
    assert Tool(name="t").model_dump() == {"name": "t", "description": "", "parameters": {}}
