"""Cache plans: five turns of one conversation rendered for Anthropic with cache breakpoints.

Each turn appends the previous user/assistant exchange to the history; turn 4 changes a tool's
description, as a host upgrading a tool would. The requests carry ``cache: {"breakpoints":
true}`` and name no previous turn: the service finds it (the latest preparation of the same
tenant and scope) and explains each turn against it in ``selection.cache``. Per turn the example
prints whether the previous prefix was kept, the first change, the ``cache_control`` markers
placed in the body, and the tokens before the last one.

Then one synthetic Anthropic usage report per turn (what a provider that read the previous
turn's cached prefix, when it was kept, would report), and the accounting's
``expected_cached_tokens`` beside the reported ``cached_input_tokens``. Last, the timeline of the
conversation: per turn its number, figures, miss (``prefix_changed`` on turn 4) and the first
change by name (the tool's). Offline: no model is called; the service creates no cache and
promises no hit.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/cache_aware.py
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Any

from context_assembly_client import Client

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None
MODEL = "claude-sonnet-4-5"
TURNS = 5
CHANGED_TOOL_AT = 4

# Long, fixed host instructions: a prefix worth caching (over the model's 1,024 tokens).
INSTRUCTIONS = "You are a careful operations assistant.\n" + "\n".join(
    f"Rule {i}: quote receipt and order ids exactly, say when a status is uncertain, "
    f"and never promise a delivery date the order system has not confirmed (case {i})."
    for i in range(1, 41)
)
QUESTIONS = [
    "Where is order A42?",
    "Has the label been printed?",
    "Which carrier has it?",
    "Can the customer change the address?",
    "Summarise what we know about A42.",
]


def tools(turn: int) -> list[dict[str, Any]]:
    lookup = "Read an order from the order system."
    if turn >= CHANGED_TOOL_AT:
        lookup += " Includes the carrier's tracking events."
    return [
        {
            "name": "lookup_order",
            "description": lookup,
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
        {
            "name": "store_get",
            "description": "Read one saved entry in full.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    ]


def request(turn: int, history: list[dict[str, str]], scope: dict[str, str]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "render": "anthropic",
        "assembly": {"layout": "stable-prefix"},
        "cache": {"breakpoints": True},
        "scope": scope,
        "instructions": INSTRUCTIONS,
        "tools": tools(turn),
        "history": history,
        "input": [{"role": "user", "content": QUESTIONS[turn - 1]}],
    }


def markers(frame: dict[str, Any]) -> int:
    """How many ``cache_control`` markers the Anthropic body carries."""
    blocks = [*frame.get("tools", [])]
    if isinstance(frame.get("system"), list):
        blocks += frame["system"]
    for message in frame.get("messages", []):
        if isinstance(message.get("content"), list):
            blocks += message["content"]
    return sum(1 for block in blocks if "cache_control" in block)


def num(value: int | bool | None) -> str:
    """A value as the API has it: ``null`` when missing, ``true``/``false``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def main() -> int:
    scope = {"task_id": f"example-{secrets.token_hex(4)}"}  # a conversation of its own
    history: list[dict[str, str]] = []
    previous_cacheable = 0
    last_id = ""
    with Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        print(f"model {MODEL}, render anthropic, {TURNS} turns, tool changed at turn 4")
        for turn in range(1, TURNS + 1):
            prep = client.prepare(request(turn, history, scope))
            report = prep.selection.cache
            assert report is not None
            change = report.first_change
            changed = "-" if change is None else f"{change.part}[{num(change.index)}]"
            placed = ",".join(b.after for b in report.breakpoints) or "-"
            skipped = ",".join(f"{s.after}:{s.reason}" for s in report.skipped) or "-"
            print(
                f"turn {turn}: prefix_kept={num(report.prefix_kept)} "
                f"first_change={changed} breakpoints={placed} skipped={skipped} "
                f"markers={markers(prep.frame)} cacheable={report.cacheable_tokens} "
                f"total_input={prep.budget.total_input_tokens}"
            )
            # Synthetic provider usage: a read of what the previous turn cached when its prefix
            # was kept, the rest of this turn's cacheable prefix written anew.
            read = previous_cacheable if report.prefix_kept else 0
            total = prep.budget.total_input_tokens
            usage = {
                "input_tokens": total - report.cacheable_tokens,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": report.cacheable_tokens - read,
                "output_tokens": 24,
            }
            result = client.report_usage(
                prep.preparation_id, report_id=f"msg-{turn}", provider="anthropic", usage=usage
            )
            last = result.accounting.last
            assert last is not None
            print(
                f"  usage turn {turn} (synthetic): expected_cached={num(last.expected_cached_tokens)} "
                f"reported_cached={num(last.cached_input_tokens)}"
            )
            previous_cacheable, last_id = report.cacheable_tokens, prep.preparation_id
            history = [
                *history,
                {"role": "user", "content": QUESTIONS[turn - 1]},
                {"role": "assistant", "content": f"Answer {turn}: A42 is in transit (checked)."},
            ]
        timeline = client.timeline(last_id)
        print(f"timeline: {len(timeline.turns)} turns")
        for row in timeline.turns:
            change = row.first_change
            named = "-" if change is None else f"{change.part}:{change.name or change.role or '-'}"
            print(
                f"  {row.turn}: input={row.total_input_tokens} "
                f"kept={num(row.prefix_kept)} "
                f"expected={num(row.expected_cached_tokens)} "
                f"reported={num(row.cached_input_tokens)} "
                f"miss={row.miss or '-'} change={named}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
