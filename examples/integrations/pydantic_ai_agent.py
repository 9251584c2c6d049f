"""A Pydantic AI agent whose model requests are prepared by the service (``ContextAssemblyCapability``).

The agent looks an order up with a tool, then answers: two model requests, each prepared with the
application's saved notes (inline blocks from ``contributions``, built from the run's deps) under
a 300-token data limit. The model is Pydantic AI's ``FunctionModel``, so nothing leaves loopback.
Per request the example prints the preparation id, each block's decision
(``source/id: status (reason) tokens=…``) and the budget; after the run, the usage report the
capability sent in the background. Block texts are never printed.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/integrations/pydantic_ai_agent.py
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from context_assembly_client import AsyncClient
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from context_assembly_client.types import PrepareResponse
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None


@dataclass
class Deps:
    customer: str


async def notes(deps: Deps) -> list[dict[str, Any]]:
    """The inline source, read before each model request from the run's deps."""
    blocks = [
        {"id": "receipt", "text": "Receipt A42: paid 40 EUR on 2026-11-30.", "protected": True},
        {
            "id": "customer",
            "text": f"{deps.customer}, enterprise tier, prefers email. " * 3,
            "priority": 5,
        },
        {"id": "history", "text": "Earlier tickets about late deliveries. " * 40, "priority": -5},
    ]
    return [{"source": "notes", "revision": "3", "blocks": blocks}]


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The offline model: ask for the order first, then answer."""
    if len(messages) < 3:
        call = ToolCallPart("lookup_order", {"order_id": "A42"}, tool_call_id="call_1")
        return ModelResponse(parts=[call], usage=RequestUsage(input_tokens=210, output_tokens=12))
    text = TextPart("A42 was paid and shipped on 2026-12-01.")
    return ModelResponse(parts=[text], usage=RequestUsage(input_tokens=260, output_tokens=14))


def show(prep: PrepareResponse) -> None:
    budget = prep.budget
    print(f"preparation {prep.preparation_id} model={prep.model} layout={prep.layout}")
    for block in prep.selection.blocks:
        print(
            f"  {block.source}/{block.id}: {block.status} ({block.reason}) "
            f"tokens={block.tokens} full={block.full_tokens}"
        )
    print(
        f"  budget: input={budget.total_input_tokens} "
        f"data={budget.data_tokens}/{budget.data_limit_tokens} tools={budget.tools_tokens}"
    )


async def main() -> None:
    prepared: list[PrepareResponse] = []
    # The three lines an application adds: the capability, its template, and its sources.
    capability = ContextAssemblyCapability(
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
    agent = Agent(
        FunctionModel(scripted),
        deps_type=Deps,
        instructions="You are a careful assistant.",
        capabilities=[capability],
    )

    @agent.tool_plain
    def lookup_order(order_id: str) -> str:
        """Read an order from the order system."""
        return f"order {order_id}: shipped on 2026-12-01"

    result = await agent.run("Where is order A42, and was it paid?", deps=Deps("Dana Ortiz"))
    print(f"agent answered after {len(prepared)} model requests ({len(result.output)} characters)")
    for prep in prepared:
        show(prep)
    await capability.aclose()  # sends the reports under way first
    async with AsyncClient(BASE_URL, api_key=API_KEY) as client:
        for prep in prepared:
            last = (await client.get_preparation(prep.preparation_id)).accounting.last
            assert last is not None
            print(
                f"usage report {prep.preparation_id}: provider={last.provider} "
                f"input={last.provider_input_tokens} output={last.output_tokens} "
                f"delta={last.input_token_delta}"
            )
    stats = capability.stats
    print(
        f"stats: prepared={stats.prepared} failed_open={stats.failed_open} usage_reports={stats.usage_reports}"
    )


if __name__ == "__main__":
    asyncio.run(main())
