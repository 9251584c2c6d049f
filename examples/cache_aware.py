"""Cache-aware layout: five turns of one conversation in ``stable-prefix`` and in ``legacy``.

Each turn appends the previous user/assistant exchange to the history, and a legacy plugin view
(``progress``) changes every turn, as task state does. Per turn the example prints the stable
prefix's hash (short) and token count, and the share of this turn's input that repeats the
previous turn's prefix unchanged: the part a provider's prompt cache could serve.

The prefix (leading system message + tools + history, SPEC §6) grows every turn, so its hash
changes every turn in both layouts; what matters for a cache is whether the *previous* turn's
prefix is still the start of this turn's frame. The example checks that on the neutral frames
(same leading messages, same tools) and reports ``share = previous prefix_tokens /
total_input_tokens`` when it is, else 0. In ``stable-prefix`` the per-turn view and the date line
sit after the history, so the previous prefix survives; in ``legacy`` they sit in the leading
message, so every turn starts differently.

Then one synthetic usage report per layout in the OpenAI shape with
``prompt_tokens_details.cached_tokens`` (what a cache hit on the previous prefix would report,
in OpenAI's 128-token steps above the model's minimum cacheable prefix), and the accounting.
Offline: no model is called; the service creates no cache and promises no hit.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/cache_aware.py
"""

from __future__ import annotations

import os
import sys
from typing import Any

from context_assembly_client import Client
from context_assembly_client.types import PrepareResponse

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None
MODEL = "gpt-4o-mini"
TURNS = 5

# Long, fixed host instructions: a prefix worth caching (over 1,024 tokens).
INSTRUCTIONS = "You are a careful operations assistant.\n" + "\n".join(
    f"Rule {i}: quote receipt and order ids exactly, say when a status is uncertain, "
    f"and never promise a delivery date the order system has not confirmed (case {i})."
    for i in range(1, 41)
)
TOOLS = [  # deliberately not sorted by name
    {
        "name": "store_get",
        "description": "Read one saved entry in full.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
    {
        "name": "lookup_order",
        "description": "Read an order from the order system.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
]
QUESTIONS = [
    "Where is order A42?",
    "Has the label been printed?",
    "Which carrier has it?",
    "Can the customer change the address?",
    "Summarise what we know about A42.",
]


def request(layout: str, turn: int, history: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_context_tokens": 16000,
        "response_reserve": 1024,
        "assembly": {"max_data_tokens": 600, "layout": layout},
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "plugins": [
            {"name": "in_context_memory", "instructions": "Saved entries; read with store_get."},
            # A legacy view that changes every turn, like task state.
            {
                "name": "progress",
                "instructions": "Task progress.",
                "content": f"turn {turn} of {TURNS}; open questions: {TURNS - turn}",
            },
        ],
        "whiteboard": {
            "source": "in_context_memory",
            "recovery_tool": "store_get",
            "entries": [
                {
                    "key": "receipt",
                    "description": "Keep exact identity",
                    "value": {"id": "A42"},
                    "priority": "critical",
                },
                {
                    "key": "last_check",
                    "description": "Last order-system check",
                    "value": f"checked at turn {turn}: in transit",
                    "priority": "high",
                },
            ],
        },
        "history": history,
        "input": [{"role": "user", "content": QUESTIONS[turn - 1]}],
    }


def keeps_prefix(previous: PrepareResponse, prev_prefix_len: int, now: PrepareResponse) -> bool:
    """Whether the previous turn's prefix messages and tools lead this turn's frame unchanged."""
    before, after = previous.frame, now.frame
    same_start: bool = before["messages"][:prev_prefix_len] == after["messages"][:prev_prefix_len]
    return same_start and before["tools"] == after["tools"]


def num(value: int | None) -> str:
    """A count as the API has it: ``null`` when the provider did not report it."""
    return "null" if value is None else str(value)


def run_layout(client: Client, layout: str, min_cacheable: int) -> None:
    print(f"layout {layout}:")
    history: list[dict[str, str]] = []
    previous: PrepareResponse | None = None
    prev_prefix_len = reused = 0
    for turn in range(1, TURNS + 1):
        prep = client.prepare(request(layout, turn, history))
        total = prep.budget.total_input_tokens
        kept = previous is not None and keeps_prefix(previous, prev_prefix_len, prep)
        same_hash = previous is not None and previous.prefix_hash == prep.prefix_hash
        reused = previous.prefix_tokens if kept and previous is not None else 0
        print(
            f"  turn {turn}: prefix_hash={prep.prefix_hash[7:19]} "
            f"prefix_tokens={prep.prefix_tokens} total_input={total} "
            f"same_hash={'yes' if same_hash else 'no'} "
            f"previous_prefix_kept={'yes' if kept else 'no'} share={reused / total:.0%}"
        )
        previous, prev_prefix_len = prep, 1 + len(history)  # leading system message + history
        history = [
            *history,
            {"role": "user", "content": QUESTIONS[turn - 1]},
            {"role": "assistant", "content": f"Answer {turn}: A42 is in transit (checked)."},
        ]
    assert previous is not None
    # What OpenAI would report for the last turn on a cache hit of the previous prefix: cached
    # tokens come in 128-token steps once the prefix reaches the model's minimum.
    cached = reused // 128 * 128 if reused >= min_cacheable else 0
    total = previous.budget.total_input_tokens
    usage = {
        "prompt_tokens": total,
        "completion_tokens": 24,
        "total_tokens": total + 24,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
    }
    result = client.report_usage(
        previous.preparation_id,
        report_id=f"chatcmpl-{layout}-turn{TURNS}",
        provider="openai",
        usage=usage,
    )
    last = result.accounting.last
    assert last is not None
    print(f"  usage turn {TURNS} (synthetic): prompt_tokens={total} cached_tokens={cached}")
    print(
        f"  accounting: estimated={result.accounting.estimated_input_tokens} "
        f"provider_input={num(last.provider_input_tokens)} "
        f"delta={num(last.input_token_delta)} cached_input={num(last.cached_input_tokens)} "
        f"cache_creation={num(last.cache_creation_input_tokens)}"
    )


def main() -> int:
    with Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        profile = next(m for m in client.models().models if m.name == MODEL)
        min_cacheable = profile.min_cacheable_prefix or 0
        print(f"model {MODEL}: min_cacheable_prefix={min_cacheable}, {TURNS} turns per layout")
        for layout in ("stable-prefix", "legacy"):
            run_layout(client, layout, min_cacheable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
