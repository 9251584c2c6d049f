"""The OpenAI Agents SDK: a ``call_model_input_filter`` and run hooks for usage.

::

    from context_assembly_client.integrations.openai_agents import ContextAssemblyInputFilter

    ca = ContextAssemblyInputFilter("http://127.0.0.1:8080", template={"model": "gpt-4o-mini"})
    result = await Runner.run(agent, "Inspect A42", run_config=RunConfig(call_model_input_filter=ca),
                              hooks=ca.hooks)

The filter runs right before each model call with the instructions and the input items, and
returns the items and instructions to send; the hooks' ``on_llm_end`` gets the model's response
and reports its usage. The two find each other through a context variable of the run's task, so
one filter and its hooks serve concurrent runs. This module only maps between the SDK's input items
and the neutral shape around the loop of :mod:`.preparer`:

- **In.** ``instructions`` are ``instructions``. A message item (``user``, ``system``,
  ``developer``, ``assistant``) is a message of that role (``input_text`` / ``output_text`` as
  text, ``input_image`` as ``image``, ``input_file`` as ``file``, the rest ``opaque``); an
  assistant message, the reasoning items and function calls that follow it form one assistant
  message with tool calls; a ``function_call_output`` (and any other ``*_output`` item) is a tool
  message. Other items (provider-run tool calls, references) join the assistant message as
  ``opaque`` parts. The agent's function tools are sent as ``tools`` so that the budget counts
  them.
- **Out.** The items come back in frame order as the original item objects; the service's leading
  system message becomes ``instructions`` (unchanged when its text is), its developer (per-turn)
  message a ``developer`` message item (the Responses API takes the role; the SDK's Chat
  Completions path sends it as such too) and its data message a ``user`` message item.
- **Not changeable here.** The filter can only change the items and the instructions: the tools
  keep the SDK's order, and there is no per-call channel for provider options, so the plan's
  Anthropic markers are not placed (counted in ``stats.cache_markers_skipped``) and
  ``prompt_cache_key`` / ``prompt_cache_retention`` are left to the application's
  ``ModelSettings`` (``prompt_cache_retention``, and ``extra_args={"prompt_cache_key": ...}``).
  With ``previous_response_id`` or ``conversation_id`` the provider holds the conversation and
  keeps what is sent, data message included: use the filter without them.
- **Usage.** The response's ``usage`` is reported as ``provider="normalized"`` (OpenAI's input
  tokens include the cached ones), with the response id as ``report_id``.

``contributions`` is called with the run's context object.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import Agent, FunctionTool, ModelResponse, RunContextWrapper, RunHooks
from agents.run_config import CallModelData, ModelInputData

from context_assembly_client import AsyncClient, Client
from context_assembly_client.integrations.preparer import (
    DEFAULT_DEADLINE,
    AdapterStats,
    Carried,
    Contributions,
    Prepared,
    PreparerAdapter,
    RuntimeCall,
    normalized_usage,
)
from context_assembly_client.types import PrepareResponse

__all__ = ["ContextAssemblyHooks", "ContextAssemblyInputFilter"]

_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


@dataclass
class _Slot:
    """The preparation of the model call under way in one run's task, taken by ``on_llm_end``."""

    prepared: Prepared | None = None


_current: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "context_assembly_agents_call", default=None
)


class ContextAssemblyInputFilter(PreparerAdapter):
    """A ``RunConfig.call_model_input_filter`` that prepares each model call with the service.

    Pass :attr:`hooks` (or a :class:`ContextAssemblyHooks` of this filter) as the run's hooks for
    the usage reports.

    Args:
        client_or_base_url: the service's URL, or a ``Client`` / ``AsyncClient``.
        template: the prepare request without ``instructions``, ``history``, ``input`` and
            ``tools`` (``model`` at least; ``render`` is always ``"neutral"``).
        contributions: ``contributions(context)`` (sync or async) returns the inline sources,
            called with the run's context object before each model call.
        fail_open: when the service fails, let the call go on unchanged (``False``: raise).
            A 4xx answer always raises.
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, with a URL.
        on_prepared: called with each prepare answer before the model call (ids, manifest).
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
    ) -> None:
        super().__init__(
            client_or_base_url,
            template=template,
            contributions=contributions,
            fail_open=fail_open,
            timeout=timeout,
            api_key=api_key,
            on_prepared=on_prepared,
        )
        self.hooks = ContextAssemblyHooks(self)

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        slot = _Slot()
        _current.set(slot)
        original = data.model_data
        outcome = await self.preparer.arun(
            lambda: _call_of(original, data.agent),
            data.context,
            lambda prepared: _apply(original, prepared, self.stats),
        )
        if outcome is None:
            return original
        filtered, slot.prepared = outcome
        return filtered

    def report(self, response: ModelResponse) -> None:
        """Report ``response``'s usage for the call this run's filter prepared (in the background)."""
        slot = _current.get()
        prepared = slot.prepared if slot is not None else None
        if slot is None or prepared is None:
            return
        slot.prepared = None
        usage = response.usage
        details = usage.input_tokens_details
        self.preparer.report_usage(
            prepared,
            provider="normalized",
            usage=normalized_usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_input_tokens=getattr(details, "cached_tokens", None),
            ),
            report_id=response.response_id,
        )


class ContextAssemblyHooks(RunHooks[Any]):
    """Run hooks that report each model call's usage for ``input_filter``'s preparation.

    Subclass it to add hooks of your own (call ``super().on_llm_end(...)``).
    """

    def __init__(self, input_filter: ContextAssemblyInputFilter) -> None:
        self.input_filter = input_filter

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        self.input_filter.report(response)


# --------------------------------------------------------------------------- items -> neutral


def _call_of(data: ModelInputData, agent: Agent[Any]) -> RuntimeCall:
    messages: list[Carried] = []
    group: tuple[dict[str, Any], list[Any]] | None = None  # the open assistant message

    def close() -> None:
        nonlocal group
        if group is not None:
            messages.append(Carried(group[0], tuple(group[1])))
            group = None

    def assistant(item: Any) -> dict[str, Any]:
        nonlocal group
        if group is None:
            group = ({"role": "assistant", "content": []}, [])
        group[1].append(item)
        return group[0]

    for item in data.input:
        kind = _get(item, "type")
        role = _get(item, "role")
        if role in _MESSAGE_ROLES and kind in (None, "message"):
            if role == "assistant":
                close()
                assistant(item)["content"].extend(_parts(_get(item, "content")))
                continue
            close()
            messages.append(
                Carried({"role": role, "content": _content(_get(item, "content"))}, (item,))
            )
        elif kind == "function_call":
            neutral = assistant(item)
            neutral.setdefault("tool_calls", []).append(
                {
                    "id": _get(item, "call_id") or "",
                    "name": _get(item, "name") or "",
                    "arguments": _get(item, "arguments") or "",
                }
            )
        elif isinstance(kind, str) and kind.endswith("_output"):
            close()
            output = _get(item, "output")
            content = output if isinstance(output, str) else _parts(output)
            neutral = {
                "role": "tool",
                "tool_call_id": _get(item, "call_id") or "",
                "content": content,
            }
            messages.append(Carried(neutral, (item,)))
        elif kind == "reasoning":
            summary = _get(item, "summary") or []
            text = "\n".join(str(_get(s, "text") or "") for s in summary)
            assistant(item)["content"].append({"type": "opaque", "kind": "reasoning", "text": text})
        else:
            assistant(item)["content"].append({"type": "opaque", "kind": str(kind)})
    close()
    tools = [
        Carried(
            {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": tool.params_json_schema,
            },
            tool,
        )
        for tool in agent.tools
        if isinstance(tool, FunctionTool)
    ]
    return RuntimeCall(data.instructions or "", messages, tools)


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)


def _content(content: Any) -> str | list[dict[str, Any]]:
    return content if isinstance(content, str) else _parts(content)


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, Sequence) else [content]:
        kind = _get(part, "type")
        if kind in _TEXT_PARTS and isinstance(_get(part, "text"), str):
            parts.append({"type": "text", "text": _get(part, "text")})
        elif kind == "input_image":
            parts.append({"type": "image"})
        elif kind == "input_file":
            parts.append({"type": "file"})
        elif kind == "refusal":
            parts.append(
                {"type": "opaque", "kind": "refusal", "text": str(_get(part, "refusal") or "")}
            )
        else:
            parts.append({"type": "opaque", "kind": str(kind)})
    return parts


# --------------------------------------------------------------------------- frame -> items


def _apply(original: ModelInputData, prepared: Prepared, stats: AdapterStats) -> ModelInputData:
    instructions = original.instructions
    items: list[Any] = []
    for message in prepared.messages:
        if message.origin is not None:
            items.extend(message.origin)
            continue
        role, text = message.neutral["role"], message.neutral["content"]
        if message.index == 0 and role == "system":
            instructions = original.instructions if text == (original.instructions or "") else text
        else:
            items.append({"role": role, "content": text})
    if prepared.breakpoints:
        stats.add("cache_markers_skipped", len(prepared.breakpoints))
    return ModelInputData(input=items, instructions=instructions or None)
