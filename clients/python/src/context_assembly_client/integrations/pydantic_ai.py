"""Pydantic AI agents: a capability that prepares each model request attempt.

::

    from context_assembly_client.integrations.pydantic_ai import ContextAssemblyCapability

    agent = Agent(model, capabilities=[
        ContextAssemblyCapability("http://127.0.0.1:8080", template={"plugins": [...]}),
    ])

Pydantic AI names ``prepare_model_request`` as the hook for fitting the context window: it runs
before each *attempt* at a model request, once the model that will serve it is known (after a
fallback or a retry chose it), and its changes hold for that attempt only. The capability
prepares the request there and reports the response's usage in ``after_model_request``, which
ends the same attempt, on ``run``, ``run_sync`` and the streaming runs alike. This module only
maps between Pydantic AI's types and the neutral shape around the loop of :mod:`.preparer`:

- **In.** The model is the serving model's ``model_name`` (a wrapper model's innermost one),
  unless the template names one; the default ``scope`` is the run's conversation
  (``{"task_id": ctx.conversation_id}``: the ``conversation_id`` given to the run, else the one
  of the message history, else a new one per run). The instruction parts are ``instructions``.
  Each part of a ``ModelRequest`` is one neutral message: a ``SystemPromptPart`` system, a
  ``UserPromptPart`` user (text as text parts, images as ``image`` parts, other files ``file``
  parts, anything else ``opaque``), a tool return tool (its ``model_response_str()``, with the
  call's id), a retry without a tool user. A ``ModelResponse`` is one assistant message: its
  text parts, its tool calls, and the rest (thinking, provider-run tools, files) as ``opaque``
  parts counted by their text. The function and output tools are ``tools``.
- **Out.** The request's messages are rebuilt in frame order from the original parts (a message
  the service kept whole is the original object); the service's data messages become
  ``ModelRequest`` objects with one ``UserPromptPart``, and its per-turn developer messages what the
  service's own render for the model's provider makes of them: a ``SystemPromptPart``, sent in
  place with the system (or developer) role, for the OpenAI models (``OpenAIChatModel``,
  ``OpenAIResponsesModel``), and a ``UserPromptPart`` whose text starts with the line
  ``[developer instructions]`` for every other model (Anthropic's and Google's move a later
  system prompt into the system block, or refuse it). The leading system message becomes the
  instruction parts (the original ones, with the service's addition after them). Function tools
  come back in frame order; output tools keep their place. ``max_tokens`` in the model settings
  is the output limit the budget reserved, unless the settings already have a smaller one. These
  changes hold for the attempt only: the run's message history keeps the agent's messages.
- **Caches.** Only for ``AnthropicModel``: the plan's tools and instructions markers become the
  settings ``anthropic_cache_tool_definitions`` and ``anthropic_cache_instructions``. A marker
  that ends a message (``history``, ``end``) has no setting (Pydantic AI marks only user prompts,
  ``CachePoint``), and every marker for another model, is skipped and counted
  (``stats.cache_markers_skipped``). Only for the OpenAI models: ``prompt_cache_key`` and
  ``prompt_cache_retention`` become ``openai_prompt_cache_key`` and
  ``openai_prompt_cache_retention``.
- **Compaction** (docs/integrations.md#compaction). A provider's ``CompactionPart`` in a
  ``ModelResponse`` is a ``native`` part (Anthropic's with its summary, OpenAI's item with its
  id and encrypted content); a ``CompactionPart`` in a ``ModelRequest`` (a summary the
  application or the service wrote) is a user message of its text. ``mode: "report"``: a
  ``compact`` decision requests compaction for the attempt (``ctx.request_compaction``), which the
  agent's compaction capabilities (``compact_history``) carry out. ``mode: "native"``: the
  provider's compaction goes into the attempt's settings, ``anthropic_context_management`` and
  ``anthropic_betas`` for ``AnthropicModel``, ``openai_context_management`` for
  ``OpenAIResponsesModel`` (any other model goes without it, warned). ``mode: "summarize"``: the
  service's summary is sent as a ``CompactionPart`` in place of the messages it folded, and the
  capability's own ``compact_history`` commits it to the run's history. A cleared tool result
  is sent as a copy of its part with the service's text.
- **Usage.** The response's ``usage`` is reported as ``provider="normalized"`` (its
  ``input_tokens`` include cache reads and writes), with the provider's response id
  (``provider_response_id``) as ``report_id`` and ``response_id`` when there is one.

``contributions`` is called with the run context's ``deps``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai.capabilities import AbstractCapability, CompactionRequest, CompactionResult
from pydantic_ai.messages import (
    BaseToolCallPart,
    BaseToolReturnPart,
    BinaryContent,
    CachePoint,
    CompactionPart,
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
from pydantic_ai.models import Model, ModelRequestContext, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.tools import RunContext, ToolDefinition

from context_assembly_client.integrations.preparer import (
    AdapterStats,
    Carried,
    NativeApi,
    Prepared,
    PreparerAdapter,
    RuntimeCall,
    normalized_usage,
    with_native,
)

__all__ = ["ContextAssemblyCapability"]

COMPACTION_HANDLER = "context-assembly"
"""``CompactionResult.handler`` of the summaries the service wrote (``mode: "summarize"``)."""


class ContextAssemblyCapability(PreparerAdapter, AbstractCapability[Any]):
    """Prepares every model request attempt of a Pydantic AI agent with the context-assembly service.

    Args:
        client_or_base_url: the service's URL, or a ``Client`` / ``AsyncClient``.
        template: the prepare request without ``instructions``, ``history``, ``input`` and
            ``tools`` (``model`` overrides the serving model; ``render`` is always
            ``"neutral"``).
        contributions: ``contributions(deps)`` (sync or async) returns the inline sources, called
            with the run's dependencies before each model request attempt.
        fail_open: when the service fails, let the request go on unchanged (``False``: raise).
            A 4xx answer always raises.
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, with a URL.
        on_prepared: called with each prepare answer before the request (ids, manifest).
        on_compaction: called with the compaction decision before the request, when it is not
            ``none``.
    """

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built around a client and callables: not constructible from a spec

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        outcome = await self.preparer.arun(
            lambda: _call_of(request_context, ctx),
            ctx.deps,
            lambda prepared: _apply(request_context, prepared, self.stats),
        )
        if outcome is None:
            return request_context
        prepared_context, prepared = outcome
        self._remember(request_context, prepared)
        decided = prepared.compaction
        if decided is not None and decided.decision == "compact" and decided.mode != "native":
            # "report": the agent's compaction capabilities compact this attempt's history;
            # "summarize": this capability's compact_history commits the service's summary.
            ctx.request_compaction(reason="threshold")
        return prepared_context

    async def compact_history(
        self, ctx: RunContext[Any], request: CompactionRequest
    ) -> CompactionResult | None:
        """The service's summary (``mode: "summarize"``), which the attempt sends in place of
        the messages it folded, as the run's history from now on; ``None`` otherwise."""
        first = request.messages[0] if request.messages else None
        part = first.parts[0] if isinstance(first, ModelRequest) and first.parts else None
        if not isinstance(part, CompactionPart) or part.metadata != _SUMMARY_METADATA:
            return None
        return CompactionResult(
            messages=list(request.messages), part=part, handler=COMPACTION_HANDLER, kept_from=1
        )

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        prepared = self._take(request_context)
        if prepared is not None:
            self.preparer.reporting(lambda: self._send_usage(prepared, response))
        return response

    def _send_usage(self, prepared: Prepared, response: ModelResponse) -> None:
        usage = response.usage
        details = response.provider_details or {}
        diagnostics = details.get("diagnostics") or details.get("prompt_cache_diagnostics")
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
            response_id=response.provider_response_id,
            diagnostics=diagnostics if isinstance(diagnostics, Mapping) else None,
        )

    def _remember(self, context: ModelRequestContext, prepared: Prepared) -> None:
        self.__dict__.setdefault("_attempts", _Attempts()).remember(context, prepared)

    def _take(self, context: ModelRequestContext) -> Prepared | None:
        attempts: _Attempts | None = self.__dict__.get("_attempts")
        return attempts.take(context) if attempts is not None else None


class _Attempts:
    """The preparation of each attempt under way, by its request context (the object
    ``prepare_model_request`` gets is the one ``after_model_request`` gets); an attempt that
    fails without a response leaves its entry only until its context is collected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[weakref.ref[ModelRequestContext], Prepared]] = {}

    def remember(self, context: ModelRequestContext, prepared: Prepared) -> None:
        key = id(context)

        def forget(ref: weakref.ref[ModelRequestContext]) -> None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0] is ref:
                    del self._entries[key]

        with self._lock:
            self._entries[key] = (weakref.ref(context, forget), prepared)

    def take(self, context: ModelRequestContext) -> Prepared | None:
        with self._lock:
            entry = self._entries.get(id(context))
            if entry is None or entry[0]() is not context:
                return None
            del self._entries[id(context)]
        return entry[1]


# --------------------------------------------------------------------------- Pydantic AI -> neutral


def _serving(model: Model) -> Model:
    """The model under any wrapper models (instrumentation, a user's wrapper)."""
    while isinstance(model, WrapperModel):
        model = model.wrapped
    return model


def _instance_of(model: Model, module: str, *names: str) -> bool:
    """Whether ``model`` is one of ``module``'s classes ``names``, without importing ``module``
    (a model of those classes exists only once it is imported)."""
    loaded = sys.modules.get(module)
    classes = tuple(c for c in (getattr(loaded, n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(_serving(model), classes)


def is_anthropic(model: Model) -> bool:
    """Whether the serving model is an ``AnthropicModel`` (which reads ``anthropic_cache_*``)."""
    return _instance_of(model, "pydantic_ai.models.anthropic", "AnthropicModel")


def is_openai(model: Model) -> bool:
    """Whether the serving model is an ``OpenAIChatModel`` or an ``OpenAIResponsesModel``."""
    return _instance_of(
        model, "pydantic_ai.models.openai", "OpenAIChatModel", "OpenAIResponsesModel"
    )


_SUMMARY_METADATA = {"context_assembly": "summary"}
"""``CompactionPart.metadata`` of a summary the service wrote (never sent to the model)."""


def _native_api(model: Model) -> NativeApi | None:
    """The provider compaction the serving model takes in its settings."""
    if is_anthropic(model):
        return "anthropic"
    if _instance_of(model, "pydantic_ai.models.openai", "OpenAIResponsesModel"):
        return "openai-responses"
    return None


def _call_of(context: ModelRequestContext, ctx: RunContext[Any]) -> RuntimeCall:
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
    return RuntimeCall(
        _instructions(parameters) or "",
        messages,
        tools,
        model=_serving(context.model).model_name,
        conversation=ctx.conversation_id,
        native_compaction=_native_api(context.model),
    )


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
    if isinstance(part, CompactionPart):  # a summary the application or the service wrote
        return {"role": "user", "content": part.content or ""}
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
        elif isinstance(part, CompactionPart):
            content.append(_compaction(part))
        else:
            content.append({"type": "opaque", "kind": str(getattr(part, "part_kind", "part"))})
    neutral: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        neutral["tool_calls"] = calls
    return neutral


def _compaction(part: CompactionPart) -> dict[str, Any]:
    """A provider's compaction item as the service reads it: OpenAI's (an id and encrypted
    content) or Anthropic's block, whose summary is counted."""
    details = part.provider_details or {}
    if part.id is not None:
        item = {
            "type": "compaction",
            "id": part.id,
            "encrypted_content": details.get("encrypted_content"),
        }
        return {"type": "native", "format": "openai-responses", "item": item}
    native: dict[str, Any] = {
        "type": "native",
        "format": "anthropic",
        "item": {"type": "compaction", "content": part.content},
    }
    if part.content is not None:
        native["text"] = part.content
    return native


# --------------------------------------------------------------------------- frame -> Pydantic AI


def _apply(
    context: ModelRequestContext, prepared: Prepared, stats: AdapterStats
) -> ModelRequestContext:
    parameters = context.model_request_parameters
    openai, anthropic = is_openai(context.model), is_anthropic(context.model)
    settings: dict[str, Any] = dict(context.model_settings or {})
    limit = prepared.limit_within(settings.get("max_tokens"))
    if limit is not None:
        settings["max_tokens"] = limit
    for point in prepared.breakpoints:
        if anthropic and point.after == "tools":
            settings["anthropic_cache_tool_definitions"] = point.ttl
        elif anthropic and point.after == "instructions":
            settings["anthropic_cache_instructions"] = point.ttl
        else:
            stats.add("cache_markers_skipped")
    if openai and prepared.prompt_cache_key is not None:
        settings["openai_prompt_cache_key"] = prepared.prompt_cache_key
    if openai and prepared.prompt_cache_retention is not None:
        settings["openai_prompt_cache_retention"] = prepared.prompt_cache_retention
    api = _native_api(context.model)
    if prepared.native is not None and api == "anthropic":
        current = settings.get("anthropic_context_management")
        settings["anthropic_context_management"] = with_native(prepared.native, api, current)
        betas = list(settings.get("anthropic_betas") or [])
        if prepared.native.beta is not None and prepared.native.beta not in betas:
            betas.append(prepared.native.beta)
        settings["anthropic_betas"] = betas
    elif prepared.native is not None and api == "openai-responses":
        current = settings.get("openai_context_management")
        settings["openai_context_management"] = with_native(prepared.native, api, current)
    summary = prepared.compaction.summary if prepared.compaction is not None else None
    if summary is not None and _opens_with_system_prompt(context.messages):
        # The fold starts at the history's head, so it took the agent's system prompt in too:
        # the summary is sent for this attempt only, never committed in the prompt's place.
        summary = None
    instructions = parameters.instruction_parts
    messages: list[ModelMessage] = []
    pending: list[tuple[ModelRequest, Any]] = []  # consecutive parts of one original request
    for item in prepared.messages:
        if item.origin is None:
            if item.index == 0 and item.neutral["role"] == "system":
                instructions = _instruction_parts(parameters, item.neutral["content"], prepared)
                continue
            _flush(pending, messages)
            if summary is not None and item.neutral == summary:
                messages.append(_summary(item.neutral["content"]))
                continue
            messages.append(_added(item.neutral["role"], item.neutral["content"], openai))
            continue
        message, part = item.origin
        if item.rewritten and part is not None:
            part = dataclasses.replace(part, content=item.neutral["content"])
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


def _added(role: str, text: str, openai: bool) -> ModelRequest:
    """A message the service added, after the leading one, in the serving model's provider's
    terms: a data message is a user prompt; a per-turn developer message a system prompt in place
    for OpenAI, a user prompt opening with the service's marker line elsewhere, as the service's
    renders do."""
    if role == "user":
        return ModelRequest(parts=[UserPromptPart(text)])
    if openai:
        return ModelRequest(parts=[SystemPromptPart(text)])
    return ModelRequest(parts=[UserPromptPart(f"[{role} instructions]\n{text}")])


def _opens_with_system_prompt(messages: Sequence[ModelMessage]) -> bool:
    first = messages[0] if messages else None
    return (
        isinstance(first, ModelRequest)
        and bool(first.parts)
        and isinstance(first.parts[0], SystemPromptPart)
    )


def _summary(text: str) -> ModelRequest:
    """The service's summary as Pydantic AI holds a summary the application wrote: a
    ``CompactionPart`` of its own request, which :meth:`ContextAssemblyCapability.compact_history`
    commits to the run's history."""
    return ModelRequest(parts=[CompactionPart(text, metadata=dict(_SUMMARY_METADATA))])


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
