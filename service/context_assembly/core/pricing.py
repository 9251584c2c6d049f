"""The price of one usage observation, bucket by bucket (pure: no I/O, no clock).

A price is USD per million tokens, per bucket (``Rates``). A usage observation is split into six
buckets (``UsageBuckets``), each priced at its own rate:

``uncached_input``
    Input tokens read neither from nor into the provider's prompt cache, at ``input``.
``cache_read``
    Input tokens read from the cache, at ``cache_read``.
``cache_write_5m`` / ``cache_write_1h``
    Input tokens written to Anthropic's cache for 5 minutes / 1 hour, at ``cache_write_5m`` /
    ``cache_write_1h``.
``cache_write``
    Input tokens written to the cache at the model's single write rate (OpenAI GPT-5.6 and later),
    at ``cache_write``; also where writes whose time to live the report does not tell go, which
    a model priced per time to live (Anthropic) then cannot price.
``output``
    Generated tokens, reasoning included, at ``output``.

From the normalized usage (``core.usage.NormalizedUsage``), whose ``provider_input_tokens`` is
every input token the provider processed, cache reads and writes included, whatever the
provider (Anthropic's ``input_tokens`` excludes both cache parts, so normalisation adds them
back; OpenAI's ``prompt_tokens`` / ``input_tokens`` and Gemini's ``promptTokenCount`` already
include them)::

    uncached_input = provider_input_tokens - cached_input_tokens - cache_creation_input_tokens
    cache_read     = cached_input_tokens
    cache writes   = cache_creation_input_tokens (split by time to live when the caller knows it)
    output         = output_tokens

A cache part the report does not name counts as 0; a report without its input or output total
cannot be priced (``None``).

Arithmetic: every bucket costs ``tokens x rate / 1,000,000`` computed exactly in decimals, then
rounded half-even to 1e-9 USD; the total is the exact sum of the buckets, rounded the same way
(so it may differ from the sum of the rounded buckets by a few 1e-9). A model priced with a
``long_context`` tier is priced wholly at that tier when the observation's input (all input
buckets together) exceeds ``above_input_tokens``, as the providers bill such requests.

Nothing is guessed: without a price there is no cost (``None``), and a bucket holding tokens
whose rate the price does not give makes the whole observation unpriced (``None``;
``unpriced_buckets`` names which) rather than priced at another bucket's rate.

The price of a cache miss (``miss_cost``) is what the observation cost less what it would have
cost had ``tokens`` more of its input been read from the cache (``read_from_cache``). Those
tokens are taken from the writes first, then from the uncached input: the part a miss bills
again is the start of the prompt, which a provider that writes (Anthropic, by its markers)
writes again along with what follows, up to the last marker; what follows the last marker is
the uncached rest. Among the writes, 1-hour ones come first (Anthropic places them before
5-minute ones), then 5-minute ones, then writes at the single rate.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Final

from context_assembly.core.usage import NormalizedUsage

PER_MILLION: Final = Decimal(1_000_000)
QUANTUM: Final = Decimal("0.000000001")
"""Costs are rounded half-even to this many USD (1e-9)."""

_CONTEXT: Final = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN)

BUCKETS: Final = (
    "uncached_input",
    "cache_read",
    "cache_write_5m",
    "cache_write_1h",
    "cache_write",
    "output",
)
# The rate each bucket is priced at.
_RATE_OF: Final = {
    "uncached_input": "input",
    "cache_read": "cache_read",
    "cache_write_5m": "cache_write_5m",
    "cache_write_1h": "cache_write_1h",
    "cache_write": "cache_write",
    "output": "output",
}


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per million tokens; ``None``: the provider publishes no such rate for the model."""

    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    cache_write_5m: Decimal | None = None
    cache_write_1h: Decimal | None = None


@dataclass(frozen=True, slots=True)
class PriceRates:
    """A model's rates, with the rates of its long-context tier when it has one: those apply to
    a whole observation whose input exceeds ``long_context_above`` tokens."""

    base: Rates
    long_context_above: int | None = None
    long_context: Rates | None = None

    def __post_init__(self) -> None:
        if (self.long_context_above is None) != (self.long_context is None):
            raise ValueError("long_context_above and long_context are given together")


@dataclass(frozen=True, slots=True)
class UsageBuckets:
    """One usage observation's tokens, by the rate they are billed at (module docstring)."""

    uncached_input: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    cache_write: int = 0
    output: int = 0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{item.name} must be a non-negative integer, not {value!r}")

    @property
    def input_tokens(self) -> int:
        """Every input token of the observation, cached or not."""
        return (
            self.uncached_input
            + self.cache_read
            + self.cache_write_5m
            + self.cache_write_1h
            + self.cache_write
        )


@dataclass(frozen=True, slots=True)
class Cost:
    """The cost of one observation in USD, per bucket and in total, each rounded to 1e-9.
    ``long_context``: the long-context tier's rates applied."""

    uncached_input: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    cache_write: Decimal
    output: Decimal
    total: Decimal
    long_context: bool = False


def buckets_from_normalized(
    usage: NormalizedUsage,
    *,
    cache_write_1h: int | None = None,
    cache_write_5m: int | None = None,
) -> UsageBuckets | None:
    """The buckets of a normalized report (module docstring), or ``None`` when it does not
    give its input or output total.

    The cache writes (``cache_creation_input_tokens``) go to ``cache_write`` unless the caller
    splits them by time to live: with ``cache_write_1h`` and/or ``cache_write_5m`` (Anthropic's
    ``cache_creation.ephemeral_1h_input_tokens`` / ``ephemeral_5m_input_tokens``), the part not
    given is the rest of the writes. Raises ValueError when the parts exceed the input, or the
    split exceeds the writes.
    """
    total, output = usage.provider_input_tokens, usage.output_tokens
    if total is None or output is None:
        return None
    read = usage.cached_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    if read + written > total:
        raise ValueError("cache reads and writes exceed the input they are part of")
    one_hour = five_minutes = single = 0
    if cache_write_1h is None and cache_write_5m is None:
        single = written
    else:
        one_hour = cache_write_1h if cache_write_1h is not None else written - (cache_write_5m or 0)
        five_minutes = cache_write_5m if cache_write_5m is not None else written - one_hour
        if one_hour < 0 or five_minutes < 0 or one_hour + five_minutes != written:
            raise ValueError(
                f"the cache writes by time to live ({five_minutes} for 5 minutes, {one_hour} "
                f"for 1 hour) do not add up to the cache writes ({written})"
            )
    return UsageBuckets(
        uncached_input=total - read - written,
        cache_read=read,
        cache_write_5m=five_minutes,
        cache_write_1h=one_hour,
        cache_write=single,
        output=output,
    )


def _tier(price: PriceRates, usage: UsageBuckets) -> tuple[Rates, bool]:
    above = price.long_context_above
    if above is not None and price.long_context is not None and usage.input_tokens > above:
        return price.long_context, True
    return price.base, False


def unpriced_buckets(price: PriceRates, usage: UsageBuckets) -> tuple[str, ...]:
    """The buckets holding tokens whose rate ``price`` does not give (at the tier that applies)."""
    rates, _ = _tier(price, usage)
    return tuple(
        bucket
        for bucket in BUCKETS
        if getattr(usage, bucket) and getattr(rates, _RATE_OF[bucket]) is None
    )


def price_usage(price: PriceRates | None, usage: UsageBuckets) -> Cost | None:
    """The cost of ``usage`` at ``price`` (module docstring); ``None`` without a price, or when
    a bucket holding tokens has no rate."""
    if price is None or unpriced_buckets(price, usage):
        return None
    rates, long_context = _tier(price, usage)
    exact: dict[str, Decimal] = {}
    for bucket in BUCKETS:
        rate = getattr(rates, _RATE_OF[bucket])
        tokens = getattr(usage, bucket)
        exact[bucket] = (
            Decimal(0)
            if not tokens
            else _CONTEXT.divide(_CONTEXT.multiply(tokens, rate), PER_MILLION)
        )
    total = Decimal(0)
    for value in exact.values():
        total = _CONTEXT.add(total, value)
    return Cost(
        **{bucket: _rounded(value) for bucket, value in exact.items()},
        total=_rounded(total),
        long_context=long_context,
    )


def _rounded(value: Decimal) -> Decimal:
    return value.quantize(QUANTUM, context=_CONTEXT)


# The buckets a miss's tokens come from, in the order they are taken (module docstring).
_REBILLED_FROM: Final = ("cache_write_1h", "cache_write_5m", "cache_write", "uncached_input")


def read_from_cache(usage: UsageBuckets, tokens: int) -> UsageBuckets:
    """``usage`` with ``tokens`` more of its input read from the cache: taken from the writes,
    then from the uncached input (module docstring), at most all of them; the input total and
    the output are unchanged."""
    if tokens < 0:
        raise ValueError(f"tokens must be non-negative, not {tokens}")
    moved: dict[str, int] = {}
    left = tokens
    for bucket in _REBILLED_FROM:
        taken = min(left, getattr(usage, bucket))
        moved[bucket] = getattr(usage, bucket) - taken
        left -= taken
    read = usage.cache_read + tokens - left
    return UsageBuckets(
        uncached_input=moved["uncached_input"],
        cache_read=read,
        cache_write_5m=moved["cache_write_5m"],
        cache_write_1h=moved["cache_write_1h"],
        cache_write=moved["cache_write"],
        output=usage.output,
    )


def miss_cost(price: PriceRates | None, usage: UsageBuckets, tokens: int) -> Decimal | None:
    """What ``usage`` cost at ``price`` over the same call with ``tokens`` more read from the
    cache (``read_from_cache``): 0 for no tokens; ``None`` when either cannot be priced (no
    price, or no rate for a bucket holding tokens, the cache read rate included)."""
    paid = price_usage(price, usage)
    instead = price_usage(price, read_from_cache(usage, tokens))
    if paid is None or instead is None:
        return None
    return _rounded(_CONTEXT.subtract(paid.total, instead.total))
