"""The model registry: capacity, framing overhead and tokenizer per model family, from ``data/models.json``.

The data file is the single place these provider facts live: its header says where the values
come from, and every entry names the page it was read from (``source``) and when (``checked``).
This module validates it, adds the operator's entries (``[models."name"]`` tables of the
configuration, validated with the same ``ModelEntry``) and resolves names.

Name resolution (``lookup``) accepts three forms and nothing else:

1. the entry's name or one of its aliases (``gpt-4o``, ``chatgpt-4o-latest``);
2. that name followed by a dated snapshot suffix: a date after ``-`` or ``@``, written
   ``YYYY-MM-DD`` or ``YYYYMMDD`` (``gpt-4o-mini-2024-07-18``, ``claude-sonnet-4-5-20250929``,
   ``claude-sonnet-4-5@20250929``), or ``-latest`` (``claude-3-7-sonnet-latest``);
3. either of those after normalisation: lower case, surrounding space removed, anything up to the
   last ``/`` dropped (``models/gemini-2.5-pro``, ``openai/gpt-4o``), and an OpenAI fine-tune
   (``ft:gpt-4o-mini-2024-07-18:acme::abc123``) read as the model it was tuned from.

Anything else is unknown (``None``): a name is never matched by a prefix, so ``claude-opus-4-6``
is not ``claude-opus-4`` in a registry without it, ``gpt-4o-mnii`` is not ``gpt-4o`` and
``gpt-5-turbo-typo`` is not ``gpt-5``. Snapshot names that are not dates (``gpt-4-0613``,
``gemini-1.5-pro-002``, ``claude-3-5-sonnet-v2``) resolve only as listed aliases. The caller of an
unknown model uses its fallback window and the conservative estimate, and ``nearest`` names the
known names closest to it for the ``unknown_model`` warning.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from importlib import resources
from typing import Annotated, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
    model_validator,
)

from context_assembly.core.counting import ModelProfile, TokenizerName

ModelName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9.\-]*$")
]
Provider = Literal["openai", "anthropic", "google"]
Origin = Literal["shipped", "configured"]
Count = Annotated[int, Field(ge=0)]
Limit = Annotated[int, Field(ge=1)]
IsoDate = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]

# A dated snapshot of a known name: ``-YYYY-MM-DD``, ``-YYYYMMDD``, ``@YYYY-MM-DD``,
# ``@YYYYMMDD``, or ``-latest``. The date must also be a real date (``_is_date``).
_SNAPSHOT: Final = re.compile(
    r"^(?P<base>.+?)(?:[-@](?P<date>(?P<y>\d{4})-?(?P<m>\d{2})-?(?P<d>\d{2}))|-latest)$"
)
NEAREST: Final = 3
"""How many nearest known names an ``unknown_model`` warning names at most."""


class RegistryDataError(RuntimeError):
    """The model registry data file is missing or invalid."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FramingDefaults(_Frozen):
    """Values every entry takes unless it sets its own."""

    tokens_per_message: Count
    tokens_per_name: Count
    reply_priming: Count
    tokens_per_tool: Count
    tokens_per_tool_call: Count
    image_tokens: Count
    file_tokens: Count


def scale_fraction(scale: float) -> Fraction:
    """``estimate_scale`` as an exact fraction (``1.3`` is 13/10), so scaled counts are exact
    integer arithmetic: the same on every platform, with no float rounding at the ceiling."""
    return Fraction(str(scale))


def scaled(count: int, scale: Fraction) -> int:
    """``count`` times ``scale``, rounded up."""
    return -(-count * scale.numerator // scale.denominator)


class ModelEntry(_Frozen):
    """One model family: an entry of the data file, or a ``[models."name"]`` table of the
    configuration (whose name is the table's)."""

    name: ModelName
    provider: Provider
    tokenizer: TokenizerName
    context_window: Limit
    max_output_tokens: Limit
    # None (or absent): the provider caches nothing for it, so no cache marker is placed.
    min_cacheable_prefix: Limit | None = None
    # OpenAI GPT-5.6 and later: the model takes explicit ``prompt_cache_breakpoint`` markers and
    # ``prompt_cache_options`` (OpenAI refuses both on earlier models), and its cache is matched
    # only at a breakpoint (``core/cache.py``).
    explicit_cache_breakpoints: StrictBool = False
    aliases: tuple[ModelName, ...] = ()
    # Only with tokenizer "estimate": a factor (at least 1) on every estimated count of the
    # entry, for a model whose tokenizer counts more than the estimator allows for (Claude
    # Sonnet 5 counts ~30% more than earlier Claude models on the same text).
    estimate_scale: float = Field(default=1.0, ge=1.0, le=10.0, allow_inf_nan=False)
    # Where the figures were read (a page name) and when: required in the data file.
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    checked: IsoDate | None = None
    tokens_per_message: Count | None = None
    tokens_per_name: Count | None = None
    reply_priming: Count | None = None
    tokens_per_tool: Count | None = None
    tokens_per_tool_call: Count | None = None
    image_tokens: Count | None = None
    file_tokens: Count | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        # Only OpenAI publishes its tokenizers; an exact count claimed for another provider's
        # model would be a silent under-count risk, so the data file may not say so.
        exact = self.tokenizer != "estimate"
        if exact != (self.provider == "openai"):
            raise ValueError(
                f"{self.name}: tokenizer {self.tokenizer!r} is not valid for provider {self.provider!r}"
            )
        if self.max_output_tokens > self.context_window:
            raise ValueError(f"{self.name}: max_output_tokens exceeds context_window")
        if self.explicit_cache_breakpoints and self.provider != "openai":
            raise ValueError(
                f"{self.name}: explicit_cache_breakpoints applies to OpenAI models only"
            )
        if exact and self.estimate_scale != 1.0:
            raise ValueError(f"{self.name}: estimate_scale applies to tokenizer 'estimate' only")
        if self.checked is not None:
            try:
                date.fromisoformat(self.checked)
            except ValueError as err:
                raise ValueError(f"{self.name}: checked is not a date: {err}") from None
        if self.name in self.aliases:
            raise ValueError(f"{self.name}: an alias repeats the name")
        return self

    def profile(self, defaults: FramingDefaults) -> ModelProfile:
        """The entry with the defaults filled in. ``estimate_scale`` also scales the framing
        tokens (they are counted in the model's own tokens); the constants for images and files
        are not (they are not text)."""
        scale = scale_fraction(self.estimate_scale)

        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        def framing(own: int | None, default: int) -> int:
            return scaled(pick(own, default), scale)

        return ModelProfile(
            name=self.name,
            provider=self.provider,
            context_window=self.context_window,
            max_output_tokens=self.max_output_tokens,
            tokenizer=self.tokenizer,
            tokens_per_message=framing(self.tokens_per_message, defaults.tokens_per_message),
            tokens_per_name=framing(self.tokens_per_name, defaults.tokens_per_name),
            reply_priming=framing(self.reply_priming, defaults.reply_priming),
            tokens_per_tool=framing(self.tokens_per_tool, defaults.tokens_per_tool),
            tokens_per_tool_call=framing(self.tokens_per_tool_call, defaults.tokens_per_tool_call),
            image_tokens=pick(self.image_tokens, defaults.image_tokens),
            file_tokens=pick(self.file_tokens, defaults.file_tokens),
            min_cacheable_prefix=self.min_cacheable_prefix,
            estimate_scale=self.estimate_scale,
        )


def _unique_names(entries: Iterable[ModelEntry]) -> None:
    """Every name and alias names one entry (raises ValueError naming the one that does not)."""
    seen: dict[str, str] = {}
    for entry in entries:
        for name in (entry.name, *entry.aliases):
            if name in seen:
                raise ValueError(
                    f"model name or alias {name!r} appears twice ({seen[name]} and {entry.name})"
                )
            seen[name] = entry.name


class RegistryFile(_Frozen):
    """The whole data file: where the values come from, defaults, and the entries."""

    as_of: IsoDate
    source: Annotated[str, StringConstraints(min_length=1)]
    notes: tuple[str, ...] = ()
    defaults: FramingDefaults
    models: tuple[ModelEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_are_unique(self) -> RegistryFile:
        _unique_names(self.models)
        return self

    def unsourced(self) -> list[str]:
        """The entries that do not name their source page and checked date (the shipped file
        may have none)."""
        return [e.name for e in self.models if e.source is None or e.checked is None]


@dataclass(frozen=True, slots=True)
class RegisteredModel:
    """One entry of a registry: as written, with its defaults filled in, and where it is from."""

    entry: ModelEntry
    profile: ModelProfile
    origin: Origin


def _base_name(model: str) -> str:
    """The normalised name; an OpenAI fine-tune (``ft:BASE:org::id``) reads as ``BASE``."""
    name = model.strip().lower().rpartition("/")[2]
    if name.startswith("ft:"):
        return name[3:].partition(":")[0]
    return name


def _is_date(year: str, month: str, day: str) -> bool:
    try:
        date(int(year), int(month), int(day))
    except ValueError:
        return False
    return True


def snapshot_base(name: str) -> str | None:
    """The name a dated snapshot (or ``-latest``) is of, or ``None`` when ``name`` is not one."""
    match = _SNAPSHOT.match(name)
    if match is None:
        return None
    if match["date"] is not None:
        raw = match["date"]
        # Either form, never a mix: YYYY-MM-DD or YYYYMMDD.
        if len(raw) not in (8, 10) or not _is_date(match["y"], match["m"], match["d"]):
            return None
    return match["base"]


class ModelRegistry:
    """Validated model profiles, looked up by model name (see the module docstring)."""

    __slots__ = ("_by_name", "_entries", "_file")

    def __init__(self, data: RegistryFile, configured: Iterable[ModelEntry] = ()) -> None:
        """The data file's entries, each replaced by a configured entry of the same name, then
        the other configured entries. Raises ValueError when a name or alias would name two
        entries."""
        self._file = data
        overrides = {entry.name: entry for entry in configured}
        merged: list[tuple[ModelEntry, Origin]] = [
            (overrides.pop(entry.name), "configured")
            if entry.name in overrides
            else (entry, "shipped")
            for entry in data.models
        ]
        merged += [(entry, "configured") for entry in overrides.values()]
        _unique_names(entry for entry, _ in merged)
        self._entries = tuple(
            RegisteredModel(entry, entry.profile(data.defaults), origin) for entry, origin in merged
        )
        self._by_name: dict[str, RegisteredModel] = {
            name: item for item in self._entries for name in (item.entry.name, *item.entry.aliases)
        }

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModelRegistry:
        """Validate and index a registry document."""
        try:
            return cls(RegistryFile.model_validate_json(raw))
        except ValidationError as err:
            raise RegistryDataError(f"model registry data is invalid: {err}") from err

    @classmethod
    def load(cls) -> ModelRegistry:
        """The registry shipped with the package, read and validated once per process."""
        return _load_shipped()

    def with_configured(self, configured: Mapping[str, ModelEntry]) -> ModelRegistry:
        """This registry's data file with the operator's entries (``[models."name"]``); the
        same registry when there are none. Raises ValueError on a name or alias conflict."""
        if not configured:
            return self
        return ModelRegistry(self._file, configured.values())

    @property
    def data(self) -> RegistryFile:
        """The validated data file (without the configured entries)."""
        return self._file

    @property
    def as_of(self) -> str:
        return self._file.as_of

    @property
    def source(self) -> str:
        return self._file.source

    def resolve(self, model: str) -> RegisteredModel | None:
        """The entry ``model`` names (exact name or alias, or a dated snapshot of one), or None."""
        name = _base_name(model)
        found = self._by_name.get(name)
        if found is not None:
            return found
        base = snapshot_base(name)
        return None if base is None else self._by_name.get(base)

    def lookup(self, model: str) -> ModelProfile | None:
        """The profile for ``model`` (see ``resolve``), or None."""
        found = self.resolve(model)
        return None if found is None else found.profile

    def nearest(self, model: str, count: int = NEAREST) -> list[str]:
        """The known names and aliases closest to an unknown ``model``, at most ``count``: first
        those it starts with (``gpt-5`` for ``gpt-5-turbo-typo``), longest first, then the most
        similar spellings (``gpt-4o-mini`` for ``gpt-4o-mnii``); empty when none is close."""
        name = _base_name(model)
        name = snapshot_base(name) or name
        if not name:
            return []
        known = list(self._by_name)
        starts = sorted(
            (
                k
                for k in known
                if len(name) > len(k) and name.startswith(k) and name[len(k)] in "-@.:"
            ),
            key=len,
            reverse=True,
        )
        similar = difflib.get_close_matches(name, known, n=count, cutoff=0.6)
        return list(dict.fromkeys([*starts, *similar]))[:count]

    def min_cacheable_prefix(self, model: str, provider: Provider) -> int | None:
        """The minimum cacheable prompt length for ``model`` when sent to ``provider``.

        A known model has its own figure (``None``: the provider caches nothing for it). For a
        model the registry does not know, the largest minimum of that provider's known models:
        a cache marker is then never claimed below a real minimum.
        """
        found = self.lookup(model)
        if found is not None:
            return found.min_cacheable_prefix
        minimums = [
            item.profile.min_cacheable_prefix
            for item in self._entries
            if item.profile.provider == provider and item.profile.min_cacheable_prefix is not None
        ]
        return max(minimums, default=None)

    def explicit_cache_breakpoints(self, model: str) -> bool:
        """Whether ``model`` takes OpenAI's explicit cache breakpoints and ``prompt_cache_options``
        (``False`` for a model the registry does not know: OpenAI refuses them on older models)."""
        found = self.resolve(model)
        return found is not None and found.entry.explicit_cache_breakpoints

    def all(self) -> list[ModelProfile]:
        """Every model family, in data-file order (configured additions last)."""
        return [item.profile for item in self._entries]

    def entries(self) -> list[RegisteredModel]:
        """Every entry with its profile and origin, in the order of ``all``."""
        return list(self._entries)


@functools.cache
def _load_shipped() -> ModelRegistry:
    source = resources.files("context_assembly.tokens").joinpath("data", "models.json")
    try:
        raw = source.read_bytes()
    except OSError as err:
        raise RegistryDataError(f"model registry file {source} could not be read: {err}") from err
    registry = ModelRegistry.from_json(raw)
    unsourced = registry.data.unsourced()
    if unsourced:
        raise RegistryDataError(
            f"model registry file {source}: every entry names its source and checked date; "
            f"these do not: {', '.join(unsourced)}"
        )
    return registry
