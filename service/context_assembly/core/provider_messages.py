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
``read_messages`` also gives the index of the caller's message each neutral message was read
from; ``read_located`` (slower: read again only to name an error) its ``Origin``, where each of
its places is in what the caller sent, so that the model's validation errors name the caller's
message and field (``Origin.locate``), not the neutral message's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
        "compaction",
    }
)
_CHAT_MESSAGE_KEYS: Final = frozenset({"refusal", "annotations", "audio", "function_call"})
# Responses content parts: the rest of its item types stand as items of their own.
RESPONSES_CONTENT_TYPES: Final = frozenset(
    {"input_text", "output_text", "input_image", "input_file", "input_audio", "refusal"}
)
_IMAGES: Final = frozenset({"image", "image_url", "input_image"})
_FILES: Final = frozenset({"document", "file", "input_file", "input_audio"})


Loc = tuple[str | int, ...]
"""A place below a message: ``("content", 2, "text")``."""


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


def read_messages(messages: list[Any], declared: InputFormat) -> tuple[list[Any], list[int]]:
    """``messages`` with every provider-shaped message read into neutral ones (one message may
    give several: an Anthropic user turn with tool results), and the index of the caller's
    message each neutral one comes from (a Responses ``function_call`` merged into the assistant
    message before it keeps that message's index). Neutral ones are left as they are for the
    request model to validate; declared ``neutral``, the list itself is returned.
    ``ShapeError.loc`` starts with the message's index."""
    neutral, indexes, _ = _read(messages, declared, routed=False)
    return neutral, indexes


# Location parts pydantic adds for the member of a union it tried ("str", "list[...]",
# "function-after[...]") and the tags of the content parts: they name types, not places.
_TYPE_TAGS: Final = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
_PART_TAGS: Final = frozenset({"text", "image", "file", "opaque", "native"})


def _structural(loc: Loc) -> Loc:
    """``loc`` (below a neutral message, as pydantic names it) without its type tags, nor the
    tag of a content part (``content.0.native.item`` is ``content.0.item``)."""
    kept: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and (part in _TYPE_TAGS or "[" in part):
            continue
        if (
            part in _PART_TAGS
            and len(kept) >= 2
            and kept[-2] == "content"
            and isinstance(kept[-1], int)
        ):
            continue
        kept.append(part)
    return tuple(kept)


Route = tuple[Loc, int, Loc]
"""A place of a neutral message (a prefix), and the caller's message and place it was read from."""
Route2 = tuple[Loc, Loc]
"""A route within one caller's message: the neutral place, and the caller's place."""


@dataclass(slots=True)
class Origin:
    """Where a neutral message comes from: the caller's message ``index`` and, for one read from
    a provider's shape, where its places are in what the caller sent (``routes``; ``None``: the
    caller's own neutral message, whose places are the same)."""

    index: int
    routes: list[Route] | None = None

    def locate(self, loc: Loc) -> tuple[int, Loc]:
        """The caller's message and place of ``loc``, a place of the neutral message: the
        longest route that leads to it, the rest of ``loc`` kept below it."""
        if self.routes is None:
            return self.index, loc
        loc = _structural(loc)
        best: Route = ((), self.index, ())
        for route in self.routes:
            prefix = route[0]
            if len(prefix) > len(best[0]) and loc[: len(prefix)] == prefix:
                best = route
        prefix, index, place = best
        return index, (*place, *loc[len(prefix) :])


# A neutral message read from a provider's shape, with its routes (neutral place, caller's place)
# within the one caller's message it was read from.
_Read = tuple[dict[str, Any], list[Route2]]


def read_located(messages: list[Any], declared: InputFormat) -> tuple[list[Any], list[Origin]]:
    """:func:`read_messages`, with the ``Origin`` of each neutral message: where its places are
    in what the caller sent. (Read again to name an error: a read without the routes is faster.)"""
    neutral, indexes, routes = _read(messages, declared, routed=True)
    assert routes is not None
    return neutral, [Origin(index, found) for index, found in zip(indexes, routes, strict=True)]


def _read(
    messages: list[Any], declared: InputFormat, *, routed: bool
) -> tuple[list[Any], list[int], list[list[Route] | None] | None]:
    """The neutral messages of ``messages``, the caller's index of each and, when ``routed``,
    the routes of each (``None`` for the caller's own neutral message)."""
    if declared == "neutral":
        return messages, list(range(len(messages))), [None] * len(messages) if routed else None
    out: list[Any] = []
    indexes: list[int] = []
    routes: list[list[Route] | None] = []
    for index, message in enumerate(messages):
        fmt = detect(message) if declared == "auto" else declared
        if fmt == "neutral":
            out.append(message)
            indexes.append(index)
            if routed:
                routes.append(None)
            continue
        if not isinstance(message, dict):
            raise ShapeError((index,), f"a {fmt} message must be a JSON object")
        call = None
        try:
            if fmt == CHAT:
                read = [_from_chat(message, routed)]
            elif fmt == ANTHROPIC:
                read = list(_from_anthropic(message, routed))
            else:
                call = _responses_call(message, routed)
                read = [] if call is not None else [_from_responses(message, routed)]
        except ShapeError as err:
            raise ShapeError((index, *err.loc), f"{fmt} message: {err.message}") from None
        if call is not None and _joins(out):
            _join(out, indexes, routes if routed else None, index, call)
            continue
        if call is not None:
            read = [_call_message(call)]
        for neutral, found in read:
            out.append(neutral)
            indexes.append(index)
            if routed:
                routes.append([(prefix, index, place) for prefix, place in found])
    return out, indexes, routes if routed else None


def _joins(out: list[Any]) -> bool:
    """Whether a Responses ``function_call`` joins the message before it: calls that follow an
    assistant message belong to its turn (parallel calls too)."""
    return bool(out) and isinstance(out[-1], dict) and out[-1].get("role") == "assistant"


def _join(
    out: list[Any],
    indexes: list[int],
    routes: list[list[Route] | None] | None,
    index: int,
    call: _Read,
) -> None:
    """The call of the Responses item ``index`` added to the assistant message before it (and
    its routes to the message's, when ``routes`` are kept)."""
    previous: dict[str, Any] = out[-1]
    calls = previous.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        # The item cannot join them; the message before it is the one to name.
        raise ShapeError(
            (indexes[-1], "tool_calls"),
            "tool_calls must be a list (the function_call item after this message joins its calls)",
        )
    number = 0 if calls is None else len(calls)
    body, found = call
    out[-1] = {**previous, "tool_calls": [*(calls or ()), body]}
    if routes is None:
        return
    joined = list(routes[-1] or ())
    joined += [(("tool_calls", number, *prefix), index, place) for prefix, place in found]
    routes[-1] = joined


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
    content: Any,
    fmt: ProviderFormat,
    text_types: frozenset[str],
    loc: Loc,
    places: Sequence[Loc] | None = None,
) -> str | list[dict[str, Any]]:
    """A content string, or its parts: plain text parts as neutral text, the rest native.
    ``places``: the caller's place of each part (default: ``loc`` and its number)."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(_list(content, loc, "content")):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            place = (*loc, number) if places is None else places[number]
            raise ShapeError(place, "a content part must be an object with a 'type'")
        part = _present(part)
        extra = _rest(part, frozenset({"type", "text", "cache_control"}))
        if part["type"] in text_types and isinstance(part.get("text"), str) and not extra:
            parts.append({"type": "text", "text": part["text"]})
        elif part["type"] in text_types and isinstance(part.get("text"), str):
            parts.append(_native(fmt, _without_marker(part), part["text"]))
        else:
            parts.append(_native(fmt, _without_marker(part)))
    return parts


def _part_routes(
    content: Any, base: Loc = ("content",), places: Sequence[Loc] | None = None
) -> list[Route2]:
    """The routes of the parts of a neutral message's ``content``, read from the caller's parts
    at ``places`` (default: ``base`` and the part's number): a part to its place, and a native
    part's ``item`` (the part as the caller sent it) to the same place."""
    if not isinstance(content, list):
        return []
    routes: list[Route2] = []
    for number, part in enumerate(content):
        place = (*base, number) if places is None else places[number]
        routes.append((("content", number), place))
        if part.get("type") == "native":
            routes.append((("content", number, "item"), place))
    return routes


def _without_marker(part: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in part.items() if key != "cache_control"}


def _with_fields(message: dict[str, Any], fmt: ProviderFormat, fields: dict[str, Any]) -> None:
    if fields:
        message["provider_fields"] = {fmt: fields}


def _role(message: Mapping[str, Any], roles: frozenset[str], words: str) -> str:
    """The message's ``role``, one of ``roles`` (``words`` say which, in the error)."""
    role = message.get("role")
    if role is None:
        raise ShapeError(("role",), f"role must be {words}")
    if not isinstance(role, str):
        raise ShapeError(("role",), f"role must be {words}, not a JSON {_json_type(role)}")
    if role not in roles:
        raise ShapeError(("role",), f"role must be {words}, not {role!r}")
    return role


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# --------------------------------------------------------------------------- OpenAI Chat

_CHAT_KNOWN: Final = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_CHAT_TEXT: Final = frozenset({"text"})
_CHAT_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})


def _from_chat(message: dict[str, Any], routed: bool) -> _Read:
    # OpenAI API reference, chat completions: ChatCompletionMessageParam.
    role = _role(message, _CHAT_ROLES, "'system', 'developer', 'user', 'assistant' or 'tool'")
    neutral: dict[str, Any] = {"role": role}
    content = message.get("content")
    fields = _present(_rest(message, _CHAT_KNOWN | {"annotations"}))
    if content is None:
        neutral["content"] = ""
    else:
        neutral["content"] = _parts(content, CHAT, _CHAT_TEXT, ("content",))
    routes = _part_routes(neutral["content"]) if routed else []
    if message.get("name") is not None:
        neutral["name"] = message["name"]
    if message.get("tool_call_id") is not None:
        neutral["tool_call_id"] = message["tool_call_id"]
    calls = message.get("tool_calls")
    if calls is not None:
        listed = _list(calls, ("tool_calls",), "tool_calls")
        if listed:
            neutral["tool_calls"] = [
                _chat_call(call, ("tool_calls", number)) for number, call in enumerate(listed)
            ]
        for number in range(len(listed) if routed else 0):
            call_at: Loc = ("tool_calls", number)
            routes += [
                ((*call_at, "name"), (*call_at, "function", "name")),
                ((*call_at, "arguments"), (*call_at, "function", "arguments")),
                ((*call_at, "provider_fields", CHAT), call_at),
            ]
    _with_fields(neutral, CHAT, fields)
    if routed:
        routes.append((("provider_fields", CHAT), ()))
    return neutral, routes


def _chat_call(call: Any, loc: Loc) -> dict[str, Any]:
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
_ANTHROPIC_ROLES: Final = frozenset({"user", "assistant"})


def _from_anthropic(message: dict[str, Any], routed: bool) -> Iterator[_Read]:
    # Anthropic Messages API reference: MessageParam and its content blocks.
    role = _role(message, _ANTHROPIC_ROLES, "'user' or 'assistant'")
    extra = _rest(message, frozenset({"role", "content"}))
    if extra:
        raise ShapeError((next(iter(extra)),), "unknown message field")
    content = message.get("content")
    if isinstance(content, str):
        yield {"role": role, "content": content}, []
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
                yield _anthropic_assistant(blocks[start:number], start, routed)
                start = number
        if not blocks:
            yield {"role": "assistant", "content": ""}, []
        return
    # A user turn: each tool result is a tool message, other blocks a user message, in order.
    pending: list[Any] = []
    numbers: list[int] = []
    for number, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if pending:
                yield _anthropic_user(pending, numbers, routed)
                pending, numbers = [], []
            yield _anthropic_result(block, ("content", number), routed)
        else:
            pending.append(block)
            numbers.append(number)
    if pending or not blocks:
        yield _anthropic_user(pending, numbers, routed)


def _anthropic_user(blocks: list[Any], numbers: list[int], routed: bool) -> _Read:
    """A user message of the blocks numbered ``numbers`` of the caller's turn."""
    places: list[Loc] = [("content", number) for number in numbers]
    content = _parts(blocks, ANTHROPIC, _ANTHROPIC_TEXT, ("content",), places)
    return {"role": "user", "content": content}, (
        _part_routes(content, places=places) if routed else []
    )


def _is_tool_use(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use"


def _anthropic_assistant(blocks: Sequence[Any], offset: int, routed: bool) -> _Read:
    """One assistant message of ``blocks`` (content blocks, then tool_use blocks), the blocks of
    the caller's turn from number ``offset`` on."""
    others = [block for block in blocks if not _is_tool_use(block)]
    places: list[Loc] = [
        ("content", number)
        for number, block in enumerate(blocks, start=offset)
        if not _is_tool_use(block)
    ]
    calls: list[dict[str, Any]] = []
    routes: list[Route2] = []
    for number, block in enumerate(blocks, start=offset):
        if not _is_tool_use(block):
            continue
        loc: Loc = ("content", number)
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
        if routed:
            call_at: Loc = ("tool_calls", len(calls))
            routes += [
                (call_at, loc),
                ((*call_at, "arguments"), (*loc, "input")),
                ((*call_at, "provider_fields", ANTHROPIC), loc),
            ]
        calls.append(call)
    content = _parts(others, ANTHROPIC, _ANTHROPIC_TEXT, ("content",), places) if others else ""
    neutral: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        neutral["tool_calls"] = calls
    return neutral, (_part_routes(content, places=places) + routes if routed else routes)


def _anthropic_result(block: dict[str, Any], loc: Loc, routed: bool) -> _Read:
    content = block.get("content", "")
    neutral: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": _string(block.get("tool_use_id"), (*loc, "tool_use_id"), "tool_use_id"),
        "content": _parts(content, ANTHROPIC, _ANTHROPIC_TEXT, (*loc, "content")),
    }
    fields = _present(_rest(block, frozenset({"type", "tool_use_id", "content", "cache_control"})))
    _with_fields(neutral, ANTHROPIC, fields)
    if not routed:
        return neutral, []
    inner = neutral["content"]
    routes: list[Route2] = [
        (("content",), (*loc, "content")),
        (("tool_call_id",), (*loc, "tool_use_id")),
        (("provider_fields", ANTHROPIC), loc),
        *_part_routes(inner, (*loc, "content")),
    ]
    return neutral, routes


# --------------------------------------------------------------------------- OpenAI Responses

_RESPONSES_TEXT: Final = frozenset({"input_text", "output_text"})
_RESPONSES_ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


def _responses_call(item: dict[str, Any], routed: bool) -> _Read | None:
    """The tool call of a ``function_call`` item, with its routes; ``None`` for another item."""
    if item.get("type") != "function_call":
        return None
    item = _present(item)
    call: dict[str, Any] = {
        "id": _string(item.get("call_id"), ("call_id",), "call_id"),
        "name": _string(item.get("name"), ("name",), "name"),
        "arguments": _string(item.get("arguments", ""), ("arguments",), "arguments"),
    }
    fields = _rest(item, frozenset({"type", "call_id", "name", "arguments"}))
    if fields:
        call["provider_fields"] = {RESPONSES: fields}
    if not routed:
        return call, []
    return call, [((), ()), (("id",), ("call_id",)), (("provider_fields", RESPONSES), ())]


def _call_message(call: _Read) -> _Read:
    """A ``function_call`` item that follows no assistant message: an assistant turn of its own."""
    body, routes = call
    message = {"role": "assistant", "content": "", "tool_calls": [body]}
    return message, [(("tool_calls", 0, *prefix), place) for prefix, place in routes]


def _from_responses(item: dict[str, Any], routed: bool) -> _Read:
    # OpenAI API reference, responses: ResponseInputItemParam. (``function_call``:
    # ``_responses_call``.)
    item = _present(item)
    kind = item.get("type", "message")
    if kind == "message":
        role = _role(item, _RESPONSES_ROLES, "'system', 'developer', 'user' or 'assistant'")
        content = _parts(item.get("content"), RESPONSES, _RESPONSES_TEXT, ("content",))
        neutral: dict[str, Any] = {"role": role, "content": content}
        _with_fields(neutral, RESPONSES, _rest(item, frozenset({"role", "content"})))
        if not routed:
            return neutral, []
        return neutral, [*_part_routes(content), (("provider_fields", RESPONSES), ())]
    if kind == "function_call_output":
        output = item.get("output")
        content = _parts(output, RESPONSES, _RESPONSES_TEXT, ("output",))
        neutral = {
            "role": "tool",
            "tool_call_id": _string(item.get("call_id"), ("call_id",), "call_id"),
            "content": content,
        }
        _with_fields(neutral, RESPONSES, _rest(item, frozenset({"type", "call_id", "output"})))
        if not routed:
            return neutral, []
        return neutral, [
            (("content",), ("output",)),
            (("tool_call_id",), ("call_id",)),
            (("provider_fields", RESPONSES), ()),
            *_part_routes(content, ("output",)),
        ]
    if isinstance(kind, str):
        # reasoning, web_search_call, item_reference, ...: an item of its own, carried as given.
        carried = {"role": "assistant", "content": [_native(RESPONSES, item)]}
        return carried, [(("content", 0), ()), (("content", 0, "item"), ())] if routed else []
    raise ShapeError(("type",), "an item's type must be a string")
