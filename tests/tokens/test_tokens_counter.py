"""Token counters and the count cache: exact counts, LRU behaviour, process-wide instances, chat framing."""

from __future__ import annotations

import threading

import pytest

from context_assembly.core.counting import (
    TokenCounter,
    TokenizerName,
    count_message,
    count_text_message,
)
from context_assembly.core.request import Block, Message
from context_assembly.tokens.counter import (
    SHORT_KEY_CHARS,
    CachedCounter,
    CacheInfo,
    CountCache,
    TiktokenCounter,
    get_counter,
)
from context_assembly.tokens.encodings import get_encoding
from context_assembly.tokens.estimate import EstimateCounter
from context_assembly.tokens.registry import ModelRegistry


class RecordingCounter:
    """A fake inner counter that records what it was asked to count."""

    def __init__(self, name: TokenizerName = "o200k_base") -> None:
        self._name: TokenizerName = name
        self.calls: list[str] = []

    @property
    def name(self) -> TokenizerName:
        return self._name

    def count(self, text: str) -> int:
        self.calls.append(text)
        return len(text)


def test_tiktoken_counter_counts_with_encode_ordinary() -> None:
    """TiktokenCounter gives the exact o200k and cl100k counts, including for special-token text."""
    o200k = TiktokenCounter("o200k_base")
    cl100k = TiktokenCounter("cl100k_base")
    assert (o200k.name, cl100k.name) == ("o200k_base", "cl100k_base")
    assert o200k.count("hello world") == 2
    assert cl100k.count("tiktoken is great!") == 6
    text = "a <|endoftext|> b"
    assert o200k.count(text) == len(get_encoding("o200k_base").encode_ordinary(text))
    assert o200k.count("") == 0


def test_cached_counter_counts_each_text_once() -> None:
    """A repeated text is counted by the inner counter only once, then served from the cache."""
    inner = RecordingCounter()
    counter = CachedCounter(inner)
    long_text = "x" * 1000
    assert counter.count("short") == 5
    assert counter.count("short") == 5
    assert counter.count(long_text) == 1000
    assert counter.count(long_text) == 1000
    assert inner.calls == ["short", long_text]
    assert counter.cache_info() == CacheInfo(hits=2, misses=2, size=2, max_entries=65_536)


def test_cache_is_bounded_and_keeps_recently_used_entries() -> None:
    """Never more than max_entries; an entry used since the last rotation survives the next one."""
    inner = RecordingCounter()
    counter = CachedCounter(inner, max_entries=4)  # generations of 2
    counter.count("a")
    counter.count("b")  # young full: {a, b} becomes old
    counter.count("a")  # hit in old: refreshed into young
    counter.count("c")  # young {a, c} full: becomes old, {a, b} dropped; "a" survives via young
    counter.count("a")
    counter.count("b")  # "b" was not used since the rotation: counted again
    assert inner.calls == ["a", "b", "c", "b"]
    for i in range(100):
        counter.count(f"t{i}")
    assert counter.cache_info().size <= 4


def test_cache_key_is_text_when_short_and_hashes_when_long() -> None:
    """Short texts key by themselves; long ones by length and two hashes, never the text itself."""
    short = "s" * (SHORT_KEY_CHARS - 1)
    long = "l" * SHORT_KEY_CHARS
    assert CountCache.key("o200k_base", short) == ("o200k_base", short)
    key = CountCache.key("o200k_base", long)
    assert key[0] == "o200k_base" and len(key) == 4
    assert long not in key
    assert CountCache.key("o200k_base", long) == CountCache.key("o200k_base", "l" * SHORT_KEY_CHARS)
    assert CountCache.key("o200k_base", long) != CountCache.key("o200k_base", long + " ")
    assert CountCache.key("o200k_base", long) != CountCache.key("cl100k_base", long)


def test_shared_cache_separates_tokenizers() -> None:
    """Two counters sharing one cache never see each other's counts for the same text."""
    cache = CountCache()
    first = CachedCounter(RecordingCounter("o200k_base"), cache)
    second_inner = RecordingCounter("cl100k_base")
    second = CachedCounter(second_inner, cache)
    text = "same text " * 20
    first.count(text)
    second.count(text)
    assert second_inner.calls == [text]
    assert cache.info().size == 2


def test_cache_survives_lone_surrogates() -> None:
    """A long text with a lone surrogate is hashed without raising."""
    counter = CachedCounter(RecordingCounter())
    assert counter.count("\ud800" * 100) == 100


def test_cache_rejects_zero_size() -> None:
    """A cache must hold at least two entries (one per generation)."""
    with pytest.raises(ValueError, match="max_entries"):
        CountCache(1)


def test_cache_clear_resets_counts() -> None:
    """clear() empties the cache and its statistics."""
    cache = CountCache()
    counter = CachedCounter(RecordingCounter(), cache)
    counter.count("a")
    counter.count("a")
    cache.clear()
    assert cache.info() == CacheInfo(0, 0, 0, 65_536)


def test_cache_is_consistent_under_threads() -> None:
    """Eight threads hammering a small cache keep it within bounds and every count correct."""
    counter = CachedCounter(RecordingCounter(), max_entries=16)
    texts = [f"text-{i}-" + "y" * (i % 100) for i in range(64)]
    start = threading.Barrier(8)
    wrong: list[str] = []

    def worker(offset: int) -> None:
        start.wait()
        for round_ in range(50):
            text = texts[(offset + round_) % len(texts)]
            if counter.count(text) != len(text):
                wrong.append(text)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    info = counter.cache_info()
    assert wrong == []
    assert info.size <= 16
    assert info.hits + info.misses == 8 * 50


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base", "estimate"])
def test_get_counter_returns_one_instance_per_tokenizer(name: str) -> None:
    """get_counter gives the same object on every call, with the requested name."""
    counter = get_counter(name)  # type: ignore[arg-type]
    assert counter is get_counter(name)  # type: ignore[arg-type]
    assert counter.name == name


def test_get_counter_shares_one_cache() -> None:
    """All process-wide counters are cached in one shared cache, each around the right inner counter."""
    o200k = get_counter("o200k_base")
    cl100k = get_counter("cl100k_base")
    estimate = get_counter("estimate")
    assert isinstance(o200k, CachedCounter) and isinstance(o200k.inner, TiktokenCounter)
    assert isinstance(cl100k, CachedCounter) and isinstance(cl100k.inner, TiktokenCounter)
    assert isinstance(estimate, CachedCounter) and isinstance(estimate.inner, EstimateCounter)
    before = o200k.cache_info()
    cl100k.count("a text that is only counted by the cl100k counter")
    estimate.count("a text that is only counted by the estimate counter")
    assert o200k.cache_info().misses == before.misses + 2


def test_get_counter_rejects_unknown_names() -> None:
    """An unknown tokenizer name is a programming error, reported as ValueError."""
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_counter("p50k_base")  # type: ignore[arg-type]


def test_openai_chat_rule_for_gpt_4o() -> None:
    """{"role":"user","content":"hello world"} costs 3 + 1 ("user") + 2 ("hello", " world") = 6, plus 3 reply priming."""
    profile = ModelRegistry.load().lookup("gpt-4o")
    assert profile is not None
    counter: TokenCounter = get_counter(profile.tokenizer)
    encoding = get_encoding("o200k_base")
    assert encoding.encode_ordinary("user") == [1428]
    assert encoding.encode_ordinary("hello world") == [24912, 2375]
    message = Message(role="user", content="hello world")
    counted = count_message(message, counter, profile)
    assert counted.tokens == profile.tokens_per_message + 1 + 2 == 6
    assert not counted.opaque
    assert counted.tokens + profile.reply_priming == 9
    assert count_text_message("user", "hello world", counter, profile) == 6


def test_chat_rule_with_a_name_adds_name_overhead() -> None:
    """A named message adds tokens_per_name (1) plus the name's tokens."""
    profile = ModelRegistry.load().lookup("gpt-4o-mini-2024-07-18")
    assert profile is not None
    counter = get_counter(profile.tokenizer)
    named = count_message(
        Message(role="user", content="hello world", name="alice"), counter, profile
    )
    plain = count_message(Message(role="user", content="hello world"), counter, profile)
    assert named.tokens - plain.tokens == 1 + counter.count("alice")


def test_estimated_models_count_with_the_estimator() -> None:
    """A Claude model resolves to the estimate counter, which over-counts the same message."""
    profile = ModelRegistry.load().lookup("claude-sonnet-4-20250514")
    assert profile is not None and profile.tokenizer == "estimate"
    estimated = count_message(
        Message(role="user", content="hello world"), get_counter("estimate"), profile
    )
    assert estimated.tokens == 3 + 4 + 11  # framing + "user" (4 bytes) + "hello world" (11 bytes)
    assert estimated.tokens >= 6


def test_count_blocks_equals_counting_the_pieces_and_is_cached() -> None:
    """count_blocks gives the exact counts of both JSON pieces, and a repeat costs no counting."""
    from context_assembly.core.counting import block_piece

    inner = RecordingCounter()
    counter = CachedCounter(inner)
    text = 'A "quoted" text with a newline\n and unicode é ' * 4
    full, proj = counter.count_blocks([Block(id="doc-1", text=text, projection="short view")])[0]
    assert full == inner.count(block_piece("doc-1", text, False))
    assert proj == inner.count(block_piece("doc-1", "short view", True))
    calls = len(inner.calls)
    assert counter.count_blocks([Block(id="doc-1", text=text, projection="short view")])[0] == (
        full,
        proj,
    )
    assert len(inner.calls) == calls, "the second lookup is a cache hit"
    assert counter.count_blocks([Block(id="doc-1", text=text)])[0] == (full, -1)
    before = len(inner.calls)
    counter.count_blocks([Block(id="doc-2", text=text)])[0]
    assert len(inner.calls) == before + 1, "another id is another key"
    exact = CachedCounter(TiktokenCounter("o200k_base"))
    encoding = get_encoding("o200k_base")
    f, p = exact.count_blocks([Block(id="x", text=text, projection="view")])[0]
    assert f == len(encoding.encode_ordinary(block_piece("x", text, False)))
    assert p == len(encoding.encode_ordinary(block_piece("x", "view", True)))


# ------------------------------------------------------------------- the estimate of Sonnet 5


def _scaled_context(model: str) -> TokenCounter:
    from context_assembly.core.request import PrepareRequest
    from context_assembly.engine import model_context

    return model_context(PrepareRequest(model=model), ModelRegistry.load()).counter


@pytest.mark.parametrize(
    "text",
    [
        "hi",
        "hello world",
        "The quick brown fox jumps over the lazy dog. " * 40,
        "def f(x):\n    return x * 2\n" * 25,
        '{"id": "call_8f3a9b2c", "arguments": {"city": "Paris", "days": 3}}' * 10,
        "日本語のテキストと English が混ざった文章です。" * 12,
    ],
)
def test_sonnet_5_counts_at_least_1_3_times_sonnet_4_5(text: str) -> None:
    """Sonnet 5's newer tokenizer counts ~30% more than earlier Claude models on the same text:
    its estimate is the earlier models' times 1.3, rounded up (integer, deterministic)."""
    older = _scaled_context("claude-sonnet-4-5")
    newer = _scaled_context("claude-sonnet-5-20260630")
    assert older.name == newer.name == "estimate"
    before, after = older.count(text), newer.count(text)
    assert isinstance(after, int)
    assert after >= 1.3 * before
    assert after == -(-before * 13 // 10)  # exactly the ceiling, no float rounding
    assert newer.count(text) == after


def test_the_scaled_counter_counts_blocks_as_it_counts_pieces() -> None:
    """``count_blocks`` of the scaled estimate is exactly its ``count`` of each piece, which the
    selection relies on; without a projection the projected count stays -1."""
    from fractions import Fraction

    from context_assembly.core.counting import block_piece
    from context_assembly.tokens.counter import ScaledCounter, estimate_counter

    counter = estimate_counter(Fraction(13, 10))
    assert isinstance(counter, ScaledCounter)
    assert estimate_counter(Fraction(13, 10)) is counter
    assert estimate_counter(Fraction(1)) is get_counter("estimate")
    blocks = [
        Block(id="a", text="A block of plain English text, long enough to pass 64 bytes."),
        Block(id="b", text="Short.", projection="S."),
    ]
    assert counter.count_blocks(blocks) == [
        (counter.count(block_piece("a", blocks[0].text, False)), -1),
        (
            counter.count(block_piece("b", "Short.", False)),
            counter.count(block_piece("b", "S.", True)),
        ),
    ]
    # A calibration factor below 1 scales down; a scale must stay positive.
    assert ScaledCounter(get_counter("estimate"), Fraction(1, 2)).count("x" * 80) == -(
        -get_counter("estimate").count("x" * 80) // 2
    )
    with pytest.raises(ValueError, match="positive"):
        ScaledCounter(get_counter("estimate"), Fraction(0))
