"""The OpenAI Agents SDK's model call in the service's neutral shape, and the prepared frame
mapped back onto it: the item mapping of :mod:`.openai_agents` (whose docstring says what maps to
what), around the loop of :mod:`.preparer`.

- **The call** (:class:`AgentsCall`): what the SDK hands a model, as far as the adapter changes
  it (instructions, input items, model settings, tools, handoffs); :func:`items_of` makes a
  string input a user item.
- **Call to neutral** (:func:`call_of`): the input items as neutral messages, each carrying the
  item(s) it stands for (an assistant message with the reasoning items and function calls after
  it is one), a Responses ``compaction`` item as one ``native`` part, and the tools and handoffs
  as neutral tools.
- **Frame to call** (:func:`prepared_call`): the items back in frame order (a cleared tool
  result as a copy of its ``function_call_output``), the service's added messages as items, and
  the output limit, cache fields and native compaction in the model settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import FunctionTool, Handoff, ModelSettings, Tool
from agents.items import TResponseInputItem

from context_assembly_client.integrations.preparer import (
    AdapterStats,
    Carried,
    NativeApi,
    Prepared,
    RuntimeCall,
    with_native,
)

__all__ = ["AgentsCall", "call_of", "items_of", "prepared_call"]

_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


@dataclass(frozen=True, slots=True)
class AgentsCall:
    """What the SDK hands a model, as far as the adapter changes it."""

    instructions: str | None
    input: list[TResponseInputItem]
    settings: ModelSettings
    tools: list[Tool]
    handoffs: list[Handoff[Any, Any]]


def items_of(input: str | list[TResponseInputItem]) -> list[TResponseInputItem]:
    """``input`` as items: a string is one user item."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    return list(input)


# --------------------------------------------------------------------------- call -> neutral


def call_of(
    call: AgentsCall, model: str, conversation: str | None, responses: bool = False
) -> RuntimeCall:
    """``call`` as the neutral call prepared for ``model`` in the thread ``conversation``
    (``responses``: the model is ``OpenAIResponsesModel``, which takes native compaction)."""
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

    for item in call.input:
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
        elif kind == "compaction":  # the provider's own: it stands for everything before it
            close()
            item_of = {
                "type": kind,
                "id": _get(item, "id"),
                "encrypted_content": _get(item, "encrypted_content"),
            }
            native = {"type": "native", "format": "openai-responses", "item": item_of}
            messages.append(Carried({"role": "assistant", "content": [native]}, (item,)))
        elif kind == "reasoning":
            summary = _get(item, "summary") or []
            text = "\n".join(str(_get(s, "text") or "") for s in summary)
            assistant(item)["content"].append({"type": "opaque", "kind": "reasoning", "text": text})
        else:
            assistant(item)["content"].append({"type": "opaque", "kind": str(kind)})
    close()
    tools: list[Carried] = []
    names: set[str] = set()
    for tool in call.tools:
        neutral = _tool(tool)
        if neutral["name"] not in names:
            names.add(neutral["name"])
            tools.append(Carried(neutral, tool))
    for handoff in call.handoffs:
        if handoff.tool_name not in names:
            names.add(handoff.tool_name)
            neutral = {
                "name": handoff.tool_name,
                "description": handoff.tool_description or "",
                "parameters": handoff.input_json_schema or {},
            }
            tools.append(Carried(neutral, handoff))
    api: NativeApi | None = "openai-responses" if responses else None
    return RuntimeCall(call.instructions or "", messages, tools, model, conversation, api)


def _tool(tool: Tool) -> dict[str, Any]:
    """A function tool (an MCP server's tool included) with its schema; a hosted tool by name."""
    if isinstance(tool, FunctionTool):
        return {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.params_json_schema,
        }
    return {"name": str(getattr(tool, "name", None) or type(tool).__name__)}


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


# --------------------------------------------------------------------------- frame -> call


def _with_output(item: Any, text: str) -> Any:
    """A ``function_call_output`` item with the service's text as its output (a cleared result)."""
    if isinstance(item, Mapping):
        return {**item, "output": text}
    return item.model_copy(update={"output": text})


def prepared_call(
    call: AgentsCall, prepared: Prepared, stats: AdapterStats, openai: bool
) -> AgentsCall:
    """``call`` as the frame of ``prepared`` makes it (``openai``: the model is one of the OpenAI
    models, which take ``developer`` items and the cache fields); the cache markers it skips are
    counted in ``stats``."""
    instructions = call.instructions
    items: list[Any] = []
    for message in prepared.messages:
        if message.origin is not None and message.rewritten:
            items.extend(_with_output(item, message.neutral["content"]) for item in message.origin)
            continue
        if message.origin is not None:
            items.extend(message.origin)
            continue
        role, text = message.neutral["role"], message.neutral["content"]
        if message.index == 0 and role == "system":
            instructions = call.instructions if text == (call.instructions or "") else text
        elif role == "user" or openai:
            items.append({"role": role, "content": text})
        else:  # no developer role outside OpenAI: a user turn with the renders' marker line
            items.append({"role": "user", "content": f"[{role} instructions]\n{text}"})
    if prepared.breakpoints:
        stats.add("cache_markers_skipped", len(prepared.breakpoints))
    changes: dict[str, Any] = {}
    limit = prepared.limit_within(call.settings.max_tokens)
    if limit is not None:
        changes["max_tokens"] = limit
    if openai and prepared.prompt_cache_key is not None:
        changes["extra_args"] = {"prompt_cache_key": prepared.prompt_cache_key}
    if openai and prepared.prompt_cache_retention is not None:
        changes["prompt_cache_retention"] = prepared.prompt_cache_retention
    if prepared.native is not None:  # only for OpenAIResponsesModel (RuntimeCall)
        body = (
            dict(call.settings.extra_body or {})
            if isinstance(call.settings.extra_body, Mapping)
            else {}
        )
        current = body.get("context_management")
        body["context_management"] = with_native(prepared.native, "openai-responses", current)
        changes["extra_body"] = body
    tools = [tool for tool in prepared.tools if not isinstance(tool, Handoff)]
    handoffs = [tool for tool in prepared.tools if isinstance(tool, Handoff)]
    return AgentsCall(
        instructions or None,
        items,
        call.settings.resolve(changes) if changes else call.settings,
        tools,
        handoffs,
    )
