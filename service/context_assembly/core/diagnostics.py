"""The providers' cache diagnostics read beside the service's own turn-to-turn comparison. Pure:
the diagnostics object a usage report carried and the turn's comparison in, a verdict out.

A usage report may carry the provider's diagnostics object as the provider returned it:

Anthropic (the response's ``diagnostics``, asked for with ``diagnostics.previous_message_id``)
    ``{"cache_miss_reason": {"type": ..., "cache_missed_input_tokens": N}}``: ``model_changed``,
    ``system_changed``, ``tools_changed`` and ``messages_changed`` name the first part that
    differs from the previous request; ``previous_message_id`` unknown to the provider
    (``previous_message_not_found``), ``unavailable`` and a ``null`` reason (the comparison was
    still running when the response was sent) say nothing about the prefix.
    (Anthropic's cache diagnostics page; the SDK's ``CacheMissReason``.)
OpenAI Responses (``prompt_cache_diagnostics``, asked for with
``prompt_cache_options.comparison_response_id``)
    ``{"type": "cache_hit"}``, or ``{"type": "cache_miss", "reason": ..., "cache_missed_tokens":
    N}``: ``model_changed``, ``tools_changed``, ``input_changed`` (the input items, which hold
    both the instructions and the conversation) and ``context_compacted`` (the conversation)
    name a part of the frame; ``prompt_cache_key_changed``, ``text_format_changed``,
    ``reasoning_effort_changed``, ``verbosity_changed`` and ``service_tier_changed`` are request
    options outside the frame the service compares. ``comparison_response_not_found`` and
    ``unavailable`` say nothing. (OpenAI API reference, the response object.)

The object is read as given or under its own name (``{"diagnostics": {...}}``,
``{"prompt_cache_diagnostics": {...}}``); anything else is not read (``None``). A reason this
module does not know is kept as the provider's word, naming no part of the frame.

``agreement`` compares the provider's verdict with the service's (``prefix_kept`` and the first
changed part): ``agree``, ``disagree`` (one says the prefix was kept and the other that it
changed, or they name different parts), or ``not_comparable`` (either side says nothing, or the
provider names an option outside the frame). The service's ``layout`` change agrees with any
changed part of the frame: a new layout moves every part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Verdict = Literal["kept", "changed", "unknown"]
VendorPart = Literal["model", "tools", "instructions", "history", "input", "other"]
Agreement = Literal["agree", "disagree", "not_comparable"]


@dataclass(frozen=True, slots=True)
class VendorDiagnosis:
    """What the provider said: its own word for it (``reason``), whether the prefix it compared
    was kept, the part of the frame it names in the service's terms (``None`` when it names
    none), and the input tokens it says the miss cost (``None``: not said)."""

    reason: str
    verdict: Verdict
    part: VendorPart | None = None
    missed_tokens: int | None = None


_ANTHROPIC_PARTS: Final[Mapping[str, VendorPart]] = {
    "model_changed": "model",
    "system_changed": "instructions",
    "tools_changed": "tools",
    "messages_changed": "history",
}
_ANTHROPIC_SILENT: Final = frozenset({"previous_message_not_found", "unavailable"})

_OPENAI_PARTS: Final[Mapping[str, VendorPart]] = {
    "model_changed": "model",
    "tools_changed": "tools",
    "input_changed": "input",
    "context_compacted": "history",
}
_OPENAI_SILENT: Final = frozenset({"comparison_response_not_found", "unavailable"})


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _anthropic(found: Mapping[str, Any]) -> VendorDiagnosis | None:
    reason = found["cache_miss_reason"]
    if reason is None:
        return VendorDiagnosis("pending", "unknown")
    kind = reason.get("type") if isinstance(reason, Mapping) else None
    if not isinstance(kind, str):
        return None
    if kind in _ANTHROPIC_SILENT:
        return VendorDiagnosis(kind, "unknown")
    return VendorDiagnosis(
        kind,
        "changed",
        _ANTHROPIC_PARTS.get(kind, "other"),
        _count(reason.get("cache_missed_input_tokens")),
    )


def _openai(found: Mapping[str, Any]) -> VendorDiagnosis | None:
    kind = found.get("type")
    if kind == "cache_hit":
        return VendorDiagnosis(kind, "kept")
    if kind in _OPENAI_SILENT:
        return VendorDiagnosis(str(kind), "unknown")
    reason = found.get("reason")
    if kind != "cache_miss" or not isinstance(reason, str):
        return None
    return VendorDiagnosis(
        reason,
        "changed",
        _OPENAI_PARTS.get(reason, "other"),
        _count(found.get("cache_missed_tokens")),
    )


def vendor_diagnosis(diagnostics: Mapping[str, Any] | None) -> VendorDiagnosis | None:
    """The provider's verdict in a usage report's ``diagnostics`` (rules in the module doc);
    ``None`` when there is none or it is not a shape either provider returns."""
    if diagnostics is None:
        return None
    for name in ("diagnostics", "prompt_cache_diagnostics"):
        inner = diagnostics.get(name)
        if len(diagnostics) == 1 and isinstance(inner, Mapping):
            diagnostics = inner
    if "cache_miss_reason" in diagnostics:
        return _anthropic(diagnostics)
    return _openai(diagnostics)


def agreement(
    prefix_kept: bool | None, changed_part: str | None, vendor: VendorDiagnosis | None
) -> Agreement:
    """Whether the provider's verdict agrees with the service's: ``prefix_kept`` and the first
    changed part of the turn's comparison (``core/cache.compare``; rules in the module doc)."""
    if vendor is None or vendor.verdict == "unknown" or prefix_kept is None:
        return "not_comparable"
    if vendor.verdict == "kept":
        return "agree" if prefix_kept else "disagree"
    if vendor.part == "other":
        return "not_comparable"
    if prefix_kept:
        return "disagree"
    if changed_part == "layout" or changed_part == vendor.part:
        return "agree"
    if vendor.part == "input" and changed_part in ("instructions", "history"):
        return "agree"
    return "disagree"
