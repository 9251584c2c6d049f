"""The OpenAI Agents SDK: the model call itself, through a wrapping ``Model``.

::

    from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter

    ca = ContextAssemblyInputFilter("http://127.0.0.1:8080", template={"plugins": [...]})
    result = await Runner.run(agent, "Inspect A42", run_config=ca.run_config())

The SDK hands a model everything it sends: the instructions, the input items, the model
settings, every tool the run assembled (function tools, MCP servers' tools, hosted tools) and the
handoffs. So the adapter prepares each call inside a ``Model`` that wraps the one the run calls
(:class:`ContextAssemblyModel`): for an agent whose model is a name, through the run's model
provider (:meth:`ContextAssemblyInputFilter.model_provider`); for a ``Model`` object, by wrapping
it (:meth:`ContextAssemblyInputFilter.model`). The adapter itself is the run's
``call_model_input_filter``: it passes the input through unchanged and hands the run's context
object to the wrapped model, for ``contributions``. :meth:`ContextAssemblyInputFilter.run_config`
makes a ``RunConfig`` with both. This module holds the filter, the model wrapper and its
provider; the mapping between the SDK's types and the neutral shape around the loop of
:mod:`.preparer` is :mod:`.openai_agents_items`'s:

- **In.** The model is the name the provider was asked for, else the wrapped model's ``model``
  (``OpenAIResponsesModel.model``, ``OpenAIChatCompletionsModel.model``), unless the template
  names one; the default ``scope`` is the call's ``conversation_id``, else the run's
  ``RunConfig.group_id`` when the run is traced (the SDK's id of a chat thread), as
  ``{"task_id": ...}``. ``instructions`` are the system instructions. A message item (``user``,
  ``system``, ``developer``, ``assistant``) is a message of that role (``input_text`` /
  ``output_text`` as text, ``input_image`` as ``image``, ``input_file`` as ``file``, the rest
  ``opaque``); an assistant message, the reasoning items and function calls that follow it form
  one assistant message with tool calls; a ``function_call_output`` (and any other ``*_output``
  item) is a tool message. Other items (provider-run tool calls, references) join the assistant
  message as ``opaque`` parts. ``tools`` are the call's tools (a function tool with its schema,
  an MCP tool as the function tool the SDK made of it, a hosted tool by name) and its handoffs
  (their tool name, description and input schema), as the SDK sends them.
- **Out.** The items come back in frame order as the original item objects; the service's leading
  system message becomes the instructions (unchanged when its text is), its data messages
  ``user`` items, and its per-turn developer messages what the service's own render for the
  model's provider makes of them: ``developer`` items for the OpenAI models
  (``OpenAIResponsesModel``, ``OpenAIChatCompletionsModel``), ``user`` items whose text starts
  with the line ``[developer instructions]`` for any other. The tools and the handoffs each come
  back in frame order. ``ModelSettings.max_tokens`` is the output limit the budget reserved,
  unless the settings have a smaller one.
- **Caches.** Only for the OpenAI models: ``prompt_cache_key`` goes into
  ``ModelSettings.extra_args`` and ``prompt_cache_retention`` into
  ``ModelSettings.prompt_cache_retention``. The SDK's items have no place for Anthropic markers:
  they are skipped and counted (``stats.cache_markers_skipped``). With ``previous_response_id``
  or ``conversation_id`` the provider holds the conversation and keeps what is sent, data message
  included: run without them.
- **Compaction** (docs/integrations.md#compaction). A Responses ``compaction`` item (which the
  SDK keeps as a ``CompactionItem``) is an assistant message of one ``native`` part, so that the
  service reads the history as the provider does. ``mode: "native"`` puts the provider's
  compaction into ``ModelSettings.extra_body`` for ``OpenAIResponsesModel`` (any other model goes
  without it, warned). A cleared tool result is sent as a copy of its ``function_call_output``
  with the service's text. The SDK keeps the conversation outside the model call: the
  application applies a ``compact`` decision, or a summary with
  :meth:`ContextAssemblyInputFilter.folded`, to the items it sends next.
- **Usage.** The response's ``usage`` is reported as ``provider="normalized"`` (OpenAI's input
  tokens include the cached ones), with the response id as ``report_id`` and ``response_id``
  and, on a stream, the response's ``prompt_cache_diagnostics`` when it has them.

``contributions`` is called with the run's context object (``None`` when the run has no filter).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from agents import (
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Tool,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.multi_provider import MultiProvider
from agents.run_config import CallModelData, ModelInputData
from agents.tracing import get_current_trace
from openai.types.responses.response_prompt_param import ResponsePromptParam

from context_assembly_client import AsyncClient, Client
from context_assembly_client.integrations.openai_agents_items import (
    AgentsCall,
    call_of,
    items_of,
    prepared_call,
)
from context_assembly_client.integrations.preparer import (
    DEFAULT_DEADLINE,
    Contributions,
    Prepared,
    PreparerAdapter,
    normalized_usage,
    text_of,
)
from context_assembly_client.types import CompactionReport, PrepareResponse

__all__ = ["ContextAssemblyInputFilter", "ContextAssemblyModel", "ContextAssemblyModelProvider"]

logger = logging.getLogger("context_assembly_client.integrations")

_OPENAI_MODELS = (OpenAIResponsesModel, OpenAIChatCompletionsModel)


@dataclass
class _Slot:
    """The run's context object for the model call under way in one run's task, handed from the
    filter to the wrapped model (``used`` once the model prepared with it)."""

    context: Any
    used: bool = False


_current: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "context_assembly_agents_call", default=None
)


class ContextAssemblyInputFilter(PreparerAdapter):
    """Prepares each model call of OpenAI Agents SDK runs with the context-assembly service.

    Use :meth:`run_config` (or pass the adapter as ``RunConfig.call_model_input_filter`` and
    :meth:`model_provider` as its ``model_provider``), and wrap with :meth:`model` every
    ``Model`` object an agent or the run config names.

    Args:
        client_or_base_url: the service's URL, or a ``Client`` / ``AsyncClient``.
        template: the prepare request without ``instructions``, ``history``, ``input`` and
            ``tools`` (``model`` overrides the model of the call; ``render`` is always
            ``"neutral"``).
        contributions: ``contributions(context)`` (sync or async) returns the inline sources,
            called with the run's context object before each model call.
        fail_open: when the service fails, let the call go on unchanged (``False``: raise).
            A 4xx answer always raises.
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, with a URL.
        on_prepared: called with each prepare answer before the model call (ids, manifest).
        on_compaction: called with the compaction decision before the model call, when it is not
            ``none``.
    """

    def __init__(
        self,
        client_or_base_url: str | Client | AsyncClient,
        *,
        template: Mapping[str, Any],
        contributions: Contributions | None = None,
        fail_open: bool = True,
        timeout: float = DEFAULT_DEADLINE,
        api_key: str | None = None,
        on_prepared: Callable[[PrepareResponse], None] | None = None,
        on_compaction: Callable[[CompactionReport], None] | None = None,
    ) -> None:
        super().__init__(
            client_or_base_url,
            template=template,
            contributions=contributions,
            fail_open=fail_open,
            timeout=timeout,
            api_key=api_key,
            on_prepared=on_prepared,
            on_compaction=on_compaction,
        )
        self._warned_unwrapped = False

    # ------------------------------------------------------------------ installing

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """``RunConfig.call_model_input_filter``: hands the run's context object to the wrapped
        model of this call; the input goes on unchanged."""
        previous = _current.get()
        if previous is not None and not previous.used and not self._warned_unwrapped:
            self._warned_unwrapped = True
            logger.warning(
                "context-assembly: a model call of this run was not prepared: wrap the run's "
                "models (ContextAssemblyInputFilter.run_config, .model_provider or .model)"
            )
        _current.set(_Slot(data.context))
        return data.model_data

    def model(self, model: Model, *, name: str | None = None) -> ContextAssemblyModel:
        """``model``, prepared by this adapter on every call (``name``: the model's name for the
        service, when the model does not say)."""
        if isinstance(model, ContextAssemblyModel):
            return model
        return ContextAssemblyModel(model, self, name=name)

    def model_provider(self, provider: ModelProvider | None = None) -> ContextAssemblyModelProvider:
        """A model provider whose models (those of agents that name theirs) are prepared by this
        adapter; ``provider`` (default: the SDK's ``MultiProvider``) makes them."""
        return ContextAssemblyModelProvider(self, provider or MultiProvider())

    def run_config(self, **options: Any) -> RunConfig:
        """A ``RunConfig`` of ``options`` with this adapter as its input filter, its model
        provider wrapped and a ``Model`` given as ``model`` wrapped."""
        model = options.pop("model", None)
        if isinstance(model, Model):
            model = self.model(model)
        provider = self.model_provider(options.pop("model_provider", None))
        return RunConfig(
            model=model, model_provider=provider, call_model_input_filter=self, **options
        )

    # ------------------------------------------------------------------ compaction

    def folded(
        self, items: Sequence[TResponseInputItem], compaction: CompactionReport | None
    ) -> list[TResponseInputItem]:
        """``items`` with the summary of ``compaction`` (``mode: "summarize"``) as a user item in
        place of the items of the messages it folded; unchanged when it folded nothing.

        ``items`` are the conversation the folding call was made with, as the run gives it back
        (``result.to_input_list()``): the messages are counted as this adapter sends them (an
        assistant message with the reasoning items and function calls after it is one)."""
        summary = compaction.summary if compaction is not None else None
        if compaction is None or summary is None or compaction.folded_messages <= 0:
            return list(items)
        call = AgentsCall(None, list(items), ModelSettings(), [], [])
        start = compaction.folded_from
        messages = call_of(call, "", None).messages[: start + compaction.folded_messages]
        if len(messages) < start + compaction.folded_messages:
            return list(items)
        before = sum(len(message.origin) for message in messages[:start])
        count = sum(len(message.origin) for message in messages)
        item: TResponseInputItem = {"role": "user", "content": text_of(summary.get("content", ""))}
        return [*items[:before], item, *items[count:]]

    # ------------------------------------------------------------------ usage

    def _send_usage(
        self,
        prepared: Prepared,
        usage: Any,
        response_id: str | None,
        diagnostics: Mapping[str, Any] | None = None,
    ) -> None:
        details = getattr(usage, "input_tokens_details", None)
        self.preparer.report_usage(
            prepared,
            provider="normalized",
            usage=normalized_usage(
                input_tokens=getattr(usage, "input_tokens", None),
                output_tokens=getattr(usage, "output_tokens", None),
                cached_input_tokens=getattr(details, "cached_tokens", None),
            ),
            report_id=response_id,
            response_id=response_id,
            diagnostics=diagnostics,
        )


class ContextAssemblyModel(Model):
    """A ``Model`` that prepares each call with the service, then calls the model it wraps.

    Everything else (closing, retry advice, the wrapped model's own attributes) is the wrapped
    model's."""

    def __init__(
        self, wrapped: Model, adapter: ContextAssemblyInputFilter, *, name: str | None = None
    ) -> None:
        self.wrapped = wrapped
        self.adapter = adapter
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.wrapped, attribute)

    async def close(self) -> None:
        await self.wrapped.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self.wrapped._cleanup_on_run_end(owner)

    def get_retry_advice(self, request: Any) -> Any:
        return self.wrapped.get_retry_advice(request)

    async def _prepare(
        self, call: AgentsCall, conversation_id: str | None
    ) -> tuple[AgentsCall, Prepared] | None:
        slot = _current.get()
        if slot is not None:
            slot.used = True
        openai = isinstance(self.wrapped, _OPENAI_MODELS)
        responses = isinstance(self.wrapped, OpenAIResponsesModel)
        return await self.adapter.preparer.arun(
            lambda: call_of(
                call, model_name(self.wrapped, self.name), _thread(conversation_id), responses
            ),
            slot.context if slot is not None else None,
            lambda prepared: prepared_call(call, prepared, self.adapter.stats, openai),
        )

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        call = AgentsCall(system_instructions, items_of(input), model_settings, tools, handoffs)
        outcome = await self._prepare(call, conversation_id)
        sent = call if outcome is None else outcome[0]
        response = await self.wrapped.get_response(
            sent.instructions,
            input if outcome is None else sent.input,
            sent.settings,
            sent.tools,
            output_schema,
            sent.handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        if outcome is not None:
            prepared = outcome[1]
            self.adapter.preparer.reporting(
                lambda: self.adapter._send_usage(prepared, response.usage, response.response_id)
            )
        return response

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        call = AgentsCall(system_instructions, items_of(input), model_settings, tools, handoffs)
        outcome = await self._prepare(call, conversation_id)
        sent = call if outcome is None else outcome[0]
        stream = self.wrapped.stream_response(
            sent.instructions,
            input if outcome is None else sent.input,
            sent.settings,
            sent.tools,
            output_schema,
            sent.handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        async for event in stream:
            if outcome is not None and getattr(event, "type", None) == "response.completed":
                self.adapter.preparer.reporting(partial(self._report_stream, outcome[1], event))
            yield event

    def _report_stream(self, prepared: Prepared, event: Any) -> None:
        response = event.response
        if response.usage is None:
            return
        diagnostics = getattr(response, "prompt_cache_diagnostics", None)
        dump = getattr(diagnostics, "model_dump", None)
        self.adapter._send_usage(
            prepared,
            response.usage,
            response.id,
            dump(mode="json", exclude_none=True) if dump is not None else None,
        )


class ContextAssemblyModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are :class:`ContextAssemblyModel`\\ s of ``provider``'s."""

    def __init__(self, adapter: ContextAssemblyInputFilter, provider: ModelProvider) -> None:
        self.adapter = adapter
        self.provider = provider

    def get_model(self, model_name: str | None) -> Model:
        return self.adapter.model(self.provider.get_model(model_name), name=model_name)

    async def aclose(self) -> None:
        await self.provider.aclose()


def model_name(model: Model, name: str | None = None) -> str:
    """The model's name for the service: the name it was asked for by, else its ``model`` (the
    OpenAI models) or ``model_name`` string, else its class name."""
    if name:
        return name
    for attribute in ("model", "model_name"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def _thread(conversation_id: str | None) -> str | None:
    """The call's conversation, else the traced run's group id (the SDK's chat thread id)."""
    if conversation_id:
        return conversation_id
    group = getattr(get_current_trace(), "group_id", None)
    return group if isinstance(group, str) and group else None
