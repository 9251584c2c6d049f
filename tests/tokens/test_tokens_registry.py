"""The model registry data file and name resolution."""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson
import pytest

from context_assembly.core.counting import ModelProfile
from context_assembly.tokens.registry import (
    ModelEntry,
    ModelRegistry,
    RegistryDataError,
)

REQUIRED: dict[str, str] = {
    "gpt-4o": "o200k_base",
    "gpt-4o-mini": "o200k_base",
    "gpt-4.1": "o200k_base",
    "gpt-4.1-mini": "o200k_base",
    "gpt-4.1-nano": "o200k_base",
    "o1": "o200k_base",
    "o3": "o200k_base",
    "o3-mini": "o200k_base",
    "o4-mini": "o200k_base",
    "gpt-5": "o200k_base",
    "gpt-5-mini": "o200k_base",
    "gpt-5-nano": "o200k_base",
    "gpt-4": "cl100k_base",
    "gpt-4-turbo": "cl100k_base",
    "gpt-3.5-turbo": "cl100k_base",
    "claude-opus-4": "estimate",
    "claude-opus-4-1": "estimate",
    "claude-sonnet-4": "estimate",
    "claude-sonnet-4-5": "estimate",
    "claude-3-7-sonnet": "estimate",
    "claude-3-5-haiku": "estimate",
    "claude-haiku-4-5": "estimate",
    "gemini-2.5-pro": "estimate",
    "gemini-2.5-flash": "estimate",
    "gemini-2.0-flash": "estimate",
    "gemini-1.5-pro": "estimate",
}


def _shipped() -> dict[str, Any]:
    raw = resources.files("context_assembly.tokens").joinpath("data", "models.json").read_bytes()
    document: dict[str, Any] = orjson.loads(raw)
    return document


def _registry_with(models: list[dict[str, Any]]) -> bytes:
    document = _shipped()
    document["models"] = models
    return orjson.dumps(document)


@pytest.fixture(scope="module")
def registry() -> ModelRegistry:
    return ModelRegistry.load()


def test_load_reads_the_file_once() -> None:
    """ModelRegistry.load() returns the same validated registry every time."""
    assert ModelRegistry.load() is ModelRegistry.load()


def test_header_says_where_values_come_from(registry: ModelRegistry) -> None:
    """The data file carries an as-of date and a source note naming each provider's documentation."""
    assert registry.as_of[:2] == "20"
    for provider_docs in ("platform.openai.com", "docs.anthropic.com", "ai.google.dev"):
        assert provider_docs in registry.source


@pytest.mark.parametrize(("model", "tokenizer"), sorted(REQUIRED.items()))
def test_required_families_are_present(registry: ModelRegistry, model: str, tokenizer: str) -> None:
    """Each required family resolves to itself with the expected tokenizer."""
    profile = registry.lookup(model)
    assert profile is not None
    assert (profile.name, profile.tokenizer) == (model, tokenizer)


def test_openai_framing_is_the_published_rule(registry: ModelRegistry) -> None:
    """Every OpenAI entry uses 3 tokens per message, 1 per name and 3 of reply priming."""
    openai = [profile for profile in registry.all() if profile.provider == "openai"]
    assert openai
    assert {(p.tokens_per_message, p.tokens_per_name, p.reply_priming) for p in openai} == {
        (3, 1, 3)
    }


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("chatgpt-4o-latest", "gpt-4o"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("o3-mini-2025-01-31", "o3-mini"),
        ("o3-2025-04-16", "o3"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-1106-preview", "gpt-4-turbo"),
        ("gpt-4-turbo-2024-04-09", "gpt-4-turbo"),
        ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-opus-4-0", "claude-opus-4"),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-3-5-sonnet-v2@20241022", "claude-3-5-sonnet"),
        ("gemini-2.5-pro-preview-06-05", "gemini-2.5-pro"),
        ("gemini-2.5-flash-lite", "gemini-2.5-flash-lite"),
        ("gemini-1.5-pro-002", "gemini-1.5-pro"),
        ("models/gemini-2.5-flash", "gemini-2.5-flash"),
        ("openai/gpt-4o", "gpt-4o"),
        ("GPT-4o-Mini", "gpt-4o-mini"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "gpt-4o-mini"),
    ],
)
def test_snapshots_resolve_to_their_family(
    registry: ModelRegistry, model: str, family: str
) -> None:
    """Dated snapshots, aliases and routed names resolve to their family's entry."""
    profile = registry.lookup(model)
    assert profile is not None
    assert profile.name == family


@pytest.mark.parametrize(
    "model", ["gpt-4.5-preview", "gpt-4o1", "o1x", "llama-3-70b", "", "claude", "gemini-3-pro"]
)
def test_other_families_are_unknown(registry: ModelRegistry, model: str) -> None:
    """A name that is neither an entry's name, an alias nor a dated snapshot of one is unknown."""
    assert registry.lookup(model) is None


def test_a_snapshot_picks_the_entry_it_is_a_snapshot_of() -> None:
    """With both 'claude-opus-4' and 'claude-opus-4-1', each dated snapshot picks its own entry."""
    base = {"provider": "anthropic", "tokenizer": "estimate", "min_cacheable_prefix": None}
    raw = _registry_with(
        [
            {"name": "claude-opus-4", "context_window": 100, "max_output_tokens": 10, **base},
            {"name": "claude-opus-4-1", "context_window": 200, "max_output_tokens": 20, **base},
        ]
    )
    registry = ModelRegistry.from_json(raw)
    assert (registry.lookup("claude-opus-4-1-20250805") or _missing()).context_window == 200
    assert (registry.lookup("claude-opus-4-20250514") or _missing()).context_window == 100


def _missing() -> ModelProfile:
    raise AssertionError("model did not resolve")


def test_min_cacheable_prefix_values(registry: ModelRegistry) -> None:
    """Caching minimums follow the provider docs: OpenAI 1024, Claude per model, Gemini 2.5 2048."""
    expected = {
        "gpt-4o": 1024,
        "gpt-5": 1024,
        "gpt-4": None,
        "claude-sonnet-4": 1024,
        "claude-opus-4-1": 1024,
        "claude-3-5-haiku": 2048,
        "claude-haiku-4-5": 4096,
        "gemini-2.5-flash": 2048,
        "gemini-2.5-pro": 2048,
    }
    for model, minimum in expected.items():
        profile = registry.lookup(model)
        assert profile is not None and profile.min_cacheable_prefix == minimum, model


def test_all_profiles_are_consistent(registry: ModelRegistry) -> None:
    """Every profile has a window, an output limit within it, and a tokenizer that fits its provider."""
    profiles = registry.all()
    assert len(profiles) == len({p.name for p in profiles}) >= len(REQUIRED)
    for profile in profiles:
        assert profile.context_window is not None and profile.max_output_tokens is not None
        assert 0 < profile.max_output_tokens <= profile.context_window
        assert (profile.tokenizer == "estimate") == (profile.provider != "openai")


def test_entry_overrides_defaults() -> None:
    """An entry's own framing value replaces the default; the others keep the defaults."""
    raw = _registry_with(
        [
            {
                "name": "gpt-x",
                "provider": "openai",
                "tokenizer": "o200k_base",
                "context_window": 1000,
                "max_output_tokens": 100,
                "min_cacheable_prefix": None,
                "tokens_per_message": 4,
            }
        ]
    )
    profile = ModelRegistry.from_json(raw).lookup("gpt-x")
    assert profile is not None
    assert (profile.tokens_per_message, profile.tokens_per_name, profile.reply_priming) == (4, 1, 3)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"tokenizer": "o200k_base", "provider": "anthropic"}, "not valid for provider"),
        ({"tokenizer": "estimate", "provider": "openai"}, "not valid for provider"),
        ({"max_output_tokens": 2000}, "exceeds context_window"),
        ({"context_window": 0}, "greater than or equal to 1"),
        ({"name": "Upper-Case"}, "pattern"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_invalid_entries_are_rejected(entry: dict[str, Any], problem: str) -> None:
    """A bad data file fails loudly at load, naming the problem."""
    valid = {
        "name": "gpt-x",
        "provider": "openai",
        "tokenizer": "o200k_base",
        "context_window": 1000,
        "max_output_tokens": 100,
        "min_cacheable_prefix": None,
    }
    with pytest.raises(RegistryDataError, match=problem):
        ModelRegistry.from_json(_registry_with([{**valid, **entry}]))


def test_duplicate_names_are_rejected() -> None:
    """A name that is also another entry's alias makes resolution ambiguous, so it is rejected."""
    base = {
        "provider": "google",
        "tokenizer": "estimate",
        "context_window": 10,
        "max_output_tokens": 5,
        "min_cacheable_prefix": None,
    }
    raw = _registry_with(
        [{"name": "gemini-a", **base}, {"name": "gemini-b", "aliases": ["gemini-a"], **base}]
    )
    with pytest.raises(RegistryDataError, match="appears twice"):
        ModelRegistry.from_json(raw)


def test_malformed_json_is_a_registry_error() -> None:
    """Syntactically broken JSON is reported as RegistryDataError, not a bare parser error."""
    with pytest.raises(RegistryDataError):
        ModelRegistry.from_json(b"{not json")


# ---------------------------------------------------------------------------- resolution table

SMALL = [
    {"name": "gpt-4o", "provider": "openai", "tokenizer": "o200k_base"},
    {"name": "gpt-4o-mini", "provider": "openai", "tokenizer": "o200k_base"},
    {"name": "gpt-5", "provider": "openai", "tokenizer": "o200k_base"},
    {"name": "claude-opus-4", "provider": "anthropic", "tokenizer": "estimate"},
    {"name": "claude-sonnet-4-5", "provider": "anthropic", "tokenizer": "estimate"},
]


@pytest.fixture(scope="module")
def small() -> ModelRegistry:
    """A registry of five entries: what resolves must resolve by the rules, not by luck."""
    limits = {"context_window": 1000, "max_output_tokens": 100, "min_cacheable_prefix": None}
    return ModelRegistry.from_json(_registry_with([{**e, **limits} for e in SMALL]))


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        # exact names, after normalisation
        ("gpt-4o", "gpt-4o"),
        ("  GPT-4o ", "gpt-4o"),
        ("openai/gpt-4o-mini", "gpt-4o-mini"),
        ("models/claude-opus-4", "claude-opus-4"),
        # dated snapshots: -YYYY-MM-DD, -YYYYMMDD, @YYYYMMDD, @YYYY-MM-DD, -latest
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5@2025-09-29", "claude-sonnet-4-5"),
        ("claude-opus-4-latest", "claude-opus-4"),
        ("openai/gpt-5-2025-08-07", "gpt-5"),
        # an OpenAI fine-tune reads as the model it was tuned from
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "gpt-4o-mini"),
        ("ft:gpt-4o:acme:custom:xyz", "gpt-4o"),
        # the typos and neighbours the longest-prefix rule used to accept
        ("claude-opus-4-6", None),
        ("gpt-4o-mnii", None),
        ("gpt-5-turbo-typo", None),
        ("gpt-5-mini", None),
        ("gpt-4o-audio-preview", None),
        ("claude-sonnet-4-5-v2", None),
        # suffixes that are not dates
        ("gpt-5-0807", None),
        ("gpt-5-2025-13-01", None),
        ("gpt-5-2025-02-30", None),
        ("gpt-5-2025-0807", None),
        ("gpt-5:2025-08-07", None),
        ("gpt-5@latest", None),
        ("gpt-5-2025-08-07-latest", None),
        ("gpt-5-", None),
        ("", None),
    ],
)
def test_resolution_table(small: ModelRegistry, model: str, entry: str | None) -> None:
    """Exact names, aliases and dated snapshots resolve; any other name, however close, is unknown."""
    found = small.lookup(model)
    assert (found.name if found is not None else None) == entry


@pytest.mark.parametrize(
    ("model", "nearest"),
    [
        ("claude-opus-4-6", "claude-opus-4"),
        ("gpt-4o-mnii", "gpt-4o-mini"),
        ("gpt-5-turbo-typo", "gpt-5"),
        ("GPT-4O-MNII-2024-07-18", "gpt-4o-mini"),
    ],
)
def test_nearest_names_an_unknown_model_neighbours(
    small: ModelRegistry, model: str, nearest: str
) -> None:
    """For an unknown model the registry names the closest known names (at most three)."""
    assert small.lookup(model) is None
    names = small.nearest(model)
    assert nearest in names and len(names) <= 3


def test_nearest_is_empty_when_nothing_is_close(small: ModelRegistry) -> None:
    assert small.nearest("llama-3-70b") == []
    assert small.nearest("") == []


# ------------------------------------------------------------------------ the models of 2026

# Window and output maximum of each new family, as its provider's page lists them.
NEW_FAMILIES: dict[str, tuple[str, int, int]] = {
    "gpt-5.1": ("o200k_base", 400_000, 128_000),
    "gpt-5.4": ("o200k_base", 1_050_000, 128_000),
    "gpt-5.4-pro": ("o200k_base", 1_050_000, 128_000),
    "gpt-5.5": ("o200k_base", 1_050_000, 128_000),
    "gpt-5.6-sol": ("o200k_base", 1_050_000, 128_000),
    "gpt-5.6-terra": ("o200k_base", 1_050_000, 128_000),
    "gpt-5.6-luna": ("o200k_base", 1_050_000, 128_000),
    "claude-opus-4-6": ("estimate", 1_000_000, 128_000),
    "claude-opus-4-7": ("estimate", 1_000_000, 128_000),
    "claude-opus-4-8": ("estimate", 1_000_000, 128_000),
    "claude-opus-5": ("estimate", 1_000_000, 128_000),
    "claude-opus-5-5": ("estimate", 1_000_000, 128_000),
    "claude-sonnet-4-6": ("estimate", 1_000_000, 128_000),
    "claude-sonnet-5": ("estimate", 1_000_000, 128_000),
    "claude-haiku-4-5": ("estimate", 200_000, 64_000),
    "gemini-3-pro-preview": ("estimate", 1_048_576, 65_536),
    "gemini-3-flash-preview": ("estimate", 1_048_576, 65_536),
    "gemini-3.1-pro-preview": ("estimate", 1_048_576, 65_536),
    "gemini-3.5-flash": ("estimate", 1_048_576, 65_536),
    "gemini-3.7-flash": ("estimate", 1_048_576, 65_536),
    "gemini-3.8-flash": ("estimate", 1_048_576, 65_536),
}


@pytest.mark.parametrize(("model", "expected"), sorted(NEW_FAMILIES.items()))
def test_the_families_of_2026_are_present(
    registry: ModelRegistry, model: str, expected: tuple[str, int, int]
) -> None:
    """Each family the providers list today resolves to its own entry with its page's figures."""
    profile = registry.lookup(model)
    assert profile is not None and profile.name == model
    assert (profile.tokenizer, profile.context_window, profile.max_output_tokens) == expected
    assert profile.min_cacheable_prefix is not None


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("gpt-5.1-2025-11-13", "gpt-5.1"),
        ("gpt-5.4-pro-2026-03-05", "gpt-5.4-pro"),
        ("openai/gpt-5.6-sol", "gpt-5.6-sol"),
        ("claude-sonnet-5@20260630", "claude-sonnet-5"),
        ("claude-opus-4-6", "claude-opus-4-6"),
        ("models/gemini-3.5-flash", "gemini-3.5-flash"),
        ("gemini-3-pro", None),
        ("gpt-5.6", None),
        ("gpt-5.6-sola", None),
        ("claude-sonnet-5-5", None),
    ],
)
def test_new_families_resolve_by_the_same_rules(
    registry: ModelRegistry, model: str, entry: str | None
) -> None:
    found = registry.lookup(model)
    assert (found.name if found is not None else None) == entry


def test_every_shipped_entry_names_its_page_and_date(registry: ModelRegistry) -> None:
    """Each entry of the data file says where its figures were read and when (not after as_of)."""
    for item in registry.entries():
        assert item.origin == "shipped"
        assert item.entry.source and item.entry.checked, item.entry.name
        assert "://" not in item.entry.source  # a page name, not an address
        assert item.entry.checked <= registry.as_of
    assert registry.data.unsourced() == []


def test_the_newer_claude_tokenizer_carries_the_estimate_scale(registry: ModelRegistry) -> None:
    """Claude Opus 4.7 and later and Sonnet 5 count ~30% more: their estimate is scaled by 1.3;
    earlier models and every exact tokenizer are not scaled."""
    scaled = {p.name for p in registry.all() if p.estimate_scale != 1.0}
    assert scaled == {
        "claude-opus-4-7",
        "claude-opus-4-8",
        "claude-opus-5",
        "claude-opus-5-5",
        "claude-sonnet-5",
    }
    assert {p.estimate_scale for p in registry.all() if p.name in scaled} == {1.3}
    # The framing tokens are counted in the model's own tokens: scaled and rounded up.
    sonnet5 = registry.lookup("claude-sonnet-5")
    sonnet45 = registry.lookup("claude-sonnet-4-5")
    assert sonnet5 is not None and sonnet45 is not None
    assert (sonnet5.tokens_per_message, sonnet5.reply_priming, sonnet5.tokens_per_tool) == (
        4,
        4,
        11,
    )
    assert sonnet5.image_tokens == sonnet45.image_tokens


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"estimate_scale": 0.9}, "greater than or equal to 1"),
        (
            {"estimate_scale": 1.3, "tokenizer": "o200k_base", "provider": "openai"},
            "estimate_scale",
        ),
        ({"checked": "2026-02-30"}, "not a date"),
        ({"checked": "06/12/2026"}, "pattern"),
        ({"aliases": ["claude-x"]}, "repeats the name"),
    ],
)
def test_invalid_new_fields_are_rejected(entry: dict[str, Any], problem: str) -> None:
    valid = {
        "name": "claude-x",
        "provider": "anthropic",
        "tokenizer": "estimate",
        "context_window": 1000,
        "max_output_tokens": 100,
        "min_cacheable_prefix": None,
    }
    with pytest.raises(RegistryDataError, match=problem):
        ModelRegistry.from_json(_registry_with([{**valid, **entry}]))


# ------------------------------------------------------------------------- configured entries


def _entry(**fields: Any) -> ModelEntry:
    base: dict[str, Any] = {
        "provider": "openai",
        "tokenizer": "o200k_base",
        "context_window": 400_000,
        "max_output_tokens": 128_000,
        "min_cacheable_prefix": 1024,
    }
    return ModelEntry.model_validate({**base, **fields})


def test_configured_entries_add_and_replace(registry: ModelRegistry) -> None:
    """A configured entry of a new name is added; one of a shipped name replaces that entry."""
    merged = registry.with_configured(
        {
            "gpt-5.2": _entry(name="gpt-5.2", aliases=("gpt-5.2-chat",)),
            "gpt-4o": _entry(name="gpt-4o", context_window=64_000, max_output_tokens=4_096),
        }
    )
    origins = {item.entry.name: item.origin for item in merged.entries()}
    assert origins["gpt-5.2"] == origins["gpt-4o"] == "configured"
    assert origins["gpt-4o-mini"] == "shipped"
    assert len(merged.entries()) == len(registry.entries()) + 1
    assert (merged.lookup("gpt-5.2-chat-2026-01-01") or _missing()).context_window == 400_000
    assert (merged.lookup("gpt-4o-2024-08-06") or _missing()).context_window == 64_000
    # the shipped entry's aliases went with it
    assert merged.lookup("chatgpt-4o-latest") is None
    assert registry.with_configured({}) is registry
    assert (registry.lookup("gpt-4o") or _missing()).context_window == 128_000


@pytest.mark.parametrize(
    "configured",
    [
        {"gpt-x": _entry(name="gpt-x", aliases=("gpt-4o",))},
        {"chatgpt-4o-latest": _entry(name="chatgpt-4o-latest")},
    ],
)
def test_a_configured_name_may_not_shadow_another_entry(
    registry: ModelRegistry, configured: dict[str, ModelEntry]
) -> None:
    """A configured name or alias that another entry already answers to is refused."""
    with pytest.raises(ValueError, match="appears twice"):
        registry.with_configured(configured)
