"""Every adapter through the provider classes people use, against a loopback stand-in of the
provider's HTTP API (``provider_server``), checked on every body the provider receives.

Each case runs a two-turn agent conversation with one tool step per turn (four model calls)
through one runtime and one provider class, with a template that names no model, asks for the
default layout (``transcript``), a cache plan (Anthropic markers, an OpenAI key and retention)
and an output reserve. Every request body must be one the provider accepts (its roles, the
service's own messages in the provider's terms, every tool call answered at once by its
results) and carry: the contributed block once; the output limit the budget reserved; the cache
directives of the plan only where the model's class reads them, the markers where the plan put
them; and each body must begin with the one before it (the transcript kept the service's
earlier messages in place). The service prepared each call for the runtime's model, and each
usage report reached it with the provider's response id. A streamed tool loop per runtime goes
through the API's server-sent events the same way.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from agents import Agent as AgentsAgent
from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
from anthropic import AsyncAnthropic
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from context_assembly_client.types import PrepareResponse
from integration_support import Service
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from openai import AsyncOpenAI
from provider_server import ANSWER, TOOL, ProviderServer
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

pytestmark = pytest.mark.e2e

BLOCK_TEXT = "Receipt A42: paid 40 EUR on 2026-11-30."
INSTRUCTIONS = "You answer questions about orders."
QUESTIONS = ("Where is order A42?", "And when was it paid?")
RESERVE = 3000
CLAUDE, GPT = "claude-sonnet-4-6", "gpt-4o-mini"
# A tool description long enough that the prefix reaches the model's minimum cacheable length
# (2,048 tokens), so the plan places its markers.
LONG = " ".join(
    f"Rule {i}: quote order ids exactly and say when a status is uncertain." for i in range(200)
)
TEMPLATE: dict[str, Any] = {
    "response_reserve": RESERVE,
    "plugins": [{"name": "memory", "instructions": "Saved entries from earlier turns."}],
    "cache": {"breakpoints": True, "key": "orders", "retention": "24h"},
}


def contributions(state: Any) -> list[dict[str, Any]]:
    return [
        {
            "source": "memory",
            "revision": "7",
            "blocks": [{"id": "receipt", "text": BLOCK_TEXT, "protected": True}],
        }
    ]


def lookup(id: str) -> str:
    """Read one order."""
    return f"order {id}: shipped"


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    server = ProviderServer()
    yield server
    server.close()


Run = Callable[[str, list[PrepareResponse]], Awaitable[Any]]


@dataclass(frozen=True)
class Case:
    name: str
    api: str  # "anthropic", "openai-chat" or "openai-responses"
    model: str
    run: Callable[[ProviderServer, Service, list[PrepareResponse]], Awaitable[Any]]
    # The runtime hands the provider's response id on (the Agents SDK's Chat Completions model
    # keeps none: its responses have ``response_id=None``).
    response_ids: bool = True


# --------------------------------------------------------------------------- the runtimes


async def langchain_run(
    chat_model: Any, service: Service, prepared: list[PrepareResponse], **template: Any
) -> ContextAssemblyMiddleware:
    middleware = ContextAssemblyMiddleware(
        service.url,
        template={**TEMPLATE, **template},
        contributions=contributions,
        on_prepared=prepared.append,
    )
    agent = create_agent(
        chat_model,
        tools=[langchain_tool(lookup, description=LONG)],
        system_prompt=INSTRUCTIONS,
        middleware=[middleware],
        checkpointer=InMemorySaver(),  # a thread: the default scope, so the turns chain
    )
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{uuid.uuid4().hex}"}}
    for question in QUESTIONS:
        state = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
        assert state["messages"][-1].content == ANSWER
    return middleware


async def pydantic_ai_run(
    model: Any, service: Service, prepared: list[PrepareResponse], **template: Any
) -> ContextAssemblyCapability:
    capability = ContextAssemblyCapability(
        service.url,
        template={**TEMPLATE, **template},
        contributions=contributions,
        on_prepared=prepared.append,
    )
    agent = PydanticAgent(model, instructions=INSTRUCTIONS, capabilities=[capability])
    agent.tool_plain(name=TOOL, description=LONG)(lookup)
    history = None
    for question in QUESTIONS:  # the run's conversation id (kept in the history) chains them
        result = await agent.run(question, message_history=history)
        assert result.output == ANSWER
        history = result.all_messages()
    return capability


async def agents_run(
    model: Any, service: Service, prepared: list[PrepareResponse], **template: Any
) -> ContextAssemblyInputFilter:
    ca = ContextAssemblyInputFilter(
        service.url,
        # no conversation id without tracing or a provider-held conversation: an explicit scope
        template={"scope": {"task_id": f"run-{uuid.uuid4().hex}"}, **TEMPLATE, **template},
        contributions=contributions,
        on_prepared=prepared.append,
    )
    agent = AgentsAgent(
        name="orders",
        instructions=INSTRUCTIONS,
        model=ca.model(model),
        tools=[function_tool(lookup, name_override=TOOL, description_override=LONG)],
    )
    items: list[Any] = []
    for question in QUESTIONS:
        items = [*items, {"role": "user", "content": question}]
        result = await Runner.run(agent, items, run_config=ca.run_config(tracing_disabled=True))
        assert result.final_output == ANSWER
        items = result.to_input_list()
    return ca


SDK_CLIENTS: list[AsyncOpenAI | AsyncAnthropic] = []  # closed after each case


def openai_client(server: ProviderServer) -> AsyncOpenAI:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test-key", max_retries=0)
    SDK_CLIENTS.append(client)
    return client


def anthropic_client(server: ProviderServer) -> AsyncAnthropic:
    client = AsyncAnthropic(base_url=server.url, api_key="test-key", max_retries=0)
    SDK_CLIENTS.append(client)
    return client


CASES = [
    Case(
        "langchain-ChatAnthropic",
        "anthropic",
        CLAUDE,
        lambda server, service, prepared: langchain_run(
            ChatAnthropic(model=CLAUDE, base_url=server.url, api_key="test-key", max_retries=0),
            service,
            prepared,
        ),
    ),
    Case(
        "langchain-ChatOpenAI",
        "openai-chat",
        GPT,
        lambda server, service, prepared: langchain_run(
            ChatOpenAI(model=GPT, base_url=f"{server.url}/v1", api_key="test-key", max_retries=0),
            service,
            prepared,
        ),
    ),
    Case(
        "pydantic_ai-AnthropicModel",
        "anthropic",
        CLAUDE,
        lambda server, service, prepared: pydantic_ai_run(
            AnthropicModel(
                CLAUDE,
                provider=AnthropicProvider(anthropic_client=anthropic_client(server)),
            ),
            service,
            prepared,
        ),
    ),
    Case(
        "pydantic_ai-OpenAIChatModel",
        "openai-chat",
        GPT,
        lambda server, service, prepared: pydantic_ai_run(
            OpenAIChatModel(GPT, provider=OpenAIProvider(openai_client=openai_client(server))),
            service,
            prepared,
        ),
    ),
    Case(
        "openai_agents-OpenAIChatCompletionsModel",
        "openai-chat",
        GPT,
        lambda server, service, prepared: agents_run(
            OpenAIChatCompletionsModel(model=GPT, openai_client=openai_client(server)),
            service,
            prepared,
        ),
        response_ids=False,
    ),
    Case(
        "openai_agents-OpenAIResponsesModel",
        "openai-responses",
        GPT,
        lambda server, service, prepared: agents_run(
            OpenAIResponsesModel(model=GPT, openai_client=openai_client(server)),
            service,
            prepared,
        ),
    ),
]


# --------------------------------------------------------------------------- what a body must be


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def markers(value: Any) -> list[dict[str, Any]]:
    """Every object under ``value`` that carries ``cache_control``."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if "cache_control" in value:
            found.append(value)
        for inner in value.values():
            found.extend(markers(inner))
    elif isinstance(value, list):
        for inner in value:
            found.extend(markers(inner))
    return found


def unmarked(value: Any) -> Any:
    """``value`` without its ``cache_control`` members (markers move from turn to turn), a
    string content as the one text block it stands for (as Anthropic reads it: a marker needs a
    block, so a marked message sends its text as one)."""
    if isinstance(value, dict):
        return {
            k: [{"type": "text", "text": v}]
            if k == "content" and isinstance(v, str)
            else unmarked(v)
            for k, v in value.items()
            if k != "cache_control"
        }
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def conversation(api: str, body: dict[str, Any]) -> list[Any]:
    return list(body["input"] if api == "openai-responses" else body["messages"])


def check_anthropic(body: dict[str, Any]) -> None:
    messages = body["messages"]
    assert {m["role"] for m in messages} <= {"user", "assistant"}, "a system turn mid-way"
    for index, message in enumerate(messages):
        uses = [b["id"] for b in _blocks(message["content"]) if b.get("type") == "tool_use"]
        results = [
            b["tool_use_id"] for b in _blocks(message["content"]) if b.get("type") == "tool_result"
        ]
        if uses:  # answered by the next turn, whose tool results come first
            following = _blocks(messages[index + 1]["content"])
            assert messages[index + 1]["role"] == "user"
            assert [b.get("type") for b in following[: len(uses)]] == ["tool_result"] * len(uses)
            assert sorted(b["tool_use_id"] for b in following[: len(uses)]) == sorted(uses)
        if results:
            before = _blocks(messages[index - 1]["content"]) if index else []
            called = {b["id"] for b in before if b.get("type") == "tool_use"}
            assert set(results) <= called, f"results {results} without their calls"
    assert body["max_tokens"] == RESERVE
    assert "prompt_cache_key" not in body and "prompt_cache_retention" not in body
    text = orjson.dumps(messages).decode()
    assert "[developer instructions]" in text  # the per-turn message, as a user turn


def check_openai_chat(body: dict[str, Any]) -> None:
    messages = body["messages"]
    roles = [m["role"] for m in messages]
    assert set(roles) <= {"system", "developer", "user", "assistant", "tool"}
    for index, message in enumerate(messages):
        calls = [call["id"] for call in message.get("tool_calls") or []]
        if calls:
            following = messages[index + 1 : index + 1 + len(calls)]
            assert [m["role"] for m in following] == ["tool"] * len(calls)
            assert sorted(m["tool_call_id"] for m in following) == sorted(calls)
        if message["role"] == "tool":
            run_start = index
            while messages[run_start - 1]["role"] == "tool":
                run_start -= 1
            called = {c["id"] for c in messages[run_start - 1].get("tool_calls") or []}
            assert message["tool_call_id"] in called
    # the per-turn message keeps an instruction role, after the first message
    assert any(role in ("developer", "system") for role in roles[1:])
    assert "[developer instructions]" not in orjson.dumps(messages).decode()
    assert body.get("max_completion_tokens", body.get("max_tokens")) == RESERVE
    assert body["prompt_cache_key"] == "orders" and body["prompt_cache_retention"] == "24h"
    assert not markers(body)


def check_openai_responses(body: dict[str, Any]) -> None:
    items = body["input"]
    calls: list[str] = []
    for item in items:
        if item.get("type") in (None, "message"):
            assert item["role"] in ("system", "developer", "user", "assistant")
        if item.get("type") == "function_call":
            calls.append(item["call_id"])
        if item.get("type") == "function_call_output":
            assert item["call_id"] in calls, "an output without its call"
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert set(calls) == outputs, "a call without its output"
    assert any(item.get("role") == "developer" for item in items)
    assert body["max_output_tokens"] == RESERVE
    assert body["prompt_cache_key"] == "orders" and body["prompt_cache_retention"] == "24h"
    assert not markers(body)


CHECKS = {
    "anthropic": check_anthropic,
    "openai-chat": check_openai_chat,
    "openai-responses": check_openai_responses,
}


def _last_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts = [p["text"] for p in content or [] if p.get("type") == "text"]
    return texts[-1] if texts else ""


def check_markers(body: dict[str, Any], preparation: PrepareResponse, runtime: str) -> None:
    """The plan's markers where it put them: the last tool, the system prompt's last block and,
    where the runtime can mark a message (LangChain), that message's last block."""
    plan = preparation.selection.cache
    assert plan is not None
    found = markers(body)
    afters = [point.after for point in plan.breakpoints]
    if "tools" in afters:
        assert "cache_control" in body["tools"][-1]
    if "instructions" in afters:
        assert isinstance(body["system"], list) and "cache_control" in body["system"][-1]
    in_messages = markers(body["messages"])
    if runtime != "langchain":  # Pydantic AI marks only user prompts: counted as skipped
        assert in_messages == []
        assert len(found) == len({"tools", "instructions"} & set(afters))
        return
    frame = preparation.frame["messages"]
    expected = [
        _last_text(frame[point.message])
        for point in plan.breakpoints
        if point.message is not None and point.message > 0 and _last_text(frame[point.message])
    ]
    assert len(in_messages) == len(expected)
    for marked, text in zip(in_messages, expected, strict=True):
        marked_text = marked.get("text") or _last_text(marked)
        assert marked_text.endswith(text)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_a_tool_loop_through_the_provider_class(
    case: Case, provider: ProviderServer, service: Service
) -> None:
    prepared: list[PrepareResponse] = []
    try:
        adapter = await case.run(provider, service, prepared)
    finally:
        while SDK_CLIENTS:
            await SDK_CLIENTS.pop().close()
    assert adapter.flush(timeout=30)
    await adapter.aclose()
    bodies = [call.body for call in provider.calls]
    assert len(bodies) == len(prepared) == 4  # two turns, each a tool call and an answer
    assert adapter.stats.prepared == 4 and adapter.stats.failed_open == 0
    assert adapter.stats.mapping_errors == 0
    runtime = case.name.split("-")[0]
    for body, preparation in zip(bodies, prepared, strict=True):
        CHECKS[case.api](body)
        assert orjson.dumps(body).decode().count(BLOCK_TEXT) == 1
        assert preparation.model == case.model  # the runtime's model: the template names none
        assert preparation.selection.model_entry == case.model
        assert preparation.layout == "transcript"
        if case.api == "anthropic":
            check_markers(body, preparation, runtime)
    for before, after in itertools.pairwise(bodies):  # each body extends the last
        earlier = unmarked(conversation(case.api, before))
        assert unmarked(conversation(case.api, after))[: len(earlier)] == earlier
    for call, preparation in zip(provider.calls, prepared, strict=True):
        last = service.preparation(preparation.preparation_id).accounting.last
        assert last is not None, "the usage report did not arrive"
        assert last.response_id == (call.response_id if case.response_ids else None)
    assert adapter.stats.usage_reports == 4 and adapter.stats.usage_report_failures == 0


async def langchain_stream(
    server: ProviderServer, service: Service, prepared: list[PrepareResponse]
) -> Any:
    middleware = ContextAssemblyMiddleware(
        service.url, template=TEMPLATE, contributions=contributions, on_prepared=prepared.append
    )
    chat = ChatAnthropic(model=CLAUDE, base_url=server.url, api_key="test-key", max_retries=0)
    agent = create_agent(
        chat, tools=[langchain_tool(lookup, description=LONG)], middleware=[middleware]
    )
    text = ""
    async for chunk, _ in agent.astream(
        {"messages": [HumanMessage(QUESTIONS[0])]}, stream_mode="messages"
    ):
        if isinstance(chunk, AIMessageChunk) and isinstance(chunk.content, list):
            text += "".join(b.get("text", "") for b in chunk.content if isinstance(b, dict))
    assert text == ANSWER
    return middleware


async def pydantic_ai_stream(
    server: ProviderServer, service: Service, prepared: list[PrepareResponse]
) -> Any:
    capability = ContextAssemblyCapability(
        service.url, template=TEMPLATE, contributions=contributions, on_prepared=prepared.append
    )
    model = OpenAIChatModel(GPT, provider=OpenAIProvider(openai_client=openai_client(server)))
    agent = PydanticAgent(model, instructions=INSTRUCTIONS, capabilities=[capability])
    agent.tool_plain(name=TOOL, description=LONG)(lookup)
    async with agent.run_stream(QUESTIONS[0]) as result:
        assert await result.get_output() == ANSWER
    return capability


async def agents_stream(
    server: ProviderServer, service: Service, prepared: list[PrepareResponse]
) -> Any:
    ca = ContextAssemblyInputFilter(
        service.url, template=TEMPLATE, contributions=contributions, on_prepared=prepared.append
    )
    model = OpenAIResponsesModel(model=GPT, openai_client=openai_client(server))
    agent = AgentsAgent(
        name="orders",
        instructions=INSTRUCTIONS,
        model=ca.model(model),
        tools=[function_tool(lookup, name_override=TOOL, description_override=LONG)],
    )
    result = Runner.run_streamed(
        agent, QUESTIONS[0], run_config=ca.run_config(tracing_disabled=True)
    )
    async for _ in result.stream_events():
        pass
    assert result.final_output == ANSWER
    return ca


@pytest.mark.parametrize(
    ("run", "response_ids"),
    # langchain-anthropic's streamed messages keep no message id (only LangChain's run id)
    [(langchain_stream, False), (pydantic_ai_stream, True), (agents_stream, True)],
    ids=["langchain-ChatAnthropic", "pydantic_ai-OpenAIChatModel", "openai_agents-Responses"],
)
async def test_a_streamed_tool_loop_through_the_provider_class(
    run: Callable[[ProviderServer, Service, list[PrepareResponse]], Awaitable[Any]],
    response_ids: bool,
    provider: ProviderServer,
    service: Service,
) -> None:
    """Streamed, the same: each request asks for a stream, carries the block once and the
    reserved output limit, and each answer's usage is reported, with the provider's response
    id where the runtime hands it on."""
    prepared: list[PrepareResponse] = []
    try:
        adapter = await run(provider, service, prepared)
    finally:
        while SDK_CLIENTS:
            await SDK_CLIENTS.pop().close()
    assert adapter.flush(timeout=30)
    await adapter.aclose()
    assert len(provider.calls) == 2  # the tool call, then the answer
    for call in provider.calls:
        assert call.body["stream"] is True
        assert orjson.dumps(call.body).decode().count(BLOCK_TEXT) == 1
        limits = ("max_tokens", "max_completion_tokens", "max_output_tokens")
        assert [call.body[key] for key in limits if key in call.body] == [RESERVE]
    assert adapter.stats.usage_reports == 2 and adapter.stats.mapping_errors == 0
    for call, preparation in zip(provider.calls, prepared, strict=True):
        last = service.preparation(preparation.preparation_id).accounting.last
        assert last is not None
        assert last.response_id == (call.response_id if response_ids else None)
