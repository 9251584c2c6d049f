"""One harness per runtime: build the adapter, run one agent call of a recorded fixture with the
runtime's own test model, and say what the model received, in a form common to all runtimes.

An observation lists the runtime's messages as events, in order: ``("system", text)``,
``("user", content)``, ``("developer", text)``, ``("assistant", text)``, ``("call", id)`` for each
tool call after its assistant event, and ``("tool", id, content)``; content is kept as the
runtime's own value (strings, blocks, binary parts), so a lost image or a rewritten block shows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agents import Agent as AgentsAgent
from agents import Runner, function_tool
from agents.result import RunResultBase
from agents_fakes import RecordingModel, Turn, text_output
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter
from context_assembly_client.integrations.preparer import AdapterStats
from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability
from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.tools import tool as langchain_tool
from langchain_fakes import RecordingChatModel, usage
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

Event = tuple[Any, ...]
ANSWER = "Order A42 has shipped."
INPUT_TOKENS = 321
OUTPUT_TOKENS = 7


@dataclass
class Observation:
    original: list[Event]
    seen: list[Event]
    instructions_seen: str
    answer: str
    report_id: str | None  # the id the usage report should carry, when the runtime gives one
    input_tokens: int  # what the runtime's usage object says the model read


class Adapter(Protocol):
    @property
    def stats(self) -> AdapterStats: ...

    def flush(self, timeout: float | None = None) -> bool: ...

    async def aclose(self) -> object: ...


class Harness(Protocol):
    name: str

    def make(self, url: str, **kwargs: Any) -> Adapter: ...

    async def run(self, adapter: Any, fixture: dict[str, Any]) -> Observation: ...


def _lookup(id: str) -> str:
    """Read one order."""
    return f"order {id}"


# --------------------------------------------------------------------------- LangChain


def langchain_events(messages: list[BaseMessage]) -> list[Event]:
    events: list[Event] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            events.append(("system", message.content))
        elif isinstance(message, HumanMessage):
            events.append(("user", message.content))
        elif isinstance(message, AIMessage):
            events.append(("assistant", message.content))
            events.extend(("call", call["id"]) for call in message.tool_calls)
        elif isinstance(message, ToolMessage):
            events.append(("tool", message.tool_call_id, message.content))
    return events


class LangChainHarness:
    name = "langchain"

    def make(self, url: str, **kwargs: Any) -> ContextAssemblyMiddleware:
        return ContextAssemblyMiddleware(url, **kwargs)

    async def run(self, adapter: Any, fixture: dict[str, Any]) -> Observation:
        messages = messages_from_dict(fixture["recorded"]["langchain"])
        model = RecordingChatModel(
            messages=iter(
                [
                    AIMessage(
                        ANSWER,
                        id="resp-langchain",
                        usage_metadata=usage(INPUT_TOKENS, OUTPUT_TOKENS),
                    )
                ]
            )
        )
        agent = create_agent(
            model,
            tools=[langchain_tool(_lookup)],
            system_prompt=fixture["instructions"],
            middleware=[adapter],
        )
        if fixture["stream"]:
            answer = ""
            # messages_from_dict answers BaseMessage; the agent's input state lists the
            # concrete message classes.
            stream = agent.astream({"messages": messages}, stream_mode="messages")  # type: ignore[call-overload]
            async for chunk, _ in stream:
                if isinstance(chunk, AIMessageChunk) and isinstance(chunk.content, str):
                    answer += chunk.content
        else:
            state = await agent.ainvoke({"messages": messages})  # type: ignore[call-overload]
            answer = str(state["messages"][-1].content)
        seen = model.calls[-1]
        system = seen[0] if seen and isinstance(seen[0], SystemMessage) else None
        return Observation(
            original=langchain_events(messages),
            seen=langchain_events(seen[1:] if system else seen),
            instructions_seen=str(system.content) if system else "",
            answer=answer,
            report_id="resp-langchain",
            input_tokens=INPUT_TOKENS,
        )


# --------------------------------------------------------------------------- Pydantic AI


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    return [
        ("binary", item.media_type, bytes(item.data)) if isinstance(item, BinaryContent) else item
        for item in content
    ]


def pydantic_ai_events(messages: list[ModelMessage]) -> list[Event]:
    events: list[Event] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    events.append(("system", part.content))
                elif isinstance(part, UserPromptPart):
                    events.append(("user", _user_content(part.content)))
                elif isinstance(part, ToolReturnPart):
                    events.append(("tool", part.tool_call_id, part.model_response_str()))
        elif isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            events.append(("assistant", text))
            events.extend(
                ("call", p.tool_call_id) for p in message.parts if isinstance(p, ToolCallPart)
            )
    return events


class PydanticAIHarness:
    name = "pydantic_ai"

    def make(self, url: str, **kwargs: Any) -> ContextAssemblyCapability:
        return ContextAssemblyCapability(url, **kwargs)

    async def run(self, adapter: Any, fixture: dict[str, Any]) -> Observation:
        history = ModelMessagesTypeAdapter.validate_python(fixture["recorded"]["pydantic_ai"])
        received: list[tuple[list[ModelMessage], AgentInfo]] = []

        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            received.append((messages, info))
            return ModelResponse(
                parts=[TextPart(ANSWER)],
                usage=RequestUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS),
                provider_response_id="resp-pydantic-ai",
            )

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
            received.append((messages, info))
            for word in ANSWER.split(" "):
                yield word + " "

        agent = PydanticAgent(FunctionModel(answer, stream_function=stream), capabilities=[adapter])
        agent.tool_plain(name="lookup")(_lookup)
        if fixture["stream"]:
            async with agent.run_stream(None, message_history=history) as result:
                text = await result.get_output()
            run_usage = result.usage
            report_id = None
        else:
            run = await agent.run(None, message_history=history)
            text, run_usage, report_id = run.output, run.usage, "resp-pydantic-ai"
        messages, info = received[-1]
        return Observation(
            original=pydantic_ai_events(history),
            seen=pydantic_ai_events(messages),
            instructions_seen=info.instructions or "",
            answer=text.strip(),
            report_id=report_id,
            input_tokens=run_usage.input_tokens,
        )


# --------------------------------------------------------------------------- OpenAI Agents SDK


def agents_events(items: list[Any]) -> list[Event]:
    events: list[Event] = []
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            events.append(("call", item["call_id"]))
        elif kind == "function_call_output":
            events.append(("tool", item["call_id"], item["output"]))
        elif item.get("role") == "assistant":
            events.append(("assistant", "".join(p["text"] for p in item["content"])))
        else:
            events.append((item["role"], item["content"]))
    return events


class OpenAIAgentsHarness:
    name = "openai_agents"

    def make(self, url: str, **kwargs: Any) -> ContextAssemblyInputFilter:
        return ContextAssemblyInputFilter(url, **kwargs)

    async def run(self, adapter: Any, fixture: dict[str, Any]) -> Observation:
        items = json.loads(json.dumps(fixture["recorded"]["openai_agents"]))  # the run may edit it
        model = RecordingModel(
            [Turn([text_output(ANSWER)], INPUT_TOKENS, OUTPUT_TOKENS, response_id="resp-agents")]
        )
        agent = AgentsAgent(
            name="orders",
            instructions=fixture["instructions"],
            model=adapter.model(model),
            tools=[function_tool(_lookup, name_override="lookup")],
        )
        config = adapter.run_config(tracing_disabled=True)
        result: RunResultBase
        if fixture["stream"]:
            result = Runner.run_streamed(agent, items, run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, items, run_config=config)
        call = model.calls[-1]
        return Observation(
            original=agents_events(fixture["recorded"]["openai_agents"]),
            seen=agents_events([_plain(item) for item in call.input]),
            instructions_seen=call.instructions or "",
            answer=str(result.final_output),
            report_id="resp-agents",
            input_tokens=result.context_wrapper.usage.input_tokens,
        )


def _plain(item: Any) -> dict[str, Any]:
    dump: Callable[..., dict[str, Any]] | None = getattr(item, "model_dump", None)
    return dump(exclude_none=True) if dump is not None else dict(item)


HARNESSES: list[Harness] = [LangChainHarness(), PydanticAIHarness(), OpenAIAgentsHarness()]
