"""Conversations in the providers' own shapes, read into the neutral message shape
(docs/api.md, "Provider-shaped history and input").

``history`` and ``input`` accept, besides neutral messages, messages as an agent already holds
them for OpenAI Chat, Anthropic Messages or OpenAI Responses. Each message is read in the
format the request declares (``input_format``) or, with ``"auto"``, the one its shape shows
(``detect``). Nothing is lost:

- text becomes text parts (counted exactly); tool calls become ``tool_calls`` and tool results
  ``tool`` messages, paired by id and kept in order;
- anything else (images, files, audio, Anthropic ``thinking`` with its signature, Responses
  ``reasoning`` items, server tool items, text carrying citations or annotations) is carried as
  a ``native`` part holding the item as given, which the renderer of the same format sends back
  unchanged (and any other renderer refuses by name);
- fields of a message or tool call that the neutral shape has no place for (a Responses item's
  ``id`` and ``status``, Anthropic's ``is_error``, an OpenAI message's ``refusal: null``) are kept
  in its ``provider_fields`` under the format's name and sent back by that format's renderer.

Anthropic ``cache_control`` markers are not kept: the service places its own (``cache``). A field
whose value is ``null`` is read as absent (SDK dumps of a provider's answer spell every unset
field so: ``refusal``, ``audio``, ``caller``, ``citations``), except OpenAI Chat's
``content: null``; so is OpenAI Chat's ``annotations``, a field of the answer that no request
declares.

Pure: JSON in, JSON out; a message that cannot be read raises ``ShapeError`` naming where.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal

InputFormat = Literal["auto", "neutral", "openai-chat", "anthropic", "openai-responses"]
ProviderFormat = Literal["openai-chat", "anthropic", "openai-responses"]

CHAT: Final = "openai-chat"
ANTHROPIC: Final = "anthropic"
RESPONSES: Final = "openai-responses"

# Content-part types that only one format has (used by ``detect``).
_RESPONSES_PARTS: Final = frozenset({"input_text", "output_text", "input_image", "input_file"})
_CHAT_PARTS: Final = frozenset({"image_url", "input_audio"})
_ANTHROPIC_PARTS: Final = frozenset(
    {
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)
_CHAT_MESSAGE_KEYS: Final = frozenset({"refusal", "annotations", "audio", "function_call"})
# Responses content parts: the rest of its item types stand as items of their own.
RESPONSES_CONTENT_TYPES: Final = frozenset(
    {"input_text", "output_text", "input_image", "input_file", "input_audio", "refusal"}
)
_IMAGES: Final = frozenset({"image", "image_url", "input_image"})
_FILES: Final = frozenset({"document", "file", "input_file", "input_audio"})


class ShapeError(ValueError):
    """A message that cannot be read; ``loc`` is the path below the message (``("content", 2)``)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


# --------------------------------------------------------------------------- detection


def _part_types(content: Any) -> set[str]:
    if not isinstance(content, list):
        return set()
    return {
        part["type"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("type"), str)
    }


def detect(message: Any) -> InputFormat:
    """The format a message's shape shows; ``"neutral"`` when it shows none (a neutral message,
    or one every format reads alike, such as ``{"role": "user", "content": "hi"}``)."""
    if not isinstance(message, dict):
        return "neutral"
    if "type" in message:
        return RESPONSES
    types = _part_types(message.get("content"))
    if types & _RESPONSES_PARTS:
        return RESPONSES
    if types & _ANTHROPIC_PARTS:
        return ANTHROPIC
    calls = message.get("tool_calls")
    if (
        (isinstance(calls, list) and any(isinstance(c, dict) and "function" in c for c in calls))
        or ("content" in message and message["content"] is None)
        or types & _CHAT_PARTS
        or _CHAT_MESSAGE_KEYS & message.keys()
    ):
        return CHAT
    return "neutral"


def to_neutral(messages: Any, declared: InputFormat) -> list[Any]:
    """``messages`` with every provider-shaped message read into neutral ones (one message may
    give several: an Anthropic user turn with tool results). Neutral ones are left as they are
    for the request model to validate. ``ShapeError.loc`` starts with the message's index."""
    if not isinstance(messages, list) or declared == "neutral":
        return messages  # type: ignore[no-any-return]
    return read_messages(messages, declared)[0]


def read_messages(messages: list[Any], declared: InputFormat) -> tuple[list[Any], list[int]]:
    """:func:`to_neutral` of a list, with the index of the caller's message each neutral one
    comes from (a Responses ``function_call`` merged into the assistant message before it keeps
    that message's index)."""
    if declared == "neutral":
        return messages, list(range(len(messages)))
    out: list[Any] = []
    origins: list[int] = []
    for index, message in enumerate(messages):
        fmt = detect(message) if declared == "auto" else declared
        if fmt == "neutral":
            out.append(message)
        elif not isinstance(message, dict):
            raise ShapeError((index,), f"a {fmt} message must be a JSON object")
        else:
            try:
                if fmt == CHAT:
                    out.append(_from_chat(message))
                elif fmt == ANTHROPIC:
                    out.extend(_from_anthropic(message))
                else:
                    _from_responses(message, out)
            except ShapeError as err:
                raise ShapeError((index, *err.loc), f"{fmt} message: {err.message}") from None
        origins.extend([index] * (len(out) - len(origins)))
    return out, origins


# --------------------------------------------------------------------------- shared


def _native(
    fmt: ProviderFormat, item: Mapping[str, Any], text: str | None = None
) -> dict[str, Any]:
    """A part carried as given. ``text``: what the service counts for it (exact); without it the
    part is counted as an image, a file, or its JSON, and marks the counts uncertain."""
    part: dict[str, Any] = {"type": "native", "format": fmt, "item": dict(item)}
    if text is not None:
        part["text"] = text
    kind = item.get("type")
    if text is None and kind in _IMAGES:
        part["media"] = "image"
    elif text is None and kind in _FILES:
        part["media"] = "file"
    return part


def _rest(item: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key not in known}


def _present(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` without its ``null`` fields (read as absent)."""
    return {key: value for key, value in item.items() if value is not None}


def _string(value: Any, loc: tuple[str | int, ...], what: str) -> str:
    if not isinstance(value, str):
        raise ShapeError(loc, f"{what} must be a string")
    return value


def _list(value: Any, loc: tuple[str | int, ...], what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ShapeError(loc, f"{what} must be a list")
    return value


def _parts(
    content: Any, fmt: ProviderFormat, text_types: frozenset[str], loc: tuple[str | int, ...]
) -> str | list[dict[str, Any]]:
    """A content string, or its parts: plain text parts as neutral text, the rest native."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(_list(content, loc, "content")):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ShapeError((*loc, number), "a content part must be an object with a 'type'")
        part = _present(part)
        extra = _rest(part, frozenset({"type", "text", "cache_control"}))
        if part["type"] in text_types and isinstance(part.get("text"), str) and not extra:
            parts.append({"type": "text", "text": part["text"]})
        elif part["type"] in text_types and isinstance(part.get("text"), str):
            parts.append(_native(fmt, _without_marker(part), part["text"]))
        else:
            parts.append(_native(fmt, _without_marker(part)))
    return parts


def _without_marker(part: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in part.items() if key != "cache_control"}


def _with_fields(message: dict[str, Any], fmt: ProviderFormat, fields: dict[str, Any]) -> None:
    if fields:
        message["provider_fields"] = {fmt: fields}


# --------------------------------------------------------------------------- OpenAI Chat

_CHAT_KNOWN: Final = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_CHAT_TEXT: Final = frozenset({"text"})


def _from_chat(message: dict[str, Any]) -> dict[str, Any]:
    # OpenAI API reference, chat completions: ChatCompletionMessageParam.
    role = message.get("role")
    if role not in {"system", "developer", "user", "assistant", "tool"}:
        raise ShapeError(("role",), f"unknown role {role!r}")
    neutral: dict[str, Any] = {"role": role}
    content = message.get("content")
    fields = _present(_rest(message, _CHAT_KNOWN | {"annotations"}))
    if content is None:
        neutral["content"] = ""
    else:
        neutral["content"] = _parts(content, CHAT, _CHAT_TEXT, ("content",))
    if message.get("name") is not None:
        neutral["name"] = message["name"]
    if message.get("tool_call_id") is not None:
        neutral["tool_call_id"] = message["tool_call_id"]
    calls = message.get("tool_calls")
    if calls:
        neutral["tool_calls"] = [
            _chat_call(call, ("tool_calls", number))
            for number, call in enumerate(_list(calls, ("tool_calls",), "tool_calls"))
        ]
    _with_fields(neutral, CHAT, fields)
    return neutral


def _chat_call(call: Any, loc: tuple[str | int, ...]) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ShapeError(
            loc, "a tool call must be {id, type: 'function', function: {name, arguments}}"
        )
    function = call["function"]
    neutral: dict[str, Any] = {
        "id": _string(call.get("id"), (*loc, "id"), "a tool call's id"),
        "name": _string(function.get("name"), (*loc, "function", "name"), "a function's name"),
        "arguments": _string(
            function.get("arguments", ""), (*loc, "function", "arguments"), "arguments"
        ),
    }
    fields = _present(_rest(call, frozenset({"id", "type", "function"})))
    if call.get("type", "function") != "function":
        raise ShapeError((*loc, "type"), f"tool call type {call.get('type')!r} is not 'function'")
    if fields:
        neutral["provider_fields"] = {CHAT: fields}
    return neutral


# --------------------------------------------------------------------------- Anthropic

_ANTHROPIC_TEXT: Final = frozenset({"text"})


def _from_anthropic(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    # Anthropic Messages API reference: MessageParam and its content blocks.
    role = message.get("role")
    if role not in {"user", "assistant"}:
        raise ShapeError(("role",), f"role must be 'user' or 'assistant', not {role!r}")
    extra = _rest(message, frozenset({"role", "content"}))
    if extra:
        raise ShapeError((next(iter(extra)),), "unknown message field")
    content = message.get("content")
    if isinstance(content, str):
        yield {"role": role, "content": content}
        return
    blocks = _list(content, ("content",), "content")
    if role == "assistant":
        # Content after a tool_use block (interleaved thinking) starts another assistant
        # message: the Anthropic renderer merges them back into one turn, in the same order.
        start = 0
        for number in range(1, len(blocks) + 1):
            if number == len(blocks) or (
                _is_tool_use(blocks[number - 1]) and not _is_tool_use(blocks[number])
            ):
                yield _anthropic_assistant(blocks[start:number], start)
                start = number
        if not blocks:
            yield {"role": "assistant", "content": ""}
        return
    # A user turn: each tool result is a tool message, other blocks a user message, in order.
    pending: list[Any] = []
    for number, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if pending:
                yield {"role": "user", "content": _parts(pending, ANTHROPIC, _ANTHROPIC_TEXT, ())}
                pending = []
            yield _anthropic_result(block, ("content", number))
        else:
            pending.append(block)
    if pending or not blocks:
        yield {"role": "user", "content": _parts(pending, ANTHROPIC, _ANTHROPIC_TEXT, ("content",))}


def _is_tool_use(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use"


def _anthropic_assistant(blocks: Sequence[Any], offset: int) -> dict[str, Any]:
    """One assistant message of ``blocks`` (content blocks, then tool_use blocks)."""
    others = [block for block in blocks if not _is_tool_use(block)]
    calls: list[dict[str, Any]] = []
    for number, block in enumerate(blocks, start=offset):
        if not _is_tool_use(block):
            continue
        loc = ("content", number)
        call = {
            "id": _string(block.get("id"), (*loc, "id"), "a tool_use id"),
            "name": _string(block.get("name"), (*loc, "name"), "a tool_use name"),
            "arguments": block.get("input", {}),
        }
        if not isinstance(call["arguments"], dict):
            raise ShapeError((*loc, "input"), "a tool_use input must be an object")
        fields = _present(_rest(block, frozenset({"type", "id", "name", "input", "cache_control"})))
        if fields:
            call["provider_fields"] = {ANTHROPIC: fields}
        calls.append(call)
    neutral: dict[str, Any] = {
        "role": "assistant",
        "content": _parts(others, ANTHROPIC, _ANTHROPIC_TEXT, ("content",)) if others else "",
    }
    if calls:
        neutral["tool_calls"] = calls
    return neutral


def _anthropic_result(block: dict[str, Any], loc: tuple[str | int, ...]) -> dict[str, Any]:
    content = block.get("content", "")
    neutral: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": _string(block.get("tool_use_id"), (*loc, "tool_use_id"), "tool_use_id"),
        "content": _parts(content, ANTHROPIC, _ANTHROPIC_TEXT, (*loc, "content")),
    }
    fields = _present(_rest(block, frozenset({"type", "tool_use_id", "content", "cache_control"})))
    _with_fields(neutral, ANTHROPIC, fields)
    return neutral


# --------------------------------------------------------------------------- OpenAI Responses

_RESPONSES_TEXT: Final = frozenset({"input_text", "output_text"})


def _from_responses(item: dict[str, Any], out: list[Any]) -> None:
    # OpenAI API reference, responses: ResponseInputItemParam.
    item = _present(item)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in {"system", "developer", "user", "assistant"}:
            raise ShapeError(("role",), f"unknown role {role!r}")
        neutral: dict[str, Any] = {
            "role": role,
            "content": _parts(item.get("content"), RESPONSES, _RESPONSES_TEXT, ("content",)),
        }
        _with_fields(neutral, RESPONSES, _rest(item, frozenset({"role", "content"})))
        out.append(neutral)
    elif kind == "function_call":
        call: dict[str, Any] = {
            "id": _string(item.get("call_id"), ("call_id",), "call_id"),
            "name": _string(item.get("name"), ("name",), "name"),
            "arguments": _string(item.get("arguments", ""), ("arguments",), "arguments"),
        }
        fields = _rest(item, frozenset({"type", "call_id", "name", "arguments"}))
        if fields:
            call["provider_fields"] = {RESPONSES: fields}
        previous = out[-1] if out else None
        if isinstance(previous, dict) and previous.get("role") == "assistant":
            # Calls that follow an assistant message belong to its turn (parallel calls too).
            out[-1] = {**previous, "tool_calls": [*(previous.get("tool_calls") or ()), call]}
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        neutral = {
            "role": "tool",
            "tool_call_id": _string(item.get("call_id"), ("call_id",), "call_id"),
            "content": _parts(output, RESPONSES, _RESPONSES_TEXT, ("output",)),
        }
        _with_fields(neutral, RESPONSES, _rest(item, frozenset({"type", "call_id", "output"})))
        out.append(neutral)
    elif isinstance(kind, str):
        # reasoning, web_search_call, item_reference, ...: an item of its own, carried as given.
        out.append({"role": "assistant", "content": [_native(RESPONSES, item)]})
    else:
        raise ShapeError(("type",), "an item's type must be a string")
