"""An OpenAI Agents SDK run whose model calls are prepared by the service
(``ContextAssemblyInputFilter``, its run config and its model wrapper).

The agent looks an order up with a tool, then answers: two model calls, each prepared with the
application's saved notes (inline blocks from ``contributions``, built from the run's context)
under a 300-token data limit. The model is a small implementation of the SDK's ``Model``
interface that answers from a script, so nothing leaves loopback. Per call the example prints the
preparation id, each block's decision (``source/id: status (reason) tokens=…``) and the budget;
after the run, the usage report the wrapped model sent in the background. Block texts are never printed.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/integrations/openai_agents_agent.py
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agents import Agent, ModelResponse, Runner, Usage, function_tool
from agents.models.interface import Model
from context_assembly_client import AsyncClient
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.types import PrepareResponse
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None


@dataclass
class Context:
    customer: str


def notes(context: Context) -> list[dict[str, Any]]:
    """The inline source, read before each model call from the run's context."""
    blocks = [
        {"id": "receipt", "text": "Receipt A42: paid 40 EUR on 2026-11-30.", "protected": True},
        {
            "id": "customer",
            "text": f"{context.customer}, enterprise tier, prefers email. " * 3,
            "priority": 5,
        },
        {"id": "history", "text": "Earlier tickets about late deliveries. " * 40, "priority": -5},
    ]
    return [{"source": "notes", "revision": "3", "blocks": blocks}]


class ScriptedModel(Model):
    """The offline model: ask for the order first, then answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            output: list[Any] = [
                ResponseFunctionToolCall(
                    id="fc_1",
                    type="function_call",
                    call_id="call_1",
                    name="lookup_order",
                    arguments='{"order_id": "A42"}',
                )
            ]
            usage = Usage(requests=1, input_tokens=210, output_tokens=12, total_tokens=222)
        else:
            text = ResponseOutputText(
                type="output_text", text="A42 was paid and shipped.", annotations=[]
            )
            output = [
                ResponseOutputMessage(
                    id="msg_1", type="message", role="assistant", status="completed", content=[text]
                )
            ]
            usage = Usage(requests=1, input_tokens=260, output_tokens=14, total_tokens=274)
        return ModelResponse(output=output, usage=usage, response_id=f"resp_{self.calls}")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")


@function_tool
def lookup_order(order_id: str) -> str:
    """Read an order from the order system."""
    return f"order {order_id}: shipped on 2026-12-01"


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
    # The three lines an application adds: the filter, its template, and its sources ...
    ca = ContextAssemblyInputFilter(
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
        name="orders",
        instructions="You are a careful assistant.",
        model=ca.model(ScriptedModel()),  # a Model object is wrapped; a model name is not
        tools=[lookup_order],
    )
    # ... and, on each run, the adapter's run config.
    result = await Runner.run(
        agent,
        "Where is order A42, and was it paid?",
        context=Context("Dana Ortiz"),
        run_config=ca.run_config(tracing_disabled=True),
    )
    print(
        f"agent answered after {len(prepared)} model calls ({len(str(result.final_output))} characters)"
    )
    for prep in prepared:
        show(prep)
    await ca.aclose()  # sends the reports under way first
    async with AsyncClient(BASE_URL, api_key=API_KEY) as client:
        for prep in prepared:
            last = (await client.get_preparation(prep.preparation_id)).accounting.last
            assert last is not None
            print(
                f"usage report {last.report_id} of {prep.preparation_id}: provider={last.provider} "
                f"input={last.provider_input_tokens} output={last.output_tokens} "
                f"delta={last.input_token_delta}"
            )
    stats = ca.stats
    print(
        f"stats: prepared={stats.prepared} failed_open={stats.failed_open} usage_reports={stats.usage_reports}"
    )


if __name__ == "__main__":
    asyncio.run(main())
