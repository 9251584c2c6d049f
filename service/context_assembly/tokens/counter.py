"""Token counters behind the core's ``TokenCounter`` seam, and the count cache that makes repeats free.

* ``TiktokenCounter(name)``: exact counts with ``encode_ordinary`` (block text is data: a block
  containing ``<|endoftext|>`` is counted as the literal characters, never as a special token).
  Its ``splits(left, right)`` says where counts add up across a join (``encodings.splits_between``),
  so that ``core.counting.count_joined`` sums the counts of a text's parts instead of counting it.
* ``CachedCounter(inner)``: memoises ``inner.count`` in a bounded two-generation cache keyed by
  ``(tokenizer name, text key)``. The text key is the text itself below 64 characters and two
  hashes of it above (see ``CountCache``), so a cached 100 KB block costs a few machine words of
  key, not 100 KB. Its ``splits`` is its inner counter's (none for the estimate).
* ``get_counter(name)``: the process-wide counter for a tokenizer. All three (o200k, cl100k and
  the estimate) are cached and share one ``CountCache``, so the process has one memory bound.
  The estimate is cached too: on a 1.25 KB text it costs ~18 µs against ~1 µs for a hit.
* ``ScaledCounter(inner, scale)`` / ``estimate_counter(scale)``: the estimate times a model's
  ``estimate_scale`` (at least 1), each count rounded up, for a model whose tokenizer counts more
  than the estimator allows for. It reads the cached estimate, so scaling costs no second cache.

Thread safety: the service counts on its event-loop thread, but large texts may be counted in a
worker thread (tiktoken releases the GIL). The cache uses no lock: each dictionary operation is
atomic under the GIL, counting happens outside them, and two threads missing on the same text
both count it and store the same value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Final, NamedTuple, cast

from context_assembly.core.counting import TokenCounter, TokenizerName, block_piece
from context_assembly.core.request import Block
from context_assembly.tokens.encodings import EncodingName, get_encoding, splits_between
from context_assembly.tokens.estimate import EstimateCounter

SHORT_KEY_CHARS: Final = 64
DEFAULT_MAX_ENTRIES: Final = 65_536


class TiktokenCounter:
    """Exact token counts for an OpenAI encoding, from the shipped rank files."""

    __slots__ = ("_encode", "_name")

    def __init__(self, encoding_name: EncodingName) -> None:
        self._name: EncodingName = encoding_name
        self._encode = get_encoding(encoding_name).encode_ordinary

    @property
    def name(self) -> EncodingName:
        return self._name

    def count(self, text: str) -> int:
        return len(self._encode(text))

    def splits(self, left: str, right: str) -> bool:
        """Whether the count of ``left + right + rest`` is that of ``left`` plus that of
        ``right + rest`` (``encodings.splits_between``)."""
        return splits_between(left, right)

    def __repr__(self) -> str:
        return f"TiktokenCounter({self._name!r})"


class CacheInfo(NamedTuple):
    """Counters of a ``CountCache`` since it was created or cleared."""

    hits: int
    misses: int
    size: int
    max_entries: int


CacheKey = tuple[str, str] | tuple[str, int, int, int] | tuple[str, str, int, int, int, int]
CacheValue = int | tuple[int, int]  # a text's count, or a block's (full, projected) piece counts


def _sample_hash(text: str) -> int:
    """A second, independent hash for long-text keys, over a fixed-size sample of the text.

    Hashing the whole text twice would double the cost of a hit on a 400 KB rendered message;
    a sample (three 64-character windows, length-dependent positions) keeps it constant. A wrong
    count still needs the full-text SipHash to collide *and* the samples and lengths to match.
    """
    size = len(text)
    middle = size // 2
    return hash((text[:64], text[middle : middle + 64], text[-64:]))


class CountCache:
    """A bounded cache of token counts in two generations, keyed by tokenizer and text identity.

    Keys: a short text (< 64 characters) keys by itself; a longer one by ``(length, hash(text),
    hash(sample))``: Python's keyed SipHash (seeded per process) of the whole text and of a
    fixed-size sample of it (``_sample_hash``), so the key never holds the text. A wrong count
    needs a 64-bit collision of the full-text hash between texts of the same length whose samples
    are also equal: far below the chance of a bit flip, and ~10x cheaper than a SHA-256 (which
    costs ~1.5 µs per 1 KB text, on a warm turn of 2,048 blocks most of the selection time). Python caches a ``str``'s hash, so a text counted twice in one
    request hashes once. Keys are process-local (the seed differs per process), as is the cache.

    Eviction: entries live in a *young* and an *old* dict. A hit in *old* is copied to *young*;
    when *young* reaches half of ``max_entries`` it becomes *old* and the previous *old* is
    dropped. So the cache never holds more than ``max_entries``, and an entry used since the last
    rotation survives the next one (an approximate LRU without a lock: single dict operations are
    atomic under the GIL; two threads missing the same text both count it and store one value).
    """

    __slots__ = ("_half", "_hits", "_max_entries", "_misses", "_old", "_young")

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 2:
            raise ValueError(f"max_entries must be at least 2, got {max_entries}")
        self._max_entries = max_entries
        self._half = max_entries // 2
        self._young: dict[CacheKey, CacheValue] = {}
        self._old: dict[CacheKey, CacheValue] = {}
        self._hits = 0
        self._misses = 0

    @staticmethod
    def key(tokenizer: str, text: str) -> CacheKey:
        """The cache key of ``text``: the text itself when short, else its length and two hashes."""
        size = len(text)
        if size < SHORT_KEY_CHARS:
            return (tokenizer, text)
        return (tokenizer, size, hash(text), _sample_hash(text))

    def get(self, key: CacheKey) -> CacheValue | None:
        """The cached count (refreshed into the young generation); ``None`` on a miss."""
        count = self._young.get(key)
        if count is None:
            count = self._old.get(key)
            if count is None:
                self._misses += 1
                return None
            self._store(key, count)
        self._hits += 1
        return count

    def put(self, key: CacheKey, count: CacheValue) -> None:
        """Store a count; rotates the generations when the young one is full."""
        self._store(key, count)

    def get_all(
        self, keys: Sequence[CacheKey], compute: Callable[[int], CacheValue]
    ) -> list[CacheValue]:
        """The cached value of each key, ``compute(i)`` stored for each ``keys[i]`` missing: what
        ``get`` and then ``put`` on a miss give, key by key, with the same counters. The young
        generation is looked up for the whole batch in one comprehension, because a warm
        selection looks up every block of every request here; only the rest go one by one."""
        young_get = self._young.get
        found = [young_get(key) for key in keys]
        misses = 0
        for i, value in enumerate(found):
            if value is not None:
                continue
            misses += 1
            key = keys[i]
            value = self.get(key)
            if value is None:
                value = compute(i)
                self.put(key, value)
            found[i] = value
        self._hits += len(keys) - misses
        return cast("list[CacheValue]", found)

    def _store(self, key: CacheKey, count: CacheValue) -> None:
        young = self._young
        young[key] = count
        if len(young) >= self._half:
            self._old = young
            self._young = {}

    def info(self) -> CacheInfo:
        young, old = self._young, self._old
        size = len(young) + sum(1 for k in old if k not in young)
        return CacheInfo(self._hits, self._misses, size, self._max_entries)

    def clear(self) -> None:
        self._young = {}
        self._old = {}
        self._hits = 0
        self._misses = 0


class CachedCounter:
    """A ``TokenCounter`` that remembers the counts of ``inner`` (see the module docstring)."""

    __slots__ = ("_cache", "_inner", "_name")

    def __init__(
        self,
        inner: TokenCounter,
        cache: CountCache | None = None,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._inner = inner
        self._name = inner.name
        self._cache = cache if cache is not None else CountCache(max_entries)

    @property
    def name(self) -> TokenizerName:
        return self._inner.name

    @property
    def inner(self) -> TokenCounter:
        return self._inner

    def count(self, text: str) -> int:
        """The count of ``text``: cached, or counted by ``inner`` and stored."""
        # CountCache.key, inlined: this is the hot path of a warm selection.
        cache = self._cache
        size = len(text)
        key: CacheKey = (
            (self._name, text)
            if size < SHORT_KEY_CHARS
            else (self._name, size, hash(text), _sample_hash(text))
        )
        found = cache.get(key)
        if found is None:
            found = self._inner.count(text)
            cache.put(key, found)
        assert isinstance(found, int)  # text keys and block keys differ in shape, never collide
        return found

    def splits(self, left: str, right: str) -> bool:
        """``inner.splits(left, right)``; ``False`` when ``inner`` has no ``splits``."""
        splits = getattr(self._inner, "splits", None)
        return splits is not None and bool(splits(left, right))

    def count_blocks(self, blocks: Sequence[Block]) -> list[tuple[int, int]]:
        """Each block's piece counts (full, projected or -1), cached per block in one entry; the
        pieces are serialised and counted only on a miss. Exactly what counting each block's
        pieces gives (``core.select``, which calls it when a counter has it, relies on that).

        The block id and the text length narrow the key: two texts must share both and a 64-bit
        keyed SipHash to collide (per pair about 2^-64), so one hash of each text suffices here.
        """
        name, inner = self._name, self._inner
        # One comprehension over the whole batch (this runs for every block on every request);
        # the pieces are serialised and counted only for the keys the cache misses.
        keys: list[CacheKey] = [
            (
                name,
                block.id,
                len(block.text),
                hash(block.text),
                -1 if block.projection is None else len(block.projection),
                0 if block.projection is None else hash(block.projection),
            )
            for block in blocks
        ]

        def pieces(i: int) -> tuple[int, int]:
            """Block ``i``'s full and projected (or -1) piece counts."""
            block = blocks[i]
            full = inner.count(block_piece(block.id, block.text, False))
            if block.projection is None:
                return full, -1
            return full, inner.count(block_piece(block.id, block.projection, True))

        return cast("list[tuple[int, int]]", self._cache.get_all(keys, pieces))

    def cache_info(self) -> CacheInfo:
        """Hits, misses and size of the underlying cache (shared caches report shared totals)."""
        return self._cache.info()

    def __repr__(self) -> str:
        return f"CachedCounter({self._inner!r})"


class ScaledCounter:
    """``inner``'s counts times ``scale``, each rounded up: integer arithmetic, so the same text
    always gets the same count. A scale of at least 1 is a model's ``estimate_scale`` (a
    tokenizer that counts more); the estimate's calibration (``core/calibration.py``) multiplies
    it by a bounded factor of at most 1, and only from the provider's own counts."""

    __slots__ = ("_den", "_inner", "_num", "_scale")

    def __init__(self, inner: TokenCounter, scale: Fraction) -> None:
        if scale <= 0:
            raise ValueError(f"a scale must be positive, got {scale}")
        self._inner = inner
        self._scale = scale
        self._num = scale.numerator
        self._den = scale.denominator

    @property
    def name(self) -> TokenizerName:
        return self._inner.name

    @property
    def scale(self) -> Fraction:
        return self._scale

    def count(self, text: str) -> int:
        return -(-self._inner.count(text) * self._num // self._den)

    def count_blocks(self, blocks: Sequence[Block]) -> list[tuple[int, int]]:
        """Each block's (full, projected or -1) piece counts, scaled: exactly what ``count`` gives
        for each piece (``core.select`` relies on that)."""
        num, den = self._num, self._den
        count_blocks = getattr(self._inner, "count_blocks", None)
        if count_blocks is None:
            inner = self._inner.count
            pieces = [
                (
                    inner(block_piece(b.id, b.text, False)),
                    -1 if b.projection is None else inner(block_piece(b.id, b.projection, True)),
                )
                for b in blocks
            ]
        else:
            pieces = count_blocks(blocks)
        return [
            (-(-full * num // den), -1 if proj < 0 else -(-proj * num // den))
            for full, proj in pieces
        ]

    def __repr__(self) -> str:
        return f"ScaledCounter({self._inner!r}, {self._scale})"


_counters: dict[TokenizerName, TokenCounter] = {}
_scaled: dict[Fraction, TokenCounter] = {}
_counters_lock = threading.Lock()
_shared_cache = CountCache()


def shared_count_cache() -> CountCache:
    """The one ``CountCache`` the counters of ``get_counter`` share (``/metrics`` shows its
    ``info()``)."""
    return _shared_cache


def get_counter(name: TokenizerName) -> TokenCounter:
    """The process-wide counter for a tokenizer (the first call for an encoding builds it, ~0.3 s)."""
    counter = _counters.get(name)
    if counter is None:
        with _counters_lock:
            counter = _counters.get(name)
            if counter is None:
                inner: TokenCounter
                if name == "estimate":
                    inner = EstimateCounter()
                elif name in ("o200k_base", "cl100k_base"):
                    inner = TiktokenCounter(name)
                else:
                    raise ValueError(f"unknown tokenizer {name!r}")
                counter = _counters[name] = CachedCounter(inner, _shared_cache)
    return counter


def estimate_counter(scale: Fraction) -> TokenCounter:
    """The process-wide estimate counter for ``scale``: ``get_counter("estimate")`` itself for a
    scale of 1, otherwise a ``ScaledCounter`` over it."""
    if scale == 1:
        return get_counter("estimate")
    counter = _scaled.get(scale)
    if counter is None:
        base = get_counter("estimate")  # before the lock: building it takes the lock too
        with _counters_lock:
            counter = _scaled.setdefault(scale, ScaledCounter(base, scale))
    return counter
