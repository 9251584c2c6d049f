"""Selection: an overflowing legacy view next to the fitting selection over the same entries.

The same five stored entries (a critical receipt, a customer profile, ticket history, a runbook
and a large background note) are sent twice to a 4,000-token window:

1. as today's legacy plugin view (every entry pasted into the instructions): the service answers
   ``CONTEXT_OVERFLOW`` explicitly, with the shortfall, instead of silently cutting text;
2. as a whiteboard under ``assembly.max_data_tokens = 1500``: the receipt enters in full
   (protected), the rest is selected, projected or omitted, each with a reason and a token count.

Offline: no model is called. Run against a running service::

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/selection.py
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from context_assembly_client import Client, ContextOverflowError

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None

# The stored entries: (key, description, value, priority). Texts are repeated, never printed.
ENTRIES: list[tuple[str, str, str, str]] = [
    (
        "receipt",
        "Keep exact identity and uncertainty",
        json.dumps({"id": "A42", "status": "completion-unknown"}, separators=(",", ":")),
        "critical",
    ),
    (
        "customer",
        "Customer profile",
        "Dana Ortiz, enterprise tier, prefers email, timezone Europe/Madrid. " * 20,
        "high",
    ),
    (
        "ticket-history",
        "Previous tickets",
        "Ticket 1181 resolved by restarting the export job; ticket 1207 pending vendor reply. "
        * 60,
        "normal",
    ),
    (
        "runbook",
        "Export runbook",
        "Step: check the queue depth, then the worker logs, then the storage quota; escalate. "
        * 96,
        "normal",
    ),
    ("background", "Retained source", "background " * 1500, "low"),
]

BASE: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "max_context_tokens": 4000,
    "response_reserve": 512,
    "instructions": "You are a careful operations assistant.",
    "input": [{"role": "user", "content": "What is the status of receipt A42?"}],
}


def legacy_request() -> dict[str, Any]:
    """Today's prompt: every entry pasted into the plugin's content view."""
    view = "\n".join(f"- {key}: {desc}: {value}" for key, desc, value, _ in ENTRIES)
    plugin = {
        "name": "in_context_memory",
        "instructions": "Saved key/value entries.",
        "content": view,
    }
    return {**BASE, "plugins": [plugin]}


def selection_request() -> dict[str, Any]:
    """The same entries, offered as blocks: the whiteboard replaces the legacy view."""
    entries = [
        {"key": key, "description": desc, "value": value, "priority": priority}
        for key, desc, value, priority in ENTRIES
    ]
    return {
        **legacy_request(),
        "assembly": {"max_data_tokens": 1500, "layout": "stable-prefix"},
        "whiteboard": {
            "source": "in_context_memory",
            "recovery_tool": "store_get",
            "entries": entries,
        },
    }


def main() -> int:
    with Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        print(f"entries: {len(ENTRIES)} stored, window 4000, response reserve 512")
        try:
            client.prepare(legacy_request())
        except ContextOverflowError as err:
            shortfall = err.problem.get("shortfall_tokens")
            needed = err.problem.get("needed_tokens")
            print(
                f"legacy view: {err.status_code} {err.code} "
                f"needed={needed} shortfall={shortfall} tokens"
            )
        else:
            print("legacy view: unexpectedly fitted")
            return 1

        prep = client.prepare(selection_request())
        print(f"selection: {prep.preparation_id} layout={prep.layout} attempt={prep.attempt}")
        for block in prep.selection.blocks:
            print(
                f"  {block.source}/{block.id}: {block.status} ({block.reason}) "
                f"tokens={block.tokens} full={block.full_tokens} "
                f"projection={block.projection_tokens}"
            )
        budget = prep.budget
        print(
            f"budget: capacity={budget.capacity} reserve={budget.response_reserve} "
            f"data={budget.data_tokens}/{budget.data_limit_tokens} "
            f"remaining={budget.remaining_tokens} total_input={budget.total_input_tokens}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
