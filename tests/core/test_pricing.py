"""The pure price of one usage observation: buckets from normalized usage, rates per bucket,
rounding, the long-context tier, and no cost rather than a guess."""

from __future__ import annotations

from decimal import Decimal

import pytest

from context_assembly.core.pricing import (
    Cost,
    PriceRates,
    Rates,
    UsageBuckets,
    buckets_from_normalized,
    miss_cost,
    price_usage,
    read_from_cache,
    unpriced_buckets,
)
from context_assembly.core.usage import NormalizedUsage, normalize_usage

D = Decimal

# Rates of the shape of each provider's prices (USD per million tokens).
ANTHROPIC = PriceRates(
    Rates(
        input=D("3"),
        output=D("15"),
        cache_read=D("0.30"),
        cache_write_5m=D("3.75"),
        cache_write_1h=D("6"),
    )
)
OPENAI_WRITES = PriceRates(
    Rates(input=D("2"), output=D("12"), cache_read=D("0.20"), cache_write=D("2.50")),
    long_context_above=272_000,
    long_context=Rates(input=D("4"), output=D("18")),
)
OPENAI_OLDER = PriceRates(Rates(input=D("1.25"), output=D("10"), cache_read=D("0.125")))


def test_anthropic_input_tokens_exclude_the_cache_parts() -> None:
    """Anthropic's ``input_tokens`` is only the uncached part: normalisation adds the cache parts
    back and the buckets take them out again, so uncached input is ``input_tokens``."""
    usage = normalize_usage(
        "anthropic",
        {
            "input_tokens": 120,
            "cache_read_input_tokens": 9_000,
            "cache_creation_input_tokens": 1_500,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 500,
                "ephemeral_1h_input_tokens": 1_000,
            },
            "output_tokens": 80,
        },
    )
    assert usage.provider_input_tokens == 10_620
    buckets = buckets_from_normalized(usage, cache_write_1h=1_000)
    assert buckets == UsageBuckets(
        uncached_input=120, cache_read=9_000, cache_write_5m=500, cache_write_1h=1_000, output=80
    )
    assert buckets.input_tokens == usage.provider_input_tokens


def test_openai_prompt_tokens_include_the_cached_and_written_parts() -> None:
    """OpenAI's ``prompt_tokens`` already includes ``cached_tokens`` (and ``cache_write_tokens``):
    uncached input is what is left, and GPT-5.6 writes take the single write rate."""
    usage = normalize_usage(
        "openai",
        {
            "prompt_tokens": 10_000,
            "prompt_tokens_details": {"cached_tokens": 6_000, "cache_write_tokens": 3_000},
            "completion_tokens": 400,
        },
    )
    buckets = buckets_from_normalized(usage)
    assert buckets == UsageBuckets(
        uncached_input=1_000, cache_read=6_000, cache_write=3_000, output=400
    )
    cost = price_usage(OPENAI_WRITES, buckets)
    assert cost is not None
    # 1,000 x $2 + 6,000 x $0.20 + 3,000 x $2.50 + 400 x $12, per million.
    assert cost.uncached_input == D("0.002")
    assert cost.cache_read == D("0.0012")
    assert cost.cache_write == D("0.0075")
    assert cost.output == D("0.0048")
    assert cost.total == D("0.0155")
    assert not cost.long_context


def test_gemini_prompt_count_includes_cached_content() -> None:
    """Gemini's ``promptTokenCount`` includes ``cachedContentTokenCount``, and thinking tokens
    are output."""
    usage = normalize_usage(
        "google",
        {
            "promptTokenCount": 5_000,
            "cachedContentTokenCount": 4_000,
            "candidatesTokenCount": 100,
            "thoughtsTokenCount": 300,
        },
    )
    assert buckets_from_normalized(usage) == UsageBuckets(
        uncached_input=1_000, cache_read=4_000, output=400
    )


def test_a_report_without_its_totals_has_no_buckets() -> None:
    """Without the input or the output total there is nothing to price: no buckets, no cost."""
    assert buckets_from_normalized(NormalizedUsage(output_tokens=5)) is None
    assert buckets_from_normalized(NormalizedUsage(provider_input_tokens=5)) is None


def test_missing_cache_parts_count_as_zero() -> None:
    usage = NormalizedUsage(provider_input_tokens=700, output_tokens=30)
    assert buckets_from_normalized(usage) == UsageBuckets(uncached_input=700, output=30)


@pytest.mark.parametrize(
    ("one_hour", "five_minutes", "expected"),
    [
        (1_000, None, (500, 1_000)),
        (None, 500, (500, 1_000)),
        (1_000, 500, (500, 1_000)),
        (0, None, (1_500, 0)),
    ],
)
def test_writes_split_by_time_to_live(
    one_hour: int | None, five_minutes: int | None, expected: tuple[int, int]
) -> None:
    """The part of the split not given is the rest of the writes."""
    usage = NormalizedUsage(
        provider_input_tokens=2_000, cache_creation_input_tokens=1_500, output_tokens=1
    )
    buckets = buckets_from_normalized(usage, cache_write_1h=one_hour, cache_write_5m=five_minutes)
    assert buckets is not None
    assert (buckets.cache_write_5m, buckets.cache_write_1h, buckets.cache_write) == (*expected, 0)


@pytest.mark.parametrize(("one_hour", "five_minutes"), [(2_000, None), (1_000, 1_000), (None, -1)])
def test_a_split_that_does_not_add_up_is_refused(
    one_hour: int | None, five_minutes: int | None
) -> None:
    usage = NormalizedUsage(
        provider_input_tokens=2_000, cache_creation_input_tokens=1_500, output_tokens=1
    )
    with pytest.raises(ValueError, match="do not add up"):
        buckets_from_normalized(usage, cache_write_1h=one_hour, cache_write_5m=five_minutes)


def test_cache_parts_above_the_input_are_refused() -> None:
    usage = NormalizedUsage.model_construct(
        provider_input_tokens=100,
        cached_input_tokens=80,
        cache_creation_input_tokens=30,
        output_tokens=1,
    )
    with pytest.raises(ValueError, match="exceed the input"):
        buckets_from_normalized(usage)


def test_no_price_no_cost() -> None:
    assert price_usage(None, UsageBuckets(uncached_input=10, output=10)) is None


def test_writes_without_a_time_to_live_are_not_priced_at_a_guessed_one() -> None:
    """Anthropic bills writes per time to live: writes the report does not split have no rate,
    so the observation has no cost, and ``unpriced_buckets`` says why."""
    buckets = UsageBuckets(uncached_input=10, cache_write=100, output=10)
    assert unpriced_buckets(ANTHROPIC, buckets) == ("cache_write",)
    assert price_usage(ANTHROPIC, buckets) is None


def test_a_bucket_without_tokens_needs_no_rate() -> None:
    """Older OpenAI models have no write rate: a report without writes is priced all the same,
    one with writes is not."""
    cost = price_usage(
        OPENAI_OLDER, UsageBuckets(uncached_input=1_000, cache_read=2_000, output=10)
    )
    assert cost is not None and cost.cache_write == 0
    assert cost.total == D("0.0016")  # 1,000 x $1.25 + 2,000 x $0.125 + 10 x $10, per million
    assert price_usage(OPENAI_OLDER, UsageBuckets(cache_write=1, output=1)) is None


def test_a_long_prompt_takes_the_long_context_rates_for_the_whole_request() -> None:
    """Above the threshold (cache reads and writes count as input) every bucket takes the
    long-context tier's rate; a rate that tier does not give leaves the request unpriced."""
    at_threshold = UsageBuckets(uncached_input=272_000, output=1_000)
    cost = price_usage(OPENAI_WRITES, at_threshold)
    assert cost is not None and not cost.long_context
    assert cost.total == D("0.544") + D("0.012")

    above = UsageBuckets(uncached_input=272_001, output=1_000)
    cost = price_usage(OPENAI_WRITES, above)
    assert cost is not None and cost.long_context
    assert cost.uncached_input == D("1.088004")
    assert cost.output == D("0.018")

    cached_above = UsageBuckets(uncached_input=1, cache_read=272_000, output=1)
    assert unpriced_buckets(OPENAI_WRITES, cached_above) == ("cache_read",)
    assert price_usage(OPENAI_WRITES, cached_above) is None


def test_costs_are_rounded_half_even_to_a_billionth() -> None:
    """Each bucket is rounded to 1e-9 USD; the total is the exact sum, rounded once."""
    rates = PriceRates(Rates(input=D("0.0005"), output=D("0.0015")))
    cost = price_usage(rates, UsageBuckets(uncached_input=1, output=1))
    assert cost is not None
    # 0.0000000005 rounds to the even 0.000000000; 0.0000000015 to 0.000000002.
    assert cost.uncached_input == D("0.000000000")
    assert cost.output == D("0.000000002")
    assert cost.total == D("0.000000002")
    assert cost.total.as_tuple().exponent == -9


def test_large_counts_stay_exact() -> None:
    """The largest count a report may carry, at a rate with six decimals, loses nothing."""
    rates = PriceRates(Rates(input=D("75.123456"), output=D("0")))
    cost = price_usage(rates, UsageBuckets(uncached_input=2**53 - 1))
    assert cost is not None
    assert cost.total == (D(2**53 - 1) * D("75.123456") / D(1_000_000)).quantize(D("1e-9"))


def test_buckets_are_non_negative_integers() -> None:
    with pytest.raises(ValueError, match="uncached_input"):
        UsageBuckets(uncached_input=-1)
    with pytest.raises(ValueError, match="output"):
        UsageBuckets(output=True)


def test_a_long_context_tier_needs_its_threshold() -> None:
    with pytest.raises(ValueError, match="together"):
        PriceRates(Rates(input=D(1), output=D(1)), long_context_above=10)


def test_cost_fields_are_the_buckets_and_the_total() -> None:
    names = [name for name in Cost.__dataclass_fields__ if name not in {"total", "long_context"}]
    assert tuple(names) == (
        "uncached_input",
        "cache_read",
        "cache_write_5m",
        "cache_write_1h",
        "cache_write",
        "output",
    )


def test_a_miss_is_read_back_from_the_writes_first_then_the_uncached_input() -> None:
    """Tokens read from the cache instead come from the 1-hour writes, the 5-minute writes,
    the single-rate writes, then the uncached input; the input total and the output stay."""
    usage = UsageBuckets(
        uncached_input=100, cache_read=10, cache_write_5m=300, cache_write_1h=200, output=7
    )
    assert read_from_cache(usage, 250) == UsageBuckets(
        uncached_input=100, cache_read=260, cache_write_5m=250, cache_write_1h=0, output=7
    )
    assert read_from_cache(usage, 550) == UsageBuckets(uncached_input=50, cache_read=560, output=7)
    everything = read_from_cache(usage, 10_000)  # at most the whole input
    assert everything == UsageBuckets(cache_read=610, output=7)
    assert everything.input_tokens == usage.input_tokens
    assert read_from_cache(usage, 0) == usage
    with pytest.raises(ValueError, match="non-negative"):
        read_from_cache(usage, -1)


def test_a_miss_costs_the_rebilled_tokens_at_their_rate_less_the_read_rate() -> None:
    """5,000 tokens written again for 5 minutes ($3.75) and 1,000 sent uncached ($3) that the
    cache could have served at $0.30: 4,000 x 3.45 + 1,000 x 2.70 per million; with an OpenAI
    price, uncached input at $1.25 against $0.125."""
    usage = UsageBuckets(uncached_input=1_500, cache_write_5m=4_000, output=100)
    assert miss_cost(ANTHROPIC, usage, 5_000) == D("0.016500000")
    assert miss_cost(ANTHROPIC, usage, 0) == D("0")
    openai = UsageBuckets(uncached_input=3_000, cache_read=1_024, output=10)
    assert miss_cost(OPENAI_OLDER, openai, 2_048) == D("0.002304000")


def test_a_miss_without_a_read_rate_or_a_price_has_no_cost() -> None:
    """No price, or a price without the cache read rate (at the tier that applies): no figure,
    never one at another bucket's rate."""
    no_read = PriceRates(Rates(input=D("1"), output=D("2")))
    usage = UsageBuckets(uncached_input=2_000, output=1)
    assert miss_cost(no_read, usage, 1_000) is None
    assert miss_cost(None, usage, 1_000) is None
    assert miss_cost(no_read, usage, 0) == D("0")
