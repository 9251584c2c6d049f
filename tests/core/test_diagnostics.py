"""The providers' cache diagnostics beside the service's comparison (core/diagnostics.py): every
reason the providers' SDKs declare is read, and a disagreement is told from an agreement."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from anthropic.types import Diagnostics
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
    PromptCacheDiagnosticsComparisonResponseNotFound,
    PromptCacheDiagnosticsUnavailable,
)
from pydantic import TypeAdapter

from context_assembly.core.diagnostics import VendorDiagnosis, agreement, vendor_diagnosis
from hypothesis_budget import examples

ANTHROPIC_KINDS = [
    "model_changed",
    "system_changed",
    "tools_changed",
    "messages_changed",
    "previous_message_not_found",
    "unavailable",
]
OPENAI_REASONS = list(
    typing.get_args(PromptCacheDiagnosticsCacheMiss.model_fields["reason"].annotation)
)


def anthropic(kind: str, missed: int = 700) -> dict[str, Any]:
    """A ``diagnostics`` object as the Anthropic SDK parses and dumps it."""
    reason: dict[str, Any] = {"type": kind}
    if kind.endswith("_changed"):
        reason["cache_missed_input_tokens"] = missed
    return Diagnostics.model_validate({"cache_miss_reason": reason}).model_dump(mode="json")


def openai_miss(reason: str, missed: int = 900) -> dict[str, Any]:
    """A ``prompt_cache_diagnostics`` as the OpenAI SDK parses and dumps it."""
    value = PromptCacheDiagnosticsCacheMiss(
        type="cache_miss", reason=reason, cache_missed_tokens=missed, comparison_reusable_tokens=5
    )
    return value.model_dump(mode="json", exclude_none=True)


@pytest.mark.parametrize(
    ("diagnostics", "expected"),
    [
        (anthropic("tools_changed"), VendorDiagnosis("tools_changed", "changed", "tools", 700)),
        (
            anthropic("system_changed"),
            VendorDiagnosis("system_changed", "changed", "instructions", 700),
        ),
        (
            anthropic("messages_changed"),
            VendorDiagnosis("messages_changed", "changed", "history", 700),
        ),
        (anthropic("model_changed"), VendorDiagnosis("model_changed", "changed", "model", 700)),
        (
            anthropic("previous_message_not_found"),
            VendorDiagnosis("previous_message_not_found", "unknown"),
        ),
        ({"cache_miss_reason": None}, VendorDiagnosis("pending", "unknown")),
        (
            {"cache_miss_reason": {"type": "new_kind"}},
            VendorDiagnosis("new_kind", "changed", "other"),
        ),
        (
            {"diagnostics": anthropic("tools_changed")},
            VendorDiagnosis("tools_changed", "changed", "tools", 700),
        ),
        (
            PromptCacheDiagnosticsCacheHit(type="cache_hit").model_dump(),
            VendorDiagnosis("cache_hit", "kept"),
        ),
        (openai_miss("input_changed"), VendorDiagnosis("input_changed", "changed", "input", 900)),
        (
            openai_miss("reasoning_effort_changed"),
            VendorDiagnosis("reasoning_effort_changed", "changed", "other", 900),
        ),
        (
            {"prompt_cache_diagnostics": openai_miss("context_compacted")},
            VendorDiagnosis("context_compacted", "changed", "history", 900),
        ),
        (
            PromptCacheDiagnosticsComparisonResponseNotFound(
                type="comparison_response_not_found"
            ).model_dump(),
            VendorDiagnosis("comparison_response_not_found", "unknown"),
        ),
        (
            PromptCacheDiagnosticsUnavailable(type="unavailable").model_dump(),
            VendorDiagnosis("unavailable", "unknown"),
        ),
        ({"anything": 1}, None),
        ({"type": "cache_miss"}, None),
        ({"cache_miss_reason": "tools"}, None),
        (None, None),
    ],
)
def test_the_providers_diagnostics_are_read(
    diagnostics: dict[str, Any] | None, expected: VendorDiagnosis | None
) -> None:
    assert vendor_diagnosis(diagnostics) == expected


def test_every_reason_the_sdks_declare_is_read() -> None:
    """No reason of the SDKs' unions falls through as unreadable; each OpenAI miss reason names
    a part of the frame or an option outside it."""
    for kind in ANTHROPIC_KINDS:
        assert vendor_diagnosis(anthropic(kind)) is not None
    assert len(OPENAI_REASONS) == 9
    for reason in OPENAI_REASONS:
        read = vendor_diagnosis(openai_miss(reason))
        assert read is not None and read.verdict == "changed" and read.part is not None
    union = TypeAdapter(Diagnostics)
    assert union.validate_python({"cache_miss_reason": None}).cache_miss_reason is None


@pytest.mark.parametrize(
    ("kept", "part", "vendor", "expected"),
    [
        (True, None, anthropic("tools_changed"), "disagree"),
        (False, "tools", anthropic("tools_changed"), "agree"),
        (False, "history", anthropic("tools_changed"), "disagree"),
        (False, "layout", anthropic("messages_changed"), "agree"),
        (False, "instructions", openai_miss("input_changed"), "agree"),
        (False, "history", openai_miss("input_changed"), "agree"),
        (False, "tools", openai_miss("input_changed"), "disagree"),
        (True, None, openai_miss("prompt_cache_key_changed"), "not_comparable"),
        (True, None, {"type": "cache_hit"}, "agree"),
        (False, "model", {"type": "cache_hit"}, "disagree"),
        (None, None, anthropic("tools_changed"), "not_comparable"),
        (True, None, anthropic("unavailable"), "not_comparable"),
        (True, None, None, "not_comparable"),
    ],
)
def test_agreement(
    kept: bool | None, part: str | None, vendor: dict[str, Any] | None, expected: str
) -> None:
    assert agreement(kept, part, vendor_diagnosis(vendor)) == expected


@settings(max_examples=examples(100), deadline=None)
@given(
    kept=st.none() | st.booleans(),
    part=st.sampled_from([None, "model", "layout", "tools", "instructions", "history"]),
    kind=st.sampled_from(ANTHROPIC_KINDS),
)
def test_a_kept_prefix_and_a_named_change_never_agree(
    kept: bool | None, part: str | None, kind: str
) -> None:
    """Whatever the two sides say: a provider naming a changed part of the frame disagrees with
    a kept prefix, and agrees with a change of the same part; silence is never a verdict."""
    vendor = vendor_diagnosis(anthropic(kind))
    assert vendor is not None
    verdict = agreement(kept, None if kept else part, vendor)
    if kept is None or vendor.verdict == "unknown":
        assert verdict == "not_comparable"
    elif kept:
        assert verdict == "disagree"
    elif part in (vendor.part, "layout"):
        assert verdict == "agree"
