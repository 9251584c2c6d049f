"""``ContextAssemblyCapability`` in Pydantic AI agents against a served process: what only this
runtime has (its ``TestModel``, run dependencies, cache settings and cache points)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from context_assembly_client.types import PrepareResponse
from integration_support import Service
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

pytestmark = pytest.mark.e2e


@dataclass
class Deps:
    account: str


async def memory(deps: Deps) -> list[dict[str, Any]]:
    text = f"Account {deps.account}: receipt A42 paid."
    return [{"source": "memory", "revision": "1", "blocks": [{"id": "receipt", "text": text}]}]


async def test_a_test_model_run_prepares_every_request_with_the_run_deps(service: Service) -> None:
    """``TestModel`` calls the tool, then answers: two model requests, each prepared with the
    block built from the run's deps, each reported under its own preparation."""
    prepared: list[PrepareResponse] = []
    capability = ContextAssemblyCapability(
        service.url,
        template={"model": "gpt-4o-mini", "plugins": [{"name": "memory"}]},
        contributions=memory,
        on_prepared=prepared.append,
    )
    agent = Agent(TestModel(), deps_type=Deps, instructions="Be exact.", capabilities=[capability])

    @agent.tool
    def lookup(ctx: RunContext[Deps], order: str) -> str:
        """Read one order."""
        return f"{ctx.deps.account}/{order}: shipped"

    result = await agent.run("Inspect A42.", deps=Deps("acme-7"))
    await capability.aclose()
    assert "lookup" in result.output
    assert len(prepared) == 2 and capability.stats.usage_reports == 2
    for preparation in prepared:
        assert [b.status for b in preparation.selection.blocks] == ["selected"]
        last = service.preparation(preparation.preparation_id).accounting.last
        assert last is not None and last.provider_input_tokens is not None
    # the second request carries the tool call and its return, in the current turn (input)
    assert prepared[1].budget.input_tokens > prepared[0].budget.input_tokens


LONG = " ".join(
    f"Rule {i}: quote order ids exactly and say when a status is uncertain." for i in range(120)
)


async def test_provider_settings_go_only_to_the_provider_s_own_model(service: Service) -> None:
    """A plan with Anthropic markers and an OpenAI key, for a model of neither class: no
    ``anthropic_*`` or ``openai_*`` setting, every marker counted as skipped, and the output
    limit the budget reserved as ``max_tokens``. (``test_provider_classes`` shows the settings
    reaching ``AnthropicModel`` and ``OpenAIChatModel``.)"""
    seen: list[AgentInfo] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return ModelResponse(
            parts=[TextPart("ok")], usage=RequestUsage(input_tokens=2000, output_tokens=1)
        )

    capability = ContextAssemblyCapability(
        service.url,
        template={
            "model": "claude-sonnet-4-5",
            "assembly": {"layout": "stable-prefix"},
            "cache": {
                "breakpoints": True,
                "ttl": "1h",
                "key": "orders",
                "retention": "24h",
                "previous_preparation_id": None,
            },
        },
    )
    agent = Agent(FunctionModel(answer), instructions="Be exact.", capabilities=[capability])

    @agent.tool_plain(description=LONG)
    def lookup(order: str) -> str:
        return f"order {order}"

    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("Where is A42?")]),
        ModelResponse(parts=[TextPart("It left on Monday.")]),
    ]
    result = await agent.run("And B7?", message_history=history)
    await capability.aclose()
    assert result.output == "ok"
    settings = seen[0].model_settings or {}
    assert not [key for key in settings if key.startswith(("anthropic_", "openai_"))]
    assert settings.get("max_tokens") == 4096
    assert capability.stats.cache_markers_skipped == 3  # tools, instructions, history
