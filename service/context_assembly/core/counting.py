"""How a frame is counted: the token-counter seam, model profiles and the chat framing rule.

For OpenAI chat models the published counting rule is: every message costs
``tokens_per_message`` plus the tokens of its role and content (plus ``tokens_per_name`` and the
name's tokens when a name is given), and every request adds ``reply_priming`` tokens for the
assistant's reply header (OpenAI Cookbook, "How to count tokens with tiktoken"; 3, 1 and 3 for
the gpt-4o/gpt-4.1/o-series families). For text-only requests that equals the billed
``prompt_tokens``. Tool definitions, tool calls and non-text parts have no published rule: they
are counted as their compact JSON plus a per-item overhead from the model profile and, for
images/files/opaque items, a conservative constant; those make ``opaque_or_multimodal`` true.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import orjson

from context_assembly.core.request import Message, NativePart, TextPart, Tool

TokenizerName = Literal["o200k_base", "cl100k_base", "estimate"]


class TokenCounter(Protocol):
    """Counts the tokens of one text. Implementations must be deterministic and side-effect free.

    ``name`` is the tokenizer used; an ``estimate`` counter must never under-count (upper bound).
    A counter may also have ``splits(left, right) -> bool``: true only when the count of
    ``left + right + rest`` is the count of ``left`` plus that of ``right + rest``, whatever
    ``rest`` is (:func:`count_joined` relies on it; ``tokens/counter.py`` has it for tiktoken).
    """

    @property
    def name(self) -> TokenizerName: ...

    def count(self, text: str) -> int: ...


def piece_object(block_id: str, text: str, projected: bool) -> dict[str, object]:
    """One block's object in the data message (``projected`` marks a projection)."""
    if projected:
        return {"id": block_id, "projected": True, "text": text}
    return {"id": block_id, "text": text}


def block_piece(block_id: str, text: str, projected: bool) -> str:
    """The compact JSON of one block in the data message (``piece_object`` serialised)."""
    return orjson.dumps(piece_object(block_id, text, projected)).decode()


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Capacity and framing facts about one model (from the registry data file)."""

    name: str
    provider: Literal["openai", "anthropic", "google", "unknown"]
    context_window: int | None
    max_output_tokens: int | None
    tokenizer: TokenizerName
    tokens_per_message: int = 3
    tokens_per_name: int = 1
    reply_priming: int = 3
    tokens_per_tool: int = 8
    tokens_per_tool_call: int = 4
    image_tokens: int = 1_105
    file_tokens: int = 2_048
    min_cacheable_prefix: int | None = None
    # A factor (>= 1) on the conservative estimate, for a model whose tokenizer counts more than
    # the estimator allows for; only with tokenizer "estimate" (tokens/estimate.py).
    estimate_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class Counted:
    """A token count and whether it includes a guess for non-text content."""

    tokens: int
    opaque: bool = False

    def __add__(self, other: Counted) -> Counted:
        return Counted(self.tokens + other.tokens, self.opaque or other.opaque)


ZERO = Counted(0)


def _compact(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def count_message(message: Message, counter: TokenCounter, profile: ModelProfile) -> Counted:
    """Tokens one message costs in a chat request, framing overhead included."""
    tokens = profile.tokens_per_message + counter.count(message.role)
    opaque = False
    if isinstance(message.content, str):
        tokens += counter.count(message.content)
    else:
        for part in message.content:
            if isinstance(part, TextPart):
                tokens += counter.count(part.text)
                continue
            if isinstance(part, NativePart) and part.text is not None:
                tokens += counter.count(part.text)
                continue
            opaque = True
            media = part.media if isinstance(part, NativePart) else part.type
            if media == "image":
                tokens += profile.image_tokens
            elif media == "file":
                tokens += profile.file_tokens
            elif isinstance(part, NativePart):
                tokens += counter.count(_compact(part.item))
            else:
                tokens += counter.count(_compact(part.model_dump(mode="json")))
    if message.name is not None:
        tokens += profile.tokens_per_name + counter.count(message.name)
    for call in message.tool_calls or ():
        arguments = call.arguments if isinstance(call.arguments, str) else _compact(call.arguments)
        tokens += (
            profile.tokens_per_tool_call
            + counter.count(call.id)
            + counter.count(call.name)
            + counter.count(arguments)
        )
    if message.tool_call_id is not None:
        tokens += counter.count(message.tool_call_id)
    return Counted(tokens, opaque)


def count_joined(parts: Sequence[str], counts: Sequence[int], counter: TokenCounter) -> int:
    """The count of ``"".join(parts)``, given each part's own count: their sum when ``counter``
    splits at every join (its optional ``splits``; the pre-tokeniser of a BPE encoding encodes
    the text on each side of such a join alone), else one count of the whole text. Exact either
    way: a join that is not a split costs a full count, never a wrong one."""
    splits = getattr(counter, "splits", None)
    if splits is not None and all(map(splits, parts, parts[1:])):
        return sum(counts)
    return counter.count("".join(parts))


def count_text_message(
    role: str, content: str, counter: TokenCounter, profile: ModelProfile
) -> int:
    """Tokens of a plain text message built by the service (no name, no tool calls)."""
    return profile.tokens_per_message + counter.count(role) + counter.count(content)


def count_messages(
    messages: list[Message], counter: TokenCounter, profile: ModelProfile
) -> Counted:
    """Tokens of several messages, without the once-per-request reply priming."""
    total = ZERO
    for message in messages:
        total = total + count_message(message, counter, profile)
    return total


def count_tools(tools: list[Tool], counter: TokenCounter, profile: ModelProfile) -> int:
    """Tokens of the tool definitions: compact JSON of each plus a per-tool overhead."""
    return sum(
        profile.tokens_per_tool + counter.count(_compact(tool.model_dump(mode="json")))
        for tool in tools
    )
