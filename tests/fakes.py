"""Test doubles for the pure core: deterministic token counters and a model profile."""

from __future__ import annotations

import re

from context_assembly.core.counting import ModelProfile, TokenizerName

_WORDS = re.compile(r"\w+|[^\w\s]")


class WordCounter:
    """Counts words and single punctuation marks: cheap, deterministic, roughly BPE-shaped."""

    name: TokenizerName = "estimate"

    def count(self, text: str) -> int:
        return len(_WORDS.findall(text))


class SurchargeCounter:
    """A counter whose count of a long text exceeds the sum of its parts' counts.

    It makes per-block estimates under-count the whole message, which exercises the exact-count
    trim step of selection (real BPE does this rarely; this does it on purpose).
    """

    name: TokenizerName = "estimate"

    def __init__(self, threshold: int = 300, surcharge: int = 25) -> None:
        self.threshold = threshold
        self.surcharge = surcharge

    def count(self, text: str) -> int:
        return len(text) // 4 + (self.surcharge if len(text) > self.threshold else 0)


PROFILE = ModelProfile(
    name="test-model",
    provider="openai",
    context_window=128_000,
    max_output_tokens=16_384,
    tokenizer="estimate",
)
