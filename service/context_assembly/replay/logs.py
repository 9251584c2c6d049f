"""Conversation logs: JSON lines, one model call each, read into conversations.

A line is ``{"timestamp", "request", "usage"}``: when the call was sent (RFC 3339 with an offset,
or a number of seconds: since the epoch from 10⁹ up, since the log's start below), the request
body as sent to the provider (OpenAI Chat, Anthropic Messages or OpenAI Responses), and the
provider's usage object when the log has it. An optional ``"format"`` (``anthropic``,
``openai-chat``, ``openai-responses``) names the body's format where the reader should not guess
it, and an optional ``"conversation"`` puts the line in a named conversation (default: one
conversation per file). Empty lines and lines starting with ``#`` are skipped.

The format is guessed from the body: ``input`` without ``messages`` is Responses; ``messages``
with a top-level ``system``, a tool with an ``input_schema``, a ``tool_use``/``tool_result`` block
or a ``claude`` model is Anthropic; any other ``messages`` body is OpenAI Chat.

Each call becomes a prepare request's parts: the system prompt (Anthropic ``system``, the
leading system or developer messages of Chat, Responses ``instructions`` and its leading system
or developer items) is ``instructions``; function tools are ``tools`` (a provider's own tools, such
as a web search, have no prepare form: they are left out and named in a note); the rest is the
conversation, split like a trace's. The plain client's body is the recorded body without its
cache markers; the ``recorded`` policy sends the body as it was recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from context_assembly.replay.conversation import Call, Conversation, Format, Reported
from context_assembly.replay.synth import DEFAULT_START

EPOCH_SECONDS = 1_000_000_000
DEFAULT_OUTPUT = 1024
_FORMATS: tuple[Format, ...] = ("anthropic", "openai-chat", "openai-responses")
_INSTRUCTION_ROLES = ("system", "developer")


class LogError(ValueError):
    """A log line that cannot be read; the message names the file and line."""


def _timestamp(value: Any, where: str) -> datetime:
    if isinstance(value, bool):
        raise LogError(f"{where}: timestamp must be RFC 3339 or a number of seconds")
    if isinstance(value, int | float):
        if value >= EPOCH_SECONDS:
            return datetime.fromtimestamp(float(value), UTC)
        return DEFAULT_START + timedelta(seconds=float(value))
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    raise LogError(f"{where}: timestamp must be RFC 3339 with an offset or a number of seconds")


def guess_format(body: dict[str, Any]) -> Format:
    if "messages" not in body and "input" in body:
        return "openai-responses"
    if "system" in body or str(body.get("model", "")).lower().startswith("claude"):
        return "anthropic"
    if any(isinstance(t, dict) and "input_schema" in t for t in body.get("tools") or ()):
        return "anthropic"
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
        ):
            return "anthropic"
    return "openai-chat"


def strip_markers(value: Any) -> Any:
    """``value`` without any ``cache_control`` member, at any depth."""
    if isinstance(value, dict):
        return {k: strip_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_markers(v) for v in value]
    return value


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _tools(body: dict[str, Any], fmt: Format, skipped: set[str]) -> tuple[dict[str, Any], ...]:
    out: list[dict[str, Any]] = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict):
            continue
        if fmt == "openai-chat":
            function = tool.get("function") if tool.get("type", "function") == "function" else None
        elif fmt == "openai-responses":
            function = tool if tool.get("type") == "function" else None
        else:
            function = (
                {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool["input_schema"],
                }
                if "input_schema" in tool and "name" in tool
                else None
            )
        if not isinstance(function, dict) or "name" not in function:
            skipped.add(str(tool.get("type") or tool.get("name") or "tool"))
            continue
        mapped: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description") or "",
            "parameters": function.get("parameters") or {},
        }
        if function.get("strict") is True:
            mapped["strict"] = True
        out.append(mapped)
    return tuple(out)


def _is_answer(message: dict[str, Any], fmt: Format) -> bool:
    if message.get("role") == "assistant":
        return True
    return fmt == "openai-responses" and message.get("type") in ("function_call", "reasoning")


def _is_user_text(message: dict[str, Any], fmt: Format) -> bool:
    if message.get("role") != "user":
        return False
    if fmt == "openai-responses":
        return bool(message.get("type", "message") == "message")
    content = message.get("content")
    if isinstance(content, list) and fmt == "anthropic":
        return any(isinstance(b, dict) and b.get("type") != "tool_result" for b in content)
    return True


def _conversation_parts(
    body: dict[str, Any], fmt: Format
) -> tuple[str | None, list[dict[str, Any]]]:
    """The instructions and the conversation's messages of a body."""
    if fmt == "anthropic":
        system = body.get("system")
        instructions = _text(system) or None
        return instructions, [strip_markers(m) for m in body.get("messages") or ()]
    if fmt == "openai-chat":
        messages = list(body.get("messages") or ())
    else:
        raw = body.get("input") or []
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    texts = (
        [str(body["instructions"])]
        if fmt == "openai-responses" and body.get("instructions")
        else []
    )
    start = 0
    while (
        start < len(messages)
        and isinstance(messages[start], dict)
        and messages[start].get("role") in _INSTRUCTION_ROLES
    ):
        texts.append(_text(messages[start].get("content")))
        start += 1
    return ("\n\n".join(t for t in texts if t) or None), messages[start:]


def _reported(usage: Any, fmt: Format) -> Reported | None:
    if not isinstance(usage, dict):
        return None

    def number(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    if fmt == "anthropic":
        parts = [
            number(usage.get(k))
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        ]
        total = None if parts[0] is None else sum(p or 0 for p in parts)
        return Reported(total, parts[1], parts[2])
    if "prompt_tokens" in usage:
        details = usage.get("prompt_tokens_details") or {}
        return Reported(
            number(usage.get("prompt_tokens")), number(details.get("cached_tokens")), None
        )
    details = usage.get("input_tokens_details") or {}
    return Reported(number(usage.get("input_tokens")), number(details.get("cached_tokens")), None)


def _output_tokens(usage: Any, body: dict[str, Any]) -> int:
    if isinstance(usage, dict):
        for key in ("output_tokens", "completion_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_OUTPUT


def _plain_body(body: dict[str, Any], fmt: Format) -> dict[str, Any]:
    return strip_markers(body) if fmt == "anthropic" else dict(body)


def read_lines(lines: Iterable[bytes | str], name: str) -> list[Conversation]:
    """The conversations of a log's lines (``name`` names the file in messages and results)."""
    grouped: dict[str, list[tuple[datetime, int, dict[str, Any], Any, Format]]] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{name}:{number}"
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            raise LogError(f"{where}: not JSON: {err}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("request"), dict):
            raise LogError(f"{where}: a line is an object with a 'request' body")
        body = entry["request"]
        if not isinstance(body.get("model"), str):
            raise LogError(f"{where}: the request names no model")
        fmt = entry.get("format") or guess_format(body)
        if fmt not in _FORMATS:
            raise LogError(f"{where}: format must be one of {', '.join(_FORMATS)}")
        at = _timestamp(entry.get("timestamp", 0), where)
        group = str(entry.get("conversation") or name)
        grouped.setdefault(group, []).append((at, number, body, entry.get("usage"), fmt))
    conversations = []
    for group, entries in grouped.items():
        entries.sort(key=lambda e: (e[0], e[1]))
        skipped: set[str] = set()
        calls: list[Call] = []
        previous: list[dict[str, Any]] | None = None
        for at, _, body, usage, fmt in entries:
            instructions, messages = _conversation_parts(body, fmt)
            call_split = next(
                (i + 1 for i in range(len(messages) - 1, -1, -1) if _is_answer(messages[i], fmt)), 0
            )
            turn_split = next(
                (i for i in range(len(messages) - 1, -1, -1) if _is_user_text(messages[i], fmt)), 0
            )
            rewritten = (
                previous is not None and messages[: len(previous)] != previous[: len(messages)]
            )
            previous = messages
            calls.append(
                Call(
                    index=len(calls) + 1,
                    at=at,
                    model=body["model"],
                    format=fmt,
                    instructions=instructions,
                    tools=_tools(body, fmt, skipped),
                    messages=tuple(messages),
                    call_split=call_split,
                    turn_split=turn_split,
                    output_tokens=_output_tokens(usage, body),
                    body=_plain_body(body, fmt),
                    recorded=body,
                    reported=_reported(usage, fmt),
                    rewritten=rewritten,
                )
            )
        notes = []
        if skipped:
            notes.append(f"tools without a prepare form left out: {', '.join(sorted(skipped))}")
        conversations.append(Conversation(group, calls, notes, "log"))
    return conversations


def read_log(path: Path) -> list[Conversation]:
    name = path.name.removesuffix(".jsonl")
    try:
        with path.open("rb") as handle:
            return read_lines(handle, name)
    except OSError as err:
        raise LogError(f"{path.name}: cannot read: {err.strerror}") from None
