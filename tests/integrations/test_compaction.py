"""The compaction decision, the providers' own compaction and its returned items through every
Python adapter and the provider classes people use, against the loopback stand-in of each
provider's API (``provider_server``: it opens its answer with a compaction item when asked to
compact) and a served process with a registered summarizer (docs/integrations.md#compaction).

Each case runs a two-turn agent conversation with one tool step per turn (four model calls). The
first question is long, so that on the second turn the history before it is worth compacting:
with ``trigger_tokens`` between the frame's floor and its input and a horizon over which carrying
it costs more than compacting, the service decides to act on the third call.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from agents import Agent as AgentsAgent
from agents import OpenAIChatCompletionsModel, Runner, function_tool
from agents import OpenAIResponsesModel as AgentsResponsesModel
from anthropic import AsyncAnthropic
from context_assembly_client.integrations.langchain import (
    COMPACTION_KEY,
    ContextAssemblyMiddleware,
)
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from context_assembly_client.types import CompactionReport, PrepareResponse
from integration_support import SUMMARIZER, SUMMARY, Service, Summarizer
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware, before_model
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from openai import AsyncOpenAI
from provider_server import ANSWER, COMPACTED, ENCRYPTED, TOOL, ProviderServer
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.capabilities import AbstractCapability, CompactionRequest, CompactionResult
from pydantic_ai.messages import CompactionPart, ModelMessage, ModelRequest, SystemPromptPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import RunContext

pytestmark = pytest.mark.e2e

CLAUDE, GPT = "claude-sonnet-4-6", "gpt-4o-mini"
INSTRUCTIONS = "You answer questions about orders."
FILLER = "The customer wrote a long message about the parcel and its delivery. " * 150
QUESTIONS = (f"Where is order A42? {FILLER}", "And when was it paid?")
TRIGGER = 1000  # over the floor of the second turn, under its input
BETA = "compact-2026-01-12"
# Carrying the first turn over a long horizon costs more than compacting it once.
DECIDING = {"trigger_tokens": TRIGGER, "horizon_turns": 1000}
SUMMARY_HEADING = "[Summary of the earlier conversation]"


def lookup(id: str) -> str:
    """Read one order."""
    return f"order {id}: shipped"


def long_lookup() -> Callable[[str], str]:
    """A ``lookup`` whose results are long and numbered: ``result 1``, ``result 2``."""
    numbers = itertools.count(1)

    def lookup(id: str) -> str:
        """Read one order."""
        return f"result {next(numbers)}: order {id} shipped. {FILLER}"

    return lookup


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    server = ProviderServer()
    yield server
    server.close()


def conversation(body: dict[str, Any]) -> list[Any]:
    return list(body.get("input") or body.get("messages") or [])


def text_of_body(body: dict[str, Any]) -> str:
    return orjson.dumps(conversation(body)).decode()


def decisions(prepared: list[PrepareResponse]) -> list[CompactionReport]:
    """Each preparation's ``selection.compaction`` (every answer has one)."""
    reports = [p.selection.compaction for p in prepared]
    assert all(report is not None for report in reports)
    return [report for report in reports if report is not None]


# --------------------------------------------------------------------------- LangChain


def chat_anthropic(server: ProviderServer) -> ChatAnthropic:
    return ChatAnthropic(model=CLAUDE, base_url=server.url, api_key="test-key", max_retries=0)


def chat_openai(server: ProviderServer, *, responses: bool) -> ChatOpenAI:
    return ChatOpenAI(
        model=GPT,
        base_url=f"{server.url}/v1",
        api_key="test-key",
        max_retries=0,
        use_responses_api=responses,
    )


async def langchain_turns(
    chat_model: Any,
    middleware: ContextAssemblyMiddleware,
    *extra: Any,
    read: Callable[[str], str] = lookup,
) -> dict[str, Any]:
    """Two turns of a checkpointed agent (its thread is the scope); the final state."""
    agent = create_agent(
        chat_model,
        tools=[langchain_tool(read)],
        system_prompt=INSTRUCTIONS,
        middleware=[*extra, middleware],
        checkpointer=InMemorySaver(),
    )
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{uuid.uuid4().hex}"}}
    state: dict[str, Any] = {}
    for question in QUESTIONS:
        state = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
        assert state["messages"][-1].text == ANSWER
    return state


def langchain_adapter(
    service: Service, compaction: dict[str, Any], prepared: list[PrepareResponse], **kwargs: Any
) -> ContextAssemblyMiddleware:
    return ContextAssemblyMiddleware(
        service.url,
        template={"assembly": {"compaction": compaction}},
        on_prepared=prepared.append,
        **kwargs,
    )


def expected_management(api: str, threshold: int) -> Any:
    if api == "anthropic":
        edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": threshold}}
        return {"edits": [edit]}
    return [{"type": "compaction", "compact_threshold": threshold}]


def compaction_items(value: Any) -> list[dict[str, Any]]:
    """Every compaction block or item under ``value``, with its set fields."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if value.get("type") == "compaction":
            found.append({k: v for k, v in value.items() if v is not None})
        for inner in value.values():
            found.extend(compaction_items(inner))
    elif isinstance(value, list):
        for inner in value:
            found.extend(compaction_items(inner))
    return found


def returned_item(api: str) -> dict[str, Any]:
    if api == "anthropic":
        return {"type": "compaction", "content": COMPACTED}
    return {"type": "compaction", "id": "cmp_1", "encrypted_content": ENCRYPTED}


def check_native(
    api: str,
    provider: ProviderServer,
    prepared: list[PrepareResponse],
    adapter: Any,
) -> None:
    """Every call asked the provider to compact at the trigger (Anthropic: at its minimum, with
    its beta header); the item the first answer opened with came back in every later call, and
    from the next turn on the service left out what precedes it, as the provider does."""
    threshold = 50_000 if api == "anthropic" else TRIGGER
    assert len(provider.calls) == len(prepared) == 4
    for call in provider.calls:
        assert call.body["context_management"] == expected_management(api, threshold)
        if api == "anthropic":
            assert BETA in call.headers.get("anthropic-beta", "").split(",")
    assert compaction_items(conversation(provider.calls[0].body)) == []
    for call in provider.calls[1:]:
        assert compaction_items(conversation(call.body)) == [returned_item(api)]
    dropped = [report.provider_item_dropped_messages for report in decisions(prepared)]
    assert dropped == [0, 0, 1, 1]  # the first question, before the item
    third = text_of_body(provider.calls[2].body)
    assert QUESTIONS[0] not in third and QUESTIONS[1] in third
    report = adapter.last_compaction
    assert report is not None and report.mode == "native"
    assert report.native is not None and report.native.threshold_tokens == threshold
    assert report.native.beta == (BETA if api == "anthropic" else None)
    assert adapter.stats.prepared == 4 and adapter.stats.failed_open == 0
    assert adapter.stats.mapping_errors == 0 and adapter.stats.native_compaction_skipped == 0


async def test_langchain_clears_the_decision_of_an_earlier_call_when_one_goes_out_unprepared(
    provider: ProviderServer, closed_url: str
) -> None:
    """A call that fails open leaves no earlier decision in the state for a hook to act on again."""
    middleware = ContextAssemblyMiddleware(closed_url, template={})
    agent = create_agent(
        chat_anthropic(provider), tools=[langchain_tool(lookup)], middleware=[middleware]
    )
    earlier = {"decision": "compact", "reason": "over_trigger"}
    # COMPACTION_KEY is a key of the middleware's state schema, which the input type omits.
    given = {"messages": [HumanMessage(QUESTIONS[1])], COMPACTION_KEY: earlier}
    state = await agent.ainvoke(given)  # type: ignore[call-overload]
    await middleware.aclose()
    assert middleware.stats.failed_open == 2 and middleware.stats.prepared == 0
    assert state[COMPACTION_KEY] is None


def check_cleared(provider: ProviderServer, prepared: list[PrepareResponse]) -> None:
    """The third call cleared the first turn's result; it and the next sent the placeholder in
    its place, and the fourth the second turn's own result whole."""
    third = prepared[2].selection.compaction
    assert third is not None and third.decision == "clear_tool_results"
    (cleared,) = third.cleared_calls
    for call in provider.calls[2:]:
        sent = text_of_body(call.body)
        assert "result 1" not in sent
        assert f"[tool result cleared to save context: {TOOL} call {cleared}]" in sent
    assert "result 2" in text_of_body(provider.calls[3].body)


@pytest.mark.parametrize("api", ["anthropic", "openai-responses"])
async def test_langchain_carries_native_compaction_and_its_item(
    api: str, provider: ProviderServer, service: Service
) -> None:
    """``mode: "native"`` through ``ChatAnthropic`` (``context_management`` and ``betas`` in the
    call's settings) and ``ChatOpenAI`` on the Responses API (``context_management``); the
    returned compaction block or item survives the agent's state into the next prepare."""
    prepared: list[PrepareResponse] = []
    middleware = langchain_adapter(service, {"mode": "native", "trigger_tokens": TRIGGER}, prepared)
    chat = chat_anthropic(provider) if api == "anthropic" else chat_openai(provider, responses=True)
    await langchain_turns(chat, middleware)
    await middleware.aclose()
    check_native(api, provider, prepared, middleware)


async def test_langchain_warns_when_the_class_cannot_carry_native_compaction(
    provider: ProviderServer, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """``ChatOpenAI`` on Chat Completions has no provider compaction: the calls go out without
    it, counted, with one warning, and the decision still says ``native`` without a directive."""
    prepared: list[PrepareResponse] = []
    middleware = langchain_adapter(service, {"mode": "native"}, prepared)
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        await langchain_turns(chat_openai(provider, responses=False), middleware)
    await middleware.aclose()
    assert all("context_management" not in call.body for call in provider.calls)
    assert middleware.stats.native_compaction_skipped == 4 and middleware.stats.prepared == 4
    warnings = [r.getMessage() for r in caplog.records if "'native'" in r.getMessage()]
    assert len(warnings) == 1
    report = middleware.last_compaction
    assert report is not None and report.mode == "native" and report.native is None


async def test_langchain_summarization_middleware_runs_on_the_services_decision(
    provider: ProviderServer, service: Service
) -> None:
    """``mode: "report"``: the decision lands in the agent's state; a ``before_model`` hook runs
    ``SummarizationMiddleware`` when it says ``compact`` (in place of its own trigger), so the
    call after the decision goes out summarized, under the trigger."""
    prepared: list[PrepareResponse] = []
    decided: list[CompactionReport] = []
    middleware = langchain_adapter(service, DECIDING, prepared, on_compaction=decided.append)
    chat = chat_anthropic(provider)
    summarization = SummarizationMiddleware(
        chat,
        trigger=("messages", 1),  # never its own: it runs only when the hook below calls it
        keep=("messages", 3),
        summarizer=lambda messages: "The first turn found order A42 shipped.",
    )

    @before_model
    async def compact_when_decided(state: Any, runtime: Any) -> dict[str, Any] | None:
        report = state.get(COMPACTION_KEY)
        if report is None or report["decision"] != "compact":
            return None
        return await summarization.abefore_model(state, runtime)

    state = await langchain_turns(chat, middleware, compact_when_decided)
    await middleware.aclose()
    reasons = [(report.decision, report.reason) for report in decisions(prepared)]
    assert reasons[2] == ("compact", "over_trigger")
    assert reasons[3] == ("none", "under_trigger")
    assert [report.decision for report in decided] == ["compact"]
    assert QUESTIONS[0] in text_of_body(provider.calls[2].body)
    fourth = text_of_body(provider.calls[3].body)
    assert QUESTIONS[0] not in fourth and "The first turn found order A42 shipped." in fourth
    assert state[COMPACTION_KEY]["reason"] == "under_trigger"
    assert middleware.stats.mapping_errors == 0 and middleware.stats.failed_open == 0


async def test_langchain_puts_the_services_summary_in_the_agents_state(
    provider: ProviderServer, service: Service, summarizer: Summarizer
) -> None:
    """``mode: "summarize"``: the service folds the first turn into its summarizer's summary; the
    model gets the summary in the folded messages' place, and the agent's state keeps it there,
    so the next call sends it back (a summary at the head, not folded again)."""
    prepared: list[PrepareResponse] = []
    middleware = langchain_adapter(
        service, {"mode": "summarize", "summarizer": SUMMARIZER, **DECIDING}, prepared
    )
    packets = len(summarizer.packets)
    state = await langchain_turns(chat_anthropic(provider), middleware)
    await middleware.aclose()
    assert len(summarizer.packets) == packets + 1
    third = prepared[2].selection.compaction
    assert third is not None and third.decision == "compact" and third.folded_messages == 3
    for call in provider.calls[2:]:
        sent = text_of_body(call.body)
        assert QUESTIONS[0] not in sent and SUMMARY in sent
    first = state["messages"][0]
    assert isinstance(first, HumanMessage) and str(first.content).startswith(SUMMARY_HEADING)
    assert QUESTIONS[0] not in orjson.dumps([m.content for m in state["messages"]]).decode()
    assert middleware.stats.mapping_errors == 0 and middleware.stats.failed_open == 0


async def test_langchain_sends_the_tool_results_the_service_cleared(
    provider: ProviderServer, service: Service
) -> None:
    """``mode: "clear_tool_results"``: the first turn's tool result goes out as the service's
    placeholder (a copy of the ``ToolMessage``), on that call and the next; the agent's state
    keeps the result as the tool returned it."""
    prepared: list[PrepareResponse] = []
    options = {"mode": "clear_tool_results", "keep_tool_results": 0, "clear_at_least": 1}
    middleware = langchain_adapter(service, {**options, **DECIDING}, prepared)
    state = await langchain_turns(chat_anthropic(provider), middleware, read=long_lookup())
    await middleware.aclose()
    check_cleared(provider, prepared)
    assert any("result 1" in str(m.content) for m in state["messages"])
    assert middleware.stats.mapping_errors == 0 and middleware.stats.failed_open == 0


# --------------------------------------------------------------------------- Pydantic AI


class FirstTurnSummary(AbstractCapability[Any]):
    """The application's own compaction (as Pydantic AI Harness's summarizing one would):
    everything before the request being answered becomes one summary it wrote."""

    async def compact_history(
        self, ctx: RunContext[Any], request: CompactionRequest
    ) -> CompactionResult | None:
        part = CompactionPart(APP_SUMMARY)
        messages = [ModelRequest(parts=[part]), request.messages[-1]]
        return CompactionResult(messages=messages, part=part, handler="app", kept_from=1)


APP_SUMMARY = "The first turn found order A42 shipped."


def pydantic_model(api: str, server: ProviderServer, clients: list[Any]) -> Any:
    if api == "anthropic":
        anthropic = AsyncAnthropic(base_url=server.url, api_key="test-key", max_retries=0)
        clients.append(anthropic)
        return AnthropicModel(CLAUDE, provider=AnthropicProvider(anthropic_client=anthropic))
    openai = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test-key", max_retries=0)
    clients.append(openai)
    provider = OpenAIProvider(openai_client=openai)
    if api == "openai-responses":
        return OpenAIResponsesModel(GPT, provider=provider)
    return OpenAIChatModel(GPT, provider=provider)


async def pydantic_turns(
    model: Any,
    capability: ContextAssemblyCapability,
    *extra: Any,
    read: Callable[[str], str] = lookup,
) -> list[ModelMessage]:
    """Two runs of one conversation (the message history carries its id); the final history."""
    agent = PydanticAgent(model, instructions=INSTRUCTIONS, capabilities=[capability, *extra])
    agent.tool_plain(name=TOOL)(read)
    history: list[ModelMessage] | None = None
    for question in QUESTIONS:
        result = await agent.run(question, message_history=history)
        assert result.output == ANSWER
        history = result.all_messages()
    assert history is not None
    return history


def pydantic_adapter(
    service: Service, compaction: dict[str, Any], prepared: list[PrepareResponse], **kwargs: Any
) -> ContextAssemblyCapability:
    return ContextAssemblyCapability(
        service.url,
        template={"assembly": {"compaction": compaction}},
        on_prepared=prepared.append,
        **kwargs,
    )


@pytest.fixture
async def sdk_clients() -> Any:
    """The provider SDK clients a case makes, closed after it."""
    clients: list[Any] = []
    yield clients
    for client in clients:
        await client.close()


@pytest.mark.parametrize("api", ["anthropic", "openai-responses"])
async def test_pydantic_ai_carries_native_compaction_and_its_item(
    api: str, provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "native"`` through ``AnthropicModel`` (``anthropic_context_management`` and
    ``anthropic_betas``) and ``OpenAIResponsesModel`` (``openai_context_management``); the
    returned ``CompactionPart`` survives the run's history into the next prepare."""
    prepared: list[PrepareResponse] = []
    capability = pydantic_adapter(service, {"mode": "native", "trigger_tokens": TRIGGER}, prepared)
    await pydantic_turns(pydantic_model(api, provider, sdk_clients), capability)
    await capability.aclose()
    check_native(api, provider, prepared, capability)


async def test_pydantic_ai_warns_when_the_model_cannot_carry_native_compaction(
    provider: ProviderServer,
    service: Service,
    sdk_clients: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``OpenAIChatModel`` has no provider compaction: the requests go out without it, counted,
    with one warning."""
    prepared: list[PrepareResponse] = []
    capability = pydantic_adapter(service, {"mode": "native"}, prepared)
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        await pydantic_turns(pydantic_model("openai-chat", provider, sdk_clients), capability)
    await capability.aclose()
    assert all("context_management" not in call.body for call in provider.calls)
    assert capability.stats.native_compaction_skipped == 4
    assert len([r for r in caplog.records if "'native'" in r.getMessage()]) == 1


async def test_pydantic_ai_compaction_capability_runs_on_the_services_decision(
    provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "report"``: a ``compact`` decision requests compaction for the attempt, so the
    agent's own compaction capability (here one without a trigger of its own) compacts the
    history it is sent with and the run keeps; the service then sees it compacted."""
    prepared: list[PrepareResponse] = []
    decided: list[CompactionReport] = []
    capability = pydantic_adapter(service, DECIDING, prepared, on_compaction=decided.append)
    model = pydantic_model("anthropic", provider, sdk_clients)
    history = await pydantic_turns(model, capability, FirstTurnSummary())
    await capability.aclose()
    reasons = [(report.decision, report.reason) for report in decisions(prepared)]
    assert reasons[2] == ("compact", "over_trigger") and reasons[3][0] == "none"
    assert [report.decision for report in decided] == ["compact"]
    for call in provider.calls[2:]:
        sent = text_of_body(call.body)
        assert QUESTIONS[0] not in sent and APP_SUMMARY in sent
    assert QUESTIONS[0] not in orjson.dumps(history, default=repr).decode()
    assert capability.stats.mapping_errors == 0 and capability.stats.failed_open == 0


async def test_pydantic_ai_commits_the_services_summary_to_the_run(
    provider: ProviderServer, service: Service, summarizer: Summarizer, sdk_clients: list[Any]
) -> None:
    """``mode: "summarize"``: the summary goes out in place of the folded messages and the
    capability's ``compact_history`` commits it, so the run's history opens with it and later
    requests send it back (a summary at the head, not folded again)."""
    prepared: list[PrepareResponse] = []
    capability = pydantic_adapter(
        service, {"mode": "summarize", "summarizer": SUMMARIZER, **DECIDING}, prepared
    )
    packets = len(summarizer.packets)
    history = await pydantic_turns(pydantic_model("anthropic", provider, sdk_clients), capability)
    await capability.aclose()
    assert len(summarizer.packets) == packets + 1
    third = prepared[2].selection.compaction
    assert third is not None and third.decision == "compact" and third.folded_messages == 3
    for call in provider.calls[2:]:
        sent = text_of_body(call.body)
        assert QUESTIONS[0] not in sent and SUMMARY in sent
    first = history[0]
    assert isinstance(first, ModelRequest) and isinstance(first.parts[0], CompactionPart)
    assert str(first.parts[0].content).startswith(SUMMARY_HEADING)
    assert QUESTIONS[0] not in orjson.dumps(history, default=repr).decode()
    assert capability.stats.mapping_errors == 0 and capability.stats.failed_open == 0


async def test_pydantic_ai_never_commits_a_summary_in_place_of_the_system_prompt(
    provider: ProviderServer, service: Service, summarizer: Summarizer, sdk_clients: list[Any]
) -> None:
    """An agent's ``system_prompt`` is the head of its history, which a fold starts at: the
    summary is sent for that attempt only, and the run's history keeps the system prompt."""
    prepared: list[PrepareResponse] = []
    capability = pydantic_adapter(
        service, {"mode": "summarize", "summarizer": SUMMARIZER, **DECIDING}, prepared
    )
    agent = PydanticAgent(
        pydantic_model("anthropic", provider, sdk_clients),
        system_prompt=INSTRUCTIONS,
        capabilities=[capability],
    )
    agent.tool_plain(name=TOOL)(lookup)
    history: list[ModelMessage] | None = None
    for question in QUESTIONS:
        history = (await agent.run(question, message_history=history)).all_messages()
    await capability.aclose()
    third = prepared[2].selection.compaction
    assert third is not None and third.summary is not None
    assert SUMMARY in text_of_body(provider.calls[2].body)
    assert history is not None and isinstance(history[0], ModelRequest)
    assert isinstance(history[0].parts[0], SystemPromptPart)
    assert not any(isinstance(p, CompactionPart) for m in history for p in m.parts)
    assert capability.stats.mapping_errors == 0 and capability.stats.failed_open == 0


async def test_pydantic_ai_sends_the_tool_results_the_service_cleared(
    provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "clear_tool_results"``: the first turn's tool result goes out as the service's
    placeholder; the run's history keeps it as the tool returned it."""
    prepared: list[PrepareResponse] = []
    options = {"mode": "clear_tool_results", "keep_tool_results": 0, "clear_at_least": 1}
    capability = pydantic_adapter(service, {**options, **DECIDING}, prepared)
    model = pydantic_model("anthropic", provider, sdk_clients)
    history = await pydantic_turns(model, capability, read=long_lookup())
    await capability.aclose()
    check_cleared(provider, prepared)
    assert "result 1" in orjson.dumps(history, default=repr).decode()
    assert capability.stats.mapping_errors == 0 and capability.stats.failed_open == 0


# --------------------------------------------------------------------------- the Agents SDK


def agents_model(api: str, server: ProviderServer, clients: list[Any]) -> Any:
    openai = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test-key", max_retries=0)
    clients.append(openai)
    if api == "openai-responses":
        return AgentsResponsesModel(model=GPT, openai_client=openai)
    return OpenAIChatCompletionsModel(model=GPT, openai_client=openai)


def agents_adapter(
    service: Service, compaction: dict[str, Any], prepared: list[PrepareResponse], **kwargs: Any
) -> ContextAssemblyInputFilter:
    return ContextAssemblyInputFilter(
        service.url,
        template={
            "scope": {"task_id": f"run-{uuid.uuid4().hex}"},
            "assembly": {"compaction": compaction},
        },
        on_prepared=prepared.append,
        **kwargs,
    )


async def agents_turns(
    model: Any,
    ca: ContextAssemblyInputFilter,
    read: Callable[[str], str] = lookup,
    questions: tuple[str, ...] = QUESTIONS,
    between: Callable[[list[Any]], list[Any]] | None = None,
) -> list[Any]:
    """Runs of one conversation, each given the conversation so far (``to_input_list``, then
    ``between``: the application's own rewrite); the final items."""
    agent = AgentsAgent(
        name="orders",
        instructions=INSTRUCTIONS,
        model=ca.model(model),
        tools=[function_tool(read, name_override=TOOL)],
    )
    items: list[Any] = []
    for question in questions:
        items = [*items, {"role": "user", "content": question}]
        result = await Runner.run(agent, items, run_config=ca.run_config(tracing_disabled=True))
        assert result.final_output == ANSWER
        items = result.to_input_list()
        if between is not None:
            items = between(items)
    return items


async def test_agents_sdk_carries_native_compaction_and_its_item(
    provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "native"`` through ``OpenAIResponsesModel`` (``ModelSettings.extra_body``); the
    returned compaction item, which the SDK keeps in the run's items, reaches the next prepare
    as the item the provider reads."""
    prepared: list[PrepareResponse] = []
    ca = agents_adapter(service, {"mode": "native", "trigger_tokens": TRIGGER}, prepared)
    await agents_turns(agents_model("openai-responses", provider, sdk_clients), ca)
    await ca.aclose()
    check_native("openai-responses", provider, prepared, ca)


async def test_agents_sdk_warns_when_the_model_cannot_carry_native_compaction(
    provider: ProviderServer,
    service: Service,
    sdk_clients: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``OpenAIChatCompletionsModel`` has no provider compaction: the calls go out without it,
    counted, with one warning."""
    prepared: list[PrepareResponse] = []
    ca = agents_adapter(service, {"mode": "native"}, prepared)
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        await agents_turns(agents_model("openai-chat", provider, sdk_clients), ca)
    await ca.aclose()
    assert all("context_management" not in call.body for call in provider.calls)
    assert ca.stats.native_compaction_skipped == 4
    assert len([r for r in caplog.records if "'native'" in r.getMessage()]) == 1


async def test_agents_sdk_hands_the_decision_to_the_application(
    provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "report"``: ``on_compaction`` gets the ``compact`` decision of the call that made
    it, and ``last_compaction`` holds the latest call's."""
    prepared: list[PrepareResponse] = []
    decided: list[CompactionReport] = []
    ca = agents_adapter(service, DECIDING, prepared, on_compaction=decided.append)
    await agents_turns(agents_model("openai-responses", provider, sdk_clients), ca)
    await ca.aclose()
    assert [report.decision for report in decided] == ["compact"]
    assert decided[0] == prepared[2].selection.compaction
    assert ca.last_compaction == prepared[3].selection.compaction
    assert ca.last_compaction is not None and ca.last_compaction.reason == "just_compacted"


async def test_agents_sdk_sends_the_tool_results_the_service_cleared(
    provider: ProviderServer, service: Service, sdk_clients: list[Any]
) -> None:
    """``mode: "clear_tool_results"``: the first turn's ``function_call_output`` goes out with the
    service's placeholder; the run's items keep the output as the tool returned it."""
    prepared: list[PrepareResponse] = []
    options = {"mode": "clear_tool_results", "keep_tool_results": 0, "clear_at_least": 1}
    ca = agents_adapter(service, {**options, **DECIDING}, prepared)
    model = agents_model("openai-responses", provider, sdk_clients)
    items = await agents_turns(model, ca, read=long_lookup())
    await ca.aclose()
    check_cleared(provider, prepared)
    assert "result 1" in orjson.dumps(items, default=repr).decode()
    assert ca.stats.mapping_errors == 0 and ca.stats.failed_open == 0


async def test_agents_sdk_folds_the_services_summary_into_the_conversation(
    provider: ProviderServer, service: Service, summarizer: Summarizer, sdk_clients: list[Any]
) -> None:
    """``mode: "summarize"``: the call that folded sends the summary; ``folded`` puts it in place
    of the folded items of the conversation the application keeps, so the next run sends it
    back (a summary at the head, not folded again)."""
    prepared: list[PrepareResponse] = []
    summaries: list[CompactionReport] = []
    ca = agents_adapter(
        service,
        {"mode": "summarize", "summarizer": SUMMARIZER, **DECIDING},
        prepared,
        on_compaction=lambda report: summaries.append(report) if report.summary else None,
    )

    def apply(items: list[Any]) -> list[Any]:
        while summaries:
            items = ca.folded(items, summaries.pop(0))
        return items

    model = agents_model("openai-responses", provider, sdk_clients)
    questions = (*QUESTIONS, "And where was it sent from?")
    packets = len(summarizer.packets)
    items = await agents_turns(model, ca, questions=questions, between=apply)
    await ca.aclose()
    assert len(summarizer.packets) == packets + 1
    third = prepared[2].selection.compaction
    assert third is not None and third.decision == "compact" and third.folded_messages == 3
    assert SUMMARY in text_of_body(provider.calls[2].body)
    for call in provider.calls[4:]:  # the next run
        sent = text_of_body(call.body)
        assert QUESTIONS[0] not in sent and SUMMARY in sent
    assert items[0]["role"] == "user" and items[0]["content"].startswith(SUMMARY_HEADING)
    assert QUESTIONS[0] not in orjson.dumps(items, default=repr).decode()
    assert ca.stats.mapping_errors == 0 and ca.stats.failed_open == 0
