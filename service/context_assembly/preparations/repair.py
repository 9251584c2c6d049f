"""The structured-output repair frame: the dispatched frame, the model's answer, and a request to
format that answer as JSON (matching a schema when one is given), counted against the window the
preparation was made for. No contributor is called."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from context_assembly.core.counting import count_messages, count_tools
from context_assembly.core.frame import Frame
from context_assembly.core.render import output_limit, render_frame
from context_assembly.core.request import Message, PrepareRequest
from context_assembly.engine import model_context
from context_assembly.errors import ContextOverflowError
from context_assembly.lifecycle_models import RepairRequest
from context_assembly.preparations.record import StoredPreparation
from context_assembly.tokens.registry import ModelRegistry

REPAIR_PROMPT: Final = (
    "Format your previous answer as a single JSON value{schema}. Reply with the JSON only, "
    "without commentary; do not change the facts of the answer."
)


@dataclass(frozen=True, slots=True)
class RepairFrame:
    """The repair frame rendered for the record's provider shape, and its estimate."""

    rendered: dict[str, Any]
    tokens: int


def repair_frame(
    body: RepairRequest, stored: StoredPreparation, registry: ModelRegistry
) -> RepairFrame:
    """The repair frame of ``body`` over a ``stored`` record, counted with the record's model
    and tokenizer (plus the provider-counted tokens of a native history: the repair call is sent
    on top of the same provider-held state); ``ContextOverflowError`` when it does not fit."""
    schema = (
        ""
        if body.schema_ is None
        else (
            " that matches this JSON Schema: "
            + orjson.dumps(body.schema_, option=orjson.OPT_SORT_KEYS).decode()
        )
    )
    messages = [
        *body.frame.messages,
        Message(role="assistant", content=body.answer),
        Message(role="user", content=REPAIR_PROMPT.format(schema=schema)),
    ]
    frame = Frame(messages=messages, tools=body.frame.tools)
    probe = PrepareRequest(model=stored.model, assembly={"tokenizer": stored.tokenizer})
    ctx = model_context(probe, registry)
    tokens = (
        count_messages(messages, ctx.counter, ctx.profile).tokens
        + count_tools(frame.tools, ctx.counter, ctx.profile)
        + ctx.profile.reply_priming
        + stored.provider_counted_tokens
    )
    available = stored.capacity - stored.reserve
    if tokens > available:
        raise ContextOverflowError(
            f"the repair frame needs {tokens} tokens but {available} are available",
            needed_tokens=tokens,
            capacity=stored.capacity,
        )
    limit = output_limit(stored.reserve, ctx.profile.max_output_tokens)
    rendered = render_frame(frame, stored.render, stored.model, limit)
    return RepairFrame(rendered, tokens)
