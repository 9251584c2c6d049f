"""Provider-shaped history and input (docs/api.md, "Provider-shaped history and input"): read
into the neutral shape with nothing lost, and rendered back for the same provider unchanged."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from context_assembly.cli import assemble_bytes
from context_assembly.core.provider_messages import detect, read_messages
from context_assembly.core.request import Message, NativePart, PrepareRequest
from context_assembly.errors import InvalidError

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CONVERSATIONS = Path(__file__).parent / "conversations"
FORMATS = ("openai-chat", "anthropic", "openai-responses")
DATA_PREFIX = '{"context_data"'


def recorded(fmt: str) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads((CONVERSATIONS / f"{fmt}.json").read_bytes())
    return loaded


def prepare(body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = orjson.loads(assemble_bytes(orjson.dumps(body), NOW))
    return answer


def neutral_history(request: PrepareRequest) -> list[Message]:
    """The request's history as neutral messages (none of these is held by the provider)."""
    assert isinstance(request.history, list)
    return request.history


def conversation(fmt: str, frame: dict[str, Any]) -> list[Any]:
    """The rendered conversation without the service's own parts: the leading system message
    (OpenAI) and the data message (or, where Anthropic merged it into the input's turn, its
    block)."""
    if fmt == "anthropic":
        turns: list[Any] = copy.deepcopy(frame["messages"])
        for turn in turns:
            if isinstance(turn["content"], list):
                turn["content"] = [
                    block
                    for block in turn["content"]
                    if not str(block.get("text", "")).startswith(DATA_PREFIX)
                ]
        return turns
    items = frame["messages"] if fmt == "openai-chat" else frame["input"]
    assert items[0]["role"] in {"system", "developer"}  # instructions and the date line
    return [
        item
        for item in items[1:]
        if not (item.get("role") == "user" and str(item.get("content")).startswith(DATA_PREFIX))
    ]


def as_sent(fmt: str, messages: list[Any]) -> list[Any]:
    """The documented reading of null fields: absent (OpenAI Chat's ``content: null`` stays),
    and OpenAI Chat's ``annotations`` (a field of answers only) is not sent back."""

    def clean(value: Any, top: bool) -> Any:
        if isinstance(value, list):
            return [clean(item, False) for item in value]
        if not isinstance(value, dict):
            return value
        kept = {}
        for key, item in value.items():
            if item is None and not (top and key == "content" and fmt == "openai-chat"):
                continue
            if top and key == "annotations" and fmt == "openai-chat":
                continue
            kept[key] = clean(item, False) if key in ("content", "tool_calls") else item
        return kept

    return [clean(message, True) for message in messages]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("with_data", [False, True])
def test_a_recorded_conversation_renders_back_unchanged(fmt: str, with_data: bool) -> None:
    """History and input in a provider's shape, rendered for that provider, equal the input
    apart from the service's own messages."""
    body = {**recorded(fmt), "render": fmt, "instructions": "Be brief."}
    if with_data:
        body["plugins"] = [{"name": "notes"}]
        body["contributions"] = [
            {"source": "notes", "revision": 1, "blocks": [{"id": "n1", "text": "Prefers email."}]}
        ]
    answer = prepare(body)
    assert conversation(fmt, answer["frame"]) == as_sent(fmt, body["history"] + body["input"])
    if with_data:
        assert answer["selection"]["blocks"][0]["status"] == "selected"


@pytest.mark.parametrize("fmt", FORMATS)
def test_declaring_the_format_reads_the_same(fmt: str) -> None:
    """``input_format`` named explicitly gives the frame that detection gives."""
    body = {**recorded(fmt), "render": fmt}
    declared = prepare({**body, "input_format": fmt})
    assert declared["frame"] == prepare(body)["frame"]


def test_tool_calls_and_results_stay_paired_in_order() -> None:
    """An Anthropic user turn with tool results becomes one tool message per result, right
    after the assistant's calls, in order; the other blocks follow as a user message."""
    request = PrepareRequest.model_validate({**recorded("anthropic"), "render": "neutral"})
    roles = [
        (m.role, m.tool_call_id, [c.id for c in m.tool_calls or ()])
        for m in neutral_history(request)
    ]
    assert roles == [
        ("user", None, []),
        ("assistant", None, ["toolu_01"]),
        ("tool", "toolu_01", []),
        ("assistant", None, ["toolu_02", "toolu_03"]),
        ("tool", "toolu_02", []),
        ("tool", "toolu_03", []),
        ("user", None, []),
        ("assistant", None, []),
    ]
    thinking = neutral_history(request)[1].content[0]
    assert isinstance(thinking, NativePart) and thinking.item["signature"] == "EqQBCkYIARgCKkBsig=="
    assert neutral_history(request)[5].provider_fields == {"anthropic": {"is_error": True}}


def test_openai_chat_tool_calls_read_as_neutral_calls() -> None:
    """``content: null`` beside ``tool_calls: [{id, type, function}]`` is an assistant turn
    with neutral calls, not a 422."""
    request = PrepareRequest.model_validate(recorded("openai-chat"))
    calls = neutral_history(request)[2].tool_calls
    assert calls is not None
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_a", "get_weather", '{"city":"Paris"}'),
        ("call_b", "get_weather", '{"city":"Rome"}'),
    ]


def test_responses_calls_join_the_assistant_turn_before_them() -> None:
    """A function_call item follows the reasoning item it came with, in one assistant turn."""
    request = PrepareRequest.model_validate(recorded("openai-responses"))
    turn = neutral_history(request)[1]
    assert turn.role == "assistant" and turn.tool_calls is not None
    assert turn.tool_calls[0].provider_fields == {
        "openai-responses": {"id": "fc_01", "status": "completed"}
    }
    result = neutral_history(request)[2]
    assert result.role == "tool" and result.tool_call_id == "call_1"


def test_text_is_counted_exactly_and_carried_items_make_counts_uncertain() -> None:
    """Text of any shape counts as text; an image or an encrypted reasoning item does not."""
    plain = [{"role": "user", "content": "hello"}]
    texts = [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}]
    base = {"model": "gpt-4o", "render": "openai-responses"}
    first = prepare({**base, "history": plain})
    second = prepare({**base, "history": texts})
    assert first["budget"]["history_tokens"] == second["budget"]["history_tokens"]
    assert second["selection"]["exact"] and not second["selection"]["opaque_or_multimodal"]
    answer = prepare({**recorded("openai-responses"), "render": "openai-responses"})
    assert answer["selection"]["opaque_or_multimodal"] is True


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        (
            {"history": [{"role": "user", "content": "a"}, {"type": "function_call", "name": "f"}]},
            "history.1.call_id",
            "call_id must be a string",
        ),
        (
            {
                "input": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c", "type": "function", "function": "f"}],
                    }
                ]
            },
            "input.0.tool_calls.0",
            "a tool call must be",
        ),
        (
            {"history": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5}]}]},
            "history.0.content.0.tool_use_id",
            "tool_use_id must be a string",
        ),
        (
            {"input_format": "anthropic", "history": [{"role": "system", "content": "x"}]},
            "history.0.role",
            "role must be 'user' or 'assistant'",
        ),
        (
            {"history": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, 7]}]},
            "history.0.content.1",
            "a content part must be an object",
        ),
    ],
)
def test_an_unreadable_message_is_a_422_naming_its_index_and_part(
    body: dict[str, Any], loc: str, words: str
) -> None:
    """The error names the message's index and the part that cannot be read."""
    with pytest.raises(InvalidError) as caught:
        prepare({"model": "gpt-4o", **body})
    errors = caught.value.to_problem()["errors"]
    assert [e["loc"] for e in errors] == [loc]
    assert words in errors[0]["msg"]


@pytest.mark.parametrize(
    ("fmt", "render"),
    [("anthropic", "openai-chat"), ("openai-responses", "anthropic"), ("openai-chat", "gemini")],
)
def test_a_carried_item_is_refused_by_another_render_by_name(fmt: str, render: str) -> None:
    """A native item goes back to its own format only; another render names the part."""
    with pytest.raises(InvalidError) as caught:
        prepare({**recorded(fmt), "render": render})
    assert caught.value.extensions["field"].startswith("frame.messages[")
    assert f"render {render!r} cannot send it" in str(caught.value)


def test_the_neutral_frame_keeps_the_provider_items() -> None:
    """A neutral render carries the native parts and provider fields as read."""
    answer = prepare({**recorded("anthropic"), "render": "neutral"})
    assistant = answer["frame"]["messages"][2]
    assert assistant["content"][0] == {
        "type": "native",
        "format": "anthropic",
        "item": recorded("anthropic")["history"][1]["content"][0],
    }


@pytest.mark.parametrize(
    ("message", "fmt"),
    [
        ({"role": "user", "content": "hi"}, "neutral"),
        ({"role": "assistant", "content": "", "tool_calls": [{"id": "1", "name": "f"}]}, "neutral"),
        ({"role": "assistant", "content": None}, "openai-chat"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "openai-chat",
        ),
        ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}, "anthropic"),
        ({"type": "function_call_output", "call_id": "c", "output": ""}, "openai-responses"),
        ({"role": "user", "content": [{"type": "input_text", "text": "a"}]}, "openai-responses"),
    ],
)
def test_detection_per_message(message: dict[str, Any], fmt: str) -> None:
    """Each message's shape names its format; a shape every format shares reads as neutral."""
    assert detect(message) == fmt


def test_neutral_messages_are_left_for_the_model_to_validate() -> None:
    """Declared ``neutral`` reads nothing: a provider shape is then refused by the request
    model."""
    chat = recorded("openai-chat")["history"]
    assert read_messages(chat, "neutral")[0] is chat
    with pytest.raises(ValidationError):
        PrepareRequest.model_validate(
            {"model": "gpt-4o", "input_format": "neutral", "history": chat}
        )


def test_a_request_without_provider_shapes_dumps_as_before() -> None:
    """``input_format`` left at ``auto`` is not dumped, so hashes of old requests stay."""
    request = PrepareRequest.model_validate(
        {"model": "gpt-4o", "input": [{"role": "user", "content": "x"}]}
    )
    assert "input_format" not in request.model_dump()
    assert "provider_fields" not in request.model_dump()["input"][0]


# --------------------------------------------------------------------------- malformed shapes

INPUT = [{"role": "user", "content": "hi"}]


def refused(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The errors of the 422 ``body`` (a prepare with ``model`` and ``input`` added) gets.
    (Written by the standard library, which writes an integer beyond 64 bits.)"""
    raw = json.dumps({"model": "gpt-4o-mini", "input": INPUT, **body}).encode()
    with pytest.raises(InvalidError) as caught:
        assemble_bytes(raw, NOW)
    errors: list[dict[str, Any]] = caught.value.to_problem()["errors"]
    return errors


@pytest.mark.parametrize("role", [[], {}, ["user"], {"user": 1}, 3, True])
@pytest.mark.parametrize(
    "message",
    [
        {"content": None},  # OpenAI Chat
        {"content": [{"type": "tool_result", "tool_use_id": "t"}]},  # Anthropic
        {"type": "message", "content": "x"},  # OpenAI Responses
    ],
)
def test_a_role_that_is_not_a_string_is_a_422_naming_it(message: dict[str, Any], role: Any) -> None:
    """A list, an object, a number or a boolean as a provider message's role is refused at
    ``history.0.role`` (never a 500), saying what it got."""
    errors = refused({"history": [{**message, "role": role}]})
    assert errors[0]["loc"] == "history.0.role"
    assert "role must be" in errors[0]["msg"] and repr(role) not in errors[0]["msg"]


@pytest.mark.parametrize("calls", [True, False, 0, 7, "x", {"id": "c"}])
def test_tool_calls_that_a_function_call_joins_must_be_a_list(calls: Any) -> None:
    """A Responses function_call after an assistant message whose tool_calls is not a list
    names that message's tool_calls (a TypeError, a 500, for a boolean before; a number's
    calls were dropped)."""
    history = [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]
    errors = refused({"history": history})
    assert [e["loc"] for e in errors][:1] == ["history.0.tool_calls"]


@pytest.mark.parametrize("calls", [0, False, "", {"id": "c"}])
def test_openai_chat_tool_calls_must_be_a_list(calls: Any) -> None:
    """An OpenAI Chat message's tool_calls that is neither a list nor null is refused where it
    is (a falsy one was dropped before)."""
    errors = refused({"history": [{"role": "assistant", "content": None, "tool_calls": calls}]})
    assert errors[0]["loc"] == "history.0.tool_calls"


TOOL_USE: dict[str, Any] = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "t", "name": "f"}],
}
CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c", "output": "ok"}
HUGE = 2**70  # beyond 64 bits: JSON the service cannot encode again


@pytest.mark.parametrize(
    ("history", "loc"),
    [
        (  # the case: a user turn split into a tool message and a user message
            [
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": "r"},
                        {"type": "text", "text": "x"},
                    ],
                },
                {"role": "user", "content": 123},
            ],
            "history.2.content",
        ),
        (  # a block of a user turn after its tool result, as sent
            [
                TOOL_USE,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}, 5]},
            ],
            "history.1.content.1",
        ),
        (  # a carried block that cannot be encoded: the block as sent
            [
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t"},
                        {"type": "text", "text": "x"},
                        {"type": "image", "source": {"size": HUGE}},
                    ],
                },
            ],
            "history.1.content.2",
        ),
        (  # inside a tool result
            [
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "image", "source": {"size": HUGE}}],
                        }
                    ],
                },
            ],
            "history.1.content.0.content.0",
        ),
        (  # an assistant turn split after a tool_use block: its second part
            [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t", "name": "f"},
                        {"type": "thinking", "thinking": "x", "signature": HUGE},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ],
            "history.0.content.1",
        ),
        (  # a tool_use block's extra field
            [
                {"role": "assistant", "content": [{**TOOL_USE["content"][0], "caller": HUGE}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ],
            "history.0.content.0",
        ),
        (  # a Responses call merged into the assistant message before it: the call as sent
            [{"role": "assistant", "content": "thinking"}, {**CALL, "id": HUGE}, OUTPUT],
            "history.1",
        ),
        (  # a call merged into a Chat assistant message after its own calls
            [
                {"role": "assistant", "content": None, "tool_calls": []},
                CALL,
                {**OUTPUT, "status": HUGE},
            ],
            "history.2",
        ),
        (  # an OpenAI Chat call's field
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                            "index": HUGE,
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ],
            "history.0.tool_calls.0",
        ),
        (  # a Responses reasoning item, carried as given
            [{"type": "reasoning", "summary": [], "encrypted_content": HUGE}],
            "history.0",
        ),
        (  # a neutral message after provider-shaped ones keeps its own place
            [
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t"},
                        {"type": "text", "text": "x"},
                    ],
                },
                {"role": "user", "name": 5},
            ],
            "history.2.name",
        ),
    ],
)
def test_a_422_names_the_message_and_place_the_caller_sent(history: list[Any], loc: str) -> None:
    """Messages split (an Anthropic user turn with tool results, an assistant turn with
    interleaved thinking) or merged (Responses function_call items) are validated as neutral
    messages; the error names the caller's message and its field, not the neutral one's."""
    errors = refused({"history": history})
    locs = [e["loc"] for e in errors]
    assert loc in locs, errors
    message = ".".join(loc.split(".")[:2])
    assert all(f"{at}.".startswith(f"{message}.") for at in locs), errors


def test_a_broken_pairing_is_named_after_the_other_errors() -> None:
    """A result without its call and a malformed message: both are named, the message first."""
    history = [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        {"role": "user", "content": 123},
    ]
    errors = refused({"history": history})
    assert [e["loc"] for e in errors] == ["history.1.content", "history.1.content", "history.0"]
    assert errors[-1]["type"] == "tool_pairing"


def test_input_errors_name_the_caller_input_message() -> None:
    """``input`` is read and named the same way as ``history``."""
    errors = refused(
        {
            "history": [TOOL_USE],
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t"},
                        {"type": "text", "text": "x"},
                    ],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "a", "n": HUGE}]},
            ],
        }
    )
    assert "input.1.content.0" in [e["loc"] for e in errors]
    assert all(e["loc"].startswith("input.1.") for e in errors)
