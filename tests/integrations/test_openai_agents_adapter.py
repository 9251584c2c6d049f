"""``ContextAssemblyInputFilter`` and its hooks in OpenAI Agents SDK runs against a served process:
what only this runtime has (the run context, a tool loop, runs side by side, what it cannot change)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents_fakes import RecordingModel, Turn, function_call, text_output
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.types import PrepareResponse
from integration_support import Service

pytestmark = pytest.mark.e2e


@dataclass
class Context:
    account: str


def memory(context: Context) -> list[dict[str, Any]]:
    text = f"Account {context.account}: receipt A42 paid."
    return [{"source": "memory", "revision": "1", "blocks": [{"id": "receipt", "text": text}]}]


@function_tool
def lookup(order: str) -> str:
    """Read one order."""
    return f"order {order}: shipped"


async def test_a_tool_loop_is_prepared_call_by_call_with_the_run_context(service: Service) -> None:
    """Each model call of a run is prepared with the run context's block; the tool call and its
    output stay together after the data message; each usage report finds its preparation."""
    prepared: list[PrepareResponse] = []
    ca = ContextAssemblyInputFilter(
        service.url,
        template={"model": "gpt-4o-mini", "plugins": [{"name": "memory"}]},
        contributions=memory,
        on_prepared=prepared.append,
    )
    model = RecordingModel(
        [
            Turn(
                [function_call("c1", "lookup", '{"order": "A42"}')],
                input_tokens=90,
                response_id="r1",
            ),
            Turn(
                [text_output("A42 has shipped.")],
                input_tokens=140,
                cached_tokens=64,
                response_id="r2",
            ),
        ]
    )
    agent = Agent(name="orders", instructions="Be exact.", model=ca.model(model), tools=[lookup])
    result = await Runner.run(
        agent,
        "Where is A42?",
        context=Context("acme-7"),
        run_config=ca.run_config(tracing_disabled=True),
    )
    await ca.aclose()
    assert result.final_output == "A42 has shipped."
    assert len(prepared) == 2 and all(p.budget.tools_tokens > 0 for p in prepared)
    second = model.calls[1].input
    kinds = [item.get("type") or item["role"] for item in map(dict, second)]
    # the per-turn message (a user item with the marker line: the model is not OpenAI's), the
    # data, the question, the pair
    assert kinds == ["user", "user", "user", "function_call", "function_call_output"]
    assert str(second[0]["content"]).startswith("[developer instructions]\n")
    assert "acme-7" in str(second[1]["content"])
    assert model.calls[1].instructions is not None and model.calls[1].instructions.startswith(
        "Be exact."
    )
    for preparation, (report_id, tokens) in zip(prepared, [("r1", 90), ("r2", 140)], strict=True):
        last = service.preparation(preparation.preparation_id).accounting.last
        assert last is not None and (last.report_id, last.provider_input_tokens) == (
            report_id,
            tokens,
        )
    assert last is not None and last.cached_input_tokens == 64


async def test_runs_side_by_side_report_to_their_own_preparations(service: Service) -> None:
    """One filter serves concurrent runs: each run's usage goes to the preparation of its own call."""
    prepared: list[PrepareResponse] = []
    ca = ContextAssemblyInputFilter(
        service.url, template={"model": "gpt-4o-mini"}, on_prepared=prepared.append
    )

    async def run(number: int) -> None:
        model = RecordingModel(
            [
                Turn(
                    [text_output(f"answer {number}")],
                    input_tokens=100 + number,
                    response_id=f"r{number}",
                )
            ]
        )
        agent = Agent(name=f"agent-{number}", model=ca.model(model))
        await Runner.run(
            agent, f"question {number}", run_config=ca.run_config(tracing_disabled=True)
        )

    await asyncio.gather(*(run(n) for n in range(4)))
    await ca.aclose()
    assert ca.stats.usage_reports == 4
    reported = {}
    for preparation in prepared:
        last = service.preparation(preparation.preparation_id).accounting.last
        assert last is not None
        reported[last.report_id] = last.provider_input_tokens
    assert reported == {f"r{n}": 100 + n for n in range(4)}
