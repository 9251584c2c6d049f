"""Conversation logs (``replay/logs.py``): JSON lines of provider request bodies read into calls,
and replayed with the recorded usage beside the prediction."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from context_assembly.replay.driver import replay
from context_assembly.replay.frames import TextCounter, anthropic_segments
from context_assembly.replay.logs import LogError, read_lines, read_log
from context_assembly.replay.policies import Options
from context_assembly.replay.synth import DEFAULT_START, blocks_text

LOGS = Path(__file__).resolve().parent / "logs"


def test_an_anthropic_log_becomes_the_prepare_request_parts() -> None:
    """System, tools and messages map to instructions, tools and the conversation; the splits
    follow the last answer and the last user text; markers leave the plain body only."""
    [conversation] = read_log(LOGS / "anthropic.jsonl")
    assert conversation.kind == "log" and len(conversation.calls) == 3
    first, second, third = conversation.calls
    assert first.format == "anthropic" and first.model == "claude-sonnet-4-5-20250929"
    assert first.instructions == "You are a careful operations assistant."
    assert first.tools == (
        {
            "name": "lookup",
            "description": "Look a receipt up by id.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
            },
        },
    )
    assert first.at == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert (second.call_split, second.turn_split) == (2, 0)
    assert (third.call_split, third.turn_split) == (4, 4)
    assert "cache_control" not in orjson.dumps(third.body).decode()
    assert "cache_control" not in orjson.dumps(third.messages).decode()
    assert third.recorded is not None and "cache_control" in orjson.dumps(third.recorded).decode()
    assert third.reported is not None and third.reported.input_tokens == 498
    assert third.output_tokens == 30
    assert not any(call.rewritten for call in conversation.calls)


def test_an_openai_chat_log_takes_its_system_message_as_instructions() -> None:
    """The leading system message is the instructions; number timestamps below 10⁹ are seconds
    since the log's start; the reported usage is the prompt's and its cached part."""
    [conversation] = read_log(LOGS / "openai-chat.jsonl")
    first, second = conversation.calls
    assert first.format == "openai-chat"
    assert first.instructions == "You answer questions about receipts."
    assert [m["role"] for m in second.messages] == ["user", "assistant", "tool"]
    assert second.at == DEFAULT_START.replace(microsecond=500_000).replace(second=3)
    assert second.reported is not None
    assert (second.reported.input_tokens, second.reported.cache_read) == (98, 0)
    assert second.tools[0]["name"] == "lookup"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ('{"timestamp": 1}', "'request' body"),
        ('{"request": {"messages": []}}', "names no model"),
        ('{"timestamp": "yesterday", "request": {"model": "gpt-4o"}}', "RFC 3339"),
        ('{"format": "gemini", "request": {"model": "gpt-4o"}}', "format must be"),
    ],
)
def test_a_bad_line_is_named(line: str, message: str) -> None:
    """A line the reader cannot use is refused with the file and line number."""
    with pytest.raises(LogError, match=message) as caught:
        read_lines(["# a comment", "", line], "calls")
    assert str(caught.value).startswith("calls:3:")


def _long_log() -> list[str]:
    """Three Anthropic calls with a 1,920-token system prompt marked for caching, the usage
    the provider reported for each."""
    system = blocks_text(range(1, 31))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the notes."}]
    lines = []
    for i in range(3):
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "messages": list(messages),
        }
        usage = {"input_tokens": 40, "cache_read_input_tokens": 1923 if i else 0}
        usage["cache_creation_input_tokens"] = 0 if i else 1923
        lines.append(orjson.dumps({"timestamp": 60 * i, "request": body, "usage": usage}).decode())
        messages += [
            {"role": "assistant", "content": f"Summary {i}."},
            {"role": "user", "content": f"Again, shorter ({i})."},
        ]
    return lines


def test_a_log_replays_with_the_recorded_markers_beside_the_reported_usage() -> None:
    """The recorded policy sends each body as logged: its system marker is written once and
    read by the next calls, as the provider reported; the service's policies run beside it."""
    [conversation] = read_lines(_long_log(), "long")
    options = Options(
        kinds=("recorded", "last-message", "service"),
        ttls=("5m",),
        layouts=("stable-prefix",),
        splits=("call",),
    )
    [result] = replay([conversation], options)
    labels = [run.policy.label for run in result.runs]
    assert labels == ["recorded", "last-message 5m", "service:stable-prefix split:call 5m"]
    recorded = result.runs[0]
    system = anthropic_segments(conversation.calls[0].body, TextCounter())[0].tokens
    assert system == 1920 + 3
    assert [o.usage.cache_read for o in recorded.outcomes] == [0, system, system]
    assert [o.usage.cache_write for o in recorded.outcomes] == [system, 0, 0]
    assert [c.reported.cache_read for c in conversation.calls if c.reported] == [0, 1923, 1923]
    service = result.runs[2]
    assert not any(o.refused for o in service.outcomes)
    assert service.outcomes[1].usage.cache_read >= system
