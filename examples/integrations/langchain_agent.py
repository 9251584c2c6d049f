"""A LangChain agent whose model calls are prepared by the service (``ContextAssemblyMiddleware``).

The agent (``langchain.agents.create_agent``) looks an order up with a tool, then answers: two
model calls, each prepared with the application's saved notes (inline blocks from
``contributions``) under a 300-token data limit. The model is LangChain's
``GenericFakeChatModel``, so nothing leaves loopback. Per model call the example prints the
preparation id, each block's decision (``source/id: status (reason) tokens=…``) and the budget;
after the run, the usage report the middleware sent in the background. Block texts are never
printed.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/integrations/langchain_agent.py
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from context_assembly_client import Client
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.types import PrepareResponse
from langchain.agents import create_agent
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import tool

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None

# The application's saved notes: the receipt must always be sent, the rest as the limit allows.
NOTES = [
    {"id": "receipt", "text": "Receipt A42: paid 40 EUR on 2026-11-30.", "protected": True},
    {"id": "customer", "text": "Dana Ortiz, enterprise tier, prefers email. " * 3, "priority": 5},
    {"id": "history", "text": "Earlier tickets about late deliveries. " * 40, "priority": -5},
]


def notes(state: Any) -> list[dict[str, Any]]:
    """The inline source, read before each model call (``state`` is the agent's state)."""
    return [{"source": "notes", "revision": "3", "blocks": NOTES}]


@tool
def lookup_order(order_id: str) -> str:
    """Read an order from the order system."""
    return f"order {order_id}: shipped on 2026-12-01"


class OfflineChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, which answers from a script; a real model gets the tools."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self


def show(prep: PrepareResponse) -> None:
    budget = prep.budget
    print(f"preparation {prep.preparation_id} model={prep.model} layout={prep.layout}")
    for block in prep.selection.blocks:
        print(
            f"  {block.source}/{block.id}: {block.status} ({block.reason}) tokens={block.tokens} full={block.full_tokens}"
        )
    print(
        f"  budget: input={budget.total_input_tokens} data={budget.data_tokens}/{budget.data_limit_tokens} "
        f"history={budget.history_tokens} tools={budget.tools_tokens}"
    )


def main() -> None:
    prepared: list[PrepareResponse] = []
    model = OfflineChatModel(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        {"id": "call_1", "name": "lookup_order", "args": {"order_id": "A42"}}
                    ],
                    usage_metadata={"input_tokens": 210, "output_tokens": 12, "total_tokens": 222},
                ),
                AIMessage(
                    "A42 was paid and shipped on 2026-12-01.",
                    usage_metadata={"input_tokens": 260, "output_tokens": 14, "total_tokens": 274},
                ),
            ]
        )
    )

    # The three lines an application adds: the middleware, its template, and its sources.
    middleware = ContextAssemblyMiddleware(
        BASE_URL,
        api_key=API_KEY,
        template={
            "model": "gpt-4o-mini",
            "plugins": [{"name": "notes", "instructions": "Saved notes about the customer."}],
            "assembly": {"max_data_tokens": 300, "layout": "stable-prefix"},
        },
        contributions=notes,
        on_prepared=prepared.append,
    )
    agent = create_agent(
        model,
        tools=[lookup_order],
        system_prompt="You are a careful assistant.",
        middleware=[middleware],
    )

    state = agent.invoke({"messages": [HumanMessage("Where is order A42, and was it paid?")]})
    print(
        f"agent answered after {len(prepared)} model calls; final message: {type(state['messages'][-1]).__name__}"
    )
    for prep in prepared:
        show(prep)
    middleware.flush(timeout=30)
    with Client(BASE_URL, api_key=API_KEY) as client:
        for prep in prepared:
            last = client.get_preparation(prep.preparation_id).accounting.last
            assert last is not None
            print(
                f"usage report {prep.preparation_id}: provider={last.provider} input={last.provider_input_tokens} "
                f"output={last.output_tokens} delta={last.input_token_delta}"
            )
    stats = middleware.stats
    print(
        f"stats: prepared={stats.prepared} failed_open={stats.failed_open} usage_reports={stats.usage_reports}"
    )
    middleware.close()


if __name__ == "__main__":
    main()
