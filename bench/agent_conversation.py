"""The agent conversation of bench_conversation.py, as request bodies: 2k-token instructions, 10
tools with JSON schemas (``tools``), a history that grows by a user and an assistant message
(OpenAI Chat shape) each turn, a ``memory`` source of 30 stable entries plus one new entry per
turn, a ``retrieval`` source of 8 fresh ~150-token passages every turn (``passages``, inline or
from bench/retrieval_contributor.py's webhook), ``cache: {"key": "auto"}`` and
``render: "openai-chat"`` (``conversation``); the operations prose they are written in
(``prose``, o200k token counts) is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Literal

import orjson

from context_assembly.tokens.counter import get_counter

MODEL = "gpt-4o-mini"  # o200k_base

_NOUNS = (
    "export job", "invoice", "refund", "shipment", "ledger entry", "customer record", "ticket",
    "deployment", "backup", "quota", "payment run", "audit trail", "warehouse slot", "contract",
    "subscription", "price list", "purchase order", "credit note", "tax report", "data feed",
)  # fmt: skip
_VERBS = (
    "check", "confirm", "reconcile", "summarise", "escalate", "archive", "compare", "verify",
    "update", "schedule", "cancel", "retry", "approve", "flag", "document", "trace",
)  # fmt: skip
_QUALIFIERS = (
    "before the end of the business day", "for the account named in the request",
    "using only the figures the tools return", "without changing any other record",
    "and note every assumption you make", "in the customer's own currency",
    "against last month's closing balance", "while the batch window is open",
    "with the ticket number in the first line", "unless a manager has already signed off",
)  # fmt: skip

_COUNT = get_counter("o200k_base").count


def prose(rng: random.Random, tokens: int, lead: str = "") -> str:
    """Sentences of operations prose, ``tokens`` long (o200k, within a sentence)."""
    sentences = [lead] if lead else []
    while _COUNT(" ".join(sentences)) < tokens:
        sentences.append(
            f"{rng.choice(_VERBS).capitalize()} the {rng.choice(_NOUNS)} {rng.randint(100, 99999)}"
            f" {rng.choice(_QUALIFIERS)}; the {rng.choice(_NOUNS)} depends on it."
        )
    return " ".join(sentences)


def _param(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def tools() -> list[dict[str, Any]]:
    """Ten tools an operations agent has, with the JSON schemas such tools carry."""
    account = _param("string", "The account id, e.g. ACC-1042.", pattern="^ACC-[0-9]+$")
    limit = _param("integer", "How many results at most.", minimum=1, maximum=100, default=10)
    specs: list[tuple[str, str, dict[str, Any], list[str]]] = [
        ("search_documents", "Search the knowledge base; returns ranked passages.",
         {"query": _param("string", "What to look for."), "limit": limit,
          "filters": {"type": "object", "properties": {
              "source": _param("string", "Only this collection.",
                               enum=["runbooks", "policies", "tickets", "contracts"]),
              "updated_after": _param("string", "ISO 8601 date.", format="date")}}},
         ["query"]),
        ("get_account", "Read an account's profile, plan and balances.",
         {"account_id": account, "include": {"type": "array", "items": _param(
             "string", "A section.", enum=["plan", "balances", "contacts", "limits"])}},
         ["account_id"]),
        ("list_invoices", "List an account's invoices, newest first.",
         {"account_id": account, "status": _param(
             "string", "Only invoices in this state.", enum=["open", "paid", "overdue", "void"]),
          "limit": limit}, ["account_id"]),
        ("create_refund", "Refund part or all of a paid invoice.",
         {"invoice_id": _param("string", "The invoice to refund."),
          "amount": _param("number", "Amount in the invoice currency.", exclusiveMinimum=0),
          "reason": _param("string", "Why, for the audit trail.", maxLength=500)},
         ["invoice_id", "amount", "reason"]),
        ("run_report", "Run a named SQL report against the read replica.",
         {"report": _param("string", "The report's name.",
                           enum=["aging", "churn", "usage", "revenue", "failed_payments"]),
          "period": {"type": "object", "properties": {
              "from": _param("string", "Start date.", format="date"),
              "to": _param("string", "End date.", format="date")},
           "required": ["from", "to"]}}, ["report", "period"]),
        ("open_ticket", "Open a support ticket and assign it.",
         {"title": _param("string", "One line.", maxLength=120),
          "body": _param("string", "What happened and what is needed."),
          "priority": _param("string", "Urgency.", enum=["low", "normal", "high", "urgent"]),
          "assignee": _param("string", "A team or a person's handle.")},
         ["title", "body"]),
        ("send_email", "Send an email to a customer contact from the support address.",
         {"to": {"type": "array", "items": _param("string", "An address.", format="email"),
                 "minItems": 1},
          "subject": _param("string", "The subject line."),
          "body": _param("string", "Plain text."), "ticket_id": _param("string", "Link to.")},
         ["to", "subject", "body"]),
        ("schedule_job", "Schedule a batch job (export, retry, reconciliation).",
         {"job": _param("string", "The job type.", enum=["export", "retry_payment", "reconcile"]),
          "account_id": account, "at": _param("string", "When, ISO 8601.", format="date-time"),
          "dry_run": _param("boolean", "Plan only.", default=False)}, ["job", "account_id"]),
        ("store_get", "Read one saved memory entry in full by its key.",
         {"key": _param("string", "The entry's key, as listed in the memory source.")}, ["key"]),
        ("store_put", "Save or replace a memory entry for later turns.",
         {"key": _param("string", "A short stable key."),
          "value": _param("string", "What to remember.", maxLength=2000),
          "ttl_days": _param("integer", "Forget after this many days.", minimum=1)},
         ["key", "value"]),
    ]  # fmt: skip
    return [
        {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        }
        for name, description, props, required in specs
    ]


def passages(rng: random.Random, label: str) -> list[dict[str, Any]]:
    """The retrieval source's answer to one turn: 8 fresh ~150-token passages, ranked."""
    return [
        {
            "id": f"doc-{label}-{k}",
            "text": prose(rng, 150, f"Passage {k} retrieved for {label}."),
            "priority": 80 - 10 * k,
            "projection": f"Passage {k} of {label} (search_documents finds it again).",
        }
        for k in range(8)
    ]


Retrieval = Literal["inline", "webhook"]


def conversation(
    seed: int, turns: int, scope: str, retrieval: Retrieval, notes: int | None = None
) -> Iterator[bytes]:
    """The request bodies of one conversation of ``turns`` turns, in order (see the module
    docstring), deterministic for its seed, one at a time (the 400 of ``growth`` weigh some
    130 MB together); ``scope`` makes it a new conversation for the service's cache plans. The
    retrieval passages are inline, or fetched by the service from the registered ``retrieval``
    contributor (``bench/retrieval_contributor.py``). With ``notes`` the memory source offers
    its stable entries and only the latest ``notes`` notes, as a memory that returns a bounded
    selection does."""
    rng = random.Random(seed)
    instructions = prose(
        rng, 2000, "You are the operations assistant of a billing team. Follow these rules."
    )
    memory = [
        {
            "id": f"mem-{i:03d}",
            "text": prose(rng, 45, f"Saved fact {i}:"),
            "priority": rng.randint(-50, 50),
            "protected": i < 2,
            "projection": f"Saved fact {i} (read it with store_get).",
        }
        for i in range(30)
    ]
    stable = len(memory)
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        memory.append(
            {
                "id": f"note-{turn:03d}",
                "text": prose(rng, 45, f"Noted in turn {turn}:"),
                "priority": 60,
            }
        )
        offered = memory if notes is None else memory[:stable] + memory[stable:][-notes:]
        contributions = [{"source": "memory", "revision": turn, "blocks": offered}]
        if retrieval == "inline":
            contributions.append(
                {"source": "retrieval", "revision": f"q{turn}", "blocks": passages(rng, f"t{turn}")}
            )
        question = {"role": "user", "content": prose(rng, 50, f"Turn {turn}.")}
        body: dict[str, Any] = {
            "model": MODEL,
            "instructions": instructions,
            "tools": tools(),
            "render": "openai-chat",
            "cache": {"key": "auto"},
            "scope": {"account_id": "ACC-1042", "task_id": scope},
            "assembly": {"max_data_tokens": 4000, "layout": "stable-prefix"},
            "plugins": [
                {"name": "memory", "instructions": "Saved entries; read one with store_get."},
                {"name": "retrieval", "instructions": "Passages from the knowledge base."},
            ],
            "contributions": contributions,
            "history": history,
            "input": [question],
        }
        if retrieval == "webhook":
            body["contributors"] = [{"source": "retrieval", "endpoint": "retrieval"}]
        yield orjson.dumps(body)
        answer = {"role": "assistant", "content": prose(rng, 200, f"Answer to turn {turn}.")}
        history = [*history, question, answer]
