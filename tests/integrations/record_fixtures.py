"""Write the conformance fixtures: each scenario as each runtime records its calls.

Every scenario is built with the runtime's own types and saved with the runtime's own serialiser
(LangChain ``messages_to_dict``, Pydantic AI ``ModelMessagesTypeAdapter``, the Agents SDK's input
items, which are JSON already), so a fixture is the shape the runtime really hands an adapter.
Run it again when a runtime changes its shapes:

    .venv/bin/python tests/integrations/record_fixtures.py
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_to_dict,
)
from pydantic_ai.messages import (
    BinaryImage,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
WHEN = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _lookup_args(order: str) -> dict[str, Any]:
    return {"id": order}


# Each scenario: (instructions, turns, stream). A turn is ("user", content) with content a string
# or a list of ("text", str) / ("image", None); ("assistant", text, [(call_id, order)]); or
# ("tool", call_id, text).
SCENARIOS: dict[str, tuple[str | None, list[tuple[Any, ...]], bool]] = {
    "multi_turn": (
        None,
        [
            ("user", "Where is order A42?"),
            ("assistant", "It left the warehouse on Monday.", []),
            ("user", "And order B7?"),
            ("assistant", "B7 is still being packed.", []),
            ("user", "Summarise both."),
        ],
        False,
    ),
    "parallel_tool_calls": (
        "You answer questions about orders.",
        [
            ("user", "Compare orders A42 and B7."),
            ("assistant", "", [("call_a42", "A42"), ("call_b7", "B7")]),
            ("tool", "call_a42", "A42: shipped"),
            ("tool", "call_b7", "B7: packing"),
        ],
        False,
    ),
    "multi_part": (
        None,
        [
            (
                "user",
                [("text", "First part of the question."), ("text", "Second part: which order?")],
            )
        ],
        False,
    ),
    "image": (
        None,
        [("user", [("text", "What does this label say?"), ("image", None)])],
        False,
    ),
    "system_prompt": (
        "You are a careful operations assistant. Quote ids exactly.",
        [("user", "Inspect receipt A42.")],
        False,
    ),
    "streaming": (
        "You answer questions about orders.",
        [
            ("user", "Where is order A42?"),
            ("assistant", "", [("call_a42", "A42")]),
            ("tool", "call_a42", "A42: shipped"),
            ("assistant", "A42 has shipped.", []),
            ("user", "Tell me again, briefly."),
        ],
        True,
    ),
}


def langchain_messages(turns: list[tuple[Any, ...]]) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for turn in turns:
        if turn[0] == "user":
            content = turn[1]
            if isinstance(content, str):
                messages.append(HumanMessage(content))
            else:
                blocks: list[str | dict[str, Any]] = [
                    {"type": "text", "text": value}
                    if kind == "text"
                    else {
                        "type": "image",
                        "base64": base64.b64encode(PNG).decode(),
                        "mime_type": "image/png",
                    }
                    for kind, value in content
                ]
                messages.append(HumanMessage(blocks))
        elif turn[0] == "assistant":
            calls = [
                {"id": cid, "name": "lookup", "args": _lookup_args(order)} for cid, order in turn[2]
            ]
            messages.append(AIMessage(turn[1], tool_calls=calls))
        else:
            messages.append(ToolMessage(turn[2], tool_call_id=turn[1]))
    return messages


def pydantic_ai_messages(
    instructions: str | None, turns: list[tuple[Any, ...]]
) -> list[ModelMessage]:
    messages: list[ModelMessage] = []
    pending: list[Any] = [SystemPromptPart(instructions, timestamp=WHEN)] if instructions else []
    for turn in turns:
        if turn[0] == "user":
            content = turn[1]
            if not isinstance(content, str):
                content = [
                    value if kind == "text" else BinaryImage(PNG, media_type="image/png")
                    for kind, value in content
                ]
            pending.append(UserPromptPart(content, timestamp=WHEN))
        elif turn[0] == "tool":
            pending.append(ToolReturnPart("lookup", turn[2], tool_call_id=turn[1], timestamp=WHEN))
        else:
            if pending:
                messages.append(ModelRequest(parts=pending))
                pending = []
            parts: list[Any] = [TextPart(turn[1])] if turn[1] else []
            parts += [
                ToolCallPart("lookup", _lookup_args(order), tool_call_id=cid)
                for cid, order in turn[2]
            ]
            messages.append(ModelResponse(parts=parts, timestamp=WHEN, model_name="recorded"))
    if pending:
        messages.append(ModelRequest(parts=pending))
    return messages


def agents_items(turns: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for number, turn in enumerate(turns):
        if turn[0] == "user":
            content = turn[1]
            if isinstance(content, str):
                items.append({"role": "user", "content": content})
            else:
                parts = [
                    {"type": "input_text", "text": value}
                    if kind == "text"
                    else {
                        "type": "input_image",
                        "detail": "auto",
                        "image_url": "data:image/png;base64," + base64.b64encode(PNG).decode(),
                    }
                    for kind, value in content
                ]
                items.append({"type": "message", "role": "user", "content": parts})
        elif turn[0] == "assistant":
            if turn[1]:
                items.append(
                    {
                        "id": f"msg_{number}",
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": turn[1], "annotations": []}],
                    }
                )
            for cid, order in turn[2]:
                items.append(
                    {
                        "id": f"fc_{cid}",
                        "type": "function_call",
                        "call_id": cid,
                        "name": "lookup",
                        "arguments": json.dumps(_lookup_args(order)),
                    }
                )
        else:
            items.append({"type": "function_call_output", "call_id": turn[1], "output": turn[2]})
    return items


def main() -> None:
    for name, (instructions, turns, stream) in SCENARIOS.items():
        recorded = {
            "langchain": messages_to_dict(langchain_messages(turns)),
            "pydantic_ai": json.loads(
                ModelMessagesTypeAdapter.dump_json(pydantic_ai_messages(instructions, turns))
            ),
            "openai_agents": agents_items(turns),
        }
        fixture = {
            "scenario": name,
            "instructions": instructions,
            "stream": stream,
            "recorded": recorded,
        }
        (FIXTURES / f"{name}.json").write_text(json.dumps(fixture, indent=1) + "\n")


if __name__ == "__main__":
    main()
