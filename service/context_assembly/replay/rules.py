"""The providers' prompt-cache rules, as documented, simulated on a prompt's content blocks.

Pure: a prompt (its content blocks in prompt order, each with a digest of the prompt through it,
its token count and its cache marker) and the time go in; the usage the provider would report
comes out, and the simulator keeps its cache entries for the next request. Nothing here knows
about the service, traces or request bodies (``frames`` turns a body into blocks).

Anthropic (``AnthropicCache``), from its prompt-caching documentation:

- the prompt is read as tools, then system, then messages; its content blocks are each tool
  definition, each system block and each message content block;
- a ``cache_control`` marker caches the prompt's prefix through the block that carries it;
- at a marker the provider also looks for an existing entry at the block boundaries before it:
  the marker's own boundary and the ``LOOKBACK`` (20) boundaries before it; the request reads the
  longest live entry any of its markers finds;
- an entry exists only where an earlier request put a marker (an entry read through the lookback
  is one an earlier request wrote at its own marker);
- a marker whose prefix is below the model's minimum cacheable length caches nothing (and finds
  nothing); a model without a minimum (``None``) caches nothing at all;
- at most ``MAX_MARKERS`` (4) markers: a request with more is refused (``TooManyMarkers``);
- cache creation is the tokens from the read point to the last marker, each stretch between two
  markers written at the later marker's lifetime;
- an entry lives 5 minutes (or 1 hour with ``ttl: "1h"``) after it was written or last read:
  every read refreshes it, and a request's markers leave a live entry behind them.

OpenAI (``OpenAICache``): automatic prefix caching, no markers: a request reads the longest
prefix it shares with a request of the last 5 minutes (``OPENAI_LIFETIME``), counted from the
model's minimum (1,024 tokens) up in steps of 128; every request leaves its prefixes behind it.
The prefix is compared block by block (a message, a tool): a prefix that ends inside a block is
not counted, which under-states a read by at most the step.

OpenAI GPT-5.6 and later (``OpenAIBreakpointCache``, models with ``explicit_cache_breakpoints``),
from its prompt caching guide and the ``prompt_cache_options`` reference:

- an entry is written only at a breakpoint: a block with ``prompt_cache_breakpoint`` (``Segment``
  ``breakpoint``) or, in the default implicit mode, OpenAI's own at the newest block it may mark
  (``eligible``: not an assistant's); at most ``MAX_MARKERS`` (4) per request: the latest 3
  explicit ones beside the implicit one, or the latest 4 in explicit mode
  (``prompt_cache_options.mode: "explicit"``); none below the model's minimum;
- a request reads the longest of its prefixes that ends exactly at a live entry among the latest
  ``OPENAI_MATCHED`` (80) written, however far back: no shorter prefix, no 128-token steps;
- cache creation is the tokens from the read point to the last breakpoint written; an entry lives
  ``OPENAI_BREAKPOINT_LIFETIME`` (30 minutes, the ``ttl`` default) after it was written or read.

``TheoryCache`` is the upper bound of any client: every request reads the longest prefix it
shares with any earlier request whose entry is still alive (its lifetime refreshed by each use),
at every block boundary, from the model's minimum up.

Prices are relative to an uncached input token (``Prices``): Anthropic reads 0.1, 5-minute writes
1.25, 1-hour writes 2; OpenAI writes cost what uncached input costs (1.25 times on GPT-5.6 and
later) and reads the model's cached price (``openai_prices``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Ttl = Literal["5m", "1h"]

LOOKBACK: Final = 20
"""How many block boundaries before a marker Anthropic checks for an entry (beside its own)."""

MAX_MARKERS: Final = 4
"""Anthropic accepts at most four ``cache_control`` markers in one request."""

LIFETIME: Final[dict[Ttl, float]] = {"5m": 300.0, "1h": 3600.0}
"""An Anthropic entry's lifetime after it was written or last read, in seconds."""

OPENAI_LIFETIME: Final = 300.0
"""OpenAI keeps a prefix five to ten minutes idle; the lower bound is taken."""

OPENAI_STEP: Final = 128
"""OpenAI caches from the model's minimum up in steps of this many tokens."""

OPENAI_MATCHED: Final = 80
"""How many of the latest breakpoints written OpenAI matches a request against (GPT-5.6 on)."""

OPENAI_BREAKPOINT_LIFETIME: Final = 1800.0
"""An entry's lifetime on GPT-5.6 and later: the ``30m`` ttl, a documented minimum."""

OPENAI_BREAKPOINT_WRITE: Final = 1.25
"""The price of a cache write on GPT-5.6 and later, relative to uncached input."""


class TooManyMarkers(ValueError):
    """A prompt with more cache markers than the provider accepts (it refuses the request)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One content block of a prompt: ``key`` is a digest of the prompt through this block (equal
    keys, equal prefixes), ``tokens`` its own tokens, ``marker`` its cache marker's lifetime."""

    key: bytes
    tokens: int
    marker: Ttl | None = None
    breakpoint: bool = False  # an OpenAI ``prompt_cache_breakpoint`` on the block
    eligible: bool = True  # a block OpenAI's implicit breakpoint may end on (not an assistant's)


@dataclass(frozen=True, slots=True)
class Usage:
    """What the provider reports for one request: its whole input, the part read from the cache
    and the parts written to it (by lifetime). The rest was sent uncached."""

    input_tokens: int
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def uncached(self) -> int:
        return self.input_tokens - self.cache_read - self.cache_write


@dataclass(frozen=True, slots=True)
class Prices:
    """Prices of a token relative to an uncached input token, and, where the model has a price
    (``tokens/prices.py``), USD per million input tokens by bucket: uncached, read, 5-minute and
    1-hour writes (``None``: no price, or a bucket the price has no rate for)."""

    read: float
    write_5m: float
    write_1h: float
    usd: tuple[float | None, float | None, float | None, float | None] | None = None
    output: float = 5.0  # an output token, relative to an uncached input token

    def cost(self, usage: Usage, output_tokens: int = 0) -> float:
        """The request's input cost in uncached-token units (with ``output_tokens``: those
        too, at ``output``; only a summary call of the replay counts its output)."""
        return (
            usage.uncached
            + usage.cache_read * self.read
            + usage.cache_write_5m * self.write_5m
            + usage.cache_write_1h * self.write_1h
            + output_tokens * self.output
        )

    def dollars(self, usage: Usage, output_tokens: int = 0) -> float | None:
        """The request's input cost in USD at the model's price (``None`` without one, or when
        a bucket with tokens has no rate); ``output_tokens`` as in ``cost``."""
        if self.usd is None:
            return None
        total = 0.0
        if output_tokens:
            if self.usd[0] is None:
                return None
            total += output_tokens * self.output * self.usd[0] / 1_000_000
        buckets = (usage.uncached, usage.cache_read, usage.cache_write_5m, usage.cache_write_1h)
        for tokens, rate in zip(buckets, self.usd, strict=True):
            if tokens and rate is None:
                return None
            total += tokens * (rate or 0.0) / 1_000_000
        return total


ANTHROPIC_PRICES: Final = Prices(read=0.1, write_5m=1.25, write_1h=2.0)

# OpenAI's cached-input price as a share of its input price, per model family (the pricing
# page): the first prefix that the model's registry name starts with wins.
_OPENAI_READ: Final = (
    ("gpt-5", 0.1),
    ("gpt-4.1", 0.25),
    ("o3", 0.25),
    ("o4", 0.25),
    ("gpt-4o", 0.5),
    ("o1", 0.5),
)
OPENAI_DEFAULT_READ: Final = 0.5
OPENAI_OUTPUT: Final = 8.0
"""An output token relative to an input one, without the model's price (GPT-5's ratio)."""


def openai_prices(model: str, *, breakpoints: bool = False) -> Prices:
    """OpenAI's prices for ``model`` (a registry name): writes cost what uncached input costs,
    or ``OPENAI_BREAKPOINT_WRITE`` on a model with explicit breakpoints (``breakpoints``)."""
    read = next((share for prefix, share in _OPENAI_READ if model.startswith(prefix)), None)
    share = OPENAI_DEFAULT_READ if read is None else read
    write = OPENAI_BREAKPOINT_WRITE if breakpoints else 1.0
    return Prices(read=share, write_5m=write, write_1h=write, output=OPENAI_OUTPUT)


def _boundaries(prompt: Sequence[Segment]) -> list[int]:
    """The tokens through each block: ``ends[i]`` is the prefix through ``prompt[i]``."""
    ends: list[int] = []
    total = 0
    for segment in prompt:
        total += segment.tokens
        ends.append(total)
    return ends


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float


class _Entries:
    """Cache entries by prefix key, each alive until ``expires`` (exclusive)."""

    __slots__ = ("_entries", "_swept")

    def __init__(self) -> None:
        self._entries: dict[bytes, _Entry] = {}
        self._swept = 0.0

    def live(self, key: bytes, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        return entry if entry is not None and now < entry.expires else None

    def put(self, key: bytes, now: float, ttl: float) -> None:
        """A live entry at ``key`` for ``ttl`` seconds from ``now`` (an entry that already
        lives longer keeps its expiry)."""
        entry = self._entries.get(key)
        if entry is None or entry.expires < now + ttl:
            self._entries[key] = _Entry(now + ttl, ttl)

    def longest_live(
        self, prompt: Sequence[Segment], ends: Sequence[int], minimum: int, now: float
    ) -> int:
        """The tokens through the last block of ``prompt`` whose entry is live, among those at
        least ``minimum`` long (0: none)."""
        for i in range(len(prompt) - 1, -1, -1):
            if ends[i] < minimum:
                break
            if self.live(prompt[i].key, now) is not None:
                return ends[i]
        return 0

    def refresh(self, entry: _Entry, now: float) -> None:
        entry.expires = max(entry.expires, now + entry.ttl)

    def sweep(self, now: float) -> None:
        """Forget expired entries (at most once a simulated minute: it is only memory)."""
        if now - self._swept < 60:
            return
        self._swept = now
        self._entries = {k: e for k, e in self._entries.items() if now < e.expires}


class AnthropicCache:
    """Anthropic's explicit prompt caching for one model (rules in the module doc).

    ``minimum`` is the model's minimum cacheable length (``min_cacheable_prefix``), ``None`` when
    the provider caches nothing for it.
    """

    def __init__(self, minimum: int | None) -> None:
        self.minimum = minimum
        self._entries = _Entries()

    def send(self, prompt: Sequence[Segment], now: float) -> Usage:
        """The usage of ``prompt`` sent at ``now`` (seconds); updates the entries."""
        markers = [i for i, segment in enumerate(prompt) if segment.marker is not None]
        if len(markers) > MAX_MARKERS:
            raise TooManyMarkers(f"{len(markers)} cache markers (at most {MAX_MARKERS})")
        ends = _boundaries(prompt)
        total = ends[-1] if ends else 0
        minimum = self.minimum
        if minimum is None:
            return Usage(total)
        effective = [i for i in markers if ends[i] >= minimum]
        self._entries.sweep(now)
        # The read point: the longest live entry found at a marker or in its lookback.
        read_at = -1
        read_entry: _Entry | None = None
        for marker in effective:
            for i in range(marker, max(marker - LOOKBACK, 0) - 1, -1):
                if i <= read_at:
                    break
                entry = self._entries.live(prompt[i].key, now)
                if entry is not None:
                    read_at, read_entry = i, entry
                    break
        read = ends[read_at] if read_at >= 0 else 0
        if read_entry is not None:
            self._entries.refresh(read_entry, now)
        written = {"5m": 0, "1h": 0}
        start = read
        for marker in effective:
            ttl = prompt[marker].marker
            assert ttl is not None
            if ends[marker] > start:
                written[ttl] += ends[marker] - start
                start = ends[marker]
            self._entries.put(prompt[marker].key, now, LIFETIME[ttl])
        return Usage(total, read, written["5m"], written["1h"])


class OpenAICache:
    """OpenAI's automatic prefix caching for one model (rules in the module doc)."""

    def __init__(self, minimum: int | None, lifetime: float = OPENAI_LIFETIME) -> None:
        self.minimum = minimum
        self.lifetime = lifetime
        self._entries = _Entries()

    def send(self, prompt: Sequence[Segment], now: float) -> Usage:
        ends = _boundaries(prompt)
        total = ends[-1] if ends else 0
        minimum = self.minimum
        if minimum is None:
            return Usage(total)
        self._entries.sweep(now)
        shared = self._entries.longest_live(prompt, ends, minimum, now)
        read = 0 if shared < minimum else minimum + (shared - minimum) // OPENAI_STEP * OPENAI_STEP
        for segment in prompt:
            self._entries.put(segment.key, now, self.lifetime)
        return Usage(total, read)


class OpenAIBreakpointCache:
    """OpenAI's caching on GPT-5.6 and later for one model (rules in the module doc)."""

    def __init__(self, minimum: int | None) -> None:
        self.minimum = minimum
        self._entries = _Entries()
        self._latest: list[bytes] = []  # the keys of the latest breakpoints written, oldest first

    def send(self, prompt: Sequence[Segment], now: float, *, explicit: bool = False) -> Usage:
        """The usage of ``prompt`` sent at ``now``; ``explicit``: the request's
        ``prompt_cache_options.mode`` is ``explicit`` (no implicit breakpoint)."""
        ends = _boundaries(prompt)
        total = ends[-1] if ends else 0
        minimum = self.minimum
        if minimum is None:
            return Usage(total)
        self._entries.sweep(now)
        matched = set(self._latest)
        read = 0
        for i in range(len(prompt) - 1, -1, -1):
            if ends[i] < minimum:
                break
            entry = self._entries.live(prompt[i].key, now) if prompt[i].key in matched else None
            if entry is not None:
                read = ends[i]
                self._entries.refresh(entry, now)
                break
        marked = [i for i, segment in enumerate(prompt) if segment.breakpoint]
        if explicit:
            chosen = marked[-MAX_MARKERS:]
        else:
            newest = next((i for i in range(len(prompt) - 1, -1, -1) if prompt[i].eligible), None)
            chosen = marked[-(MAX_MARKERS - 1) :] + ([] if newest is None else [newest])
        written = sorted({i for i in chosen if ends[i] >= minimum})
        for i in written:
            key = prompt[i].key
            self._entries.put(key, now, OPENAI_BREAKPOINT_LIFETIME)
            if key in matched:
                self._latest.remove(key)
            self._latest.append(key)
        del self._latest[:-OPENAI_MATCHED]
        write = max(0, ends[written[-1]] - read) if written else 0
        return Usage(total, read, cache_write_5m=write)


class TheoryCache:
    """The most any client could read: the longest live shared prefix at any block boundary;
    what lies beyond it is written (when the prompt reaches the minimum)."""

    def __init__(self, minimum: int | None, ttl: Ttl = "5m", *, writes: bool = True) -> None:
        self.minimum = minimum
        self.ttl = ttl
        self.writes = writes
        self._entries = _Entries()

    def send(self, prompt: Sequence[Segment], now: float) -> Usage:
        ends = _boundaries(prompt)
        total = ends[-1] if ends else 0
        minimum = self.minimum
        if minimum is None or total < minimum:
            return Usage(total)
        self._entries.sweep(now)
        read = self._entries.longest_live(prompt, ends, minimum, now)
        lifetime = LIFETIME[self.ttl]
        for i, segment in enumerate(prompt):
            if ends[i] >= minimum:
                self._entries.put(segment.key, now, lifetime)
        if not self.writes:
            return Usage(total, read)
        written = total - read
        if self.ttl == "1h":
            return Usage(total, read, cache_write_1h=written)
        return Usage(total, read, cache_write_5m=written)
