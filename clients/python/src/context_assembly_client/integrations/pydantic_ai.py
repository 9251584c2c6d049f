"""Pydantic AI agents: a capability around each model request (``wrap_model_request``).

::

    from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability

    agent = Agent(model, capabilities=[
        ContextAssemblyCapability("http://127.0.0.1:8080", template={"model": "gpt-4o-mini"}),
    ])

The hook sees the request's messages, its tool definitions and instructions
(``model_request_parameters``) and its model settings, and gets the model's response with its
usage, on ``run``, ``run_sync`` and the streaming runs alike. This module only maps between
Pydantic AI's types and the neutral shape around the loop of :mod:`.preparer`:

- **In.** The instruction parts are ``instructions``. Each part of a ``ModelRequest`` is one
  neutral message: a ``SystemPromptPart`` system, a ``UserPromptPart`` user (text as text parts,
  images as ``image`` parts, other files ``file`` parts, anything else ``opaque``), a tool return
  tool (its ``model_response_str()``, with the call's id), a retry without a tool user. A
  ``ModelResponse`` is one assistant message: its text parts, its tool calls, and the rest
  (thinking, provider-run tools, files) as ``opaque`` parts counted by their text. The function
  and output tools are ``tools``.
- **Out.** The request's messages are rebuilt in frame order from the original parts (a message
  the service kept whole is the original object); the service's developer (per-turn) and data
  messages become ``ModelRequest``s with one ``UserPromptPart`` each: models treat a
  ``SystemPromptPart`` after the first request each their own way (hoisted into the system
  block, tagged, or sent in place), while a user prompt is sent where it stands on every model.
  The leading system message becomes the instruction parts (the original ones, with the
  service's addition after them). Function tools come back in frame order; output tools keep
  their place. These changes hold for the request only: the run's message history keeps the
  agent's messages (its recorded instructions are what was sent).
- **Caches.** The plan's Anthropic markers become the model settings
  ``anthropic_cache_tool_definitions`` (the tools marker) and ``anthropic_cache_instructions``
  (the instructions marker). The history marker ends the last history message, an assistant
  message or a tool return (the user turn is input), and Pydantic AI marks only user prompts
  (``CachePoint``): that marker is skipped and counted (``stats.cache_markers_skipped``).
  ``prompt_cache_key`` and ``prompt_cache_retention`` become ``openai_prompt_cache_key`` and
  ``openai_prompt_cache_retention``; each model reads its own settings and ignores the others.
- **Usage.** The response's ``usage`` is reported as ``provider="normalized"`` (its
  ``input_tokens`` include cache reads and writes), with the provider's response id as
  ``report_id`` when there is one.

``contributions`` is called with the run context's ``deps``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import WrapModelRequestHandler
from pydantic_ai.messages import (
    BaseToolCallPart,
    BaseToolReturnPart,
    BinaryContent,
    CachePoint,
    FilePart,
    FileUrl,
    ImageUrl,
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryFeedbackPart,
    RetryPromptPart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
from pydantic_ai.tools import RunContext, ToolDefinition

from context_assembly_client.integrations.preparer import (
    AdapterStats,
    Carried,
    Prepared,
    PreparerAdapter,
    RuntimeCall,
    normalized_usage,
)

__all__ = ["ContextAssemblyCapability"]


class ContextAssemblyCapability(PreparerAdapter, AbstractCapability[Any]):
    """Prepares every model request of a Pydantic AI agent with the context-assembly service.

    Args:
        client_or_base_url: the service's URL, or a ``Client`` / ``AsyncClient``.
        template: the prepare request without ``instructions``, ``history``, ``input`` and
            ``tools`` (``model`` at least; ``render`` is always ``"neutral"``).
        contributions: ``contributions(deps)`` (sync or async) returns the inline sources, called
            with the run's dependencies before each model request.
        fail_open: when the service fails, let the request go on unchanged (``False``: raise).
            A 4xx answer always raises.
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, with a URL.
        on_prepared: called with each prepare answer before the request (ids, manifest).
    """

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built around a client and callables: not constructible from a spec

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        outcome = await self.preparer.arun(
            lambda: _call_of(request_context),
            ctx.deps,
            lambda prepared: _apply(request_context, prepared, self.stats),
        )
        if outcome is None:
            return await handler(request_context)
        prepared_context, prepared = outcome
        response = await handler(prepared_context)
        usage = response.usage
        self.preparer.report_usage(
            prepared,
            provider="normalized",
            usage=normalized_usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_input_tokens=usage.cache_read_tokens,
                cache_creation_input_tokens=usage.cache_write_tokens,
            ),
            report_id=response.provider_response_id,
        )
        return response


# --------------------------------------------------------------------------- Pydantic AI -> neutral


def _call_of(context: ModelRequestContext) -> RuntimeCall:
    parameters = context.model_request_parameters
    messages: list[Carried] = []
    for message in context.messages:
        if isinstance(message, ModelRequest):
            messages.extend(Carried(_request_part(part), (message, part)) for part in message.parts)
        else:
            messages.append(Carried(_response(message), (message, None)))
    tools = [
        Carried(_tool(tool), tool)
        for tool in [*parameters.function_tools, *parameters.output_tools]
    ]
    return RuntimeCall(_instructions(parameters) or "", messages, tools)


def _instructions(parameters: ModelRequestParameters) -> str | None:
    return InstructionPart.join(parameters.instruction_parts or [])


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.parameters_json_schema,
    }


def _request_part(part: Any) -> dict[str, Any]:
    if isinstance(part, SystemPromptPart):
        return {"role": "system", "content": part.content}
    if isinstance(part, UserPromptPart):
        return {"role": "user", "content": _user_content(part.content)}
    if isinstance(part, BaseToolReturnPart):
        return {
            "role": "tool",
            "tool_call_id": part.tool_call_id,
            "content": part.model_response_str(),
        }
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:
        return {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response()}
    if isinstance(part, RetryFeedbackPart | RetryPromptPart):
        return {"role": "user", "content": part.model_response()}
    kind = getattr(part, "part_kind", type(part).__name__)
    return {"role": "user", "content": [{"type": "opaque", "kind": str(kind)}]}


def _user_content(content: str | Sequence[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            parts.append({"type": "text", "text": item})
        elif isinstance(item, TextContent):
            parts.append({"type": "text", "text": item.content})
        elif isinstance(item, CachePoint):
            continue  # a marker, not content
        elif isinstance(item, ImageUrl) or (isinstance(item, BinaryContent) and item.is_image):
            parts.append({"type": "image"})
        elif isinstance(item, FileUrl | BinaryContent):
            parts.append({"type": "file"})
        else:
            parts.append({"type": "opaque", "kind": type(item).__name__})
    return parts


def _response(message: ModelResponse) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.content})
        elif isinstance(part, NativeToolCallPart | NativeToolReturnPart):
            content.append({"type": "opaque", "kind": part.part_kind})
        elif isinstance(part, BaseToolCallPart):
            calls.append(
                {"id": part.tool_call_id, "name": part.tool_name, "arguments": part.args or ""}
            )
        elif isinstance(part, ThinkingPart):
            content.append({"type": "opaque", "kind": "thinking", "text": part.content})
        elif isinstance(part, FilePart):
            content.append({"type": "image" if part.content.is_image else "file"})
        else:
            content.append({"type": "opaque", "kind": str(getattr(part, "part_kind", "part"))})
    neutral: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        neutral["tool_calls"] = calls
    return neutral


# --------------------------------------------------------------------------- frame -> Pydantic AI


def _apply(
    context: ModelRequestContext, prepared: Prepared, stats: AdapterStats
) -> ModelRequestContext:
    parameters = context.model_request_parameters
    settings: dict[str, Any] = dict(context.model_settings or {})
    for point in prepared.breakpoints:
        if point.after == "tools":
            settings["anthropic_cache_tool_definitions"] = point.ttl
        elif point.after == "instructions":
            settings["anthropic_cache_instructions"] = point.ttl
        else:
            stats.add("cache_markers_skipped")
    if prepared.prompt_cache_key is not None:
        settings["openai_prompt_cache_key"] = prepared.prompt_cache_key
    if prepared.prompt_cache_retention is not None:
        settings["openai_prompt_cache_retention"] = prepared.prompt_cache_retention
    instructions = parameters.instruction_parts
    messages: list[ModelMessage] = []
    pending: list[tuple[ModelRequest, Any]] = []  # consecutive parts of one original request
    for item in prepared.messages:
        if item.origin is None:
            if item.index == 0 and item.neutral["role"] == "system":
                instructions = _instruction_parts(parameters, item.neutral["content"], prepared)
                continue
            _flush(pending, messages)
            messages.append(ModelRequest(parts=[UserPromptPart(item.neutral["content"])]))
            continue
        message, part = item.origin
        if part is None:  # a whole ModelResponse
            _flush(pending, messages)
            messages.append(message)
            continue
        if pending and pending[-1][0] is not message:
            _flush(pending, messages)
        pending.append((message, part))
    _flush(pending, messages)
    function_names = {tool.name for tool in parameters.function_tools}
    function_tools = [tool for tool in prepared.tools if tool.name in function_names]
    new_parameters = dataclasses.replace(
        parameters, function_tools=function_tools, instruction_parts=instructions
    )
    return dataclasses.replace(
        context,
        messages=messages,
        model_settings=settings,  # type: ignore[arg-type]
        model_request_parameters=new_parameters,
    )


def _flush(pending: list[tuple[ModelRequest, Any]], messages: list[ModelMessage]) -> None:
    """Close a run of parts of one original request: the original, or a copy with those parts."""
    if not pending:
        return
    original = pending[0][0]
    parts = [part for _, part in pending]
    whole = len(parts) == len(original.parts) and all(
        a is b for a, b in zip(parts, original.parts, strict=True)
    )
    messages.append(original if whole else dataclasses.replace(original, parts=parts))
    pending.clear()


def _instruction_parts(
    parameters: ModelRequestParameters, leading: str, prepared: Prepared
) -> list[InstructionPart]:
    """The frame's leading system text as instruction parts, keeping the original ones."""
    original = list(parameters.instruction_parts or [])
    joined = _instructions(parameters)
    if joined is None:
        return [InstructionPart(leading, dynamic=prepared.response.layout == "legacy")]
    if leading == joined:
        return original
    if leading.startswith(joined):
        addition = leading[len(joined) :].lstrip("\n")
        return [*original, InstructionPart(addition, dynamic=prepared.response.layout == "legacy")]
    return [InstructionPart(leading, dynamic=True)]
