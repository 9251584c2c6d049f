"""The price data file, its lookup through the model registry, configured prices, and the price
of a real report computed by hand."""

from __future__ import annotations

from decimal import Decimal
from importlib import resources
from typing import Any

import orjson
import pytest

from context_assembly.core.pricing import buckets_from_normalized, price_usage
from context_assembly.core.usage import normalize_usage
from context_assembly.tokens.prices import (
    ModelPrices,
    PriceEntry,
    PriceFile,
    PricesDataError,
)
from context_assembly.tokens.registry import ModelEntry, ModelRegistry

D = Decimal


@pytest.fixture(scope="module")
def prices() -> ModelPrices:
    return ModelPrices.load()


def _shipped() -> dict[str, Any]:
    raw = resources.files("context_assembly.tokens").joinpath("data", "prices.json").read_bytes()
    document: dict[str, Any] = orjson.loads(raw)
    return document


def _price(name: str, **rates: Any) -> PriceEntry:
    return PriceEntry.model_validate({"name": name, **rates})


# ----------------------------------------------------------------------------- the data file


def test_load_reads_the_file_once() -> None:
    assert ModelPrices.load() is ModelPrices.load()
    assert ModelPrices.load(ModelRegistry.load()) is ModelPrices.load()


def test_every_shipped_price_names_its_page_and_date(prices: ModelPrices) -> None:
    """Each entry says where it was read and when; the header says where prices come from."""
    assert prices.data.unsourced() == []
    for item in prices.entries():
        assert item.entry.source and item.entry.checked == "2026-12-06", item.entry.name
        assert item.origin == "shipped"
    for provider_docs in ("platform.claude.com", "developers.openai.com", "ai.google.dev"):
        assert provider_docs in prices.source


def test_every_shipped_price_is_a_registry_entry_of_its_provider(prices: ModelPrices) -> None:
    """Prices are keyed by the registry's entry names, and bill the way their provider does:
    Anthropic per time to live, OpenAI GPT-5.6 with one write rate, older OpenAI with none."""
    registry = ModelRegistry.load()
    entries = {item.entry.name: item.entry for item in registry.entries()}
    for item in prices.entries():
        price = item.entry
        model = entries[price.name]
        if model.provider == "anthropic":
            assert price.cache_read is not None and price.cache_write_5m is not None, price.name
            assert price.cache_write is None
        else:
            assert price.cache_write_5m is None and price.cache_write_1h is None
        if price.name.startswith("gpt-5.6"):
            # The GPT-5.6 pages: cache writes are billed at 1.25x the uncached input rate.
            assert price.cache_write == price.input * D("1.25"), price.name
        elif model.provider == "openai":
            assert price.cache_write is None, price.name


def test_anthropic_prices_follow_the_documented_multipliers_but_two(prices: ModelPrices) -> None:
    """Anthropic's multipliers (cache read 0.1x input, 5-minute write 1.25x, 1-hour write 2x)
    hold for the Claude prices but two, which keep the pages' own figures: Opus 5.5's cache
    read is 0.05x its input, and Haiku 3's page rounds ($0.30 and $0.03 for 0.3125 and 0.025)."""
    claude = [p.entry for p in prices.entries() if p.entry.name.startswith("claude-")]
    assert len(claude) == 18
    haiku_3 = prices.for_entry("claude-3-haiku")
    assert haiku_3 is not None
    assert (haiku_3.entry.cache_write_5m, haiku_3.entry.cache_read) == (D("0.3"), D("0.03"))
    for price in claude:
        if price.name == "claude-3-haiku":
            continue
        assert price.cache_write_5m == price.input * D("1.25"), price.name
        assert price.cache_write_1h == price.input * 2, price.name
        expected_read = D("0.05") if price.name == "claude-opus-5-5" else D("0.1")
        assert price.cache_read == price.input * expected_read, price.name


def test_models_without_a_readable_page_have_no_price(prices: ModelPrices) -> None:
    """Nothing is guessed: the models whose page could not be read are not priced."""
    for model in ("gpt-4o", "gpt-5.5", "o3", "gemini-2.5-pro", "gemini-3.8-flash"):
        assert prices.lookup(model) is None, model
    assert prices.lookup("no-such-model") is None


# --------------------------------------------------------------------------------- lookup


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("Anthropic/Claude-Sonnet-4-5", "claude-sonnet-4-5"),
        ("claude-opus-4-0", "claude-opus-4"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-1106-preview", "gpt-4-turbo"),
        ("openai/gpt-5.6-sol", "gpt-5.6-sol"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
    ],
)
def test_a_model_name_finds_its_price_as_the_registry_resolves_it(
    prices: ModelPrices, model: str, entry: str
) -> None:
    """Name, alias, dated snapshot and routing prefix: the registry's own resolution."""
    found = prices.lookup(model)
    assert found is not None and found.entry.name == entry
    assert ModelRegistry.load().lookup(model) is not None


@pytest.mark.parametrize("model", ["claude-sonnet-4-5-turbo", "claude-sonnet-4", "gpt-5.6"])
def test_no_prefix_match(prices: ModelPrices, model: str) -> None:
    """A name resolves only as the registry resolves it; ``claude-sonnet-4`` is its own entry."""
    found = prices.lookup(model)
    resolved = ModelRegistry.load().resolve(model)
    assert (found is None) == (resolved is None)
    if found is not None and resolved is not None:
        assert found.entry.name == resolved.entry.name


# ----------------------------------------------------------------- the price of one report


def test_a_claude_sonnet_4_5_report_with_all_four_buckets() -> None:
    """A Sonnet 4.5 report (``input_tokens`` excludes the cache parts) priced at the public
    rates, $3 input, $15 output, $0.30 cache read, $3.75 5-minute and $6 1-hour write per
    million tokens, and computed by hand."""
    found = ModelPrices.load().lookup("claude-sonnet-4-5-20250929")
    assert found is not None
    price = found.entry
    assert (price.input, price.output, price.cache_read) == (D("3"), D("15"), D("0.3"))
    assert (price.cache_write_5m, price.cache_write_1h) == (D("3.75"), D("6"))

    usage = normalize_usage(
        "anthropic",
        {
            "input_tokens": 1_234,
            "cache_read_input_tokens": 48_000,
            "cache_creation_input_tokens": 6_500,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 2_500,
                "ephemeral_1h_input_tokens": 4_000,
            },
            "output_tokens": 789,
        },
    )
    buckets = buckets_from_normalized(usage, cache_write_1h=4_000)
    assert buckets is not None
    cost = price_usage(found.rates, buckets)
    assert cost is not None
    # By hand, tokens x USD per million / 1,000,000:
    assert cost.uncached_input == D("0.003702")  # 1,234 x 3
    assert cost.cache_read == D("0.0144")  # 48,000 x 0.30
    assert cost.cache_write_5m == D("0.009375")  # 2,500 x 3.75
    assert cost.cache_write_1h == D("0.024")  # 4,000 x 6
    assert cost.output == D("0.011835")  # 789 x 15
    assert cost.cache_write == 0
    assert cost.total == D("0.063312")
    assert not cost.long_context

    # Without the split by time to live, the writes cannot be priced: no cost, not a guess.
    assert price_usage(found.rates, buckets_from_normalized(usage)) is None  # type: ignore[arg-type]


def test_a_gpt_5_6_report_with_cache_writes() -> None:
    """GPT-5.6 Terra: $2 input, $0.20 cached input, $2.50 cache write, $12 output per million."""
    found = ModelPrices.load().lookup("gpt-5.6-terra")
    assert found is not None
    usage = normalize_usage(
        "openai",
        {
            "input_tokens": 20_000,
            "input_tokens_details": {"cached_tokens": 15_000, "cache_write_tokens": 4_000},
            "output_tokens": 1_000,
        },
    )
    buckets = buckets_from_normalized(usage)
    assert buckets is not None
    cost = price_usage(found.rates, buckets)
    assert cost is not None
    # 1,000 x 2 + 15,000 x 0.20 + 4,000 x 2.50 + 1,000 x 12, per million.
    assert cost.total == D("0.002") + D("0.003") + D("0.01") + D("0.012")


# ----------------------------------------------------------------------- configured prices


def test_configured_prices_add_and_replace(prices: ModelPrices) -> None:
    configured = {
        "gpt-4o": _price("gpt-4o", input=2.5, output=10, cache_read=1.25),
        "claude-haiku-4-5": _price(
            "claude-haiku-4-5",
            input=1,
            output=5,
            cache_read=0.1,
            cache_write_5m=1.25,
            cache_write_1h=2,
            source="Anthropic pricing page",
            checked="2026-12-06",
        ),
    }
    merged = prices.with_configured(configured)
    added = merged.lookup("gpt-4o-2024-08-06")
    assert added is not None and added.origin == "configured"
    replaced = merged.for_entry("claude-haiku-4-5")
    assert replaced is not None and replaced.origin == "configured"
    kept = merged.for_entry("claude-sonnet-4-5")
    assert kept is not None and kept.origin == "shipped"
    assert len(merged.entries()) == len(prices.entries()) + 1
    assert prices.with_configured({}) is prices


def test_a_configured_model_can_be_priced() -> None:
    registry = ModelRegistry.load().with_configured(
        {
            "gpt-5.2": ModelEntry(
                name="gpt-5.2",
                provider="openai",
                tokenizer="o200k_base",
                context_window=400_000,
                max_output_tokens=128_000,
            )
        }
    )
    priced = ModelPrices.load(registry).with_configured(
        {"gpt-5.2": _price("gpt-5.2", input=1.75, output=14, cache_read=0.175)}
    )
    found = priced.lookup("gpt-5.2-2025-12-11")
    assert found is not None and found.entry.input == D("1.75")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (_price("chatgpt-4o-latest", input=1, output=1), "resolves to 'gpt-4o'"),
        (_price("gpt-4o-2024-08-06", input=1, output=1), "resolves to 'gpt-4o'"),
        (_price("gpt-9", input=1, output=1), '[models."name"] table first'),
        (
            _price("claude-haiku-4-5", input=1, output=5, cache_write=1.25),
            "per time to live",
        ),
        (
            _price("gpt-4o", input=1, output=1, cache_write_5m=1, cache_write_1h=2),
            "Anthropic's rates",
        ),
        (_price("gpt-4o", input=1, output=1, cache_storage_per_hour=1), "Google's"),
    ],
)
def test_a_configured_price_that_does_not_fit_is_refused(
    prices: ModelPrices, entry: PriceEntry, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace(".", r"\.")):
        prices.with_configured({entry.name: entry})


@pytest.mark.parametrize(
    ("rates", "problem"),
    [
        ({"input": 1}, "output"),
        ({"input": -1, "output": 1}, "greater than or equal to 0"),
        ({"input": 1, "output": 1, "cache_write_5m": 1}, "given together"),
        (
            {"input": 1, "output": 1, "cache_write": 1, "cache_write_5m": 1, "cache_write_1h": 2},
            "not both",
        ),
        ({"input": "1.0000001", "output": 1}, "decimal places"),
        ({"input": 1, "output": 1, "checked": "2026-02-30"}, "not a date"),
        (
            {"input": 1, "output": 1, "long_context": {"input": 2, "output": 2}},
            "above_input_tokens",
        ),
        ({"input": 1, "output": 1, "cached": 1}, "Extra inputs"),
    ],
)
def test_invalid_price_entries_are_refused(rates: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        _price("gpt-4o", **rates)


def test_a_replaced_model_of_another_provider_loses_its_shipped_price() -> None:
    """A [models."gpt-4"] table that makes gpt-4 an Anthropic model drops the shipped OpenAI
    price; one that keeps the provider keeps it."""

    def registry(provider: str, tokenizer: str) -> ModelRegistry:
        entry = ModelEntry(
            name="gpt-4",
            provider=provider,
            tokenizer=tokenizer,
            context_window=8_192,
            max_output_tokens=8_192,
        )
        return ModelRegistry.load().with_configured({"gpt-4": entry})

    assert ModelPrices.load(registry("anthropic", "estimate")).for_entry("gpt-4") is None
    kept = ModelPrices.load(registry("openai", "cl100k_base")).for_entry("gpt-4")
    assert kept is not None and kept.origin == "shipped"


# ------------------------------------------------------------------------- a broken file


def test_duplicate_prices_are_refused() -> None:
    document = _shipped()
    document["prices"] = [*document["prices"], document["prices"][0]]
    with pytest.raises(PricesDataError, match="priced twice"):
        ModelPrices.from_json(orjson.dumps(document), ModelRegistry.load())


def test_a_price_for_an_unknown_model_is_a_data_error() -> None:
    document = _shipped()
    document["prices"] = [{**document["prices"][0], "name": "gpt-9"}]
    with pytest.raises(PricesDataError, match="gpt-9"):
        ModelPrices.from_json(orjson.dumps(document), ModelRegistry.load())


def test_the_shipped_file_validates_on_its_own() -> None:
    data = PriceFile.model_validate_json(orjson.dumps(_shipped()))
    assert data.as_of == "2026-12-06"
    assert len(data.prices) == len(ModelPrices.load().entries())
