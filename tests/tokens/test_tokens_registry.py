"""The model registry data file and name resolution."""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson
import pytest

from context_assembly.core.counting import ModelProfile
from context_assembly.tokens.registry import ModelRegistry, RegistryDataError, normalise_model_name

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
    """Dated snapshots, aliases and routed names resolve to the longest matching family."""
    profile = registry.lookup(model)
    assert profile is not None
    assert profile.name == family


@pytest.mark.parametrize(
    "model", ["gpt-4.5-preview", "gpt-4o1", "o1x", "llama-3-70b", "", "claude", "gemini-3-pro"]
)
def test_other_families_are_unknown(registry: ModelRegistry, model: str) -> None:
    """A prefix only counts when a separator follows it, so a different family is not mistaken for a known one."""
    assert registry.lookup(model) is None


def test_longest_prefix_wins_over_shorter_family() -> None:
    """With both 'claude-opus-4' and 'claude-opus-4-1', a 4.1 snapshot picks the longer entry."""
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


def test_normalise_model_name() -> None:
    """Normalisation lower-cases, strips whitespace, a routing prefix and OpenAI's ft: prefix."""
    assert normalise_model_name("  Models/Gemini-2.5-Pro ") == "gemini-2.5-pro"
    assert normalise_model_name("ft:gpt-4o:org::x") == "gpt-4o:org::x"
