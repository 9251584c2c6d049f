"""What a prepared call sets besides its messages and tools, as the adapters write it into the
runtime's request.

- **The cache plan** (``selection.cache``): Anthropic's markers as :class:`Breakpoint` values
  (:func:`cache_plan`; :func:`cache_control` is a marker's value) and OpenAI's
  ``prompt_cache_key`` / ``prompt_cache_retention``.
- **Native compaction** (``assembly.compaction.mode: "native"``): the provider's own directive
  (:func:`native_directive`) and the call's ``context_management`` with it in
  (:func:`with_native`), as the service's ``anthropic`` and ``openai-responses`` renders write
  them (docs/compaction.md#native).
- **The output limit**: the budget's ``response_reserve`` plus its ``reasoning_reserve_tokens``
  (:func:`reserve`), at most the model's maximum output of ``GET /v1/models``
  (:class:`ModelMaxima`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from context_assembly_client import ContextAssemblyError
from context_assembly_client.types import (
    CompactionReport,
    ModelList,
    NativeDirective,
    PrepareResponse,
)

__all__ = [
    "ANTHROPIC_COMPACTION_BETA",
    "ANTHROPIC_COMPACTION_EDIT",
    "ANTHROPIC_MIN_THRESHOLD",
    "Breakpoint",
    "ModelMaxima",
    "NativeApi",
    "cache_control",
    "cache_plan",
    "native_directive",
    "reserve",
    "with_native",
]

logger = logging.getLogger("context_assembly_client.integrations")

NativeApi: TypeAlias = Literal["anthropic", "openai-responses"]
"""The provider compactions an adapter can write: those of the service's renders that have one."""

ANTHROPIC_COMPACTION_EDIT: Final = "compact_20260112"
ANTHROPIC_COMPACTION_BETA: Final = "compact-2026-01-12"
ANTHROPIC_MIN_THRESHOLD: Final = 50_000
"""Anthropic's compaction edit, the beta it needs and its least trigger, as the service's
``anthropic`` render writes them (docs/compaction.md#native)."""


# --------------------------------------------------------------------------- the cache plan


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """An Anthropic cache marker of the plan: after the last tool (``message`` is ``None``) or at
    the end of the frame message ``message``."""

    after: Literal["tools", "instructions", "history", "end"]
    ttl: Literal["5m", "1h"]
    message: int | None


def cache_control(ttl: str) -> dict[str, str]:
    """Anthropic's ``cache_control`` value for a marker of ``ttl``."""
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def cache_plan(
    response: PrepareResponse,
) -> tuple[list[Breakpoint], str | None, str | None]:
    """The plan of ``selection.cache``: its Anthropic markers, OpenAI's ``prompt_cache_key`` and
    ``prompt_cache_retention`` (none of them without a plan)."""
    cache = response.selection.cache
    if cache is None:
        return [], None, None
    # Anthropic markers only: a ``30m`` breakpoint is OpenAI's ``prompt_cache_breakpoint``
    # (GPT-5.6 and later), which the runtimes here have no place for.
    breakpoints = [
        Breakpoint(point.after, point.ttl, getattr(point, "message", None))
        for point in cache.breakpoints
        if point.ttl != "30m"
    ]
    key = getattr(cache, "prompt_cache_key", None)
    retention = getattr(cache, "prompt_cache_retention", None)
    return breakpoints, key, retention


# --------------------------------------------------------------------------- native compaction


def native_directive(report: CompactionReport, api: NativeApi) -> NativeDirective:
    """The provider's compaction at the report's trigger, as the service's render for ``api``
    writes it (Anthropic: at least ``ANTHROPIC_MIN_THRESHOLD``, with its beta)."""
    if api == "anthropic":
        threshold = max(report.trigger_tokens, ANTHROPIC_MIN_THRESHOLD)
        return NativeDirective(
            parameter="context_management",
            threshold_tokens=threshold,
            beta=ANTHROPIC_COMPACTION_BETA,
        )
    return NativeDirective(
        parameter="context_management", threshold_tokens=report.trigger_tokens, beta=None
    )


def with_native(directive: NativeDirective, api: NativeApi, current: Any = None) -> Any:
    """The call's ``context_management`` with ``directive`` in it: ``current`` (the application's
    own, kept) plus the provider's compaction entry, unless ``current`` has one already."""
    if api == "anthropic":
        edit = {
            "type": ANTHROPIC_COMPACTION_EDIT,
            "trigger": {"type": "input_tokens", "value": directive.threshold_tokens},
        }
        config = dict(current) if isinstance(current, Mapping) else {}
        edits = list(config.get("edits") or [])
        if not any(isinstance(e, Mapping) and e.get("type") == edit["type"] for e in edits):
            edits.append(edit)
        return {**config, "edits": edits}
    entries = list(current) if isinstance(current, list) else []
    if not any(isinstance(e, Mapping) and e.get("type") == "compaction" for e in entries):
        entries.append({"type": "compaction", "compact_threshold": directive.threshold_tokens})
    return entries


# --------------------------------------------------------------------------- the output limit


def reserve(response: PrepareResponse) -> int | None:
    """The output the budget reserved: ``response_reserve`` plus ``reasoning_reserve_tokens``
    (``None``: no reserve)."""
    budget = response.budget
    reserved = budget.response_reserve + budget.reasoning_reserve_tokens
    return reserved if reserved > 0 else None


class ModelMaxima:
    """The models' maximum outputs, read from the registry (``GET /v1/models``) once per adapter;
    until it is read, or when it cannot be, a call's output limit is its reserve alone."""

    def __init__(self) -> None:
        self._max_output: dict[str, int | None] | None = None  # registry entry -> maximum

    def needed(self, response: PrepareResponse) -> bool:
        """Whether the limit of ``response``'s call waits on the registry, still unread."""
        entry = response.selection.model_entry
        return reserve(response) is not None and entry is not None and self._max_output is None

    def limit(
        self, response: PrepareResponse, registry: Callable[[], ModelList | None]
    ) -> int | None:
        """The frame's output limit: the reserve, at most the model's maximum output. The registry
        (``registry()``) is read once; when it cannot be read, the reserve stands alone."""
        reserved = reserve(response)
        if reserved is None:
            return None
        entry = response.selection.model_entry
        if entry is None:
            return reserved
        if self._max_output is None:
            try:
                models = registry()
            except ContextAssemblyError as err:
                logger.debug("the model registry could not be read (%s)", type(err).__name__)
                return reserved
            if models is not None:
                self._max_output = {info.name: info.max_output_tokens for info in models.models}
        maximum = (self._max_output or {}).get(entry)
        return reserved if maximum is None else min(reserved, maximum)
