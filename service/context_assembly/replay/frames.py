"""A provider request body as the content blocks the cache rules read (``rules.Segment``), with
the simulated provider's token count of each.

The simulated provider counts text with ``o200k_base`` (the encoding shipped in ``tokens/``; the
replay's synthesised text is made of words that are one token each, so its counts are exact by
construction) and adds a fixed framing, the model registry's default figures:

- each message: ``MESSAGE_FRAMING`` (3), on its first block;
- each tool definition: its name, its description and its compact JSON schema, plus
  ``TOOL_FRAMING`` (8);
- each tool call and each tool result: ``CALL_FRAMING`` (4) beside its name and compact JSON
  arguments, or its content;
- the system prompt: ``MESSAGE_FRAMING`` once, on its first block;
- an image: ``IMAGE_TOKENS`` (1,105); any other block: the compact JSON of the block.

A block's key is a digest of the prompt through it: the previous block's key and the block's
canonical JSON without its ``cache_control`` (a string content and the same text as one text
block are the same block).

Anthropic (``anthropic_segments``): each tool definition, each system block (a string system is
one block) and each message content block (a string content is one text block), with its marker.
OpenAI Chat (``chat_segments``) and Responses (``responses_segments``): each tool definition and
each message or input item is one block (the rules compare whole blocks), with whether it
carries a ``prompt_cache_breakpoint`` (GPT-5.6 and later) and whether OpenAI's implicit
breakpoint may end on it (not an assistant's message or call). A message's key is taken without
its breakpoints, and a string content as one text block: the same message marked on one turn
and not on the next is the same block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import orjson

from context_assembly.replay.rules import Segment, Ttl
from context_assembly.tokens.encodings import get_encoding

MESSAGE_FRAMING: Final = 3
TOOL_FRAMING: Final = 8
CALL_FRAMING: Final = 4
IMAGE_TOKENS: Final = 1105

_JSON: Final = orjson.OPT_SORT_KEYS


class TextCounter:
    """``o200k_base`` counts of texts, memoised (a replayed conversation repeats its texts)."""

    __slots__ = ("_cache", "_encode")

    def __init__(self) -> None:
        self._encode = get_encoding("o200k_base").encode_ordinary
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        found = self._cache.get(text)
        if found is None:
            found = self._cache[text] = len(self._encode(text))
        return found

    def json(self, value: Any) -> int:
        return self(orjson.dumps(value, option=_JSON).decode())


def _bare(block: Any) -> Any:
    """``block`` without its ``cache_control``."""
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _marker(block: Any) -> Ttl | None:
    if not isinstance(block, dict):
        return None
    control = block.get("cache_control")
    if not isinstance(control, dict):
        return None
    return "1h" if control.get("ttl") == "1h" else "5m"


def _chain(items: Iterable[tuple[Any, Any, int]]) -> list[Segment]:
    """Segments of ``(identity, block, tokens)``: the key chains the identities (which hold no
    marker), the marker is the block's."""
    key = b""
    out: list[Segment] = []
    for identity, block, tokens in items:
        key = hashlib.sha256(key + orjson.dumps(identity, option=_JSON)).digest()
        out.append(Segment(key, tokens, _marker(block)))
    return out


def _text_of(value: Any) -> str:
    """The text of a string, or of the text parts of a list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(part) for part in value)
    if isinstance(value, dict):
        for field in ("text", "thinking", "output", "content"):
            inner = value.get(field)
            if isinstance(inner, str | list):
                return _text_of(inner)
    return ""


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return list(content)
    return []


# --------------------------------------------------------------------------- Anthropic


def _anthropic_block_tokens(block: Any, count: TextCounter) -> int:
    if not isinstance(block, dict):
        return count.json(block)
    kind = block.get("type")
    if kind == "text":
        return count(str(block.get("text", "")))
    if kind in ("thinking", "redacted_thinking"):
        return count(str(block.get("thinking", block.get("data", ""))))
    if kind == "tool_use":
        return CALL_FRAMING + count(str(block.get("name", ""))) + count.json(block.get("input", {}))
    if kind == "tool_result":
        return CALL_FRAMING + count(_text_of(block.get("content", "")))
    if kind == "image":
        return IMAGE_TOKENS
    return count.json(_bare(block))


def _anthropic_tool_tokens(tool: Mapping[str, Any], count: TextCounter) -> int:
    schema = tool.get("input_schema")
    return (
        TOOL_FRAMING
        + count(str(tool.get("name", "")))
        + count(str(tool.get("description", "")))
        + (count.json(schema) if schema is not None else 0)
    )


def _anthropic_items(body: Mapping[str, Any], count: TextCounter) -> Iterator[tuple[Any, Any, int]]:
    for tool in body.get("tools") or ():
        yield ["tool", _bare(tool)], tool, _anthropic_tool_tokens(tool, count)
    for i, block in enumerate(_blocks(body.get("system"))):
        tokens = (MESSAGE_FRAMING if i == 0 else 0) + _anthropic_block_tokens(block, count)
        yield ["system", _bare(block)], block, tokens
    for message in body.get("messages") or ():
        role = message.get("role")
        for i, block in enumerate(_blocks(message.get("content"))):
            # The role and the message boundary are part of the prefix.
            tokens = (MESSAGE_FRAMING if i == 0 else 0) + _anthropic_block_tokens(block, count)
            yield [role, i == 0, _bare(block)], block, tokens


def anthropic_segments(body: Mapping[str, Any], count: TextCounter) -> list[Segment]:
    """An Anthropic Messages body as its content blocks, in prompt order (module doc)."""
    return _chain(_anthropic_items(body, count))


# --------------------------------------------------------------------------- OpenAI

_BREAKPOINT: Final = "prompt_cache_breakpoint"


def _openai_blocks(value: Any, text_type: str) -> Any:
    """Content as the blocks OpenAI reads, without their breakpoints: a string is one
    ``text_type`` block; anything else (``None``) as it is."""
    if isinstance(value, str):
        return [{"type": text_type, "text": value}]
    if isinstance(value, list):
        return [
            {k: v for k, v in part.items() if k != _BREAKPOINT} if isinstance(part, dict) else part
            for part in value
        ]
    return value


def _has_breakpoint(value: Any) -> bool:
    return isinstance(value, list) and any(
        isinstance(part, dict) and _BREAKPOINT in part for part in value
    )


def _openai_chain(items: Iterable[tuple[Any, int, bool, bool]]) -> list[Segment]:
    """Segments of ``(identity, tokens, breakpoint, eligible)``, the keys chained as
    ``_chain``'s."""
    key = b""
    out: list[Segment] = []
    for identity, tokens, breakpoint, eligible in items:
        key = hashlib.sha256(key + orjson.dumps(identity, option=_JSON)).digest()
        out.append(Segment(key, tokens, breakpoint=breakpoint, eligible=eligible))
    return out


def openai_explicit_mode(body: Mapping[str, Any]) -> bool:
    """Whether an OpenAI body turns OpenAI's implicit breakpoint off
    (``prompt_cache_options.mode: "explicit"``)."""
    options = body.get("prompt_cache_options")
    return isinstance(options, dict) and options.get("mode") == "explicit"


def _chat_message_tokens(message: Mapping[str, Any], count: TextCounter) -> int:
    tokens = MESSAGE_FRAMING + count(_text_of(message.get("content") or ""))
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "")
        tokens += (
            CALL_FRAMING
            + count(str(function.get("name", "")))
            + (count(arguments) if isinstance(arguments, str) else count.json(arguments))
        )
    if message.get("role") == "tool":
        tokens += CALL_FRAMING
    return tokens


def _function_tool_tokens(function: Mapping[str, Any], count: TextCounter) -> int:
    parameters = function.get("parameters")
    return (
        TOOL_FRAMING
        + count(str(function.get("name", "")))
        + count(str(function.get("description", "") or ""))
        + (count.json(parameters) if parameters is not None else 0)
    )


def chat_segments(body: Mapping[str, Any], count: TextCounter) -> list[Segment]:
    """An OpenAI Chat body: each tool, then each message, one block each."""
    items: list[tuple[Any, int, bool, bool]] = []
    for tool in body.get("tools") or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        items.append((["tool", tool], _function_tool_tokens(function, count), False, False))
    for message in body.get("messages") or ():
        content = message.get("content")
        identity = {**message, "content": _openai_blocks(content, "text")}
        tokens = _chat_message_tokens(message, count)
        eligible = message.get("role") != "assistant"
        items.append((identity, tokens, _has_breakpoint(content), eligible))
    return _openai_chain(items)


def _responses_item_tokens(item: Any, count: TextCounter) -> int:
    if not isinstance(item, dict):
        return MESSAGE_FRAMING + count(_text_of(item))
    kind = item.get("type", "message")
    if kind == "message":
        return MESSAGE_FRAMING + count(_text_of(item.get("content", "")))
    if kind == "function_call":
        return (
            CALL_FRAMING + count(str(item.get("name", ""))) + count(str(item.get("arguments", "")))
        )
    if kind == "function_call_output":
        return CALL_FRAMING + count(_text_of(item.get("output", "")))
    if kind == "reasoning":
        return count.json(item.get("summary", []))
    return count.json(item)


def _responses_item(item: Any) -> tuple[Any, bool, bool]:
    """An input item's identity (without breakpoints), whether it carries one, and whether
    OpenAI's implicit breakpoint may end on it."""
    if not isinstance(item, dict):
        return item, False, True
    kind = item.get("type", "message")
    if kind == "function_call_output":
        output = item.get("output")
        return (
            {**item, "output": _openai_blocks(output, "input_text")},
            _has_breakpoint(output),
            True,
        )
    if kind == "message" and "content" in item:
        content = item["content"]
        identity = {**item, "content": _openai_blocks(content, "input_text")}
        return identity, _has_breakpoint(content), item.get("role") != "assistant"
    return item, False, False


def responses_segments(body: Mapping[str, Any], count: TextCounter) -> list[Segment]:
    """An OpenAI Responses body: the instructions, each tool, then each input item."""
    items: list[tuple[Any, int, bool, bool]] = []
    instructions = body.get("instructions")
    if instructions:
        tokens = MESSAGE_FRAMING + count(str(instructions))
        items.append((["instructions", instructions], tokens, False, True))
    for tool in body.get("tools") or ():
        items.append((["tool", tool], _function_tool_tokens(tool, count), False, False))
    raw = body.get("input") or ()
    inputs: Sequence[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    for item in inputs:
        identity, breakpoint, eligible = _responses_item(item)
        items.append((identity, _responses_item_tokens(item, count), breakpoint, eligible))
    return _openai_chain(items)


def segments(render: str, body: Mapping[str, Any], count: TextCounter) -> list[Segment]:
    """The content blocks of ``body`` in the format of ``render``."""
    if render == "anthropic":
        return anthropic_segments(body, count)
    if render == "openai-chat":
        return chat_segments(body, count)
    if render == "openai-responses":
        return responses_segments(body, count)
    raise ValueError(f"no cache rules for render {render!r}")
