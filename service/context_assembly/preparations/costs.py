"""What one usage report cost (docs/api.md, "Prices"): the report's buckets at the model's price.

The buckets and the arithmetic are ``core/pricing.py``'s; this module finds the price (the
registry entry the preparation's model resolves to, ``tokens/prices.py``) and the time to live of
Anthropic cache writes: the report's own ``cache_creation`` split when it gives one, else the
time to live the preparation's cache plan asked for (every marker of a plan has the same one).
A model without a price, or a report whose buckets it cannot price, costs ``None``.

A main call's cost also says what its cache miss cost (``miss``, ``core.pricing.miss_cost``): the
input tokens the miss billed again (``turns.rebilled``) priced as the cache reads they could have
been, ``None`` when that figure is not known or the price has no cache read rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from context_assembly.core.pricing import buckets_from_normalized, miss_cost, price_usage
from context_assembly.core.usage import NormalizedUsage
from context_assembly.tokens.prices import ModelPrices


def report_cost(
    prices: ModelPrices,
    model: str,
    provider: str,
    usage: Mapping[str, Any],
    normalized: NormalizedUsage,
    planned_ttl: str,
    rebilled_tokens: int | None = None,
) -> dict[str, Any] | None:
    """The cost of one report as the accounting keeps it (USD per bucket and in total, and what
    its ``rebilled_tokens`` cost over reading them from the cache: ``None`` when not given), or
    ``None`` when it cannot be priced."""
    found = prices.lookup(model)
    if found is None:
        return None
    five, hour = _write_split(provider, usage, normalized, planned_ttl)
    try:
        buckets = buckets_from_normalized(normalized, cache_write_5m=five, cache_write_1h=hour)
    except ValueError:
        return None  # parts that do not add up: nothing to price them by
    cost = None if buckets is None else price_usage(found.rates, buckets)
    if cost is None or buckets is None:
        return None
    missed = None
    if rebilled_tokens is not None:
        missed = miss_cost(found.rates, buckets, rebilled_tokens)
    return {
        "currency": "USD",
        "uncached_input": float(cost.uncached_input),
        "cache_read": float(cost.cache_read),
        "cache_write_5m": float(cost.cache_write_5m),
        "cache_write_1h": float(cost.cache_write_1h),
        "cache_write": float(cost.cache_write),
        "output": float(cost.output),
        "total": float(cost.total),
        "miss": None if missed is None else float(missed),
        "long_context": cost.long_context,
        "price": found.entry.name,
        "price_source": found.origin,
    }


def _write_split(
    provider: str, usage: Mapping[str, Any], normalized: NormalizedUsage, planned_ttl: str
) -> tuple[int | None, int | None]:
    """``(5-minute, 1-hour)`` cache writes of an Anthropic report (``(None, None)`` otherwise:
    the writes are priced at the model's one write rate)."""
    if provider != "anthropic":
        return None, None
    split = usage.get("cache_creation")
    written = normalized.cache_creation_input_tokens or 0
    if isinstance(split, Mapping):
        five = split.get("ephemeral_5m_input_tokens")
        hour = split.get("ephemeral_1h_input_tokens")
        if isinstance(five, int) or isinstance(hour, int):
            return (
                five if isinstance(five, int) else None,
                hour if isinstance(hour, int) else None,
            )
    return (None, written) if planned_ttl == "1h" else (written, None)
