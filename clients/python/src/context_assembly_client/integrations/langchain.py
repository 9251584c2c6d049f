"""LangChain v1 agents (``langchain.agents.create_agent``): an ``AgentMiddleware``.

::

    from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware

    agent = create_agent(model, tools, middleware=[
        ContextAssemblyMiddleware("http://127.0.0.1:8080", template={"plugins": [...]}),
    ])

``wrap_model_call`` / ``awrap_model_call`` see each model call of the agent (``invoke``,
``ainvoke`` and the streaming paths alike), with the model the call goes to (``request.model``,
after any middleware before it chose one), and run the loop of :mod:`.preparer`. This module only
maps between LangChain's types and the neutral shape:

- **In.** The model is ``request.model``'s name (``ChatOpenAI.model_name``,
  ``ChatAnthropic.model``, else a ``model_name`` / ``model`` / ``model_id`` attribute), unless the
  template names one; the default ``scope`` is the LangGraph thread (``{"task_id": thread_id}``,
  when the agent runs with a checkpointer and a ``thread_id``). ``request.system_message`` is
  ``instructions``; ``SystemMessage`` / ``HumanMessage`` / ``AIMessage`` / ``ToolMessage`` are
  system / user / assistant / tool (an ``AIMessage``'s ``tool_calls`` its tool calls, with their
  ``args`` as the arguments object). Text blocks are text parts; image blocks are ``image``
  parts, file, audio, video and document blocks ``file`` parts; any other block (reasoning,
  thinking, provider items) is an ``opaque`` part counted by its text, if it has one. A
  ``tool_use`` / ``tool_call`` block that repeats one of the message's ``tool_calls`` is left to
  them. Tools are ``request.tools`` that ``convert_to_openai_tool`` reads; other dict tools (a
  provider's built-in tools) are not sent and keep their place after the others.
- **Out.** The messages come back in frame order as the runtime's own objects; the service's
  leading system message becomes ``system_message`` (the original object when its text is
  unchanged); its data messages become ``HumanMessage``s, and its per-turn developer messages
  what the service's own render for the model's provider makes of them: a ``SystemMessage`` sent
  with the ``developer`` role for the OpenAI classes (``BaseChatOpenAI``), a ``HumanMessage``
  whose text starts with the line ``[developer instructions]`` for every other class (Anthropic
  and Gemini refuse or move a system message after the first turn). Tools come back in frame
  order. ``max_tokens`` in ``model_settings`` is the output limit the budget reserved, unless
  the call's settings or the model already have a smaller one.
- **Caches.** Only for ``ChatAnthropic`` (as ``AnthropicPromptCachingMiddleware`` checks): the
  plan's markers become ``cache_control`` on the last content block of the marked message (a
  string content becomes one text block), as ``langchain-anthropic`` reads it, and
  ``extras["cache_control"]`` on the last tool when it is a ``BaseTool``. A marker without a
  place (an ``AIMessage`` that only calls tools), and every marker for another class, is skipped
  and counted (``stats.cache_markers_skipped``). Only for the OpenAI classes:
  ``prompt_cache_key`` and ``prompt_cache_retention`` go into ``model_settings``, which the agent
  binds to the model as call arguments.
- **Compaction** (docs/integrations.md#compaction). A ``compaction`` content block (Anthropic's,
  or a Responses compaction item in ``ChatOpenAI``'s content) is a ``native`` part, so that the
  service reads the history as the provider does. Each call's decision goes into the agent's
  state as ``context_assembly_compaction`` (the report as a dict), for a ``before_model`` hook
  of the application's to act on. ``mode: "native"`` writes the provider's compaction into the
  call's settings: ``context_management`` and the ``betas`` it needs for ``ChatAnthropic``,
  ``context_management`` for ``ChatOpenAI`` on the Responses API (any other class goes without
  it, warned). A summary (``summarize``) replaces the messages it folded in the agent's state;
  a cleared tool result is sent as a copy of the ``ToolMessage`` with the service's text.
- **Usage.** The first ``AIMessage`` of the answer's ``usage_metadata`` is reported as
  ``provider="normalized"`` (``input_tokens`` already sums cached and cache-creation tokens), with
  the message id as ``report_id``, the provider's response id (``response_metadata["id"]``) as
  ``response_id`` and its cache diagnostics (``response_metadata["diagnostics"]`` or
  ``["prompt_cache_diagnostics"]``) when there are some.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NotRequired, TypeVar

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command

from context_assembly_client.integrations.preparer import (
    AdapterStats,
    Carried,
    IntegrationError,
    NativeApi,
    Prepared,
    PreparerAdapter,
    RuntimeCall,
    cache_control,
    normalized_usage,
    text_of,
    with_native,
)
from context_assembly_client.types import NativeDirective

__all__ = ["COMPACTION_KEY", "ContextAssemblyMiddleware", "ContextAssemblyState"]

COMPACTION_KEY = "context_assembly_compaction"
"""The agent state's key for the compaction decision of the latest model call."""

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_NEUTRAL_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})
_FILE_BLOCKS = frozenset({"file", "document", "audio", "video", "text-plain", "input_file"})
_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})
_UNMARKABLE = frozenset({"thinking", "redacted_thinking", "reasoning"} | _CALL_BLOCKS)
_MODEL_ATTRIBUTES = ("model_name", "model", "model_id")

ModelResult = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]
MessageT = TypeVar("MessageT", bound=BaseMessage)


class ContextAssemblyState(AgentState[Any]):
    """The agent's state with the compaction decision of its latest model call."""

    context_assembly_compaction: NotRequired[dict[str, Any] | None]
    """``selection.compaction`` of the latest prepared call, as a dict (``None``: that call went
    out unprepared)."""


class ContextAssemblyMiddleware(PreparerAdapter, AgentMiddleware[ContextAssemblyState, Any, Any]):
    """Prepares every model call of a LangChain agent with the context-assembly service.

    Args:
        client_or_base_url: the service's URL, or a ``Client`` / ``AsyncClient``.
        template: the prepare request without ``instructions``, ``history``, ``input`` and
            ``tools`` (``model`` overrides the model of the call; ``render`` is always
            ``"neutral"``).
        contributions: ``contributions(state)`` (sync, or async for ``ainvoke``/``astream``)
            returns the inline sources, called with the agent's state before each model call.
        fail_open: when the service fails, let the model call go on unchanged (``False``: raise).
            A 4xx answer always raises.
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, with a URL.
        on_prepared: called with each prepare answer before the model call (ids, manifest).
        on_compaction: called with the compaction decision before the model call, when it is not
            ``none``.
    """

    state_schema = ContextAssemblyState

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResult:
        outcome = self.preparer.run(
            lambda: _call_of(request), request.state, lambda p: _apply(request, p, self.stats)
        )
        if outcome is None:
            return _unprepared(request, handler(request))
        prepared_request, prepared = outcome
        response = handler(prepared_request)
        self._report(prepared, response)
        return _with_state(request, prepared, response)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResult:
        outcome = await self.preparer.arun(
            lambda: _call_of(request), request.state, lambda p: _apply(request, p, self.stats)
        )
        if outcome is None:
            return _unprepared(request, await handler(request))
        prepared_request, prepared = outcome
        response = await handler(prepared_request)
        self._report(prepared, response)
        return _with_state(request, prepared, response)

    def _report(self, prepared: Prepared, response: ModelResult) -> None:
        self.preparer.reporting(lambda: self._send_usage(prepared, response))

    def _send_usage(self, prepared: Prepared, response: ModelResult) -> None:
        message = _answer(response)
        if message is None or not message.usage_metadata:
            return
        meta = message.usage_metadata
        details = meta.get("input_token_details") or {}
        usage = normalized_usage(
            input_tokens=meta.get("input_tokens"),
            output_tokens=meta.get("output_tokens"),
            cached_input_tokens=details.get("cache_read"),
            cache_creation_input_tokens=details.get("cache_creation"),
        )
        metadata = message.response_metadata or {}
        response_id = metadata.get("id")
        diagnostics = metadata.get("diagnostics") or metadata.get("prompt_cache_diagnostics")
        self.preparer.report_usage(
            prepared,
            provider="normalized",
            usage=usage,
            report_id=message.id,
            response_id=response_id if isinstance(response_id, str) else None,
            diagnostics=diagnostics if isinstance(diagnostics, Mapping) else None,
        )


# --------------------------------------------------------------------------- LangChain -> neutral


def _call_of(request: ModelRequest[Any]) -> RuntimeCall:
    tools = []
    for tool in request.tools:
        neutral = _tool(tool)
        if neutral is not None:
            tools.append(Carried(neutral, tool))
    return RuntimeCall(
        instructions=str(request.system_prompt or ""),
        messages=[Carried(_message(message), message) for message in request.messages],
        tools=tools,
        model=model_name(request.model),
        conversation=_thread(request),
        native_compaction=_native_api(request.model),
    )


def _native_api(model: Any) -> NativeApi | None:
    """The provider compaction the model's class carries in its call settings: Anthropic's for
    ``ChatAnthropic``, Responses' for an OpenAI class that sends through the Responses API."""
    if is_anthropic(model):
        return "anthropic"
    if is_openai(model):
        chosen = getattr(model, "use_responses_api", None)
        if isinstance(chosen, bool):
            return "openai-responses" if chosen else None
        # ChatOpenAI's own choice when unset (adding context_management would switch the API).
        choose = getattr(model, "_use_responses_api", None)
        return "openai-responses" if callable(choose) and choose({}) is True else None
    return None


def model_name(model: Any) -> str:
    """The name of a LangChain chat model, as the service's registry knows it:
    ``ChatOpenAI.model_name``, ``ChatAnthropic.model``, else the first string of ``model_name``,
    ``model`` or ``model_id``; the class name when there is none."""
    for attribute in _MODEL_ATTRIBUTES:
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def _thread(request: ModelRequest[Any]) -> str | None:
    """The LangGraph thread of the run (with a checkpointer), else ``None``."""
    info = getattr(request.runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    return thread if isinstance(thread, str) and thread else None


def _instance_of(model: Any, module: str, name: str) -> bool:
    """``isinstance(model, module.name)`` without importing ``module``: a model of that class
    exists only once its module is imported."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(model, cls)


def is_anthropic(model: Any) -> bool:
    """Whether ``model`` is a ``ChatAnthropic`` (which reads ``cache_control``)."""
    return _instance_of(model, "langchain_anthropic.chat_models", "ChatAnthropic")


def is_openai(model: Any) -> bool:
    """Whether ``model`` is one of the OpenAI classes (``ChatOpenAI``, ``AzureChatOpenAI``)."""
    return _instance_of(model, "langchain_openai.chat_models.base", "BaseChatOpenAI")


def _tool(tool: BaseTool | dict[str, Any]) -> dict[str, Any] | None:
    try:
        function = convert_to_openai_tool(tool).get("function")
    except (TypeError, ValueError, KeyError):
        return None
    if not isinstance(function, Mapping) or not function.get("name"):
        return None  # a provider's built-in tool: nothing the service can count or order
    return {
        "name": function["name"],
        "description": function.get("description") or "",
        "parameters": function.get("parameters") or {},
    }


def _message(message: BaseMessage) -> dict[str, Any]:
    role = message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type)
    if role not in _NEUTRAL_ROLES:
        raise IntegrationError(f"a {type(message).__name__} has no neutral role")
    call_ids: set[str] = set()
    neutral: dict[str, Any] = {"role": role}
    if isinstance(message, AIMessage) and message.tool_calls:
        calls: list[dict[str, Any]] = [
            {"id": call.get("id") or "", "name": call["name"], "arguments": call.get("args", {})}
            for call in message.tool_calls
        ]
        call_ids = {call["id"] for call in calls}
        neutral["content"] = _content(message.content, call_ids)
        neutral["tool_calls"] = calls
    else:
        neutral["content"] = _content(message.content, call_ids)
    if isinstance(message, ToolMessage):
        neutral["tool_call_id"] = message.tool_call_id
    elif message.name and role in ("user", "assistant"):
        neutral["name"] = message.name
    return neutral


def _content(content: str | list[Any], call_ids: set[str]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
            continue
        if not isinstance(block, Mapping):
            parts.append({"type": "opaque", "kind": type(block).__name__})
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind in _CALL_BLOCKS and (block.get("id") or block.get("call_id")) in call_ids:
            continue  # the same call is one of the message's tool_calls
        elif kind == "compaction":
            parts.append(_compaction(block))
        elif kind in _IMAGE_BLOCKS:
            parts.append({"type": "image"})
        elif kind in _FILE_BLOCKS:
            parts.append({"type": "file"})
        else:
            parts.append(_opaque(str(kind), block))
    return parts


def _compaction(block: Mapping[str, Any]) -> dict[str, Any]:
    """A provider's compaction item as the service reads it: a Responses item (it has an ``id``)
    or Anthropic's block, whose summary text is counted."""
    item = {key: value for key, value in block.items() if key not in ("index", "cache_control")}
    if item.get("id"):
        return {"type": "native", "format": "openai-responses", "item": item}
    part: dict[str, Any] = {"type": "native", "format": "anthropic", "item": item}
    if isinstance(item.get("content"), str):
        part["text"] = item["content"]
    return part


def _opaque(kind: str, block: Mapping[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "opaque", "kind": kind}
    for key in ("text", "thinking", "reasoning"):
        if isinstance(block.get(key), str):
            part["text"] = block[key]
            break
    return part


# --------------------------------------------------------------------------- frame -> LangChain


def _apply(
    request: ModelRequest[Any], prepared: Prepared, stats: AdapterStats
) -> ModelRequest[Any]:
    openai, anthropic = is_openai(request.model), is_anthropic(request.model)
    system: SystemMessage | None = None
    by_index: dict[int, AnyMessage] = {}
    for item in prepared.messages:
        if item.origin is not None:
            by_index[item.index] = (
                item.origin.model_copy(update={"content": item.neutral["content"]})
                if item.rewritten
                else item.origin
            )
            continue
        text = item.neutral["content"]
        role = item.neutral["role"]
        if item.index == 0 and role == "system":
            unchanged = request.system_message is not None and str(request.system_prompt) == text
            system = request.system_message if unchanged else SystemMessage(content=text)
        else:
            by_index[item.index] = _added(role, text, openai)
    tools = list(prepared.tools)
    settings = dict(request.model_settings)
    limit = prepared.limit_within(
        settings.get("max_tokens"),
        settings.get("max_completion_tokens"),
        getattr(request.model, "max_tokens", None),
    )
    if limit is not None:
        settings["max_tokens"] = limit
    api = _native_api(request.model)
    if prepared.native is not None and api is not None:
        _write_native(settings, request.model, prepared.native, api)
    if openai:
        if prepared.prompt_cache_key is not None:
            settings["prompt_cache_key"] = prepared.prompt_cache_key
        if prepared.prompt_cache_retention is not None:
            settings["prompt_cache_retention"] = prepared.prompt_cache_retention
    for point in prepared.breakpoints if anthropic else ():
        if point.message is None:
            marked_tool = _marked_tool(tools[-1], point.ttl) if tools else None
            if marked_tool is None:
                stats.add("cache_markers_skipped")
            else:
                tools[-1] = marked_tool
            continue
        target = (
            system if point.message == 0 and system is not None else by_index.get(point.message)
        )
        marked = _marked(target, point.ttl) if target is not None else None
        if marked is None:
            stats.add("cache_markers_skipped")
        elif isinstance(marked, SystemMessage) and target is system:
            system = marked
        else:
            by_index[point.message] = marked
    if not anthropic and prepared.breakpoints:
        stats.add("cache_markers_skipped", len(prepared.breakpoints))
    sent = {id(tool) for tool in prepared.tools}
    kept = [tool for tool in request.tools if id(tool) not in sent]  # not sent: built-in tools
    return request.override(
        system_message=system,
        messages=[by_index[index] for index in sorted(by_index)],
        tools=[*tools, *kept],
        model_settings=settings,
    )


def _write_native(
    settings: dict[str, Any], model: Any, directive: NativeDirective, api: NativeApi
) -> None:
    """The provider's compaction in the call's settings, which the agent binds as call arguments
    and which take the place of the model's own ``context_management`` / ``betas`` (so those are
    kept in them)."""
    kwargs = getattr(model, "model_kwargs", None) or {}
    current = settings.get(
        "context_management",
        kwargs.get("context_management", getattr(model, "context_management", None)),
    )
    if api == "anthropic":
        settings["context_management"] = with_native(directive, "anthropic", current)
        betas = list(
            settings.get("betas") or kwargs.get("betas") or getattr(model, "betas", None) or []
        )
        if directive.beta is not None and directive.beta not in betas:
            betas.append(directive.beta)
        settings["betas"] = betas
    else:
        settings["context_management"] = with_native(directive, api, current)


def _with_state(
    request: ModelRequest[Any], prepared: Prepared, response: ModelResponse[Any]
) -> ModelResult:
    """The answer with the call's compaction decision for the agent's state and, when the service
    folded history into a summary, the state's messages with the summary in their place."""
    decided = prepared.compaction
    if decided is None:
        return response
    update: dict[str, Any] = {COMPACTION_KEY: decided.model_dump(mode="json")}
    folded = _folded(request, prepared)
    if folded is not None:
        update["messages"] = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *folded, *response.result]
    return ExtendedModelResponse(model_response=response, command=Command(update=update))


def _unprepared(request: ModelRequest[Any], response: ModelResponse[Any]) -> ModelResult:
    """The answer of a call that went out unprepared: an earlier call's decision in the state is
    cleared, so that nothing acts on it twice."""
    if request.state.get(COMPACTION_KEY) is None:
        return response
    return ExtendedModelResponse(
        model_response=response, command=Command(update={COMPACTION_KEY: None})
    )


def _folded(request: ModelRequest[Any], prepared: Prepared) -> list[AnyMessage] | None:
    """The state's messages with the summary in place of the ones it folded (``summarize``), or
    ``None`` when nothing was folded or the folded messages are not the state's own."""
    decided = prepared.compaction
    if decided is None or not decided.folded_messages or decided.summary is None:
        return None
    start = decided.folded_from
    folded = request.messages[start : start + decided.folded_messages]
    state: list[Any] = list(request.state.get("messages") or [])
    if not folded or not any(m is folded[-1] for m in state):
        return None
    if not any(m is folded[0] for m in state):
        return None
    first = next(index for index, m in enumerate(state) if m is folded[0])
    after = next(index for index, m in enumerate(state) if m is folded[-1]) + 1
    summary = HumanMessage(content=text_of(decided.summary.get("content", "")))
    return [*state[:first], summary, *state[after:]]


def _added(role: str, text: str, openai: bool) -> AnyMessage:
    """A message the service added, after the leading one, in the model's provider's terms: a
    data message is a user message; a per-turn developer message keeps its role for OpenAI and is
    a user message opening with the service's marker line elsewhere, as the service's renders do."""
    if role == "user":
        return HumanMessage(content=text)
    if openai:
        return SystemMessage(content=text, additional_kwargs={"__openai_role__": "developer"})
    return HumanMessage(content=f"[{role} instructions]\n{text}")


def _marked(message: MessageT, ttl: str) -> MessageT | None:
    """A copy of ``message`` whose last content block carries ``cache_control``, or ``None``."""
    content: Sequence[Any] = message.content
    if isinstance(content, str):
        content = [content] if content else []
    if not content:
        return None
    last = content[-1]
    if isinstance(last, str):
        last = {"type": "text", "text": last}
    if not isinstance(last, Mapping) or last.get("type") in _UNMARKABLE:
        return None
    blocks = [*content[:-1], {**last, "cache_control": cache_control(ttl)}]
    return message.model_copy(update={"content": blocks})


def _marked_tool(tool: Any, ttl: str) -> BaseTool | None:
    if not isinstance(tool, BaseTool):
        return None
    return tool.model_copy(
        update={"extras": {**(tool.extras or {}), "cache_control": cache_control(ttl)}}
    )


def _answer(response: ModelResult) -> AIMessage | None:
    if isinstance(response, AIMessage):
        return response
    if isinstance(response, ExtendedModelResponse):
        response = response.model_response
    return next((m for m in response.result if isinstance(m, AIMessage)), None)
