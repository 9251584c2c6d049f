"""What each adapter takes from the call the runtime actually makes, against a served process and
a loopback stand-in of the providers (``provider_server``): the model a fallback moved the call
to, the application's own smaller output limit, every tool the Agents SDK sends (MCP servers'
tools, handoffs), the Agents SDK's thread as the default scope, and a failure of the mapping
itself (logged with where it happened, counted, failing open)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent as AgentsAgent
from agents import ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from agents.mcp import MCPServer
from agents_fakes import RecordingModel, Turn, text_output
from anthropic import AsyncAnthropic
from context_assembly_client.integrations import langchain as langchain_adapter
from context_assembly_client.integrations import openai_agents as agents_adapter
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from context_assembly_client.types import PrepareResponse
from integration_support import Service
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelFallbackMiddleware
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage
from langchain_fakes import RecordingChatModel, usage
from langchain_openai import ChatOpenAI
from mcp.types import CallToolResult, GetPromptResult, ListPromptsResult
from mcp.types import Tool as MCPTool
from openai import AsyncOpenAI
from provider_server import ANSWER, ProviderServer
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.capabilities.model_fallback import ModelFallback
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

pytestmark = pytest.mark.e2e

CLAUDE, GPT = "claude-sonnet-4-6", "gpt-4o-mini"
QUESTION = "Where is order A42?"


def lookup(id: str) -> str:
    """Read one order."""
    return f"order {id}: shipped"


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    server = ProviderServer()
    yield server
    server.close()


# --------------------------------------------------------------------------- the model of the call


async def test_langchain_prepares_for_the_model_a_fallback_moved_the_call_to(
    provider: ProviderServer, service: Service, closed_url: str
) -> None:
    """``ModelFallbackMiddleware`` (outside) moves the call from an OpenAI model that cannot be
    reached to a Claude model: each attempt is prepared for its own model, and Claude's body
    carries its own output limit and no OpenAI settings."""
    prepared: list[PrepareResponse] = []
    middleware = ContextAssemblyMiddleware(
        service.url,
        template={"response_reserve": 1500, "cache": {"key": "orders"}},
        on_prepared=prepared.append,
    )
    primary = ChatOpenAI(model=GPT, base_url=f"{closed_url}/v1", api_key="k", max_retries=0)
    fallback = ChatAnthropic(model=CLAUDE, base_url=provider.url, api_key="k", max_retries=0)
    stack: list[AgentMiddleware[Any, Any, Any]] = [ModelFallbackMiddleware(fallback), middleware]
    agent = create_agent(primary, tools=[], middleware=stack)
    state = await agent.ainvoke({"messages": [HumanMessage("Say hello.")]})
    await middleware.aclose()
    assert state["messages"][-1].content == ANSWER
    assert [p.model for p in prepared] == [GPT, CLAUDE]
    (call,) = provider.calls
    assert call.body["max_tokens"] == 1500 and "prompt_cache_key" not in call.body


async def test_pydantic_ai_prepares_each_attempt_for_its_serving_model(
    provider: ProviderServer, service: Service, closed_url: str
) -> None:
    """``prepare_model_request`` runs per attempt: the ``ModelFallback`` capability's second
    attempt is prepared again, for the model that serves it."""
    prepared: list[PrepareResponse] = []
    capability = ContextAssemblyCapability(
        service.url, template={"response_reserve": 1500}, on_prepared=prepared.append
    )
    unreachable = AsyncOpenAI(base_url=f"{closed_url}/v1", api_key="k", max_retries=0)
    claude = AsyncAnthropic(base_url=provider.url, api_key="k", max_retries=0)
    agent = PydanticAgent(
        OpenAIChatModel(GPT, provider=OpenAIProvider(openai_client=unreachable)),
        capabilities=[
            ModelFallback(
                AnthropicModel(CLAUDE, provider=AnthropicProvider(anthropic_client=claude))
            ),
            capability,
        ],
    )
    try:
        result = await agent.run("Say hello.")
    finally:
        await unreachable.close()
        await claude.close()
    await capability.aclose()
    assert result.output == ANSWER
    assert [p.model for p in prepared] == [GPT, CLAUDE]
    (call,) = provider.calls
    assert call.body["max_tokens"] == 1500
    assert capability.stats.usage_reports == 1  # the attempt that answered


# --------------------------------------------------------------------------- the output limit


async def test_a_smaller_limit_of_the_application_is_kept(
    provider: ProviderServer, service: Service
) -> None:
    """The reserve (4,096 by default) is the call's output limit unless the application set a
    smaller one: on the model (LangChain), in the agent's settings (Pydantic AI, Agents SDK)."""
    template: dict[str, Any] = {}
    chat = ChatAnthropic(
        model=CLAUDE, base_url=provider.url, api_key="k", max_retries=0, max_tokens=700
    )
    middleware = ContextAssemblyMiddleware(service.url, template=template)
    await create_agent(chat, tools=[], middleware=[middleware]).ainvoke(
        {"messages": [HumanMessage("Say hello.")]}
    )
    await middleware.aclose()

    client = AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="k", max_retries=0)
    capability = ContextAssemblyCapability(service.url, template=template)
    agent = PydanticAgent(
        OpenAIChatModel(GPT, provider=OpenAIProvider(openai_client=client)),
        model_settings={"max_tokens": 600},
        capabilities=[capability],
    )
    await agent.run("Say hello.")
    await capability.aclose()

    ca = ContextAssemblyInputFilter(service.url, template=template)
    agents_agent = AgentsAgent(
        name="orders",
        model=ca.model(OpenAIChatCompletionsModel(model=GPT, openai_client=client)),
        model_settings=ModelSettings(max_tokens=500),
    )
    await Runner.run(agents_agent, "Say hello.", run_config=ca.run_config(tracing_disabled=True))
    await ca.aclose()
    await client.close()

    limits = [
        call.body.get("max_tokens", call.body.get("max_completion_tokens"))
        for call in provider.calls
    ]
    assert limits == [700, 600, 500]


# --------------------------------------------------------------------------- Agents SDK tools


class OrdersServer(MCPServer):
    """An MCP server stand-in with one tool (the SDK lists it as the agent's tool)."""

    @property
    def name(self) -> str:
        return "orders"

    async def connect(self) -> None:
        pass

    async def cleanup(self) -> None:
        pass

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[MCPTool]:
        schema = {"type": "object", "properties": {"query": {"type": "string"}}}
        return [MCPTool(name="search_orders", description="Search orders.", inputSchema=schema)]

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: Any = None
    ) -> CallToolResult:
        return CallToolResult(content=[])

    async def list_prompts(self) -> ListPromptsResult:
        return ListPromptsResult(prompts=[])

    async def get_prompt(self, name: str, arguments: Any = None) -> GetPromptResult:
        raise NotImplementedError


async def test_agents_count_every_tool_the_sdk_sends(service: Service) -> None:
    """Function tools, an MCP server's tools and the handoffs all reach the service (sorted by
    the layout), and the model gets them all back, tools and handoffs apart."""
    prepared: list[PrepareResponse] = []
    ca = ContextAssemblyInputFilter(
        service.url,
        template={"model": GPT, "assembly": {"layout": "stable-prefix"}},
        on_prepared=prepared.append,
    )
    model = RecordingModel([Turn([text_output("done")])])
    billing = AgentsAgent(name="billing", instructions="Bills.")
    agent = AgentsAgent(
        name="orders",
        model=ca.model(model),
        tools=[function_tool(lookup)],
        mcp_servers=[OrdersServer()],
        handoffs=[billing],
    )
    await Runner.run(agent, QUESTION, run_config=ca.run_config(tracing_disabled=True))
    await ca.aclose()
    (preparation,) = prepared
    names = [tool["name"] for tool in preparation.frame["tools"]]
    assert names == ["lookup", "search_orders", "transfer_to_billing"]
    assert model.calls[0].tools == ["lookup", "search_orders"]


async def test_agents_scope_a_traced_run_by_its_group_id(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a template scope, a traced run's ``group_id`` (the SDK's chat thread id) scopes
    the preparations, so the second run's turn follows the first in the timeline."""
    thread = SimpleNamespace(group_id=f"thread-{uuid.uuid4().hex}")
    monkeypatch.setattr(agents_adapter, "get_current_trace", lambda: thread)
    prepared: list[PrepareResponse] = []
    ca = ContextAssemblyInputFilter(service.url, template={}, on_prepared=prepared.append)
    for number in range(2):
        model = RecordingModel([Turn([text_output(f"answer {number}")])])
        agent = AgentsAgent(name="orders", model=ca.model(model, name=GPT))
        await Runner.run(agent, QUESTION, run_config=ca.run_config(tracing_disabled=True))
    await ca.aclose()
    timeline = service.client.timeline(prepared[1].preparation_id)
    assert [turn.preparation_id for turn in timeline.turns] == [p.preparation_id for p in prepared]


# --------------------------------------------------------------------------- mapping failures


def test_a_mapping_failure_is_logged_with_where_it_happened_and_counted(
    service: Service, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of the adapter's mapping fails open: the warning names the exception class and the
    frames (module, line, function), never the message; ``stats.mapping_errors`` counts it. A
    failure while mapping the answer's usage is logged and counted the same, and the agent's
    answer stands."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the user said: secret")

    middleware = ContextAssemblyMiddleware(service.url, template={"model": GPT})
    answer = AIMessage("ok", id="resp-1", usage_metadata=usage(100, 2))
    model = RecordingChatModel(messages=iter([answer, answer]))
    agent = create_agent(model, tools=[], system_prompt="Be exact.", middleware=[middleware])
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        monkeypatch.setattr(langchain_adapter, "_added", broken)
        agent.invoke({"messages": [HumanMessage(QUESTION)]})
        monkeypatch.undo()
        monkeypatch.setattr(langchain_adapter, "normalized_usage", broken)
        state = agent.invoke({"messages": [HumanMessage(QUESTION)]})
    middleware.close()
    assert state["messages"][-1].content == "ok"
    assert [str(m.content) for m in model.calls[0]] == ["Be exact.", QUESTION]  # unchanged
    stats = middleware.stats
    assert stats.mapping_errors == 2 and stats.failed_open == 1 and stats.prepared == 1
    first, second = (r.getMessage() for r in caplog.records)
    assert "mapping failed: RuntimeError at" in first
    assert "context_assembly_client.integrations.langchain:" in first and " _apply" in first
    assert "context_assembly_client.integrations.preparer:" in first and " run" in first
    assert "usage of a call was not reported (mapping failed: RuntimeError at" in second
    assert " _send_usage" in second
    assert "secret" not in first + second


def test_a_reserve_above_the_model_s_maximum_output_is_cut_to_it(service: Service) -> None:
    """The output limit is the reserve, at most the model's maximum output of the registry
    (``GET /v1/models``: 16,384 for gpt-4o-mini)."""
    middleware = ContextAssemblyMiddleware(
        service.url, template={"model": GPT, "response_reserve": 20_000}
    )
    answer = AIMessage("ok", id="resp-1", usage_metadata=usage(100, 2))
    model = RecordingChatModel(messages=iter([answer]))
    create_agent(model, tools=[], middleware=[middleware]).invoke(
        {"messages": [HumanMessage(QUESTION)]}
    )
    middleware.close()
    assert model.call_kwargs[0]["max_tokens"] == 16_384
