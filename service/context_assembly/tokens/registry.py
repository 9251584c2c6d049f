"""The model registry: capacity, framing overhead and tokenizer per model family, from ``data/models.json``.

The data file is the single place these provider facts live (its header says where each value
comes from and when it was checked); this module only validates it and resolves names.

Name resolution (``lookup``): the requested name is normalised (lower-cased, anything up to the
last ``/`` dropped, an OpenAI ``ft:`` prefix dropped), then matched against every entry's name
and aliases. An exact match wins; otherwise the **longest** name or alias that is a prefix of the
request and is followed by ``-``, ``@`` or ``:`` wins. So dated snapshots resolve to their family
(``gpt-4o-mini-2024-07-18`` → ``gpt-4o-mini``, ``claude-sonnet-4-20250514`` → ``claude-sonnet-4``,
``claude-3-5-sonnet-v2@20241022`` → ``claude-3-5-sonnet``), while a different family that merely
shares characters does not (``gpt-4o`` and ``gpt-4.5-preview`` are not ``gpt-4``). An unknown model
gives ``None``; the caller then uses its fallback window and the conservative estimate.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from context_assembly.core.counting import ModelProfile, TokenizerName

_SEPARATORS: Final = ("-", "@", ":")

ModelName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9.\-]*$")
]
Provider = Literal["openai", "anthropic", "google"]
Count = Annotated[int, Field(ge=0)]
Limit = Annotated[int, Field(ge=1)]


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


class ModelEntry(_Frozen):
    """One model family as written in the data file."""

    name: ModelName
    provider: Provider
    tokenizer: TokenizerName
    context_window: Limit
    max_output_tokens: Limit
    min_cacheable_prefix: Limit | None
    aliases: tuple[ModelName, ...] = ()
    tokens_per_message: Count | None = None
    tokens_per_name: Count | None = None
    reply_priming: Count | None = None
    tokens_per_tool: Count | None = None
    tokens_per_tool_call: Count | None = None
    image_tokens: Count | None = None
    file_tokens: Count | None = None

    @model_validator(mode="after")
    def _tokenizer_matches_provider(self) -> ModelEntry:
        # Only OpenAI publishes its tokenizers; an exact count claimed for another provider's
        # model would be a silent under-count risk, so the data file may not say so.
        exact = self.tokenizer != "estimate"
        if exact != (self.provider == "openai"):
            raise ValueError(
                f"{self.name}: tokenizer {self.tokenizer!r} is not valid for provider {self.provider!r}"
            )
        if self.max_output_tokens > self.context_window:
            raise ValueError(f"{self.name}: max_output_tokens exceeds context_window")
        return self

    def profile(self, defaults: FramingDefaults) -> ModelProfile:
        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        return ModelProfile(
            name=self.name,
            provider=self.provider,
            context_window=self.context_window,
            max_output_tokens=self.max_output_tokens,
            tokenizer=self.tokenizer,
            tokens_per_message=pick(self.tokens_per_message, defaults.tokens_per_message),
            tokens_per_name=pick(self.tokens_per_name, defaults.tokens_per_name),
            reply_priming=pick(self.reply_priming, defaults.reply_priming),
            tokens_per_tool=pick(self.tokens_per_tool, defaults.tokens_per_tool),
            tokens_per_tool_call=pick(self.tokens_per_tool_call, defaults.tokens_per_tool_call),
            image_tokens=pick(self.image_tokens, defaults.image_tokens),
            file_tokens=pick(self.file_tokens, defaults.file_tokens),
            min_cacheable_prefix=self.min_cacheable_prefix,
        )


class RegistryFile(_Frozen):
    """The whole data file: where the values come from, defaults, and the entries."""

    as_of: Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    source: Annotated[str, StringConstraints(min_length=1)]
    notes: tuple[str, ...] = ()
    defaults: FramingDefaults
    models: tuple[ModelEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_are_unique(self) -> RegistryFile:
        seen: set[str] = set()
        for entry in self.models:
            for name in (entry.name, *entry.aliases):
                if name in seen:
                    raise ValueError(f"model name or alias {name!r} appears twice")
                seen.add(name)
        return self


def normalise_model_name(model: str) -> str:
    """Lower-case, drop a routing prefix (``models/``, ``openai/``) and OpenAI's ``ft:``."""
    name = model.strip().lower().rpartition("/")[2]
    return name.removeprefix("ft:")


class ModelRegistry:
    """Validated model profiles, looked up by model name (see the module docstring)."""

    __slots__ = ("_by_name", "_candidates", "_file", "_profiles")

    def __init__(self, data: RegistryFile) -> None:
        self._file = data
        self._profiles = tuple(entry.profile(data.defaults) for entry in data.models)
        self._by_name: dict[str, ModelProfile] = {}
        for entry, profile in zip(data.models, self._profiles, strict=True):
            for name in (entry.name, *entry.aliases):
                self._by_name[name] = profile
        # Longest first, so the first prefix that matches is the longest one.
        self._candidates = sorted(self._by_name.items(), key=lambda item: -len(item[0]))

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

    @property
    def as_of(self) -> str:
        return self._file.as_of

    @property
    def source(self) -> str:
        return self._file.source

    def lookup(self, model: str) -> ModelProfile | None:
        """The profile for ``model`` (exact name or alias, else longest family prefix), or None."""
        name = normalise_model_name(model)
        exact = self._by_name.get(name)
        if exact is not None:
            return exact
        for candidate, profile in self._candidates:
            if name.startswith(candidate) and name[len(candidate)] in _SEPARATORS:
                return profile
        return None

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
            p.min_cacheable_prefix
            for p in self._profiles
            if p.provider == provider and p.min_cacheable_prefix is not None
        ]
        return max(minimums, default=None)

    def all(self) -> list[ModelProfile]:
        """Every model family, in data-file order."""
        return list(self._profiles)


@functools.cache
def _load_shipped() -> ModelRegistry:
    source = resources.files("context_assembly.tokens").joinpath("data", "models.json")
    try:
        raw = source.read_bytes()
    except OSError as err:
        raise RegistryDataError(f"model registry file {source} could not be read: {err}") from err
    return ModelRegistry.from_json(raw)
