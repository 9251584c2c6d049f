"""A recorded conversation as the replay drives it: one ``Call`` per model call, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from context_assembly.replay.rules import Usage

Format = Literal["anthropic", "openai-chat", "openai-responses"]


@dataclass(frozen=True, slots=True)
class Reported:
    """The usage a log recorded for a call, normalised (``None``: the provider did not say)."""

    input_tokens: int | None
    cache_read: int | None
    cache_write: int | None


@dataclass(frozen=True, slots=True)
class Call:
    """One model call of a conversation.

    ``messages`` is the conversation in the provider's shape (``format``), without the system
    prompt (``instructions``) and tools (``tools``, in the prepare request's shape); the caller's
    input starts at ``call_split`` when it splits per model call (what came since the model last
    answered) and at ``turn_split`` when it splits per turn (since the last user text message).
    ``body`` is the request a plain client sends, without any cache marker; ``recorded`` the body
    as a log recorded it (markers included), ``None`` for a trace.
    """

    index: int
    at: datetime
    model: str
    format: Format
    instructions: str | None
    tools: tuple[dict[str, Any], ...]
    messages: tuple[dict[str, Any], ...]
    call_split: int
    turn_split: int
    output_tokens: int
    body: dict[str, Any]
    recorded: dict[str, Any] | None = None
    reference_input_tokens: int | None = None
    reported: Reported | None = None
    rewritten: bool = False


@dataclass(slots=True)
class Conversation:
    """A conversation's calls and what the reader noted about its source."""

    name: str
    calls: list[Call]
    notes: list[str] = field(default_factory=list)
    kind: Literal["trace", "log"] = "trace"


def simulated_usage(provider_format: Format, usage: Usage, output_tokens: int) -> dict[str, Any]:
    """``usage`` as the provider's own usage object (the body of a usage report)."""
    if provider_format == "anthropic":
        return {
            "input_tokens": usage.uncached,
            "cache_read_input_tokens": usage.cache_read,
            "cache_creation_input_tokens": usage.cache_write,
            "cache_creation": {
                "ephemeral_5m_input_tokens": usage.cache_write_5m,
                "ephemeral_1h_input_tokens": usage.cache_write_1h,
            },
            "output_tokens": output_tokens,
        }
    # GPT-5.6 and later report their writes beside the reads; the others write nothing.
    details: dict[str, int] = {"cached_tokens": usage.cache_read}
    if usage.cache_write:
        details["cache_write_tokens"] = usage.cache_write
    if provider_format == "openai-chat":
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": output_tokens,
            "prompt_tokens_details": details,
        }
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": output_tokens,
        "input_tokens_details": details,
    }
