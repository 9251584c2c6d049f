"""Model prices: USD per million tokens per model, from ``data/prices.json`` and the configuration.

The data file is the one place the providers' prices live: its header says where they come from,
and every entry names the page it was read from (``source``) and when (``checked``). Entries are
keyed by the model registry's entry names (``data/models.json``); a model the file does not
price has no price, and its usage has no cost (never a guess). This module validates the file,
adds the operator's prices (``[prices."name"]`` tables of the configuration, validated with the
same ``PriceEntry``) and looks prices up by model name through the registry's own resolution
(``ModelRegistry.resolve``: name, alias, dated snapshot), so a model name means the same entry
for its price as for its window. The arithmetic is ``core.pricing``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from importlib import resources
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from context_assembly.core.pricing import PriceRates, Rates
from context_assembly.tokens.registry import (
    IsoDate,
    Limit,
    ModelName,
    ModelRegistry,
    Origin,
    Provider,
)

Usd = Annotated[Decimal, Field(ge=0, le=100_000, decimal_places=6, allow_inf_nan=False)]
"""USD per million tokens (or per million tokens per hour, for cache storage)."""

Source = Annotated[str, StringConstraints(min_length=1, max_length=300)]


class PricesDataError(RuntimeError):
    """The price data file is missing or invalid."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PriceTier(_Frozen):
    """Rates in USD per million tokens. A rate left out is one the provider publishes no price
    for: tokens billed at it cannot be priced."""

    input: Usd
    output: Usd
    cache_read: Usd | None = None
    # OpenAI GPT-5.6 and later: one write rate. Anthropic: a rate per time to live instead.
    cache_write: Usd | None = None
    cache_write_5m: Usd | None = None
    cache_write_1h: Usd | None = None

    @model_validator(mode="after")
    def _one_kind_of_write_rate(self) -> PriceTier:
        per_ttl = (self.cache_write_5m, self.cache_write_1h)
        if self.cache_write is not None and any(rate is not None for rate in per_ttl):
            raise ValueError(
                "give cache_write (one write rate) or cache_write_5m and cache_write_1h "
                "(a rate per time to live), not both"
            )
        if (per_ttl[0] is None) != (per_ttl[1] is None):
            raise ValueError("cache_write_5m and cache_write_1h are given together")
        return self

    def rates(self) -> Rates:
        return Rates(
            input=self.input,
            output=self.output,
            cache_read=self.cache_read,
            cache_write=self.cache_write,
            cache_write_5m=self.cache_write_5m,
            cache_write_1h=self.cache_write_1h,
        )


class LongContextTier(PriceTier):
    """The rates of a whole request whose input exceeds ``above_input_tokens`` tokens."""

    above_input_tokens: Limit


class PriceEntry(PriceTier):
    """One model's price: an entry of the data file, or a ``[prices."name"]`` table of the
    configuration (whose name is the table's)."""

    name: ModelName
    # Gemini's explicit context cache: USD per million cached tokens per hour of storage. Not
    # part of a call's usage (the storage is billed by the hour), so not in a call's cost.
    cache_storage_per_hour: Usd | None = None
    long_context: LongContextTier | None = None
    # Where the figures were read (a page name) and when: required in the data file.
    source: Source | None = None
    checked: IsoDate | None = None

    @model_validator(mode="after")
    def _checked_is_a_date(self) -> PriceEntry:
        if self.checked is not None:
            try:
                date.fromisoformat(self.checked)
            except ValueError as err:
                raise ValueError(f"{self.name}: checked is not a date: {err}") from None
        return self

    def price_rates(self) -> PriceRates:
        """The entry as the pure pricing of ``core.pricing`` takes it."""
        tier = self.long_context
        return PriceRates(
            base=self.rates(),
            long_context_above=None if tier is None else tier.above_input_tokens,
            long_context=None if tier is None else tier.rates(),
        )


class PriceFile(_Frozen):
    """The whole data file: where the prices come from, and the entries."""

    as_of: IsoDate
    source: Annotated[str, StringConstraints(min_length=1)]
    notes: tuple[str, ...] = ()
    prices: tuple[PriceEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_are_unique(self) -> PriceFile:
        seen: set[str] = set()
        for entry in self.prices:
            if entry.name in seen:
                raise ValueError(f"model {entry.name!r} is priced twice")
            seen.add(entry.name)
        return self

    def unsourced(self) -> list[str]:
        """The entries that do not name their source page and checked date (the shipped file
        may have none)."""
        return [e.name for e in self.prices if e.source is None or e.checked is None]


@dataclass(frozen=True, slots=True)
class RegisteredPrice:
    """One model's price as written, for ``core.pricing``, and where it is from."""

    entry: PriceEntry
    rates: PriceRates
    origin: Origin


def _fits_provider(entry: PriceEntry, provider: Provider) -> None:
    """The rates a provider bills by: per time to live (Anthropic), one write rate (OpenAI),
    cache storage by the hour (Google). Raises ValueError naming the entry."""
    tiers = [entry, *([entry.long_context] if entry.long_context is not None else [])]
    if provider == "anthropic" and any(t.cache_write is not None for t in tiers):
        raise ValueError(
            f"{entry.name}: Anthropic prices cache writes per time to live "
            "(cache_write_5m and cache_write_1h), not with cache_write"
        )
    if provider != "anthropic" and any(t.cache_write_5m is not None for t in tiers):
        raise ValueError(
            f"{entry.name}: cache_write_5m and cache_write_1h are Anthropic's rates; "
            f"the {provider} provider's take cache_write"
        )
    if provider != "google" and entry.cache_storage_per_hour is not None:
        raise ValueError(f"{entry.name}: cache_storage_per_hour is Google's (explicit caches)")


def _provider_changed(registry: ModelRegistry, name: str) -> bool:
    """Whether the configuration replaced the shipped entry ``name`` by another provider's."""
    current = registry.resolve(name)
    shipped = next((m for m in registry.data.models if m.name == name), None)
    return (
        current is not None and shipped is not None and current.entry.provider != shipped.provider
    )


class ModelPrices:
    """Validated prices, looked up by model name through a registry (see the module docstring)."""

    __slots__ = ("_by_name", "_file", "_registry")

    def __init__(
        self, data: PriceFile, registry: ModelRegistry, configured: Iterable[PriceEntry] = ()
    ) -> None:
        """The data file's entries, each replaced by a configured entry of the same name, then the
        other configured entries. Raises ValueError when a name is not a registry entry's name
        or an entry does not fit its model's provider. A shipped price whose model a
        ``[models."name"]`` table gives another provider is dropped."""
        self._file = data
        self._registry = registry
        overrides = {entry.name: entry for entry in configured}
        merged: list[tuple[PriceEntry, Origin]] = [
            (overrides.pop(entry.name), "configured")
            if entry.name in overrides
            else (entry, "shipped")
            for entry in data.prices
        ]
        merged += [(entry, "configured") for entry in overrides.values()]
        by_name: dict[str, RegisteredPrice] = {}
        for entry, origin in merged:
            model = registry.resolve(entry.name)
            if model is None or model.entry.name != entry.name:
                hint = (
                    f"; it resolves to {model.entry.name!r}: price that name"
                    if model is not None
                    else '; add the model with a [models."name"] table first'
                )
                raise ValueError(f"{entry.name}: not the name of a model registry entry{hint}")
            if origin == "shipped" and _provider_changed(registry, entry.name):
                # A [models."name"] table that makes a shipped model another provider's drops
                # its shipped price: that was the shipped model's.
                continue
            _fits_provider(entry, model.entry.provider)
            by_name[entry.name] = RegisteredPrice(entry, entry.price_rates(), origin)
        self._by_name = by_name

    @classmethod
    def from_json(cls, raw: bytes | str, registry: ModelRegistry) -> ModelPrices:
        """Validate and index a price document against ``registry``."""
        try:
            return cls(PriceFile.model_validate_json(raw), registry)
        except (ValidationError, ValueError) as err:
            raise PricesDataError(f"price data is invalid: {err}") from err

    @classmethod
    def load(cls, registry: ModelRegistry | None = None) -> ModelPrices:
        """The prices shipped with the package, for ``registry`` (default: the shipped one).
        The file is read and validated once per process."""
        data = _load_shipped_file()
        if registry is None or registry is ModelRegistry.load():
            return _shipped_prices()
        return cls(data, registry)

    def with_configured(self, configured: Mapping[str, PriceEntry]) -> ModelPrices:
        """These prices with the operator's entries (``[prices."name"]``); the same prices when
        there are none. Raises ValueError naming an entry that does not fit."""
        if not configured:
            return self
        return ModelPrices(self._file, self._registry, configured.values())

    @property
    def data(self) -> PriceFile:
        """The validated data file (without the configured entries)."""
        return self._file

    @property
    def as_of(self) -> str:
        return self._file.as_of

    @property
    def source(self) -> str:
        return self._file.source

    def for_entry(self, name: str) -> RegisteredPrice | None:
        """The price of the registry entry named ``name`` (an entry's name, not an alias)."""
        return self._by_name.get(name)

    def lookup(self, model: str) -> RegisteredPrice | None:
        """The price of the entry ``model`` resolves to in the registry (its name, an alias, or
        a dated snapshot of either), or ``None``: an unknown model, or one without a price."""
        found = self._registry.resolve(model)
        return None if found is None else self._by_name.get(found.entry.name)

    def entries(self) -> list[RegisteredPrice]:
        """Every price, in data-file order (configured additions last)."""
        return list(self._by_name.values())


@functools.cache
def _load_shipped_file() -> PriceFile:
    source = resources.files("context_assembly.tokens").joinpath("data", "prices.json")
    try:
        raw = source.read_bytes()
    except OSError as err:
        raise PricesDataError(f"price file {source} could not be read: {err}") from err
    try:
        data = PriceFile.model_validate_json(raw)
    except ValidationError as err:
        raise PricesDataError(f"price data is invalid: {err}") from err
    unsourced = data.unsourced()
    if unsourced:
        raise PricesDataError(
            f"price file {source}: every entry names its source and checked date; "
            f"these do not: {', '.join(unsourced)}"
        )
    return data


@functools.cache
def _shipped_prices() -> ModelPrices:
    try:
        return ModelPrices(_load_shipped_file(), ModelRegistry.load())
    except ValueError as err:
        raise PricesDataError(f"price data does not fit the model registry: {err}") from err
