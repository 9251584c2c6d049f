"""Dispatch safety: a host-hook edit, one refresh, stale repair rejection, wrap-up accounting.

1. prepare a request (inline blocks and a whiteboard; no contributor, no model call);
2. a host hook edits the current input: ``refresh`` answers ``attempt: 2`` with a new input hash;
3. a second refresh is refused: ``StaleError`` with reason ``refresh_used``;
4. the refreshed frame passes ``validate``;
5. the host prompt changed before formatting: ``repair`` is refused (``instructions_changed``);
   with the original prompt it answers a repair frame over the frozen prefix;
6. synthetic usage reports: the main call, a wrap-up call (``call: "wrap_up"``, replaces
   ``last``) and the repair call (goes to ``auxiliary``, never overwriting ``last``).

Offline: the usage objects are synthetic. Run against a running service::

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/dispatch_safety.py
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

from context_assembly_client import Client, StaleError
from context_assembly_client.types import AccountingReport, Observation

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None

INSTRUCTIONS = "You are a careful operations assistant. Answer from the context data only."

REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "max_context_tokens": 8000,
    "response_reserve": 512,
    "assembly": {"max_data_tokens": 600, "layout": "stable-prefix"},
    "instructions": INSTRUCTIONS,
    "plugins": [
        {"name": "in_context_memory", "instructions": "Saved entries; read one with store_get."},
        {"name": "orders", "instructions": "Order records from the order system."},
    ],
    "whiteboard": {
        "source": "in_context_memory",
        "recovery_tool": "store_get",
        "entries": [
            {
                "key": "receipt",
                "description": "Keep exact identity and uncertainty",
                "value": {"id": "A42", "status": "completion-unknown"},
                "priority": "critical",
            },
            {
                "key": "notes",
                "description": "Working notes",
                "value": "export retried twice; vendor contacted " * 40,
                "priority": "low",
            },
        ],
    },
    "contributions": [
        {
            "source": "orders",
            "revision": "orders-r7",
            "blocks": [
                {"id": "A42", "text": "Order A42: 3 items, paid, shipping label printed."},
                {
                    "id": "A42-lines",
                    "text": "Line items of A42: " + "widget, " * 60,
                    "dependencies": ["orders/A42"],
                    "projection": "A42 has 3 line items.",
                },
            ],
        }
    ],
    "scope": {"account_id": "acct-1", "task_id": "task-9"},
    "history": [
        {"role": "user", "content": "Track order A42 for me."},
        {"role": "assistant", "content": "Tracking A42; the receipt is saved."},
    ],
    "input": [{"role": "user", "content": "Is A42 shipped yet?"}],
}


def short(value: str) -> str:
    """``sha256:0123456789ab`` — enough of a hash to compare by eye."""
    return value[:19]


def num(value: int | None) -> str:
    """A count as the API has it: ``null`` when the provider did not report it."""
    return "null" if value is None else str(value)


def observation(obs: Observation | None) -> str:
    if obs is None:
        return "null"
    return (
        f"{obs.call}/{obs.report_id} provider_input={num(obs.provider_input_tokens)} "
        f"delta={num(obs.input_token_delta)} cached={num(obs.cached_input_tokens)} "
        f"output={num(obs.output_tokens)}"
    )


def print_accounting(label: str, accounting: AccountingReport) -> None:
    print(f"{label}: estimated={accounting.estimated_input_tokens}")
    print(f"  last:      {observation(accounting.last)}")
    print(f"  auxiliary: {observation(accounting.auxiliary)}")


def main() -> int:
    with Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        prep = client.prepare(REQUEST)
        pid = prep.preparation_id
        print(
            f"prepare: {pid} attempt={prep.attempt} input_hash={short(prep.input_hash)} "
            f"prefix_hash={short(prep.prefix_hash)} total_input={prep.budget.total_input_tokens}"
        )

        # A host hook (e.g. a request listener) edits the current input after preparation: the
        # frame must be prepared again, once, keeping the trusted prefix (instructions, history).
        edited = copy.deepcopy(REQUEST)
        edited["input"][0]["content"] += " (customer asked again at 10:05; urgent)"
        refreshed = client.refresh(pid, edited)
        changed = refreshed.input_hash != prep.input_hash
        print(
            f"refresh: attempt={refreshed.attempt} input_hash={short(refreshed.input_hash)} "
            f"(changed={changed}) prefix_hash={short(refreshed.prefix_hash)} "
            f"total_input={refreshed.budget.total_input_tokens}"
        )

        try:
            client.refresh(pid, edited)
        except StaleError as err:
            print(f"second refresh: {err.status_code} {err.code} reasons={err.reasons}")
        else:
            print("second refresh: unexpectedly accepted")
            return 1

        model, scope = REQUEST["model"], REQUEST["scope"]
        valid = client.validate(pid, model=model, scope=scope, frame=refreshed.frame)
        print(f"validate refreshed frame: valid={valid.valid}")

        # The main call answered unformatted text; meanwhile the host prompt was edited.
        answer = "A42 shipped yesterday, tracking 1Z999."
        try:
            client.repair(
                pid,
                model=model,
                scope=scope,
                instructions=INSTRUCTIONS + " Be terse.",
                frame=refreshed.frame,
                answer=answer,
            )
        except StaleError as err:
            print(
                f"repair with a changed host prompt: {err.status_code} {err.code} "
                f"reasons={err.reasons}"
            )
        else:
            print("repair with a changed host prompt: unexpectedly accepted")
            return 1
        schema = {"type": "object", "properties": {"shipped": {"type": "boolean"}}}
        repair = client.repair(
            pid,
            model=model,
            scope=scope,
            instructions=INSTRUCTIONS,
            frame=refreshed.frame,
            answer=answer,
            schema=schema,
        )
        messages = repair.frame["messages"]
        print(
            f"repair with the original prompt: {len(messages)} messages "
            f"(last roles {messages[-2]['role']},{messages[-1]['role']}) "
            f"estimated_input={repair.estimated_input_tokens}"
        )

        # Synthetic provider usage (OpenAI Chat Completions shape), as an SDK would return it.
        total = refreshed.budget.total_input_tokens
        main_usage = {"prompt_tokens": total, "completion_tokens": 21, "total_tokens": total + 21}
        result = client.report_usage(
            pid, report_id="chatcmpl-main-1", provider="openai", usage=main_usage, call="main"
        )
        print_accounting("after main report", result.accounting)
        wrap_usage = {"prompt_tokens": total + 40, "completion_tokens": 12}
        result = client.report_usage(
            pid, report_id="chatcmpl-wrap-1", provider="openai", usage=wrap_usage, call="wrap_up"
        )
        print_accounting("after wrap_up report", result.accounting)
        repair_usage = {"prompt_tokens": repair.estimated_input_tokens + 3, "completion_tokens": 9}
        result = client.report_usage(
            pid, report_id="chatcmpl-repair-1", provider="openai", usage=repair_usage, call="repair"
        )
        print_accounting("after repair report", result.accounting)
        again = client.report_usage(
            pid, report_id="chatcmpl-repair-1", provider="openai", usage=repair_usage, call="repair"
        )
        print(f"same report_id again: unchanged={again.accounting == result.accounting}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
