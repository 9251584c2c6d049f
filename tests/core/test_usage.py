"""Usage normalisation across provider shapes, and the accounting observation (docs/contract.md, "Accounting")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from context_assembly.core.usage import (
    MAX_COUNT,
    NormalizedUsage,
    Provider,
    accounting_observation,
    normalize_usage,
)
from context_assembly.errors import InvalidError
from hypothesis_budget import examples


def U(
    provider_input: int | None,
    cached: int | None,
    creation: int | None,
    output: int | None,
) -> NormalizedUsage:
    return NormalizedUsage(
        provider_input_tokens=provider_input,
        cached_input_tokens=cached,
        cache_creation_input_tokens=creation,
        output_tokens=output,
    )


NONE = U(None, None, None, None)

CASES: list[tuple[str, Provider, dict[str, Any], NormalizedUsage]] = [
    # ------------------------------------------------------------- OpenAI Chat Completions
    (
        "openai-chat-full",
        "openai",
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 100},
        },
        U(2006, 1920, None, 300),
    ),
    (
        "openai-chat-cache-write",
        "openai",
        {
            "prompt_tokens": 9657,
            "completion_tokens": 78,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 9654},
        },
        U(9657, 0, 9654, 78),
    ),
    (
        "openai-chat-zeros",
        "openai",
        {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}},
        U(0, 0, None, 0),
    ),
    (
        "openai-chat-no-details",
        "openai",
        {"prompt_tokens": 12, "completion_tokens": 3},
        U(12, None, None, 3),
    ),
    (
        "openai-chat-null-details",
        "openai",
        {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": None},
        U(12, None, None, 3),
    ),
    (
        "openai-chat-null-cached",
        "openai",
        {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": None}},
        U(12, None, None, None),
    ),
    # ------------------------------------------------------------- OpenAI Responses
    (
        "openai-responses-full",
        "openai",
        {
            "input_tokens": 3438,
            "output_tokens": 42,
            "total_tokens": 3480,
            "input_tokens_details": {"cached_tokens": 3423, "cache_write_tokens": 12},
            "output_tokens_details": {"reasoning_tokens": 25},
        },
        U(3438, 3423, 12, 42),
    ),
    (
        "openai-responses-zeros",
        "openai",
        {"input_tokens": 0, "output_tokens": 0, "input_tokens_details": {"cached_tokens": 0}},
        U(0, 0, None, 0),
    ),
    (
        "openai-responses-only-output",
        "openai",
        {"output_tokens": 7},
        U(None, None, None, 7),
    ),
    ("openai-empty", "openai", {}, NONE),
    ("openai-unrelated-keys", "openai", {"total_tokens": 10}, NONE),
    # ------------------------------------------------------------- Anthropic
    (
        "anthropic-sum",
        "anthropic",
        {
            "input_tokens": 50,
            "cache_read_input_tokens": 100_000,
            "cache_creation_input_tokens": 248,
            "output_tokens": 503,
        },
        U(100_298, 100_000, 248, 503),
    ),
    (
        "anthropic-zeros",
        "anthropic",
        {
            "input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 0,
        },
        U(0, 0, 0, 0),
    ),
    (
        "anthropic-no-cache-fields",
        "anthropic",
        {"input_tokens": 25, "output_tokens": 9},
        U(25, None, None, 9),
    ),
    (
        "anthropic-null-cache-fields",
        "anthropic",
        {
            "input_tokens": 25,
            "cache_read_input_tokens": None,
            "cache_creation_input_tokens": None,
            "output_tokens": 9,
        },
        U(25, None, None, 9),
    ),
    (
        "anthropic-only-read",
        "anthropic",
        {"input_tokens": 5, "cache_read_input_tokens": 2048, "output_tokens": 1},
        U(2053, 2048, None, 1),
    ),
    (
        "anthropic-creation-by-ttl",
        "anthropic",
        {
            "input_tokens": 10,
            "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 20},
            "output_tokens": 4,
        },
        U(130, None, 120, 4),
    ),
    (
        "anthropic-flat-creation-wins-over-ttl",
        "anthropic",
        {
            "input_tokens": 10,
            "cache_creation_input_tokens": 7,
            "cache_creation": {"ephemeral_5m_input_tokens": 100},
        },
        U(17, None, 7, None),
    ),
    (
        "anthropic-input-missing-total-unknown",
        "anthropic",
        {"cache_read_input_tokens": 2048, "output_tokens": 1},
        U(None, 2048, None, 1),
    ),
    ("anthropic-empty", "anthropic", {}, NONE),
    # ------------------------------------------------------------- Google Gemini
    (
        "gemini-wrapped",
        "google",
        {
            "usageMetadata": {
                "promptTokenCount": 4096,
                "cachedContentTokenCount": 2048,
                "candidatesTokenCount": 120,
                "thoughtsTokenCount": 30,
                "totalTokenCount": 4246,
            }
        },
        U(4096, 2048, None, 150),
    ),
    (
        "gemini-bare",
        "google",
        {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        U(10, None, None, 5),
    ),
    (
        "gemini-snake-case",
        "google",
        {
            "prompt_token_count": 10,
            "cached_content_token_count": 0,
            "candidates_token_count": 5,
            "thoughts_token_count": None,
        },
        U(10, 0, None, 5),
    ),
    (
        "gemini-snake-wrapper",
        "google",
        {"usage_metadata": {"prompt_token_count": 8, "candidates_token_count": 0}},
        U(8, None, None, 0),
    ),
    (
        "gemini-only-thoughts",
        "google",
        {"usageMetadata": {"promptTokenCount": 8, "thoughtsTokenCount": 40}},
        U(8, None, None, 40),
    ),
    (
        "gemini-both-spellings-agree",
        "google",
        {"promptTokenCount": 8, "prompt_token_count": 8},
        U(8, None, None, None),
    ),
    ("gemini-null-wrapper", "google", {"usageMetadata": None}, NONE),
    ("gemini-empty", "google", {}, NONE),
    # ------------------------------------------------------------- normalized
    (
        "normalized-full",
        "normalized",
        {
            "provider_input_tokens": 100,
            "cached_input_tokens": 0,
            "cache_creation_input_tokens": 50,
            "output_tokens": 10,
        },
        U(100, 0, 50, 10),
    ),
    (
        "normalized-partial",
        "normalized",
        {"provider_input_tokens": 100, "output_tokens": None},
        U(100, None, None, None),
    ),
]


@pytest.mark.parametrize(
    ("provider", "usage", "expected"),
    [pytest.param(p, u, e, id=case_id) for case_id, p, u, e in CASES],
)
def test_normalize_usage_table(
    provider: Provider, usage: dict[str, Any], expected: NormalizedUsage
) -> None:
    """Every provider shape maps to the documented four numbers; missing is None, zero stays 0."""
    assert normalize_usage(provider, usage) == expected


@settings(max_examples=examples(100))
@given(
    input_tokens=st.integers(min_value=0, max_value=10**9),
    cache_read=st.integers(min_value=0, max_value=10**9),
    cache_creation=st.integers(min_value=0, max_value=10**9),
)
def test_anthropic_input_is_the_sum_of_its_three_parts(
    input_tokens: int, cache_read: int, cache_creation: int
) -> None:
    """For Anthropic, provider_input_tokens is input + cache read + cache creation."""
    usage = {
        "input_tokens": input_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_creation,
    }
    normalized = normalize_usage("anthropic", usage)
    assert normalized.provider_input_tokens == input_tokens + cache_read + cache_creation
    assert normalized.cached_input_tokens == cache_read
    assert normalized.cache_creation_input_tokens == cache_creation


@settings(max_examples=examples(100))
@given(
    cached=st.integers(min_value=0, max_value=10**9),
    uncached=st.integers(min_value=0, max_value=10**9),
)
def test_openai_and_gemini_input_already_include_cached_tokens(cached: int, uncached: int) -> None:
    """For OpenAI and Gemini the reported input is taken as is, never added to the cached part."""
    prompt = cached + uncached
    chat = normalize_usage(
        "openai", {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}
    )
    gemini = normalize_usage(
        "google", {"usageMetadata": {"promptTokenCount": prompt, "cachedContentTokenCount": cached}}
    )
    assert chat.provider_input_tokens == gemini.provider_input_tokens == prompt


@settings(max_examples=examples(100))
@given(
    prompt=st.integers(min_value=0, max_value=10**9),
    over=st.integers(min_value=1, max_value=10**9),
)
def test_a_cached_part_larger_than_its_input_is_refused(prompt: int, over: int) -> None:
    """Cached input is part of the input: a report with more cached than input tokens is refused
    by the cached field's path, for every shape that reports both."""
    cases: list[tuple[Provider, Any, str]] = [
        (
            "openai",
            {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": prompt + over}},
            "usage.prompt_tokens_details.cached_tokens",
        ),
        (
            "openai",
            {"input_tokens": prompt, "input_tokens_details": {"cache_write_tokens": prompt + over}},
            "usage.input_tokens_details.cache_write_tokens",
        ),
        (
            "google",
            {
                "usageMetadata": {
                    "promptTokenCount": prompt,
                    "cachedContentTokenCount": prompt + over,
                }
            },
            "usage.usageMetadata.cachedContentTokenCount",
        ),
        (
            "normalized",
            {"provider_input_tokens": prompt, "cached_input_tokens": prompt + over},
            "usage.cached_input_tokens",
        ),
    ]
    for provider, usage, field in cases:
        with pytest.raises(InvalidError) as caught:
            normalize_usage(provider, usage)
        assert caught.value.extensions["field"] == field


def test_cached_and_written_parts_together_cannot_exceed_the_input() -> None:
    """OpenAI's cached and cache-write tokens are disjoint parts of the input: both may fit alone
    and still be refused together; exactly filling the input is accepted."""
    details = {"cached_tokens": 6, "cache_write_tokens": 5}
    with pytest.raises(InvalidError) as caught:
        normalize_usage("openai", {"prompt_tokens": 10, "prompt_tokens_details": details})
    assert caught.value.extensions["field"] == "usage.prompt_tokens_details.cache_write_tokens"
    fits = normalize_usage("openai", {"prompt_tokens": 11, "prompt_tokens_details": details})
    assert (fits.cached_input_tokens, fits.cache_creation_input_tokens) == (6, 5)


def test_counts_and_their_sums_stop_at_max_count() -> None:
    """A count above 2^53 - 1, or a sum of counts above it, is refused by path: nothing reaches
    the store that a JSON client could not read exactly (a sum past 64 bits would answer 500)."""
    assert (
        normalize_usage("openai", {"prompt_tokens": MAX_COUNT}).provider_input_tokens == MAX_COUNT
    )
    refused: list[tuple[Provider, Any, str]] = [
        ("openai", {"prompt_tokens": MAX_COUNT + 1}, "usage.prompt_tokens"),
        ("anthropic", {"input_tokens": MAX_COUNT, "cache_read_input_tokens": 1}, "usage"),
        (
            "anthropic",
            {
                "input_tokens": 1,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": MAX_COUNT,
                    "ephemeral_1h_input_tokens": 1,
                },
            },
            "usage.cache_creation",
        ),
        (
            "google",
            {"usageMetadata": {"candidatesTokenCount": MAX_COUNT, "thoughtsTokenCount": 5}},
            "usage.usageMetadata",
        ),
        ("google", {"candidatesTokenCount": 2**64 - 1}, "usage.candidatesTokenCount"),
    ]
    for provider, usage, field in refused:
        with pytest.raises(InvalidError) as caught:
            normalize_usage(provider, usage)
        assert caught.value.extensions["field"] == field, usage


INVALID: list[tuple[str, Provider, Any, str]] = [
    ("negative", "openai", {"prompt_tokens": -1}, "usage.prompt_tokens"),
    ("bool", "openai", {"completion_tokens": True}, "usage.completion_tokens"),
    ("float", "anthropic", {"input_tokens": 3.0}, "usage.input_tokens"),
    ("string", "anthropic", {"output_tokens": "12"}, "usage.output_tokens"),
    (
        "nested-negative",
        "openai",
        {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": -3}},
        "usage.prompt_tokens_details.cached_tokens",
    ),
    (
        "nested-bool",
        "openai",
        {"input_tokens": 5, "input_tokens_details": {"cache_write_tokens": False}},
        "usage.input_tokens_details.cache_write_tokens",
    ),
    (
        "details-not-object",
        "openai",
        {"prompt_tokens": 5, "prompt_tokens_details": 5},
        "usage.prompt_tokens_details",
    ),
    (
        "details-list",
        "openai",
        {"input_tokens": 5, "input_tokens_details": [1]},
        "usage.input_tokens_details",
    ),
    ("mixed-openai-shapes", "openai", {"prompt_tokens": 5, "output_tokens": 2}, "usage"),
    (
        "anthropic-ttl-not-object",
        "anthropic",
        {"input_tokens": 1, "cache_creation": "lots"},
        "usage.cache_creation",
    ),
    (
        "anthropic-ttl-negative",
        "anthropic",
        {"input_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": -1}},
        "usage.cache_creation.ephemeral_1h_input_tokens",
    ),
    (
        "gemini-wrapper-not-object",
        "google",
        {"usageMetadata": [1, 2]},
        "usage.usageMetadata",
    ),
    (
        "gemini-nested-float",
        "google",
        {"usageMetadata": {"promptTokenCount": 1.5}},
        "usage.usageMetadata.promptTokenCount",
    ),
    (
        "gemini-spellings-disagree",
        "google",
        {"promptTokenCount": 8, "prompt_token_count": 9},
        "usage.promptTokenCount",
    ),
    (
        "gemini-two-wrappers",
        "google",
        {"usageMetadata": {}, "usage_metadata": {}},
        "usage",
    ),
    (
        "normalized-unknown-field",
        "normalized",
        {"provider_input_tokens": 1, "prompt_tokens": 1},
        "usage.prompt_tokens",
    ),
    (
        "normalized-negative",
        "normalized",
        {"output_tokens": -5},
        "usage.output_tokens",
    ),
    ("usage-not-object", "openai", [1, 2, 3], "usage"),
    ("usage-null", "anthropic", None, "usage"),
]


@pytest.mark.parametrize(
    ("provider", "usage", "field"),
    [pytest.param(p, u, f, id=case_id) for case_id, p, u, f in INVALID],
)
def test_invalid_usage_raises_invalid_error_naming_the_field(
    provider: Provider, usage: Any, field: str
) -> None:
    """Negative, boolean, non-integer counts and wrongly shaped objects are refused by path."""
    with pytest.raises(InvalidError) as caught:
        normalize_usage(provider, usage)
    assert caught.value.extensions["field"] == field
    assert field in caught.value.detail
    assert caught.value.code == "CONTEXT_ASSEMBLY_INVALID"


def test_unknown_provider_is_refused() -> None:
    """A provider name outside the closed set is an InvalidError, not a silent empty report."""
    with pytest.raises(InvalidError) as caught:
        normalize_usage("mistral", {"prompt_tokens": 1})  # type: ignore[arg-type]
    assert caught.value.extensions["field"] == "provider"


def test_normalized_usage_is_frozen() -> None:
    """A normalised report is an immutable value that refuses unknown fields."""
    usage = U(1, 2, 3, 4)
    with pytest.raises(ValidationError):
        usage.output_tokens = 5  # type: ignore[misc]
    with pytest.raises(ValidationError):
        NormalizedUsage(total_tokens=3)  # type: ignore[call-arg]


def test_normalize_does_not_mutate_the_report() -> None:
    """Normalising reads the provider object without changing it."""
    usage = {"usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 2}}
    before = {"usageMetadata": dict(usage["usageMetadata"])}
    normalize_usage("google", usage)
    assert usage == before


def test_accounting_observation_fields_and_delta() -> None:
    """The observation carries the report's identity and provider-minus-estimate as the delta."""
    normalized = normalize_usage(
        "anthropic",
        {
            "input_tokens": 40,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 0,
            "output_tokens": 12,
        },
    )
    observation = accounting_observation(
        normalized,
        estimated_input_tokens=1100,
        provider="anthropic",
        call="main",
        report_id="r-1",
        observed_at="2025-01-01T00:00:00Z",
        expected_cached_tokens=0,
    )
    assert observation == {
        "provider": "anthropic",
        "call": "main",
        "report_id": "r-1",
        "observed_at": "2025-01-01T00:00:00Z",
        "provider_input_tokens": 1040,
        "input_token_delta": -60,
        "cached_input_tokens": 1000,
        "expected_cached_tokens": 0,
        "cache_creation_input_tokens": 0,
        "output_tokens": 12,
        "response_id": None,
        "diagnostics": None,
        "miss_cause": None,
        "rebilled_tokens": None,
        "cost": None,
    }


def test_accounting_observation_delta_is_null_without_provider_input() -> None:
    """Without a reported input the delta is null, and the other nulls stay null."""
    observation = accounting_observation(
        normalize_usage("openai", {"completion_tokens": 5}),
        estimated_input_tokens=300,
        provider="openai",
        call="repair",
        report_id="r-2",
        observed_at="2025-01-01T00:00:01Z",
    )
    assert observation["input_token_delta"] is None
    assert observation["provider_input_tokens"] is None
    assert observation["cached_input_tokens"] is None
    assert observation["output_tokens"] == 5


@settings(max_examples=examples(100))
@given(
    provider_input=st.integers(min_value=0, max_value=10**9),
    estimate=st.integers(min_value=0, max_value=10**9),
)
def test_accounting_delta_is_provider_minus_estimate(provider_input: int, estimate: int) -> None:
    """input_token_delta is exactly provider_input_tokens minus the estimate, with either sign."""
    observation = accounting_observation(
        U(provider_input, None, None, None),
        estimated_input_tokens=estimate,
        provider="normalized",
        call="wrap_up",
        report_id="r",
        observed_at="t",
    )
    assert observation["input_token_delta"] == provider_input - estimate
