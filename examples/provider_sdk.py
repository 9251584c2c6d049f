"""The direct path: an OpenAI-shaped history in, the frame to the OpenAI SDK as it is, its usage back.

An agent already holds its conversation as OpenAI Chat messages (an assistant turn with
``content: null`` and ``tool_calls``, the ``tool`` results). It posts them as they are with
``render: "openai-chat"``, passes the answer's ``frame`` to ``chat.completions.create(**frame)``
without adding anything (the output limit is the budget's reserve), and posts the SDK's usage
object back.

Offline: the OpenAI client gets a mock transport that answers a canned completion (no key, no
network); the service is real. Prints ids, roles, statuses and token counts, never texts::

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/provider_sdk.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx2
import openai
from context_assembly_client import Client, usage_from_openai

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None

# The agent's history, as the OpenAI SDK returned and took it.
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Is order A42 paid, and where is it?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "payment", "arguments": '{"order":"A42"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "tracking", "arguments": '{"order":"A42"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "paid 40 EUR on 2 December"},
    {"role": "tool", "tool_call_id": "call_2", "content": "in transit, Lyon hub"},
]
TOOLS = [
    {
        "name": name,
        "description": f"The {name} of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    for name in ("payment", "tracking")
]
sent: list[dict[str, Any]] = []


def canned_completion(request: httpx2.Request) -> httpx2.Response:
    """What OpenAI would answer; records the body the SDK sent."""
    sent.append(json.loads(request.content))
    return httpx2.Response(
        200,
        json={
            "id": "chatcmpl-example",
            "object": "chat.completion",
            "created": 1_764_676_800,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "It is paid and in transit."},
                }
            ],
            "usage": {
                "prompt_tokens": 236,
                "completion_tokens": 9,
                "total_tokens": 245,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
    )


def main() -> None:
    llm = openai.OpenAI(
        api_key="offline",
        http_client=httpx2.Client(transport=httpx2.MockTransport(canned_completion)),
    )
    with Client(BASE_URL, api_key=API_KEY) as ca:
        prep = ca.prepare(
            {
                "model": "gpt-4o-mini",
                "render": "openai-chat",
                "instructions": "You answer questions about orders.",
                "tools": TOOLS,
                "history": HISTORY,  # as the agent holds it
                "input": [{"role": "user", "content": "Summarise in one line."}],
                "plugins": [{"name": "notes"}],
                "contributions": [
                    {
                        "source": "notes",
                        "revision": "3",
                        "blocks": [
                            {"id": "vip", "text": "Customer of A42 is a VIP: answer first."}
                        ],
                    }
                ],
            }
        )
        limit = prep.selection.output_limit
        print(f"prepared {prep.preparation_id}: {prep.budget.total_input_tokens} input tokens")
        if limit is not None:
            print(f"output limit: {limit.parameter} = {limit.tokens} ({limit.source})")
        for block in prep.selection.blocks:
            print(
                f"block {block.source}/{block.id}: {block.status} ({block.reason}, {block.tokens} tokens)"
            )

        completion = llm.chat.completions.create(**prep.frame)  # the frame as it is
        body = sent[-1]
        assert body == prep.frame, "the SDK sent the frame unchanged"
        print("sent roles:", " ".join(message["role"] for message in body["messages"]))

        provider, usage = usage_from_openai(completion)
        report = ca.report_usage(
            prep.preparation_id, report_id=completion.id, provider=provider, usage=usage
        )
        last = report.accounting.last
        assert last is not None
        print(
            f"usage: provider {last.provider_input_tokens} input tokens, "
            f"delta {last.input_token_delta} against the service's count, "
            f"cached {last.cached_input_tokens}"
        )


if __name__ == "__main__":
    main()
