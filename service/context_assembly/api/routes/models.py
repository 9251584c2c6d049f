"""``GET /v1/models``: the model registry as the service reads it, with each entry's price and the
caller's calibration of the estimate."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from context_assembly.api.routes.dependencies import get_tenant
from context_assembly.core import calibration
from context_assembly.core.request import wire_schema
from context_assembly.errors import UnauthenticatedError
from context_assembly.preparations import Preparations
from context_assembly.tokens.prices import ModelPrices, RegisteredPrice
from context_assembly.tokens.registry import ModelRegistry

router = APIRouter(prefix="/v1")


class ModelCalibration(BaseModel):
    """How the provider's counts in the tenant's usage reports have calibrated the estimate."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    reports: int = Field(description="How many usage reports' ratios are kept (at most 50).")
    factor: float | None = Field(
        description="The factor estimated counts are multiplied by (between 0.5 and 1; `null` "
        "while fewer than 5 reports are kept)."
    )


class ModelPriceTier(BaseModel):
    """The rates of a whole request whose input exceeds `above_input_tokens` (the provider's
    long-context price), in USD per million tokens."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    above_input_tokens: int = Field(
        description="The input size above which the whole request takes these rates, in tokens "
        "(cache reads and writes included)."
    )
    input: float = Field(description="Uncached input, USD per million tokens.")
    output: float = Field(description="Output (reasoning included), USD per million tokens.")
    cache_read: float | None = Field(
        description="Input read from the prompt cache, USD per million tokens (`null`: not "
        "published at this size)."
    )
    cache_write: float | None = Field(
        description="Input written to the prompt cache at the single write rate, USD per million "
        "tokens (`null`: not published at this size)."
    )
    cache_write_5m: float | None = Field(
        description="Input written to the cache for 5 minutes, USD per million tokens (`null`: "
        "not published at this size)."
    )
    cache_write_1h: float | None = Field(
        description="Input written to the cache for 1 hour, USD per million tokens (`null`: not "
        "published at this size)."
    )


class ModelPrice(BaseModel):
    """A model's price, in USD per million tokens at the provider's standard tier. A rate that is
    `null` is one the provider publishes no price for: a usage report with tokens at it has no
    cost, never one at another rate."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    source: Literal["shipped", "configured"] = Field(
        description="`shipped`: the prices of the service's release. `configured`: a "
        '`[prices."name"]` table of the configuration, which adds this price or replaces the '
        "shipped one."
    )
    read_from: str | None = Field(
        description="The page the prices were read from (`null`: a configured price that names "
        "none)."
    )
    checked: str | None = Field(
        description="The date (YYYY-MM-DD) the prices were read (`null`: a configured price that "
        "names none)."
    )
    input: float = Field(description="Uncached input, USD per million tokens.")
    output: float = Field(description="Output (reasoning included), USD per million tokens.")
    cache_read: float | None = Field(
        description="Input read from the prompt cache (cache hits), USD per million tokens."
    )
    cache_write: float | None = Field(
        description="Input written to the prompt cache at the model's single write rate (OpenAI "
        "GPT-5.6 and later), USD per million tokens; `null` for earlier OpenAI models, whose "
        "writes are not billed apart."
    )
    cache_write_5m: float | None = Field(
        description="Input written to the cache for 5 minutes (Anthropic), USD per million tokens."
    )
    cache_write_1h: float | None = Field(
        description="Input written to the cache for 1 hour (Anthropic), USD per million tokens."
    )
    cache_storage_per_hour: float | None = Field(
        description="Storage of an explicit context cache (Gemini), USD per million tokens per "
        "hour; not part of a call's cost."
    )
    long_context: ModelPriceTier | None = Field(
        description="The rates of a request whose input exceeds a size (`null`: the same rates at "
        "every size)."
    )


class ModelInfo(BaseModel):
    """One model of the registry. A request's model resolves to the entry of that name or alias,
    or of which it is a dated snapshot (`-2025-08-07`, `-20250929`, `@20250929`, `-latest`);
    any other name is unknown."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    name: str = Field(description="The model's name.")
    aliases: list[str] = Field(description="Other names that resolve to this entry.")
    source: Literal["shipped", "configured"] = Field(
        description="`shipped`: the registry of the service's release. `configured`: a "
        '`[models."name"]` table of the configuration, which adds this entry or replaces the '
        "shipped one of the same name."
    )
    read_from: str | None = Field(
        description="The page the figures were read from (`null`: a configured entry that "
        "names none)."
    )
    checked: str | None = Field(
        description="The date (YYYY-MM-DD) the figures were read (`null`: a configured entry "
        "that names none)."
    )
    provider: str = Field(description="Its provider.")
    context_window: int | None = Field(description="Its context window, in tokens.")
    max_output_tokens: int | None = Field(description="The most tokens it may answer.")
    tokenizer: str = Field(
        description="`o200k_base`, `cl100k_base`, or `estimate` (no public tokenizer: counts are "
        "conservative and not exact)."
    )
    estimate_scale: float = Field(
        description="The factor on the conservative estimate (1 unless the model's tokenizer "
        "counts more than the estimator allows for); it also scales the framing tokens."
    )
    tokens_per_message: int = Field(description="The framing tokens of each message.")
    tokens_per_name: int = Field(description="The tokens a message's `name` adds.")
    reply_priming: int = Field(description="The tokens that prime the reply, once per request.")
    tokens_per_tool: int = Field(description="The framing tokens of each tool definition.")
    min_cacheable_prefix: int | None = Field(
        description="The shortest prefix the provider caches, in tokens (`null`: unknown or none)."
    )
    explicit_cache_breakpoints: bool = Field(
        description="Whether the model takes OpenAI's explicit cache breakpoints and "
        "`prompt_cache_options` (GPT-5.6 and later): the cache plan marks it only then."
    )
    price: ModelPrice | None = Field(
        description="Its price and where it comes from (`null`: no price is known, and its usage "
        "reports have no cost)."
    )
    calibration: ModelCalibration | None = Field(
        default=None,
        description="The estimate's calibration for the caller's tenant (absent for exact "
        "tokenizers, and without a valid key when keys are required).",
    )


class ModelList(BaseModel):
    """The model registry."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    models: list[ModelInfo] = Field(description="Every model the registry knows.")
    fallback_context_window: int = Field(
        description="The window of a model the registry does not know, without "
        "`max_context_tokens`."
    )


@router.get(
    "/models",
    response_model=ModelList,
    name="list_models",
    tags=["Models"],
    summary="List the model registry",
    response_description="Every known model's window, output limit, tokenizer, framing and "
    "minimum cacheable prefix.",
)
async def models(request: Request) -> ModelList:
    """The model registry: context window, output limit, tokenizer, framing overhead and
    minimum cacheable prefix where known, and where each entry comes from (shipped, or a
    `[models."name"]` table of the configuration). Needs no key."""
    from context_assembly.core.budget import FALLBACK_CAPACITY

    registry: ModelRegistry = request.app.state.registry
    prices: ModelPrices = request.app.state.prices
    kept = await _calibrations(request)
    items = [
        ModelInfo(
            name=p.name,
            aliases=list(item.entry.aliases),
            source=item.origin,
            read_from=item.entry.source,
            checked=item.entry.checked,
            provider=p.provider,
            context_window=p.context_window,
            max_output_tokens=p.max_output_tokens,
            tokenizer=p.tokenizer,
            estimate_scale=p.estimate_scale,
            tokens_per_message=p.tokens_per_message,
            tokens_per_name=p.tokens_per_name,
            reply_priming=p.reply_priming,
            tokens_per_tool=p.tokens_per_tool,
            min_cacheable_prefix=p.min_cacheable_prefix,
            explicit_cache_breakpoints=item.entry.explicit_cache_breakpoints,
            price=_model_price(prices.for_entry(p.name)),
            calibration=None
            if kept is None or p.tokenizer != "estimate"
            else ModelCalibration(
                reports=len(kept.get(p.name, ())), factor=calibration.factor(kept.get(p.name, ()))
            ),
        )
        for item in registry.entries()
        for p in (item.profile,)
    ]
    return ModelList(models=items, fallback_context_window=FALLBACK_CAPACITY)


def _usd(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _model_price(found: RegisteredPrice | None) -> ModelPrice | None:
    """The wire form of a registry entry's price."""
    if found is None:
        return None
    entry, tier = found.entry, found.entry.long_context
    return ModelPrice(
        source=found.origin,
        read_from=entry.source,
        checked=entry.checked,
        input=float(entry.input),
        output=float(entry.output),
        cache_read=_usd(entry.cache_read),
        cache_write=_usd(entry.cache_write),
        cache_write_5m=_usd(entry.cache_write_5m),
        cache_write_1h=_usd(entry.cache_write_1h),
        cache_storage_per_hour=_usd(entry.cache_storage_per_hour),
        long_context=None
        if tier is None
        else ModelPriceTier(
            above_input_tokens=tier.above_input_tokens,
            input=float(tier.input),
            output=float(tier.output),
            cache_read=_usd(tier.cache_read),
            cache_write=_usd(tier.cache_write),
            cache_write_5m=_usd(tier.cache_write_5m),
            cache_write_1h=_usd(tier.cache_write_1h),
        ),
    )


async def _calibrations(request: Request) -> dict[str, list[float]] | None:
    """The caller's tenant's calibration ratios by model; ``None`` without a valid key where
    keys are required (the registry itself needs none)."""
    try:
        tenant = await get_tenant(request)
    except UnauthenticatedError:
        return None
    service: Preparations = request.app.state.preparations
    return await service.store.calibrations(tenant)
