"""Token counters behind the core's ``TokenCounter`` seam, and the count cache that makes repeats free.

* ``TiktokenCounter(name)``: exact counts with ``encode_ordinary`` (block text is data: a block
  containing ``<|endoftext|>`` is counted as the literal characters, never as a special token).
* ``CachedCounter(inner)``: memoises ``inner.count`` in a bounded LRU keyed by
  ``(tokenizer name, text key)``. The text key is the text itself below 64 characters (hashing
  would cost more than it saves) and its SHA-256 digest above, so a cached 100 KB block costs 32
  bytes of key, not 100 KB. SHA-256 rather than BLAKE2b because OpenSSL uses the CPU's SHA
  extensions: 1.8 µs against 3.0 µs per 1.25 KB on the project machine, and a hit is mostly
  hashing.
* ``get_counter(name)``: the process-wide counter for a tokenizer. All three (o200k, cl100k and
  the estimate) are cached and share one ``CountCache``, so the process has one memory bound.
  The estimate is cached too: on a 1.25 KB text it costs ~18 µs against ~5 µs for a hit.

Thread safety: the service counts on its event-loop thread, but large texts may be counted in a
worker thread (tiktoken releases the GIL). The cache takes a ``threading.Lock`` around each
dictionary operation only (never around counting), which costs ~0.1 µs uncontended; two threads
missing on the same text both count it and store the same value.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Final, NamedTuple

from context_assembly.core.counting import TokenCounter, TokenizerName
from context_assembly.tokens.encodings import EncodingName, get_encoding
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

    def __repr__(self) -> str:
        return f"TiktokenCounter({self._name!r})"


class CacheInfo(NamedTuple):
    """Counters of a ``CountCache`` since it was created or cleared."""

    hits: int
    misses: int
    size: int
    max_entries: int


CacheKey = tuple[str, str | bytes]


class CountCache:
    """A bounded LRU of token counts, keyed by ``(tokenizer name, text or its digest)``."""

    __slots__ = ("_entries", "_hits", "_lock", "_max_entries", "_misses")

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._max_entries = max_entries
        self._entries: OrderedDict[CacheKey, int] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @staticmethod
    def key(tokenizer: str, text: str) -> CacheKey:
        """The cache key of ``text`` (a ``str`` key never equals a ``bytes`` key)."""
        if len(text) < SHORT_KEY_CHARS:
            return (tokenizer, text)
        # surrogatepass: a lone surrogate is legal in a str and must not make counting raise.
        return (tokenizer, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())

    def get(self, key: CacheKey) -> int | None:
        """The cached count, marking it most recently used; ``None`` on a miss."""
        with self._lock:
            count = self._entries.get(key)
            if count is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries.move_to_end(key)
            return count

    def put(self, key: CacheKey, count: int) -> None:
        """Store a count, evicting the least recently used entries beyond ``max_entries``."""
        with self._lock:
            self._entries[key] = count
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, len(self._entries), self._max_entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._hits = 0
            self._misses = 0


class CachedCounter:
    """A ``TokenCounter`` that remembers the counts of ``inner`` (see the module docstring)."""

    __slots__ = ("_cache", "_inner")

    def __init__(
        self,
        inner: TokenCounter,
        cache: CountCache | None = None,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._inner = inner
        self._cache = cache if cache is not None else CountCache(max_entries)

    @property
    def name(self) -> TokenizerName:
        return self._inner.name

    @property
    def inner(self) -> TokenCounter:
        return self._inner

    def count(self, text: str) -> int:
        key = CountCache.key(self._inner.name, text)
        count = self._cache.get(key)
        if count is None:
            count = self._inner.count(text)
            self._cache.put(key, count)
        return count

    def cache_info(self) -> CacheInfo:
        """Hits, misses and size of the underlying cache (shared caches report shared totals)."""
        return self._cache.info()

    def __repr__(self) -> str:
        return f"CachedCounter({self._inner!r})"


_counters: dict[TokenizerName, TokenCounter] = {}
_counters_lock = threading.Lock()
_shared_cache = CountCache()


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
