"""A recording model for the OpenAI Agents SDK: an implementation of the SDK's ``Model`` interface
that answers with scripted output items and keeps what each call received."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import ModelResponse, ModelSettings, Tool, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


def text_output(text: str, item_id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", type="function_call", call_id=call_id, name=name, arguments=arguments
    )


@dataclass
class Turn:
    """One scripted answer: output items and the usage the provider would report."""

    output: Sequence[TResponseOutputItem]
    input_tokens: int = 100
    output_tokens: int = 10
    cached_tokens: int = 0
    response_id: str = "resp_1"


@dataclass
class Call:
    instructions: str | None
    input: list[Any]  # as the SDK gave them: its input dicts, or its pydantic items
    tools: list[str]
    settings: ModelSettings


@dataclass
class RecordingModel(Model):
    """Answers with ``turns`` in order and records every call's instructions, input and tools."""

    turns: list[Turn]
    calls: list[Call] = field(default_factory=list)

    def _next(
        self,
        instructions: str | None,
        input: str | list[TResponseInputItem],
        tools: list[Tool],
        settings: ModelSettings,
    ) -> Turn:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.calls.append(Call(instructions, items, [t.name for t in tools], settings))
        return self.turns[len(self.calls) - 1]

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> ModelResponse:
        turn = self._next(system_instructions, input, tools, model_settings)
        usage = Usage(
            requests=1,
            input_tokens=turn.input_tokens,
            output_tokens=turn.output_tokens,
            total_tokens=turn.input_tokens + turn.output_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=turn.cached_tokens, cache_write_tokens=0
            ),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )
        return ModelResponse(output=list(turn.output), usage=usage, response_id=turn.response_id)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        turn = self._next(system_instructions, input, tools, model_settings)
        response = Response(
            id=turn.response_id,
            created_at=0,
            model="fake",
            object="response",
            output=list(turn.output),
            parallel_tool_calls=True,
            tool_choice="auto",
            tools=[],
            usage=ResponseUsage(
                input_tokens=turn.input_tokens,
                output_tokens=turn.output_tokens,
                total_tokens=turn.input_tokens + turn.output_tokens,
                input_tokens_details=InputTokensDetails(
                    cached_tokens=turn.cached_tokens, cache_write_tokens=0
                ),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            ),
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )
