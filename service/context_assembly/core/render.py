"""Provider renderers: the neutral frame as an OpenAI, Anthropic or Gemini request body (docs/contract.md, "Provider renders").

``render_frame`` is a pure function of the frame: same frame, same body; the frame is never
mutated and the body shares no mutable object with it. The service creates no provider cache and
promises no hit (docs/contract.md, "Provider renders"): only when a request opts in with ``cache`` does the body carry the
directives its cache plan chose (``CacheDirectives``, planned in ``core/cache.py``):

- Anthropic: ``cache_control: {"type": "ephemeral"}`` (plus ``"ttl": "1h"`` for a one-hour
  lifetime, per marker) on the last tool definition and on the last content block of each
  marked message. When a marked message is part of the system prompt, ``system`` is a list of
  text blocks, one per message of the leading run, instead of one string. Automatic caching is a
  top-level ``cache_control``; cache diagnostics a top-level ``diagnostics`` object
  (``previous_message_id``, ``null`` included).
- OpenAI Chat and Responses: ``prompt_cache_key`` and ``prompt_cache_retention``; on models with
  explicit breakpoints, ``prompt_cache_breakpoint: {"mode": "explicit"}`` on the last content
  block of each marked message (a string content becomes one text block, ``text`` for Chat,
  ``input_text`` for Responses, a tool result's output included) and ``prompt_cache_options``.
  Only a system, developer, user or tool message whose last block OpenAI takes a breakpoint on
  can be marked (``openai_markable``): never an assistant message.

Common rules
    - Message order is kept; only the grouping of messages into turns changes where a provider
      needs it (Anthropic, Gemini).
    - Text parts become the provider's text item. Image, file and opaque parts are passed through
      unchanged (with their neutral ``type``): the host supplies them in the target provider's
      shape, the service cannot translate an arbitrary payload. For Gemini, which has no part
      ``type``, the ``type`` key is dropped and the remaining fields form the part
      (``{"type": "image", "inlineData": {...}}`` → ``{"inlineData": {...}}``).
    - A ``native`` part (an item read from a provider-shaped message,
      ``core/provider_messages.py``) is sent as it came by its own format's renderer and refused
      by the others (``InvalidError`` naming the frame message and part); ``provider_fields`` of
      a message or tool call are added to its item by that format's renderer only.
    - String tool-call ``arguments`` are sent as given to OpenAI; object arguments as compact
      JSON. Anthropic and Gemini want an object: a JSON-object string is parsed, an empty string
      is ``{}``, and anything else (not JSON, or JSON that is not an object) is kept verbatim as
      ``{"_raw_arguments": "<the string>"}`` so nothing is silently lost.
    - ``max_output_tokens`` becomes ``max_completion_tokens`` (OpenAI Chat), ``max_output_tokens``
      (Responses), ``max_tokens`` (Anthropic) or ``generationConfig.maxOutputTokens`` (Gemini);
      when it is ``None`` the key is left out and the host sets it (Anthropic requires one; the
      renderer never invents a value). A prepare passes ``output_limit`` of its budget: what the
      budget reserved for the answer, so that input plus output limit never exceed the window.

Tools
    A tool with ``strict: true`` carries it to OpenAI Chat (``function.strict``) and Anthropic
    (``strict``); the Responses render always sends ``strict`` (``false`` unless asked: the API
    reads an absent ``strict`` as true). Gemini has no such flag: it is not sent.

OpenAI Chat (``openai-chat``)
    Roles, ``name``, ``tool_calls`` and ``tool_call_id`` map one to one; an assistant message with
    tool calls and empty content sends ``content: null``, as the API itself returns it.

OpenAI Responses (``openai-responses``)
    system/developer/user/assistant messages are ``{role, content}`` input items (text parts are
    ``input_text``, or ``output_text`` for the assistant). Assistant tool calls follow their
    message as ``function_call`` items (an assistant message with no content yields only those);
    tool messages are ``function_call_output`` items. Responses has no per-message ``name``: it is
    dropped.

Anthropic Messages (``anthropic``) and Gemini (``gemini``)
    Neither has a developer role, nor system turns inside the conversation.

    - The *leading* run of system/developer messages (before the first other message) becomes the
      system prompt (``system`` / ``systemInstruction``): their texts joined with a blank line.
      A leading message that carries a non-text part ends that run (a system prompt is text only)
      and is treated like a later one.
    - A later system or developer message keeps its position as a *user* turn whose text starts
      with a marker line, ``[developer instructions]`` or ``[system instructions]``, so the model
      can still tell host instructions from user text. This is a faithful mapping, not an
      equivalent: the provider gives such text user-turn authority, no more.
    - Assistant tool calls become ``tool_use`` blocks / ``functionCall`` parts after the
      assistant's text; tool messages become user-turn ``tool_result`` blocks (``tool_use_id``) /
      ``functionResponse`` parts (``response: {"content": <text>}``; the function name is looked
      up from the call with the same id, else the tool message's ``name``; non-text parts of the
      tool message follow the ``functionResponse`` in the same turn). Gemini gets no call ids:
      it pairs calls and responses by name and order.
    - Both require alternating turns: consecutive messages that map to the same role are merged
      into one turn with several blocks/parts, in order. Empty texts are dropped (both APIs
      refuse empty text blocks) before merging, so alternation also holds around them.
    - If the first turn after the system prompt is the assistant's, it is kept as is: the
      renderer never invents a user turn.
    - Per-message ``name`` has no equivalent and is dropped.
    - An empty tool ``parameters`` schema becomes ``{"type": "object", "properties": {}}`` for
      Anthropic (``input_schema`` must be an object schema) and is left out for Gemini (which
      refuses an object schema without properties).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from context_assembly.core.frame import Frame
from context_assembly.core.provider_messages import RESPONSES_CONTENT_TYPES, ProviderFormat
from context_assembly.core.request import (
    Message,
    NativePart,
    OpaquePart,
    Render,
    TextPart,
    Tool,
    ToolCall,
)
from context_assembly.errors import InvalidError

RAW_ARGUMENTS_KEY = "_raw_arguments"
"""Key under which non-object tool-call arguments are kept for Anthropic and Gemini."""

_INSTRUCTION_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class CacheDirectives:
    """Provider cache directives for a body (see the module doc).

    Anthropic: a marker on the last tool definition when ``tools`` (lifetime ``tools_ttl``, else
    ``ttl``), and on the last content block of each frame message listed in ``messages`` (by
    index, lifetime the same entry of ``message_ttls``, else ``ttl``; a message without blocks
    marks the last block before it); with ``automatic`` a top-level ``cache_control`` of ``ttl``;
    with ``diagnostics`` a top-level ``diagnostics`` naming ``previous_response_id``.
    OpenAI: ``key`` and ``retention`` as ``prompt_cache_key`` and ``prompt_cache_retention`` when
    set; a ``prompt_cache_breakpoint`` on each message of ``messages`` (``openai_markable`` ones
    only); ``prompt_cache_options`` with ``mode`` and ``previous_response_id`` as
    ``comparison_response_id`` when either is set.
    """

    ttl: Literal["5m", "1h"] = "5m"
    tools: bool = False
    messages: tuple[int, ...] = ()
    key: str | None = None
    retention: str | None = None
    tools_ttl: Literal["5m", "1h"] | None = None
    message_ttls: tuple[Literal["5m", "1h"], ...] = ()
    automatic: bool = False
    diagnostics: bool = False
    previous_response_id: str | None = None
    mode: Literal["explicit"] | None = None


# The content blocks OpenAI takes a ``prompt_cache_breakpoint`` on (the SDKs' text, image, audio
# and file parts of Chat; input text, image and file of Responses); assistant output blocks are
# not among them (OpenAI API reference, create chat completion / create a model response).
OPENAI_BREAKPOINT_PARTS: Final[dict[str, frozenset[str]]] = {
    "openai-chat": frozenset({"text", "image_url", "input_audio", "file"}),
    "openai-responses": frozenset({"input_text", "input_image", "input_file"}),
}
_MARKABLE_ROLES: Final = frozenset({"system", "developer", "user", "tool"})
_BREAKPOINT: Final = {"mode": "explicit"}


def openai_markable(message: Message, target: Render) -> bool:
    """Whether OpenAI takes a ``prompt_cache_breakpoint`` on ``message``'s last content block in
    a ``target`` body: a system, developer, user or tool message whose content is a non-empty
    string or ends with a non-empty text part, or (OpenAI renders) with a part of a type the
    provider marks. ``neutral``: as text only, the shape every adapter can mark."""
    if message.role not in _MARKABLE_ROLES:
        return False
    content = message.content
    if isinstance(content, str):
        return bool(content)
    if not content:
        return False
    last = content[-1]
    if isinstance(last, TextPart):
        return bool(last.text)
    kinds = OPENAI_BREAKPOINT_PARTS.get(target, frozenset())
    if isinstance(last, NativePart):
        return last.format == target and last.item.get("type") in kinds
    return last.type in kinds


OUTPUT_LIMIT_KEYS: dict[str, str] = {
    "openai-chat": "max_completion_tokens",
    "openai-responses": "max_output_tokens",
    "anthropic": "max_tokens",
    "gemini": "generationConfig.maxOutputTokens",
}
"""The output-limit parameter of each provider render (dotted: nested in the body)."""


def output_limit(reserve: int, model_maximum: int | None) -> int:
    """The output limit a frame carries: the tokens the budget reserved for the answer
    (``response_reserve + reasoning_reserve_tokens``), at most the model's maximum output.

    Every provider rendered here counts reasoning or thinking inside that limit (OpenAI
    ``max_completion_tokens`` / ``max_output_tokens`` on reasoning models, Anthropic ``max_tokens``
    with extended thinking, Gemini ``maxOutputTokens`` with thinking), so the reasoning reserve
    belongs in it; and every one of them refuses, or cuts the answer at, input plus limit beyond
    the window, so the limit is never more than the reserve.
    """
    return reserve if model_maximum is None else min(reserve, model_maximum)


def render_frame(
    frame: Frame,
    target: Render,
    model: str,
    max_output_tokens: int | None,
    cache: CacheDirectives | None = None,
) -> dict[str, Any]:
    """Map the neutral frame to the request body of ``target`` (mapping rules in the module doc).

    ``neutral`` returns the frame itself as JSON data (``messages``, ``tools``); ``model`` and
    ``max_output_tokens`` are used by the provider targets only (Gemini takes the model in its
    URL, so its body has no ``model``). Raises ``InvalidError`` naming the field when a tool
    message cannot be linked to its call (no ``tool_call_id`` for Responses/Anthropic, no known
    function name for Gemini) or object arguments cannot be encoded as JSON (integers beyond
    64 bits). ``cache`` adds the directives of a cache plan; ``neutral`` and ``gemini`` carry
    none.
    """
    if target == "neutral":
        return frame.model_dump(mode="json", exclude_none=True)
    _check_native(frame, target)
    marked = frozenset(cache.messages) if cache is not None else frozenset()
    if target == "openai-chat":
        return _openai_cache(_openai_chat(frame, model, max_output_tokens, marked), cache)
    if target == "openai-responses":
        return _openai_cache(_openai_responses(frame, model, max_output_tokens, marked), cache)
    if target == "anthropic":
        return _anthropic(frame, model, max_output_tokens, cache)
    if target == "gemini":
        return _gemini(frame, max_output_tokens)
    raise InvalidError(f"unknown render target {target!r}", field="render")


# --------------------------------------------------------------------------- shared helpers


def _opaque(part: OpaquePart | NativePart) -> dict[str, Any]:
    """A pass-through part as a fresh dict (never shared with the frame): a native part's item
    as it came, an opaque part as given."""
    if isinstance(part, NativePart):
        return copy.deepcopy(part.item)
    return part.model_dump(mode="json")


def _fields(owner: Message | ToolCall, target: ProviderFormat) -> dict[str, Any]:
    """The provider fields ``owner`` keeps for ``target`` (fresh; empty for other targets)."""
    if owner.provider_fields is None:
        return {}
    return copy.deepcopy(owner.provider_fields.get(target, {}))


def _check_native(frame: Frame, target: Render) -> None:
    """Native parts go back to their own format only: another target is a named refusal."""
    for index, message in enumerate(frame.messages):
        if isinstance(message.content, str):
            continue
        for number, part in enumerate(message.content):
            if isinstance(part, NativePart) and part.format != target:
                path = f"frame.messages[{index}].content[{number}]"
                kind = part.item.get("type", "?")
                raise InvalidError(
                    f"{path} is an {part.format} {kind!r} item, carried as given: render "
                    f"{target!r} cannot send it (render {part.format!r}, or send the message in "
                    "the neutral shape)",
                    field=path,
                )


def _texts(message: Message) -> list[str]:
    """The message's texts in order: the string content, or each text part."""
    if isinstance(message.content, str):
        return [message.content]
    return [part.text for part in message.content if isinstance(part, TextPart)]


def _text_only(message: Message) -> bool:
    return isinstance(message.content, str) or all(
        isinstance(part, TextPart) for part in message.content
    )


def _arguments_string(arguments: str | dict[str, Any], path: str) -> str:
    """Arguments as the JSON string OpenAI expects; object arguments become compact JSON."""
    if isinstance(arguments, str):
        return arguments
    try:
        return orjson.dumps(arguments).decode()
    except orjson.JSONEncodeError as err:
        # Only reachable with integers beyond 64 bits (a body parsed by stdlib json keeps them).
        raise InvalidError(f"{path} cannot be encoded as JSON: {err}", field=path) from err


def _arguments_object(arguments: str | dict[str, Any]) -> dict[str, Any]:
    """Arguments as a JSON object for Anthropic/Gemini (see the module doc for non-objects)."""
    if isinstance(arguments, dict):
        return copy.deepcopy(arguments)
    if not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {RAW_ARGUMENTS_KEY: arguments}
    if isinstance(parsed, dict):
        return parsed
    return {RAW_ARGUMENTS_KEY: arguments}


def _require_call_id(message: Message, index: int, target: str) -> str:
    if message.tool_call_id is None:
        path = f"frame.messages[{index}].tool_call_id"
        raise InvalidError(
            f"{path} is required: a tool message needs it for render {target!r}", field=path
        )
    return message.tool_call_id


def _split_system(messages: list[Message]) -> tuple[str | None, int]:
    """The system prompt of the leading text-only system/developer run, and where the run ends."""
    texts: list[str] = []
    index = 0
    while (
        index < len(messages)
        and messages[index].role in _INSTRUCTION_ROLES
        and _text_only(messages[index])
    ):
        texts.extend(text for text in _texts(messages[index]) if text)
        index += 1
    return ("\n\n".join(texts) if texts else None), index


def _marker(role: str) -> str:
    return f"[{role} instructions]"


def _merge_turns(turns: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, list[Any]]]:
    """Drop empty turns and merge consecutive turns of the same role (strict alternation)."""
    merged: list[tuple[str, list[Any]]] = []
    for role, items in turns:
        if not items:
            continue
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(items)
        else:
            merged.append((role, list(items)))
    return merged


def _openai_cache(body: dict[str, Any], cache: CacheDirectives | None) -> dict[str, Any]:
    if cache is None:
        return body
    if cache.key is not None:
        body["prompt_cache_key"] = cache.key
    if cache.retention is not None:
        body["prompt_cache_retention"] = cache.retention
    options: dict[str, str] = {}
    if cache.mode is not None:
        options["mode"] = cache.mode
    if cache.previous_response_id is not None:
        options["comparison_response_id"] = cache.previous_response_id
    if options:
        body["prompt_cache_options"] = options
    return body


def _mark_openai(holder: dict[str, Any], key: str, text_type: str) -> None:
    """A ``prompt_cache_breakpoint`` on the last block of ``holder[key]``; a string becomes one
    ``text_type`` block (``openai_markable`` said the message takes one)."""
    value = holder[key]
    if isinstance(value, str):
        holder[key] = [
            {"type": text_type, "text": value, "prompt_cache_breakpoint": dict(_BREAKPOINT)}
        ]
    else:
        value[-1]["prompt_cache_breakpoint"] = dict(_BREAKPOINT)


# --------------------------------------------------------------------------- OpenAI Chat


def _chat_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": part.text} if isinstance(part, TextPart) else _opaque(part)
        for part in content
    ]


def _chat_tool_call(call: ToolCall, path: str) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _arguments_string(call.arguments, path)},
        **_fields(call, "openai-chat"),
    }


def _chat_function(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": copy.deepcopy(tool.parameters),
    }
    if tool.strict:
        function["strict"] = True
    return function


def _openai_chat(
    frame: Frame, model: str, max_output_tokens: int | None, marked: frozenset[int]
) -> dict[str, Any]:
    # OpenAI API reference: create chat completion.
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(frame.messages):
        item: dict[str, Any] = {"role": message.role}
        empty = message.content == "" or message.content == []
        item["content"] = None if message.tool_calls and empty else _chat_content(message.content)
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                _chat_tool_call(call, f"frame.messages[{index}].tool_calls[{number}].arguments")
                for number, call in enumerate(message.tool_calls)
            ]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        item.update(_fields(message, "openai-chat"))
        if index in marked and openai_markable(message, "openai-chat"):
            _mark_openai(item, "content", "text")
        messages.append(item)
    body: dict[str, Any] = {"model": model, "messages": messages}
    if frame.tools:
        body["tools"] = [
            {"type": "function", "function": _chat_function(tool)} for tool in frame.tools
        ]
    if max_output_tokens is not None:
        body["max_completion_tokens"] = max_output_tokens
    return body


# --------------------------------------------------------------------------- OpenAI Responses


def _responses_content(content: str | list[Any], text_type: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if text_type == "output_text" and all(isinstance(part, TextPart) for part in content):
        # An input message of the assistant takes its text as a string (the SDK's
        # EasyInputMessageParam lists input parts only).
        return "".join(part.text for part in content)
    return [
        {"type": text_type, "text": part.text} if isinstance(part, TextPart) else _opaque(part)
        for part in content
    ]


def _responses_items(message: Message, text_type: str) -> list[dict[str, Any]]:
    """The input items of a non-tool message: one message item, or the items it carries
    (a ``reasoning`` item and the like) in place, between message items of the other parts."""
    content = message.content
    fields = _fields(message, "openai-responses")
    if isinstance(content, str) or not any(_own_item(part) for part in content):
        return [{"role": message.role, "content": _responses_content(content, text_type), **fields}]
    items: list[dict[str, Any]] = []
    run: list[Any] = []
    for part in [*content, None]:
        if part is not None and not _own_item(part):
            run.append(part)
            continue
        if run:
            items.append(
                {"role": message.role, "content": _responses_content(run, text_type), **fields}
            )
            run = []
        if isinstance(part, NativePart):
            items.append(_opaque(part))
    return items


def _own_item(part: Any) -> bool:
    return (
        isinstance(part, NativePart)
        and part.format == "openai-responses"
        and part.item.get("type") not in RESPONSES_CONTENT_TYPES
    )


def _openai_responses(
    frame: Frame, model: str, max_output_tokens: int | None, marked: frozenset[int]
) -> dict[str, Any]:
    # OpenAI API reference: create a model response (input items:
    # EasyInputMessage, function_call, function_call_output)
    items: list[dict[str, Any]] = []
    for index, message in enumerate(frame.messages):
        mark = index in marked and openai_markable(message, "openai-responses")
        if message.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": _require_call_id(message, index, "openai-responses"),
                    "output": _responses_content(message.content, "input_text"),
                    **_fields(message, "openai-responses"),
                }
            )
            if mark:
                _mark_openai(items[-1], "output", "input_text")
            continue
        text_type = "output_text" if message.role == "assistant" else "input_text"
        empty = message.content == "" or message.content == []
        if not (message.tool_calls and empty):
            items.extend(_responses_items(message, text_type))
            if mark:
                _mark_openai(items[-1], "content", "input_text")
        items.extend(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": _arguments_string(
                    call.arguments, f"frame.messages[{index}].tool_calls[{number}].arguments"
                ),
                **_fields(call, "openai-responses"),
            }
            for number, call in enumerate(message.tool_calls or ())
        )
    body: dict[str, Any] = {"model": model, "input": items}
    if frame.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": copy.deepcopy(tool.parameters),
                # Responses takes an absent ``strict`` as true and then refuses a schema that is
                # not strict-compatible: always say it.
                "strict": tool.strict,
            }
            for tool in frame.tools
        ]
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    return body


# --------------------------------------------------------------------------- Anthropic


def _anthropic_blocks(content: str | list[Any]) -> list[dict[str, Any]]:
    """Content blocks of a message; empty texts are dropped (the API refuses them)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [
        {"type": "text", "text": part.text} if isinstance(part, TextPart) else _opaque(part)
        for part in content
        if not (isinstance(part, TextPart) and not part.text)
    ]


def _marked_anthropic(role: str, content: str | list[Any]) -> list[dict[str, Any]]:
    blocks = _anthropic_blocks(content)
    if not blocks:
        return []
    if blocks[0]["type"] == "text":
        blocks[0]["text"] = f"{_marker(role)}\n{blocks[0]['text']}"
    else:
        blocks.insert(0, {"type": "text", "text": _marker(role)})
    return blocks


def _anthropic(
    frame: Frame, model: str, max_output_tokens: int | None, cache: CacheDirectives | None
) -> dict[str, Any]:
    # Anthropic's Messages API reference (system, alternating user/assistant turns,
    # tool_use / tool_result blocks) and its tool use guide.
    system, start = _split_system(frame.messages)
    marked = cache.messages if cache is not None else ()
    # The last content block of each message that has one (by message index): where a
    # message's cache marker goes.
    last_blocks: dict[int, dict[str, Any]] = {}
    system_blocks: list[dict[str, Any]] | None = None
    if any(index < start for index in marked):
        system_blocks = []
        for index, message in enumerate(frame.messages[:start]):
            texts = [text for text in _texts(message) if text]
            if texts:
                block = {"type": "text", "text": "\n\n".join(texts)}
                system_blocks.append(block)
                last_blocks[index] = block
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    plain: set[int] = set()  # the blocks made of a message's string content
    for index, message in enumerate(frame.messages[start:], start=start):
        if message.role in _INSTRUCTION_ROLES:
            turns.append(("user", _marked_anthropic(message.role, message.content)))
        elif message.role == "user":
            turns.append(("user", _anthropic_blocks(message.content)))
            if isinstance(message.content, str):
                plain.update(id(block) for block in turns[-1][1])
        elif message.role == "assistant":
            blocks = _anthropic_blocks(message.content)
            if isinstance(message.content, str) and not message.tool_calls:
                plain.update(id(block) for block in blocks)
            blocks.extend(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": _arguments_object(call.arguments),
                    **_fields(call, "anthropic"),
                }
                for call in message.tool_calls or ()
            )
            turns.append(("assistant", blocks))
        else:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": _require_call_id(message, index, "anthropic"),
            }
            content: str | list[dict[str, Any]] = (
                message.content
                if isinstance(message.content, str)
                else _anthropic_blocks(message.content)
            )
            if content:
                result["content"] = content
            result.update(_fields(message, "anthropic"))
            turns.append(("user", [result]))
        if marked and turns[-1][1]:
            last_blocks[index] = turns[-1][1][-1]
    body: dict[str, Any] = {"model": model}
    if max_output_tokens is not None:
        body["max_tokens"] = max_output_tokens
    if system_blocks is not None:
        body["system"] = system_blocks
    elif system is not None:
        body["system"] = system
    body["messages"] = [{"role": role, "content": blocks} for role, blocks in _merge_turns(turns)]
    if frame.tools:
        body["tools"] = [_anthropic_tool(tool) for tool in frame.tools]
    if cache is not None:
        _anthropic_markers(body, last_blocks, cache)
        if cache.automatic:
            body["cache_control"] = _anthropic_marker(cache.ttl)
        if cache.diagnostics:
            body["diagnostics"] = {"previous_message_id": cache.previous_response_id}
    for turn in body["messages"]:
        # A turn that is one message of string content goes back as that string.
        blocks = turn["content"]
        if len(blocks) == 1 and id(blocks[0]) in plain and "cache_control" not in blocks[0]:
            turn["content"] = blocks[0]["text"]
    return body


def _anthropic_tool(tool: Tool) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "input_schema": (
            copy.deepcopy(tool.parameters)
            if tool.parameters
            else {"type": "object", "properties": {}}
        ),
    }
    if tool.strict:
        definition["strict"] = True
    return definition


def _anthropic_marker(ttl: Literal["5m", "1h"]) -> dict[str, str]:
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": "1h"}


def _anthropic_markers(
    body: dict[str, Any], last_blocks: dict[int, dict[str, Any]], cache: CacheDirectives
) -> None:
    """Put ``cache``'s markers on the last tool and on the last block of each marked message
    (or of the nearest message before it that has a block), each with its own lifetime."""
    if cache.tools and body.get("tools"):
        body["tools"][-1]["cache_control"] = _anthropic_marker(cache.tools_ttl or cache.ttl)
    ttls = cache.message_ttls or (cache.ttl,) * len(cache.messages)
    for message, ttl in zip(cache.messages, ttls, strict=True):
        index = next((i for i in range(message, -1, -1) if i in last_blocks), None)
        if index is not None:
            last_blocks[index]["cache_control"] = _anthropic_marker(ttl)


# --------------------------------------------------------------------------- Gemini


def _gemini_opaque(part: OpaquePart) -> dict[str, Any]:
    fields = _opaque(part)
    fields.pop("type", None)
    return fields


def _gemini_parts(content: str | list[Any]) -> list[dict[str, Any]]:
    """Parts of a message; empty texts are dropped (the API refuses empty text parts)."""
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [
        {"text": part.text} if isinstance(part, TextPart) else _gemini_opaque(part)
        for part in content
        if not (isinstance(part, TextPart) and not part.text)
    ]


def _marked_gemini(role: str, content: str | list[Any]) -> list[dict[str, Any]]:
    parts = _gemini_parts(content)
    if not parts:
        return []
    if "text" in parts[0]:
        parts[0]["text"] = f"{_marker(role)}\n{parts[0]['text']}"
    else:
        parts.insert(0, {"text": _marker(role)})
    return parts


def _gemini_function_name(message: Message, index: int, call_names: dict[str, str]) -> str:
    if message.tool_call_id is not None and message.tool_call_id in call_names:
        return call_names[message.tool_call_id]
    if message.name is not None:
        return message.name
    path = f"frame.messages[{index}]"
    raise InvalidError(
        f"{path}: render 'gemini' needs the function name of a tool result; give a tool_call_id "
        "matching an earlier tool call, or a name",
        field=path,
    )


def _gemini(frame: Frame, max_output_tokens: int | None) -> dict[str, Any]:
    # Gemini API reference, generateContent (Content, Part, FunctionCall, FunctionResponse,
    # systemInstruction, GenerationConfig), and its function calling guide.
    system, start = _split_system(frame.messages)
    call_names: dict[str, str] = {}
    for message in frame.messages:
        for call in message.tool_calls or ():
            call_names.setdefault(call.id, call.name)
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for index, message in enumerate(frame.messages[start:], start=start):
        if message.role in _INSTRUCTION_ROLES:
            turns.append(("user", _marked_gemini(message.role, message.content)))
        elif message.role == "user":
            turns.append(("user", _gemini_parts(message.content)))
        elif message.role == "assistant":
            parts = _gemini_parts(message.content)
            parts.extend(
                {"functionCall": {"name": call.name, "args": _arguments_object(call.arguments)}}
                for call in message.tool_calls or ()
            )
            turns.append(("model", parts))
        else:
            response = {
                "functionResponse": {
                    "name": _gemini_function_name(message, index, call_names),
                    "response": {"content": "\n".join(_texts(message))},
                }
            }
            others = [
                _gemini_opaque(part)
                for part in (message.content if isinstance(message.content, list) else ())
                if isinstance(part, OpaquePart)
            ]
            turns.append(("user", [response, *others]))
    body: dict[str, Any] = {
        "contents": [{"role": role, "parts": parts} for role, parts in _merge_turns(turns)]
    }
    if system is not None:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    if frame.tools:
        declarations: list[dict[str, Any]] = []
        for tool in frame.tools:
            declaration: dict[str, Any] = {"name": tool.name, "description": tool.description}
            if tool.parameters:
                declaration["parameters"] = copy.deepcopy(tool.parameters)
            declarations.append(declaration)
        body["tools"] = [{"functionDeclarations": declarations}]
    if max_output_tokens is not None:
        body["generationConfig"] = {"maxOutputTokens": max_output_tokens}
    return body
