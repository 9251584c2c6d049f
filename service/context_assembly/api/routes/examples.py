"""The request examples of the OpenAPI document, and the body documentation that carries them
(Swagger UI's "Try it out" starts from the first, ReDoc lists them all)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from context_assembly.api.bodies import documented


def with_examples(model: type[BaseModel], examples: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body is ``model``, with its OpenAPI ``examples``:
    Swagger UI's "Try it out" starts from the first, ReDoc lists them all."""
    extra = documented(model)
    extra["requestBody"]["content"]["application/json"]["examples"] = examples
    return extra


# --------------------------------------------------------------------------- request examples
# Each one is a request the service answers 200 (tests/api/test_openapi_teaches.py posts them):
# the prepare examples with the default configuration, except the contributor one, which needs
# the registration it names. The validate and repair examples hold the frame the minimal prepare
# example answers (its date line aside, outside the prefix and the input), so that they hold for
# any preparation made with it. Their names sort in the order given, so that the first (the one
# Swagger UI fills in) is the same in the committed document (sorted keys) and the served one.

_INSTRUCTIONS = "You are a careful operations assistant."
_QUESTION = {"role": "user", "content": "Is order A42 paid?"}
_FRAME = {
    "messages": [
        {"role": "system", "content": _INSTRUCTIONS},
        {
            "role": "developer",
            "content": "Current date and time: 2026-12-02 12:00 (UTC, Wednesday)",
        },
        _QUESTION,
    ],
    "tools": [],
}

PREPARE_EXAMPLES: dict[str, dict[str, Any]] = {
    "minimal": {
        "summary": "Minimal: a model, instructions and the user's turn",
        "description": "No sources: the frame is the instructions, the date line and the input. "
        "`stable-prefix` keeps the instructions in a prefix that stays the same from turn to "
        "turn (the date line follows it).",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "input": [_QUESTION],
            "assembly": {"layout": "stable-prefix"},
        },
    },
    "with_blocks_and_whiteboard": {
        "summary": "Inline blocks and a whiteboard under a data limit",
        "description": "Each source replaces a plugin's content view. `receipt` is protected, "
        "`policy` needs `orders/glossary` and has a projection for when it does not fit, "
        "`faq` has expired; whiteboard entries become blocks (`critical` is protected). "
        "`selection.blocks` says what was chosen and why.",
        "value": {
            "model": "gpt-4o-mini",
            "response_reserve": 512,
            "assembly": {
                "max_data_tokens": 300,
                "source_token_limits": {"orders": 200},
                "layout": "stable-prefix",
            },
            "instructions": _INSTRUCTIONS,
            "plugins": [
                {"name": "orders", "instructions": "Order records; cite their ids."},
                {"name": "memory", "instructions": "Saved entries; read one with store_get."},
            ],
            "contributions": [
                {
                    "source": "orders",
                    "revision": "2026-12-02T11:58:00Z",
                    "blocks": [
                        {"id": "receipt", "text": "Receipt A42: paid 40 EUR.", "protected": True},
                        {"id": "glossary", "text": "A receipt proves a completed payment."},
                        {
                            "id": "policy",
                            "text": "Refunds: within 30 days, to the original card, "
                            "after the item is back in the warehouse and checked.",
                            "priority": 10,
                            "dependencies": ["orders/glossary"],
                            "projection": "Refunds within 30 days.",
                        },
                        {
                            "id": "faq",
                            "text": "Old FAQ about paper receipts.",
                            "expires_at": "2026-01-01T00:00:00Z",
                        },
                    ],
                }
            ],
            "whiteboard": {
                "source": "memory",
                "recovery_tool": "store_get",
                "entries": [
                    {
                        "key": "customer",
                        "description": "The customer's identity",
                        "value": {"id": "C7", "name": "Ada"},
                        "priority": "critical",
                    },
                    {
                        "key": "mood",
                        "description": "Tone so far",
                        "value": "calm",
                        "priority": "low",
                    },
                ],
            },
            "input": [_QUESTION],
        },
    },
    "with_cache": {
        "summary": "Provider cache plan (Anthropic)",
        "description": "`render: anthropic` answers the Messages API body; with `cache` it carries "
        "`cache_control` markers where the prefix reaches the model's minimum cacheable length "
        "(`selection.cache.skipped` says why one is not placed) and compares this turn with the "
        "previous one of the same scope.",
        "value": {
            "model": "claude-sonnet-4-5",
            "render": "anthropic",
            "response_reserve": 1024,
            "cache": {"breakpoints": True, "ttl": "5m"},
            "assembly": {"layout": "stable-prefix"},
            "instructions": _INSTRUCTIONS,
            "tools": [
                {
                    "name": "order_status",
                    "description": "Look an order up by id.",
                    "parameters": {
                        "type": "object",
                        "properties": {"order_id": {"type": "string"}},
                        "required": ["order_id"],
                    },
                }
            ],
            "scope": {"account_id": "acme", "task_id": "order-A42"},
            "history": [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hello! How can I help?"},
            ],
            "input": [_QUESTION],
        },
    },
    "with_contributor": {
        "summary": "A registered contributor (webhook)",
        "description": "The service calls the contributor registered as `[contributors.memory]` "
        "in its configuration, within `timeout_ms`; its blocks replace the `memory` plugin's "
        "view. Without that registration the answer is a `422` naming `contributors.0.endpoint`.",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "plugins": [{"name": "memory", "instructions": "Facts saved in earlier turns."}],
            "contributors": [{"source": "memory", "endpoint": "memory", "failure_policy": "omit"}],
            "assembly": {"layout": "stable-prefix", "timeout_ms": 800},
            "scope": {"account_id": "acme", "task_id": "order-A42"},
            "input": [_QUESTION],
        },
    },
    "with_routing": {
        "summary": "Routing: the first candidate model that fits",
        "description": "`models` instead of `model`: the first candidate whose window holds the "
        "request is chosen; `selection.routing` reports each candidate tried.",
        "value": {
            "models": ["gpt-4", "gpt-4o-mini"],
            "routing": {"policy": "first_fit"},
            "instructions": _INSTRUCTIONS,
            "input": [_QUESTION],
            "assembly": {"layout": "stable-prefix"},
        },
    },
}

VALIDATE_EXAMPLES: dict[str, dict[str, Any]] = {
    "frame": {
        "summary": "The frame about to be sent",
        "description": "The frame of the minimal prepare example, as its answer gave it.",
        "value": {"model": "gpt-4o-mini", "frame": _FRAME},
    }
}

REPAIR_EXAMPLES: dict[str, dict[str, Any]] = {
    "schema": {
        "summary": "Ask for the answer as JSON matching a schema",
        "description": "The dispatched frame of the minimal prepare example and the model's "
        "answer; `instructions` are the prepare request's.",
        "value": {
            "model": "gpt-4o-mini",
            "instructions": _INSTRUCTIONS,
            "frame": _FRAME,
            "answer": "Yes, order A42 is paid: 40 EUR.",
            "schema": {
                "type": "object",
                "properties": {"paid": {"type": "boolean"}, "amount_eur": {"type": "number"}},
                "required": ["paid"],
            },
        },
    }
}

USAGE_EXAMPLES: dict[str, dict[str, Any]] = {
    "chat_completions": {
        "summary": "OpenAI Chat Completions usage",
        "description": "The `usage` object of the completion, as received.",
        "value": {
            "report_id": "chatcmpl-A42",
            "provider": "openai",
            "call": "main",
            "usage": {
                "prompt_tokens": 37,
                "completion_tokens": 12,
                "total_tokens": 49,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
    },
    "messages": {
        "summary": "Anthropic Messages usage",
        "description": "The `usage` object of the message, as received (for a preparation "
        "made for an Anthropic model).",
        "value": {
            "report_id": "msg_A42",
            "provider": "anthropic",
            "usage": {
                "input_tokens": 30,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": 12,
            },
        },
    },
}
