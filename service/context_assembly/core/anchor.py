"""Counts anchored on the provider's usage report of the previous turn (docs/api.md, "Counts").

A model without a public tokenizer is counted with the conservative estimate, which is meant to
be over the real count and is, on real text, well over it. Once the previous turn of the scope
has a usage report of its main call, the provider has told the exact count of that turn's frame.
This turn's conversation (history, then input) usually begins with the previous turn's: that
shared part, with the tools and the leading message before it, is then counted with the
provider's figure, and only what changed is estimated:

- The previous frame's head (model, render, layout, tools in frame order, leading message) must
  be the same (``head``), else nothing is anchored.
- ``whole``: this conversation begins with all of the previous one. The shared part counts as the
  provider's figure for the whole previous frame. That figure also holds the previous turn's own
  per-turn and data messages, which are not in the shared part, so it is over by at most those.
- Otherwise (a strict prefix is shared) the shared part counts as the smaller of the two figures:
  a part of a frame never counts more than the whole frame, and the estimate is an upper bound.

Pure: hashes and figures in, a figure out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from context_assembly.core.fingerprint import digest
from context_assembly.core.request import Tool


@dataclass(frozen=True, slots=True)
class Anchor:
    """The previous turn as its record and its usage report describe it."""

    preparation_id: str
    head: str  # ``head_digest`` of the previous frame
    conversation: tuple[str, ...]  # message hashes of the conversation it sent
    provider_tokens: int  # the provider's input count of that frame


def head_digest(
    model: str, render: str, layout: str, tools: Sequence[Tool], leading: str | None
) -> str:
    """A digest of what comes before the conversation in a frame, and of how it is counted."""
    return digest(
        {
            "model": model,
            "render": render,
            "layout": layout,
            "tools": [t.model_dump(mode="json") for t in tools],
            "leading": leading,
        }
    )


def shared_length(previous: Sequence[str], current: Sequence[str]) -> int:
    """How many leading message hashes the two conversations share."""
    count = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class Anchored:
    """How the shared part of this frame counts."""

    preparation_id: str
    shared_messages: int
    whole: bool
    provider_tokens: int
    estimated_tokens: int
    counted_tokens: int

    @property
    def correction(self) -> int:
        return self.estimated_tokens - self.counted_tokens


def anchor_count(anchor: Anchor, shared_messages: int, estimated_tokens: int) -> Anchored:
    """The figure of the shared part: the provider's when the whole previous conversation is
    repeated, else the smaller of the provider's and the estimate (module doc)."""
    whole = shared_messages == len(anchor.conversation)
    counted = anchor.provider_tokens if whole else min(estimated_tokens, anchor.provider_tokens)
    return Anchored(
        anchor.preparation_id,
        shared_messages,
        whole,
        anchor.provider_tokens,
        estimated_tokens,
        counted,
    )
